"""DemoServer: start and stop the demo app under gunicorn (or a dev server) from a notebook.

Introduced in lesson 00. The server runs in its own process session, so the notebook's
Interrupt button (SIGINT to the kernel's process group) does not reach it; yet it never
outlives its kernel: the gunicorn master watches its parent and quits within seconds of
the kernel dying, and each worker is killed by the OS if the master dies.

    with DemoServer(workers=2, threads=4) as server:
        print(server.url)
"""

from __future__ import annotations

import atexit
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import deque
from pathlib import Path

import psutil

__all__ = ["DemoServer", "ServerStartError", "stop_all", "running", "server_for_url", "state_root"]

WORKER_CLASSES = ("sync", "gthread", "gevent")
SERVER_KINDS = ("gunicorn", "flask-dev", "aiohttp", "aiohttp-dev")
DEFAULT_APP = "labapp:create_app()"
AIOHTTP_APP = "labapp.aiohttp_app:create_app()"
AIOHTTP_WORKER = "aiohttp.GunicornWebWorker"
HOST = "127.0.0.1"
MAX_WORKERS = 64
MAX_THREADS = 1024
MAX_WORKER_CONNECTIONS = 100_000

# Memory per process, measured with psutil USS on the 2-core reference machine after a few
# requests (benchmarks/README.md): master 10-15 MB, worker 16-21 MB (11 MB with preload).
# Rounded up, since a learner's app may hold more once warm.
MASTER_MB = 20.0
WORKER_MB = 30.0
WORKER_PRELOADED_MB = 18.0
MEMORY_BUDGET_FRACTION = 0.8

_REGISTRY: dict[int, "DemoServer"] = {}  # id(server) -> server; every server this process started
_REGISTRY_LOCK = threading.Lock()


class ServerStartError(RuntimeError):
    """The server process did not become ready; the message carries its log tail."""


def state_root() -> Path:
    """This user's folder for server state (logs, ready markers), private to the user."""
    root = Path(tempfile.gettempdir()) / f"webperf-course-{os.getuid()}" / "servers"
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    return root


