"""Server-side timing, added once for every endpoint by a WSGI middleware.

Each response carries:
  Server-Timing: app;dur=<handler wall ms>, cpu;dur=<handler CPU ms>, io;dur=<simulated I/O ms>
  X-Worker-Pid, X-Worker-Thread: which process and thread (greenlet under gevent) served it
  X-Handler-Start, X-Handler-End: wall-clock epoch seconds when the handler began and ended

`cpu` counts only the CPU of the thread serving the request. Under gevent many
requests share one OS thread, so there the clock is charged per greenlet on every
switch; otherwise a request would be billed for its neighbours' work.
"""

from __future__ import annotations

import os
import threading
import time

IO_KEY = "labapp.io_ms"  # environ slot where endpoints add the I/O they waited on


def add_io_ms(environ, ms: float) -> None:
    """Record simulated I/O time for the current request."""
    environ[IO_KEY] = environ.get(IO_KEY, 0.0) + ms


def _gevent_is_active() -> bool:
    try:
        from gevent import monkey
    except ImportError:
        return False
    return monkey.is_module_patched("threading")


class _GreenletCpuClock:
    """CPU seconds used by the current greenlet, kept by a switch hook."""

    def __init__(self):
        import greenlet

        self._getcurrent = greenlet.getcurrent
        self._last = time.thread_time()
        greenlet.settrace(self._on_switch)

    def _on_switch(self, event, args):
        if event in ("switch", "throw"):
            origin = args[0]
            now = time.thread_time()
            try:
                origin.labapp_cpu_s = getattr(origin, "labapp_cpu_s", 0.0) + (now - self._last)
            except AttributeError:  # a greenlet type that refuses attributes
                pass
            self._last = now

    def __call__(self) -> float:
        current = self._getcurrent()
        now = time.thread_time()
        return getattr(current, "labapp_cpu_s", 0.0) + (now - self._last)


class ServerTimingMiddleware:
    """Wrap a WSGI app so every response reports where its time went."""

    def __init__(self, wsgi_app):
        self.wsgi_app = wsgi_app
        self._cpu_clock = None
        self._lock = threading.Lock()

    def _clock(self):
        # Chosen on the first request, in the worker, after gevent has patched.
        if self._cpu_clock is None:
            with self._lock:
                if self._cpu_clock is None:
                    self._cpu_clock = _GreenletCpuClock() if _gevent_is_active() else time.thread_time
        return self._cpu_clock

    def __call__(self, environ, start_response):
        cpu_clock = self._clock()
        start_wall = time.time()
        t0 = time.perf_counter()
        c0 = cpu_clock()
        environ[IO_KEY] = 0.0
        captured = {}
        written = []

        def capture(status, headers, exc_info=None):
            captured["status"], captured["headers"] = status, list(headers)
            return written.append

        body_iter = self.wsgi_app(environ, capture)
        try:
            body = b"".join(written) + b"".join(body_iter)
        finally:
            if hasattr(body_iter, "close"):
                body_iter.close()
        cpu_ms = (cpu_clock() - c0) * 1000.0
        app_ms = (time.perf_counter() - t0) * 1000.0
        end_wall = start_wall + app_ms / 1000.0
        io_ms = environ[IO_KEY]
        headers = [(k, v) for k, v in captured["headers"] if k.lower() != "content-length"]
        headers += [
            ("Content-Length", str(len(body))),
            ("Server-Timing", f"app;dur={app_ms:.3f}, cpu;dur={cpu_ms:.3f}, io;dur={io_ms:.3f}"),
            ("X-Worker-Pid", str(os.getpid())),
            ("X-Worker-Thread", str(threading.get_ident())),
            ("X-Handler-Start", f"{start_wall:.6f}"),
            ("X-Handler-End", f"{end_wall:.6f}"),
        ]
        start_response(captured["status"], headers)
        return [body]
