"""Run the demo app under a single-process development server (DemoServer(server="flask-dev" or "aiohttp-dev")).

Like the gunicorn hooks, it writes its port for DemoServer and quits when its owner dies.
"""

import argparse
import asyncio
import importlib
import json
import os
import threading
import time


def load_target(target: str):
    """Import 'module:name' or call 'module:factory()', as gunicorn reads its app argument."""
    module_name, _, attr = target.partition(":")
    module = importlib.import_module(module_name)
    if attr.endswith("()"):
        return getattr(module, attr[:-2])()
    return getattr(module, attr or "app")


def announce(port: int) -> None:
    """Tell DemoServer which port we listen on (atomically, like the gunicorn hooks)."""
    state = os.environ.get("COURSE_SERVER_STATE")
    if state:
        record = {"master_pid": os.getpid(), "host": "127.0.0.1", "port": port, "ready_at": time.time()}
        tmp = os.path.join(state, "master.json.tmp")
        with open(tmp, "w") as fh:
            json.dump(record, fh)
        os.replace(tmp, os.path.join(state, "master.json"))
    print(f"[{os.getpid()}] listening at http://127.0.0.1:{port}", flush=True)


def watch_owner() -> None:
    owner = os.getppid()

    def watch():
        while os.getppid() == owner:
            time.sleep(0.25)
        os._exit(0)

    threading.Thread(target=watch, daemon=True).start()


def serve_flask(app_target: str, port: int, threads: int) -> None:
    from werkzeug.serving import make_server

    server = make_server("127.0.0.1", port, load_target(app_target), threaded=threads > 1)
    announce(server.server_port)
    server.serve_forever()


async def serve_aiohttp(app_target: str, port: int) -> None:
    from aiohttp import web

    runner = web.AppRunner(load_target(app_target))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    announce(site._server.sockets[0].getsockname()[1])
    await asyncio.Event().wait()  # serve until killed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kind", choices=["flask-dev", "aiohttp-dev"], default="flask-dev")
    parser.add_argument("--app", default="labapp:create_app()")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    watch_owner()
    if args.kind == "aiohttp-dev":
        asyncio.run(serve_aiohttp(args.app, args.port))
    else:
        serve_flask(args.app, args.port, args.threads)


if __name__ == "__main__":
    main()
