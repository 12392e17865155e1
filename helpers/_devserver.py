"""Run the demo app under Flask's threaded development server (DemoServer(server="flask-dev")).

Like the gunicorn hooks, it writes its port for DemoServer and quits when its owner dies.
"""

import argparse
import importlib
import json
import os
import threading
import time

from werkzeug.serving import make_server


def load_wsgi_target(target: str):
    """Import 'module:name' or call 'module:factory()', as gunicorn reads its app argument."""
    module_name, _, attr = target.partition(":")
    module = importlib.import_module(module_name)
    if attr.endswith("()"):
        return getattr(module, attr[:-2])()
    return getattr(module, attr or "app")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--app", default="labapp:create_app()")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    app = load_wsgi_target(args.app)
    server = make_server("127.0.0.1", args.port, app, threaded=args.threads > 1)
    state = os.environ.get("COURSE_SERVER_STATE")
    if state:
        record = {"master_pid": os.getpid(), "host": "127.0.0.1", "port": server.server_port, "ready_at": time.time()}
        with open(os.path.join(state, "master.json.tmp"), "w") as fh:
            json.dump(record, fh)
        os.replace(os.path.join(state, "master.json.tmp"), os.path.join(state, "master.json"))
    owner = os.getppid()

    def watch_owner():
        while os.getppid() == owner:
            time.sleep(0.25)
        os._exit(0)

    threading.Thread(target=watch_owner, daemon=True).start()
    server.serve_forever()


if __name__ == "__main__":
    main()
