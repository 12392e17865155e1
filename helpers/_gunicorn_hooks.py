"""Gunicorn server hooks that DemoServer loads with `-c python:helpers._gunicorn_hooks`.

They run inside gunicorn, not in the notebook:
  * the master watches its owner (the kernel that started it) and quits soon after it dies;
  * each worker asks the kernel to SIGKILL it if the master dies, so no worker is orphaned;
  * the master writes its port and each worker writes when it forked and when it was ready
    (the app loaded), so DemoServer knows exactly when every worker can serve.
"""

import ctypes
import json
import os
import signal
import threading
import time

STATE_DIR = os.environ.get("COURSE_SERVER_STATE", "")
WATCH_OWNER = os.environ.get("COURSE_WATCH_OWNER", "1") == "1"
_PR_SET_PDEATHSIG = 1
_forked_at = None


def _write_json(name, payload):
    if not STATE_DIR:
        return
    path = os.path.join(STATE_DIR, name)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as fh:
        json.dump(payload, fh)
    os.replace(tmp, path)  # readers never see half a file


def _append_jsonl(name, payload):
    if STATE_DIR:
        with open(os.path.join(STATE_DIR, name), "a") as fh:
            fh.write(json.dumps(payload) + "\n")


def on_starting(server):
    if not WATCH_OWNER:
        return
    owner = os.getppid()
    sleep = time.sleep  # bound now: nothing has monkey-patched the master

    def watch_owner():
        while os.getppid() == owner:
            sleep(0.25)
        server.log.warning("owner process %s is gone; shutting down", owner)
        os.kill(os.getpid(), signal.SIGQUIT)  # quick shutdown, workers included

    threading.Thread(target=watch_owner, name="owner-watch", daemon=True).start()


def when_ready(server):
    host, port = server.LISTENERS[0].sock.getsockname()[:2]
    _write_json("master.json", {"master_pid": os.getpid(), "host": host, "port": port, "ready_at": time.time()})


def post_fork(server, worker):
    global _forked_at
    _forked_at = time.time()
    try:  # Linux: die with the master even if it is SIGKILLed
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def post_worker_init(worker):
    ready_at = time.time()
    record = {"pid": os.getpid(), "forked_at": _forked_at, "ready_at": ready_at,
              "boot_ms": (ready_at - _forked_at) * 1000.0 if _forked_at else None}
    _write_json(f"worker-{os.getpid()}.json", record)
    _append_jsonl("boots.jsonl", record)


def child_exit(server, worker):
    try:
        os.remove(os.path.join(STATE_DIR, f"worker-{worker.pid}.json"))
    except OSError:
        pass