def _check_int(name: str, value, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be a whole number from {low} to {high}, got {value!r}.")
    if not low <= value <= high:
        raise ValueError(f"{name} must be from {low} to {high}, got {value}.")
    return value


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((HOST, port))
        except OSError:
            return False
    return True


class DemoServer:
    """Start the demo app in a subprocess on 127.0.0.1 and stop it cleanly (lesson 00).

    workers, threads, worker_class ("sync", "gthread", "gevent"), worker_connections,
    backlog, preload, max_requests, max_requests_jitter, timeout and graceful_timeout map onto gunicorn's
    settings of the same names. threads > 1 with worker_class="sync" runs gthread, as
    gunicorn itself does. port=None picks a free port.

    server= picks what serves the app (lesson 06): "gunicorn" (default), "flask-dev"
    (Flask's threaded development server), "aiohttp" (the aiohttp twin under gunicorn's
    aiohttp worker; workers apply) or "aiohttp-dev" (the twin's own single-process server).
    """

    def __init__(self, workers: int = 1, threads: int = 1, worker_class: str = "sync",
                 worker_connections: int = 1000, backlog: int | None = None, preload: bool = False,
                 max_requests: int = 0, max_requests_jitter: int = 0, timeout: int = 30, graceful_timeout: int = 3,
                 app: str = DEFAULT_APP, server: str = "gunicorn", port: int | None = None,
                 start_timeout_s: float = 30.0):
        if server not in SERVER_KINDS:
            raise ValueError(f"server must be one of {', '.join(SERVER_KINDS)}, got {server!r}.")
        if worker_class not in WORKER_CLASSES:
            raise ValueError(f"worker_class must be one of {', '.join(WORKER_CLASSES)}, got {worker_class!r}.")
        self.workers = _check_int("workers", workers, 1, MAX_WORKERS)
        self.threads = _check_int("threads", threads, 1, MAX_THREADS)
        if worker_class == "gevent" and threads != 1:
            raise ValueError("threads only apply to sync/gthread workers; gevent takes worker_connections instead.")
        if worker_class == "sync" and threads > 1:
            worker_class = "gthread"  # gunicorn's own rule, made visible
        self.worker_class = worker_class
        self.worker_connections = _check_int("worker_connections", worker_connections, 1, MAX_WORKER_CONNECTIONS)
        self.backlog = None if backlog is None else _check_int("backlog", backlog, 1, 65535)
        self.preload = bool(preload)
        self.max_requests = _check_int("max_requests", max_requests, 0, 10_000_000)
        self.max_requests_jitter = _check_int("max_requests_jitter", max_requests_jitter, 0, 10_000_000)
        self.timeout = _check_int("timeout", timeout, 1, 3600)
        self.graceful_timeout = _check_int("graceful_timeout", graceful_timeout, 1, 600)
        if not isinstance(app, str) or not app:
            raise ValueError(f"app must be a WSGI target such as {DEFAULT_APP!r}, got {app!r}.")
        self.server = server
        if server in ("flask-dev", "aiohttp-dev") and (workers != 1 or worker_class not in ("sync", "gthread")):
            raise ValueError(f"server={server!r} is one process; leave workers and worker_class at their defaults.")
        if server.startswith("aiohttp"):
            if worker_class != "sync" or threads != 1:
                raise ValueError("the aiohttp servers run one event loop per process; leave worker_class and threads at their defaults.")
            self.worker_class = "aiohttp"
            app = AIOHTTP_APP if app == DEFAULT_APP else app
        self.app = app
        self.requested_port = None if port is None else _check_int("port", port, 1, 65535)
        self.start_timeout_s = float(start_timeout_s)
        self.port: int | None = None
        self.proc: subprocess.Popen | None = None
        self.state_dir: Path | None = None
        self.started_at: float | None = None
        self.ready_s: float | None = None
        self._final_log: list[str] | None = None

    # ---- memory budget ---------------------------------------------------------------
    def estimated_mb(self) -> float:
        """Memory this server is expected to take (MB of USS), from the measured per-process costs."""
        if self._single_process:
            return MASTER_MB + WORKER_MB
        return MASTER_MB + self.workers * (WORKER_PRELOADED_MB if self.preload else WORKER_MB)

    def _check_memory_budget(self) -> None:
        limit_mb = memory_limit_mb()
        with _REGISTRY_LOCK:
            others = [s for s in _REGISTRY.values() if s is not self and s.alive]
        others_mb = sum(s.estimated_mb() for s in others)
        budget_mb = MEMORY_BUDGET_FRACTION * limit_mb
        if self.estimated_mb() + others_mb > budget_mb:
            raise ValueError(
                f"this server needs about {self.estimated_mb():.0f} MB and the {len(others)} already running "
                f"about {others_mb:.0f} MB, over the {budget_mb:.0f} MB budget "
                f"({MEMORY_BUDGET_FRACTION:.0%} of the {limit_mb:.0f} MB memory limit); use fewer workers or stop a server.")

    # ---- lifecycle -------------------------------------------------------------------
    def start(self) -> "DemoServer":
        """Start the server and return once every worker answers; raise with the log tail if not."""
        if self.alive:
            return self
        self._check_memory_budget()
        if self.requested_port is not None and not _port_is_free(self.requested_port):
            raise ValueError(f"port {self.requested_port} is already in use on {HOST}; pass port=None to pick a free one.")
        self.state_dir = state_root() / uuid.uuid4().hex[:12]
        self.state_dir.mkdir(mode=0o700)
        self._final_log = None
        self.port = None
        log = open(self.state_dir / "server.log", "ab")
        env = dict(os.environ, COURSE_SERVER_STATE=str(self.state_dir), PYTHONUNBUFFERED="1")
        t0 = time.perf_counter()
        self.started_at = time.time()
        try:
            self.proc = subprocess.Popen(self._command(), stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=env, cwd=self.state_dir,
                                         start_new_session=True)  # out of the kernel's process group
        finally:
            log.close()
        with _REGISTRY_LOCK:
            _REGISTRY[id(self)] = self
        self._write_meta()
        try:
            self._wait_ready()
        except BaseException:
            self.stop()  # nothing half-started is left behind
            raise
        self.ready_s = time.perf_counter() - t0
        return self

    def _command(self) -> list[str]:
        port = self.requested_port or 0
        if self.server in ("flask-dev", "aiohttp-dev"):
            return [sys.executable, "-m", "helpers._devserver", "--kind", self.server, "--app", self.app,
                    "--port", str(port), "--threads", str(self.threads)]
        worker_class = AIOHTTP_WORKER if self.server == "aiohttp" else self.worker_class
        cmd = [sys.executable, "-m", "gunicorn", self.app, "--bind", f"{HOST}:{port}",
               "--workers", str(self.workers), "--worker-class", worker_class,
               "--timeout", str(self.timeout), "--graceful-timeout", str(self.graceful_timeout),
               "--max-requests", str(self.max_requests), "--max-requests-jitter", str(self.max_requests_jitter),
               "--config", "python:helpers._gunicorn_hooks",
               "--no-control-socket",  # gunicorn 27 would otherwise share ~/.gunicorn/gunicorn.ctl between servers
               "--error-logfile", "-", "--log-level", "info"]
        if self.worker_class == "gthread":
            cmd += ["--threads", str(self.threads)]
        if self.worker_class in ("gevent", "gthread"):
            # gthread: how many connections one worker accepts at once (greedily, lesson 02)
            cmd += ["--worker-connections", str(self.worker_connections)]
        if self.backlog is not None:
            cmd += ["--backlog", str(self.backlog)]
        if self.preload:
            cmd.append("--preload")
        if os.path.isdir("/dev/shm"):
            cmd += ["--worker-tmp-dir", "/dev/shm"]  # heartbeats off the disk
        return cmd

    def _write_meta(self):
        meta = {"owner_pid": os.getpid(), "master_pid": self.proc.pid, "config": self.config(),
                "started_at": self.started_at,
                "master_create_time": _create_time(self.proc.pid)}
        (self.state_dir / "server.json").write_text(json.dumps(meta))

    def _wait_ready(self):
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            code = self.proc.poll()
            if code is not None:
                raise ServerStartError(f"{self._label()} exited with code {code} while starting.\n"
                                       f"--- log tail ---\n{self.log_tail(30)}")
            if self.port is None:
                master = _read_json(self.state_dir / "master.json")
                if master:
                    self.port = master["port"]
            if self.port is not None and len(self.worker_pids()) >= self._expected_workers() and self._health_ok():
                return
            if time.monotonic() > deadline:
                raise ServerStartError(f"{self._label()} was not ready within {self.start_timeout_s:g} s.\n"
                                       f"--- log tail ---\n{self.log_tail(30)}")
            time.sleep(0.02)

    @property
    def _single_process(self) -> bool:
        return self.server in ("flask-dev", "aiohttp-dev")

    def _expected_workers(self) -> int:
        return 0 if self._single_process else self.workers

    def _health_ok(self) -> bool:
        conn = http.client.HTTPConnection(HOST, self.port, timeout=2)
        try:
            conn.request("GET", "/health")
            return conn.getresponse().status == 200
        except OSError:
            return False
        finally:
            conn.close()

    def stop(self) -> None:
        """Stop the server and every worker; safe to call twice or on a half-started server."""
        if self.proc is None:
            return
        pids = [self.proc.pid] + self.worker_pids(include_unready=True)
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGQUIT)  # gunicorn's quick shutdown
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=self.graceful_timeout + 2)
            except subprocess.TimeoutExpired:
                pass
        _kill_pids(pids)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self._final_log = self._read_log_lines()
        if self.state_dir is not None:
            shutil.rmtree(self.state_dir, ignore_errors=True)
        with _REGISTRY_LOCK:
            _REGISTRY.pop(id(self), None)

    def restart(self) -> "DemoServer":
        """Stop, then start again with the same settings (a fresh port unless one was given)."""
        self.stop()
        return self.start()

    def __enter__(self) -> "DemoServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- what a notebook reads --------------------------------------------------------
    @property
    def alive(self) -> bool:
        """True while the server process is running."""
        return self.proc is not None and self.proc.poll() is None

    @property
    def url(self) -> str:
        """Base URL, e.g. http://127.0.0.1:41234 (no trailing slash)."""
        if self.port is None:
            raise RuntimeError("the server has not been started; call .start() or use it in a with-block.")
        return f"http://{HOST}:{self.port}"

    @property
    def master_pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def worker_pids(self, include_unready: bool = False) -> list[int]:
        """PIDs of the current workers that have loaded the app (or all children, if include_unready)."""
        if not self.alive:
            return []
        try:
            children = psutil.Process(self.proc.pid).children()
        except psutil.Error:
            return []
        pids = sorted(c.pid for c in children)
        if include_unready or self._single_process:
            return pids
        return [p for p in pids if (self.state_dir / f"worker-{p}.json").exists()]

    @property
    def pids(self) -> dict:
        """Current process ids: {'master': pid, 'workers': [pid, ...]}."""
        return {"master": self.master_pid if self.alive else None, "workers": self.worker_pids()}

    def worker_boots(self) -> list[dict]:
        """Every worker boot so far: pid, forked_at, ready_at (epoch s) and boot_ms (lesson 08)."""
        path = self.state_dir / "boots.jsonl" if self.state_dir else None
        if path is None or not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def memory(self) -> list[dict]:
        """Memory of the master and each worker now: pid, role, rss_mb, uss_mb, pss_mb (lessons 03, 08).

        RSS counts pages shared with other workers (copy-on-write after fork) in every worker;
        USS is what stopping that one process would free; PSS splits shared pages fairly.
        """
        rows = []
        for role, pids in (("master", [self.master_pid] if self.alive else []), ("worker", self.worker_pids())):
            for pid in pids:
                try:
                    info = psutil.Process(pid).memory_full_info()
                except psutil.Error:
                    continue  # it exited while we looked
                rows.append({"pid": pid, "role": role, "rss_mb": info.rss / 2**20, "uss_mb": info.uss / 2**20,
                             "pss_mb": getattr(info, "pss", float("nan")) / 2**20})
        return rows

    def config(self) -> dict:
        """The settings this server runs with, as stored alongside every load run."""
        return {"server": self.server, "app": self.app, "workers": self.workers, "threads": self.threads,
                "worker_class": self.worker_class, "worker_connections": self.worker_connections,
                "backlog": self.backlog, "preload": self.preload, "max_requests": self.max_requests,
                "max_requests_jitter": self.max_requests_jitter,
                "timeout": self.timeout, "graceful_timeout": self.graceful_timeout,
                "slots": self.slots}

    @property
    def slots(self) -> int:
        """Requests the server can work on at once: workers x threads (x connections under gevent)."""
        if self.worker_class == "aiohttp":
            return self.workers * self.worker_connections  # one loop awaits as many as are open
        if self.worker_class == "gevent":
            return self.workers * self.worker_connections
        return self.workers * self.threads

    def _read_log_lines(self) -> list[str]:
        if self._final_log is not None:
            return self._final_log
        if self.state_dir is None:
            return []
        path = self.state_dir / "server.log"
        if not path.exists():
            return []
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 256_000))
            return fh.read().decode("utf-8", "replace").splitlines()

    def log_tail(self, n: int = 20) -> str:
        """The last n lines of the server's log (still readable after stop)."""
        return "\n".join(deque(self._read_log_lines(), maxlen=n))

    @property
    def status(self) -> str:
        """'not started', 'running', 'stopped', or 'died (exit code N)'."""
        if self.proc is None:
            return "not started"
        code = self.proc.poll()
        if code is None:
            return "running"
        return "stopped" if self._final_log is not None else f"died (exit code {code})"

    def browser_path(self, path: str = "/health") -> str:
        """A link to `path` through JupyterLab's server proxy; works locally and on JupyterHub/Binder (lesson 00).

        It is relative to the Jupyter server (no host, no token), so it is meant for a
        notebook's rendered output; from a terminal on this machine use .url instead.
        """
        if self.port is None:
            raise RuntimeError("the server has not been started; call .start() or use it in a with-block.")
        prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/").rstrip("/")
        return f"{prefix}/proxy/{self.port}/{path.lstrip('/')}"

    def _repr_html_(self) -> str:
        from html import escape

        text = escape(repr(self))
        if not (self.alive and self.port):
            return f"<code>{text}</code>"
        links = " · ".join(f'<a href="{escape(self.browser_path(p))}" target="_blank">{escape(p)}</a>'
                           for p in ("/health", "/io?ms=200", "/cpu?ms=50"))
        return (f"<code>{text}</code><br>Open in your browser (through JupyterLab): {links}"
                f"<br><small>From this machine's terminal: <code>curl {escape(self.url)}/health</code></small>")

    def _label(self) -> str:
        if self._single_process:
            return f"{self.server} server"
        if self.server == "aiohttp":
            return f"gunicorn ({self.workers} aiohttp worker{'s' * (self.workers > 1)})"
        return f"gunicorn ({self.workers} {self.worker_class} worker{'s' * (self.workers > 1)})"

    def __repr__(self) -> str:
        opts = [f"workers={self.workers}", f"worker_class={self.worker_class!r}"]
        if self._single_process:
            opts = []
        if self.worker_class == "gthread" or self.server == "flask-dev":
            opts.append(f"threads={self.threads}")
        if self.worker_class == "gevent" or (self.worker_class == "gthread" and self.worker_connections != 1000):
            opts.append(f"worker_connections={self.worker_connections}")
        for name in ("backlog", "max_requests", "max_requests_jitter"):
            if getattr(self, name):
                opts.append(f"{name}={getattr(self, name)}")
        if self.preload:
            opts.append("preload=True")
        where = f" at {self.url}" if self.port and self.alive else ""
        pids = f" pids={self.pids}" if self.alive else ""
        return f"<DemoServer {self.server} {', '.join(opts)}: {self.status}{where}{pids}>"


