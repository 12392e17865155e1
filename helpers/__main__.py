"""Command line: python -m helpers {serve,load,doctor,record-reference} ...

Bad arguments print one sentence and the usage, and exit with code 2 (never a traceback).
"""

from __future__ import annotations

import argparse
import signal
import sys
import time


def _serve(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m helpers serve",
                                     description="Run the demo app under gunicorn until Ctrl-C.")
    parser.add_argument("--workers", "-w", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--worker-class", "-k", default="sync", help="sync, gthread or gevent")
    parser.add_argument("--worker-connections", type=int, default=1000)
    parser.add_argument("--port", type=int, default=None, help="default: a free port")
    parser.add_argument("--preload", action="store_true")
    parser.add_argument("--max-requests", type=int, default=0)
    parser.add_argument("--server", default="gunicorn", help="gunicorn or flask-dev")
    args = parser.parse_args(argv)
    from helpers.server import DemoServer

    try:
        server = DemoServer(workers=args.workers, threads=args.threads, worker_class=args.worker_class,
                            worker_connections=args.worker_connections, port=args.port, preload=args.preload,
                            max_requests=args.max_requests, server=args.server)
    except ValueError as err:
        parser.print_usage(sys.stderr)
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        server.start()
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"Serving at {server.url}", flush=True)
    print(f"{server!r}\nPress Ctrl-C to stop.", flush=True)
    try:
        while server.alive:
            time.sleep(0.5)
        print(f"the server died:\n{server.log_tail(20)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        server.stop()


def _record_reference(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m helpers record-reference",
                                     description="Run the course's key sweeps and write them to data/reference/.")
    parser.add_argument("--names", nargs="*", help="which reference sweeps (default: all)")
    args = parser.parse_args(argv)
    from helpers.sweep import record_reference

    # three tries each, keeping the quietest: the machine may be shared
    for path in record_reference(names=args.names or None, attempts=3):
        print(path)
    return 0


COMMANDS = {
    "serve": ("run the demo app until Ctrl-C", _serve),
    "load": ("fire load at a URL and print a wrk-like summary", lambda argv: _lazy("helpers.load", argv)),
    "doctor": ("check this machine is ready for the course", lambda argv: _lazy("helpers.doctor", argv)),
    "record-reference": ("record the reference sweeps into data/reference/", _record_reference),
}


def _lazy(module_name: str, argv: list[str]) -> int:
    import importlib

    return importlib.import_module(module_name).cli(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    usage = "usage: python -m helpers {" + ",".join(COMMANDS) + "} [options]\n" + "\n".join(
        f"  {name:<17} {help_}" for name, (help_, _) in COMMANDS.items())
    if not argv or argv[0] in ("-h", "--help"):
        print(usage)
        return 0 if argv else 2
    if argv[0] not in COMMANDS:
        print(f"error: unknown command {argv[0]!r}.\n{usage}", file=sys.stderr)
        return 2
    try:
        return COMMANDS[argv[0]][1](argv[1:])
    except SystemExit as exit_:  # argparse's own usage errors already printed one line
        return exit_.code if isinstance(exit_.code, int) else 2


if __name__ == "__main__":
    sys.exit(main())
