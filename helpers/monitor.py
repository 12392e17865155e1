"""Resource sampling while a load run is under way: CPU and memory of server, client and cores.

Introduced in lesson 02 (where did the CPU go?). `run_load` starts a `Monitor` in a thread of
the notebook's process; about ten times a second it records each core's busy %, each server
process's CPU % and RSS, and each client process's CPU %. USS (memory only this process
holds, the honest per-worker figure) costs a walk of the process's page tables, so it is
sampled about once a second. Worker PIDs are looked up afresh every sample: a worker
recycled by max_requests shows up as a new series.
"""

from __future__ import annotations

import os
import threading
import time

import psutil

__all__ = ["Monitor", "SAMPLE_COLUMNS", "samples_frame"]

SAMPLE_COLUMNS = ["t_s", "kind", "name", "pid", "cpu_percent", "rss_mb", "uss_mb"]
_MB = 2**20


class Monitor:
    """Sample CPU% and memory of a server's processes, client processes and every core (lesson 02).

    server: a DemoServer (or anything with `master_pid` and `worker_pids()`), or None.
    Use as a context manager, or call start() and stop(); stop() returns the samples as a
    DataFrame with columns t_s, kind, name, pid, cpu_percent, rss_mb, uss_mb.
    """

    def __init__(self, server=None, interval_s: float = 0.1, uss_interval_s: float = 1.0):
        if not interval_s > 0:
            raise ValueError(f"interval_s must be a positive number of seconds, got {interval_s!r}.")
        self.server = server
        self.interval_s = float(interval_s)
        self.uss_interval_s = float(uss_interval_s)
        self.rows: list[tuple] = []
        self._client_pids: list[int] = []
        self._procs: dict[int, psutil.Process] = {}
        self._last_uss: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def add_client(self, pid: int) -> None:
        """Also sample this client process (a load generator)."""
        with self._lock:
            if pid not in self._client_pids:
                self._client_pids.append(pid)
        self._process(pid)  # prime its CPU counter now, so its first sample is meaningful

    def start(self) -> "Monitor":
        """Begin sampling in a background thread."""
        psutil.cpu_percent(percpu=True)  # sets the baseline for the first per-core delta
        self._server_processes()
        self._thread = threading.Thread(target=self._loop, name="course-monitor", daemon=True)
        self._thread.start()
        return self

    def stop(self):
        """Stop sampling; return the samples as a pandas DataFrame."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        return self.frame()

    def __enter__(self) -> "Monitor":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def frame(self):
        """The samples so far as a DataFrame (long format, one row per series per sample)."""
        return samples_frame(self.rows)

    # ---- sampling -------------------------------------------------------------------
    def _process(self, pid: int) -> psutil.Process | None:
        proc = self._procs.get(pid)
        if proc is None:
            try:
                proc = psutil.Process(pid)
                proc.cpu_percent(None)  # the first reading is always 0.0: take it now and discard it
            except psutil.Error:
                return None
            self._procs[pid] = proc
        return proc

    def _server_processes(self) -> list[tuple[str, int]]:
        server = self.server
        if server is None:
            return []
        try:
            master = server.master_pid if getattr(server, "alive", True) else None
        except Exception:  # a half-started server: nothing to sample yet
            return []
        if master is None:
            return []
        found = [("master", master)] + [("worker", pid) for pid in _children(master)]
        for _, pid in found:
            self._process(pid)
        return found

    def _loop(self) -> None:
        next_t = time.monotonic()
        next_uss = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            want_uss = now >= next_uss
            if want_uss:
                next_uss = now + self.uss_interval_s
            try:
                self.sample(want_uss)
            except Exception:  # a sampler must never take the run down with it
                pass
            next_t += self.interval_s
            delay = next_t - time.monotonic()
            if delay < 0:  # fell behind (a busy machine): skip, do not burst
                next_t = time.monotonic()
                delay = 0
            self._stop.wait(delay)

    def sample(self, with_uss: bool = False) -> None:
        """Take one sample of every series now."""
        t_s = time.time()
        rows = self.rows
        for core, pct in enumerate(psutil.cpu_percent(percpu=True)):
            rows.append((t_s, "core", f"cpu{core}", None, pct, None, None))
        with self._lock:
            clients = list(self._client_pids)
        series = self._server_processes() + [("client", pid) for pid in clients]
        alive = set()
        for name, pid in series:
            proc = self._process(pid)
            if proc is None:
                continue
            try:
                with proc.oneshot():
                    cpu = proc.cpu_percent(None)
                    rss_mb = proc.memory_info().rss / _MB
                uss_mb = None
                if with_uss:
                    try:
                        uss_mb = proc.memory_full_info().uss / _MB
                    except (psutil.AccessDenied, AttributeError):
                        pass
            except psutil.Error:
                continue
            alive.add(pid)
            rows.append((t_s, "client" if name == "client" else "server", name, pid, cpu, rss_mb, uss_mb))
        for pid in list(self._procs):  # forget processes that are gone
            if pid not in alive and not psutil.pid_exists(pid):
                self._procs.pop(pid, None)


def _children(pid: int) -> list[int]:
    """Child PIDs of pid, asked afresh (workers come and go).

    Linux lists them per thread in /proc/<pid>/task/<tid>/children, which costs microseconds;
    psutil's children() scans every process on the machine (about 1.5 ms, 10 times a second).
    """
    try:
        found = []
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                found += [int(p) for p in fh.read().split()]
        return sorted(found)
    except (OSError, ValueError):
        try:
            return sorted(child.pid for child in psutil.Process(pid).children())
        except psutil.Error:
            return []


def samples_frame(rows):
    """Build the samples DataFrame with the documented columns and dtypes (from tuples or a frame).

    Run.samples (lesson 02) is always in this shape, fresh or read back from CSV.
    """
    import pandas as pd

    frame = rows.copy() if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows), columns=SAMPLE_COLUMNS)
    for col in SAMPLE_COLUMNS:
        if col not in frame:
            frame[col] = None
    frame = frame[SAMPLE_COLUMNS]
    frame["t_s"] = pd.to_numeric(frame["t_s"], errors="coerce").astype("float64")
    frame["kind"] = frame["kind"].astype("str")
    frame["name"] = frame["name"].astype("str")
    frame["pid"] = pd.to_numeric(frame["pid"], errors="coerce").astype("Int64")
    for col in ("cpu_percent", "rss_mb", "uss_mb"):
        frame[col] = pd.to_numeric(frame[col], errors="coerce").astype("float64")
    return frame