def memory_limit_mb() -> float:
    """The memory the course may plan with: COURSE_MEMORY_LIMIT_MB if set, else the cgroup/RAM limit."""
    override = os.environ.get("COURSE_MEMORY_LIMIT_MB")
    if override:
        return float(override)
    from helpers.machine import machine

    return float(machine()["memory_limit_mb"])


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _create_time(pid: int):
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def _kill_pids(pids: list[int]) -> None:
    """SIGKILL whichever of these processes (ours) are still alive."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def server_for_url(url: str) -> "DemoServer | None":
    """The live DemoServer of this process that serves `url` (matched by port), if any."""
    from urllib.parse import urlsplit

    try:
        port = urlsplit(url).port
    except ValueError:
        return None
    with _REGISTRY_LOCK:
        servers = list(_REGISTRY.values())
    return next((s for s in servers if s.alive and s.port == port), None)


def stop_all(stale: bool = False) -> int:
    """Stop every server this Python process started (lesson 00); returns how many.

    stale=True also stops this user's course servers whose owning process is gone
    (left by an earlier kernel); servers of other live kernels are left alone.
    """
    with _REGISTRY_LOCK:
        servers = list(_REGISTRY.values())
    for server in servers:
        server.stop()
    count = len(servers)
    if stale:
        for entry in running():
            if not entry["owner_alive"]:
                _stop_foreign(entry)
                count += 1
    return count


def running() -> list[dict]:
    """This user's course servers that are alive now, from any kernel (lesson 00).

    Each entry: master_pid, owner_pid, owner_alive, url, config, state_dir. Processes the
    course did not start are never listed: a master must match its recorded start time.
    """
    found = []
    for meta_path in sorted(state_root().glob("*/server.json")):
        meta = _read_json(meta_path)
        if not meta:
            continue
        master_pid = meta.get("master_pid")
        recorded = meta.get("master_create_time")
        actual = _create_time(master_pid) if master_pid else None
        if actual is None or recorded is None or abs(actual - recorded) > 0.01:
            shutil.rmtree(meta_path.parent, ignore_errors=True)  # its server is gone
            continue
        port = (_read_json(meta_path.parent / "master.json") or {}).get("port")
        found.append({"master_pid": master_pid, "owner_pid": meta.get("owner_pid"),
                      "owner_alive": psutil.pid_exists(meta.get("owner_pid") or -1),
                      "url": f"http://{HOST}:{port}" if port else None,
                      "config": meta.get("config"), "state_dir": str(meta_path.parent)})
    return found


def _stop_foreign(entry: dict) -> None:
    """Stop a course server that another (possibly dead) process started."""
    try:
        master = psutil.Process(entry["master_pid"])
        pids = [entry["master_pid"]] + [c.pid for c in master.children()]
        master.send_signal(signal.SIGQUIT)
        master.wait(timeout=(entry.get("config") or {}).get("graceful_timeout", 3) + 2)
    except (psutil.Error, psutil.TimeoutExpired):
        pids = [entry["master_pid"]]
    _kill_pids(pids)
    shutil.rmtree(entry["state_dir"], ignore_errors=True)


atexit.register(stop_all)
