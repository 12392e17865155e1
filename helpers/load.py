"""Fire HTTP load at a DemoServer and keep every request: run_load, Run and Summary.

Introduced in lesson 01. One call, several modes:

    run = run_load(server.url + "/io?ms=200", concurrency=16, duration=5)      # closed loop
    run = run_load({url_cpu: 1, url_io: 4}, duration=5)                          # mixed streams
    run = run_load(server.url + "/io?ms=1000", requests=10, burst=True)          # all at once
    run = run_load(server.url + "/cpu?ms=20", rate=40, duration=10)              # open loop
    run.summary()

The client runs in a child process by default (isolate=True), so what the notebook kernel
does meanwhile (plotting, holding the GIL) cannot slow it down. A monitor thread here samples
the server's and the client's processes. The client says when it may itself be the limit:
a Python client on a 2-core machine shares the CPU with the server it measures.
"""

from __future__ import annotations

import collections
import json
import math
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import pandas as pd

from helpers import _client
from helpers.machine import machine

__all__ = ["run_load", "Run", "Summary", "ErrorCounts", "explain_errors", "load_run", "list_runs", "cli", "ERRORS", "REQUEST_COLUMNS"]

ERRORS = _client.ERRORS
REQUEST_COLUMNS = ["request_id", "url", "endpoint", "client_thread", "intended_s", "send_s", "end_s", "latency_ms",
                   "latency_intended_ms", "schedule_lag_ms", "connect_ms", "status", "error", "ok",
                   "server_app_ms", "server_cpu_ms", "server_io_ms", "worker_pid", "worker_thread",
                   "handler_start_s", "handler_end_s", "queue_ms", "contention_ms"]

MAX_CONCURRENCY = 20_000
MAX_DURATION_S = 3600.0
MAX_REQUESTS = 10_000_000
MAX_RATE_RPS = 100_000.0
MAX_TIMEOUT_S = 600.0
MAX_PROCESSES = 16
SATURATED_CPU_PERCENT = 85.0   # a client process this busy (of one core) may be the limit itself
# ...as may one whose responses wait this long (median) before it reads them: measured 0.02-0.1 ms
# for a client with a core to spare, 0.9-1.2 ms for one pinned beside a busy loop at idle priority.
SATURATED_DELAY_MS = 0.5
# Client processes, measured on the 2-core reference box (/io?ms=2000, gevent, 6 s runs):
# one event-loop process kept up with 8,000 connections at 15% of a core, and splitting them
# over 4 or 8 processes changed nothing but the tail (slightly worse), so closed and open loops
# use one process unless told otherwise. Bursts use a thread per request, and threads do not
# scale: 3,000 threads in one process collapsed (81 req/s, 145% CPU, a GIL convoy) where three
# processes of 1,000 did 1,166 req/s. So a burst gets a process per 1,000 requests.
THREADS_PER_PROCESS = 1000
PROGRESS_AFTER_S = 2.0
START_TIMEOUT_S = 60.0
CLIENT_SCRIPT = str(Path(_client.__file__).resolve())


# ---- argument checking: every mistake is one sentence ----------------------------------

def _is_number(value) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _check_url(url) -> str:
    if not isinstance(url, str):
        raise ValueError(f"url must be a string such as 'http://127.0.0.1:8000/io', got {url!r}.")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a malformed port
    except ValueError:
        raise ValueError(f"url {url!r} is not a valid URL (check the port).") from None
    if parts.scheme != "http":
        raise ValueError(f"url must start with http:// (the course loads plain HTTP on this machine), got {url!r}.")
    if parts.hostname not in ("127.0.0.1", "localhost"):
        raise ValueError(f"run_load only sends load to this machine (127.0.0.1 or localhost), not to {parts.hostname!r}.")
    return url


def _check_concurrency(value, name: str = "concurrency") -> int:
    if not _is_int(value) or value < 1:
        raise ValueError(f"{name} must be a whole number of at least 1, got {value!r}.")
    if value > MAX_CONCURRENCY:
        raise ValueError(f"{name}={value} is more than this course ever needs (at most {MAX_CONCURRENCY:,}).")
    return int(value)


def _validate(url, concurrency, duration, requests, rate, burst, timeout, arrival, processes) -> dict:
    """Check run_load's arguments; return the normalised plan of the run."""
    if isinstance(url, dict):
        if not url:
            raise ValueError("url as a dict needs at least one {url: concurrency} entry.")
        if concurrency is not None:
            raise ValueError("with a dict of {url: concurrency}, leave concurrency out: each URL carries its own.")
        if burst or rate is not None:
            raise ValueError("a dict of {url: concurrency} runs closed-loop streams; burst and rate take a single url.")
        streams = [(_check_url(u), _check_concurrency(c, f"concurrency for {u}")) for u, c in url.items()]
        if sum(c for _, c in streams) > MAX_CONCURRENCY:
            raise ValueError(f"the streams add up to {sum(c for _, c in streams):,} threads; at most "
                             f"{MAX_CONCURRENCY:,} in all.")
    else:
        streams = [(_check_url(url), None)]
    if duration is not None:
        if not _is_number(duration) or not math.isfinite(duration) or duration <= 0:
            raise ValueError(f"duration must be a positive number of seconds, got {duration!r}.")
        if duration > MAX_DURATION_S:
            raise ValueError(f"duration={duration:g} s is longer than an hour; keep runs under {MAX_DURATION_S:g} s.")
    if requests is not None:
        if not _is_int(requests) or requests < 1:
            raise ValueError(f"requests must be a whole number of at least 1, got {requests!r}.")
        if requests > MAX_REQUESTS:
            raise ValueError(f"requests={requests:,} is absurd for this course; ask for at most {MAX_REQUESTS:,}.")
    if timeout is None or not _is_number(timeout) or not math.isfinite(timeout) or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}.")
    if timeout > MAX_TIMEOUT_S:
        raise ValueError(f"timeout={timeout:g} s is too long; at most {MAX_TIMEOUT_S:g} s per request.")
    if processes is not None and (not _is_int(processes) or not 1 <= processes <= MAX_PROCESSES):
        raise ValueError(f"processes must be a whole number from 1 to {MAX_PROCESSES}, got {processes!r}.")
    if arrival is not None and rate is None:
        raise ValueError("arrival only applies to an open loop; give rate= (requests per second) as well.")
    if arrival is not None and arrival not in ("uniform", "poisson"):
        raise ValueError(f"arrival must be 'uniform' or 'poisson', got {arrival!r}.")

    if rate is not None:
        if burst:
            raise ValueError("burst and rate are different modes; use burst=True with requests, or rate with duration.")
        if not _is_number(rate) or not math.isfinite(rate) or rate <= 0:
            raise ValueError(f"rate must be a positive number of requests per second, got {rate!r}.")
        if rate > MAX_RATE_RPS:
            raise ValueError(f"rate={rate:g} req/s is beyond anything this machine can send; at most {MAX_RATE_RPS:g}.")
        if requests is not None:
            raise ValueError("an open loop runs for a duration; give rate with duration, not requests.")
        if duration is None:
            raise ValueError("rate needs a duration: say how many seconds to send requests at that rate.")
        if rate * duration > MAX_REQUESTS:
            raise ValueError(f"rate x duration asks for {rate * duration:,.0f} requests; keep it under {MAX_REQUESTS:,}.")
        mode = "open"
        if concurrency is None:
            concurrency = int(min(1000, max(16, math.ceil(2 * rate))))  # enough for ~2 s latencies at full rate
    elif burst:
        if requests is None:
            raise ValueError("burst needs requests: how many requests to release at the same instant.")
        if duration is not None:
            raise ValueError("a burst sends its requests once; give requests, not duration.")
        if requests > MAX_CONCURRENCY:
            raise ValueError(f"a burst of {requests:,} means as many threads; at most {MAX_CONCURRENCY:,}.")
        if concurrency is not None and concurrency != requests:
            raise ValueError("a burst uses one thread per request; leave concurrency out (or equal to requests).")
        mode, concurrency = "burst", requests
    else:
        if duration is not None and requests is not None:
            raise ValueError("give either duration (seconds) or requests (a count), not both.")
        if duration is None and requests is None:
            raise ValueError("say how long to run: duration=<seconds> or requests=<count>.")
        mode = "closed"
        if concurrency is None and streams[0][1] is None:
            concurrency = 1
    if streams[0][1] is None:
        concurrency = _check_concurrency(concurrency)
        streams = [(streams[0][0], concurrency)]
    else:
        concurrency = sum(c for _, c in streams)
    return {"mode": mode, "streams": streams, "concurrency": concurrency,
            "duration_s": None if duration is None else float(duration),
            "requests": None if requests is None else int(requests),
            "rate_rps": None if rate is None else float(rate),
            "arrival": (arrival or "uniform") if rate is not None else None,
            "timeout_s": float(timeout)}


def _schedule(rate_rps: float, duration_s: float, arrival: str, seed) -> list[float]:
    """Intended send offsets (seconds from the start) of an open-loop run."""
    if arrival == "uniform":
        n = math.ceil(rate_rps * duration_s - 1e-9)
        return [k / rate_rps for k in range(n)]
    rng = random.Random(seed)
    offsets, t = [], rng.expovariate(rate_rps)
    while t < duration_s:
        offsets.append(t)
        t += rng.expovariate(rate_rps)
    return offsets


def _ensure_fd_limit(threads_per_process: int, concurrency: int, in_process: bool) -> None:
    """Make room for one socket per thread: raise the soft open-file limit, or say why we cannot."""
    import resource

    in_use = len(os.listdir("/proc/self/fd")) if in_process and os.path.isdir("/proc/self/fd") else 16
    need = threads_per_process + in_use + 64
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        target = hard if hard != resource.RLIM_INFINITY else max(need, 65536)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            pass
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft != resource.RLIM_INFINITY and soft < need:
        raise ValueError(f"concurrency={concurrency:,} needs about {need:,} open files per client process, but this "
                         f"system allows {soft:,} (hard limit {hard:,}); lower the concurrency.")


def _auto_processes(mode: str, concurrency: int) -> int:
    """Client processes for a run: one event loop, or for a burst one process per 1,000 threads."""
    if mode != "burst":
        return 1
    return max(1, min(MAX_PROCESSES, math.ceil(concurrency / THREADS_PER_PROCESS)))


def _plans(spec: dict, processes: int, schedule: list[float] | None, max_duration_s: float) -> list[dict]:
    """Split the run over client processes: threads round-robin, requests and schedule shared out."""
    urls = [u for u, _ in spec["streams"]]
    threads = []
    for index, (_, count) in enumerate(spec["streams"]):
        threads += [index] * count
    threads = [[tno, tgt] for tno, tgt in enumerate(threads)]
    processes = max(1, min(processes, len(threads)))
    plans = []
    for p in range(processes):
        mine = threads[p::processes]
        plan = {"mode": spec["mode"], "urls": urls, "threads": mine, "timeout_s": spec["timeout_s"],
                "duration_s": spec["duration_s"], "max_duration_s": max_duration_s}
        if spec["requests"] is not None and spec["mode"] == "closed":
            share = spec["requests"] * len(mine) // len(threads)
            extra = spec["requests"] * len(mine) % len(threads)
            plan["requests"] = share + (1 if p < extra else 0)  # shares add up exactly
        if schedule is not None:
            plan["schedule"] = [[i, off] for i, off in enumerate(schedule) if i % processes == p]
        plans.append(plan)
    if spec["requests"] is not None and spec["mode"] == "closed":
        total = sum(p["requests"] for p in plans)
        plans[0]["requests"] += spec["requests"] - total
    return plans


# ---- running the client ------------------------------------------------------------------

class _Progress:
    """A tqdm bar that appears only once a run has taken longer than ~2 s."""

    def __init__(self, quiet: bool, duration_s: float | None, total_requests: int | None):
        self.quiet, self.duration_s, self.total = quiet, duration_s, total_requests
        self.t0 = time.monotonic()
        self.bar = None

    def update(self, done: int) -> None:
        if self.quiet:
            return
        elapsed = time.monotonic() - self.t0
        if self.bar is None:
            if elapsed < PROGRESS_AFTER_S and not (self.duration_s and self.duration_s > PROGRESS_AFTER_S):
                return
            try:
                from tqdm.auto import tqdm
            except ImportError:
                self.quiet = True
                return
            if self.duration_s:
                self.bar = tqdm(total=round(self.duration_s, 1), unit="s", desc="load", leave=False,
                                bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.1f}/{total:.1f} s{postfix}")
            else:
                self.bar = tqdm(total=self.total, unit="req", desc="load", leave=False)
        if self.duration_s:
            self.bar.n = round(min(elapsed, self.duration_s), 1)
            self.bar.set_postfix_str(f"{done:,} requests", refresh=False)
        else:
            self.bar.n = min(done, self.total or done)
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class _ChildProcess:
    """One client process: started with its plan, then driven by 'go' and 'stop' lines."""

    def __init__(self, plan: dict, index: int):
        self.ready = threading.Event()
        self.done = threading.Event()
        self.progress = 0
        self._result = None
        self._stderr = collections.deque(maxlen=40)
        # -I: stdlib only, and the helpers/ folder is not put on sys.path to shadow anything
        self.proc = subprocess.Popen([sys.executable, "-I", "-u", CLIENT_SCRIPT], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, close_fds=True,
                                     start_new_session=True)  # Ctrl-C reaches the parent only
        self.pid = self.proc.pid
        threading.Thread(target=self._read, daemon=True, name=f"load-child-{index}").start()
        threading.Thread(target=self._read_stderr, daemon=True, name=f"load-child-err-{index}").start()
        self.send(json.dumps(plan))

    def _read(self) -> None:
        import pickle

        stdout = self.proc.stdout
        try:
            while True:
                raw = stdout.readline()
                if not raw:
                    break
                line = raw.decode("utf-8", "replace").strip()
                if line.startswith("ready"):
                    self.ready.set()
                elif line.startswith("progress "):
                    self.progress = int(line.split()[1])
                elif line.startswith("result "):
                    self._result = pickle.loads(stdout.read(int(line.split()[1])))
                elif line == "done":
                    self.done.set()
        except (OSError, ValueError, EOFError, pickle.UnpicklingError):
            pass
        self.ready.set()  # EOF: the process is gone, do not wait on it
        self.done.set()

    def _read_stderr(self) -> None:
        for raw in self.proc.stderr:
            self._stderr.append(raw.decode("utf-8", "replace").rstrip())

    def send(self, line: str) -> None:
        try:
            self.proc.stdin.write(line.encode() + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass

    def result(self) -> dict | None:
        """The child's results, once it has sent them (None if it never did)."""
        return self._result

    def stderr_tail(self) -> str:
        return "\n".join(self._stderr)

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.kill()  # our own child, by its handle
            except OSError:
                pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                stream.close()
            except OSError:
                pass


def _run_isolated(plans: list[dict], monitor, progress: _Progress, start_delay_s: float):
    """Run the plans in child processes; return (results, start epoch, interrupted)."""
    children: list[_ChildProcess] = []
    interrupted = False
    start_epoch = None
    try:
        try:
            for index, plan in enumerate(plans):
                children.append(_ChildProcess(plan, index))
                monitor.add_client(children[-1].pid)
            deadline = time.monotonic() + START_TIMEOUT_S
            for child in children:
                child.ready.wait(max(0.0, deadline - time.monotonic()))
            broken = [c for c in children if c.proc.poll() is not None or not c.ready.is_set()]
            if broken:
                raise RuntimeError(f"the load client process did not start:\n{broken[0].stderr_tail()}")
            start_epoch = time.time() + start_delay_s
            for child in children:
                child.send(f"go {start_epoch!r}")
            # the children stop themselves at their hard deadline; this is the backstop
            hard = time.monotonic() + start_delay_s + _client.hard_span_s(plans[0]) + 5.0
            while not all(c.done.is_set() for c in children) and time.monotonic() < hard:
                time.sleep(0.1)
                progress.update(sum(c.progress for c in children))
        except KeyboardInterrupt:
            if start_epoch is None:  # interrupted while starting: nothing to keep
                raise
            interrupted = True
            for child in children:
                child.send("stop")
            limit = time.monotonic() + _client.STOP_GRACE_S + 5.0
            for child in children:  # a second interrupt here gives up on the results (finally: kill)
                child.done.wait(max(0.0, limit - time.monotonic()))
        results = []
        for child in children:
            child.done.wait(1.0)
            result = child.result()
            if result is None and not interrupted:
                child.kill()
                raise RuntimeError(f"the load client process (pid {child.pid}) ended without results:\n"
                                   f"{child.stderr_tail()}")
            if result is not None:
                results.append(result)
        return results, start_epoch, interrupted
    finally:
        for child in children:
            child.kill()


def _run_in_process(plans: list[dict], monitor, progress: _Progress, start_delay_s: float):
    """Run the plans in threads of this process (isolate=False); return (results, start epoch, interrupted)."""
    engines = [_client.Engine(plan) for plan in plans]
    for engine in engines:
        engine.prepare()
    monitor.add_client(os.getpid())
    start_epoch = time.time() + start_delay_s
    for engine in engines:  # go() waits for all of that engine's threads to be in place
        engine.go(start_epoch)
    interrupted = False
    try:
        for engine in engines:
            engine.wait(on_progress=lambda _n: progress.update(sum(e.completed() for e in engines)))
    except KeyboardInterrupt:
        interrupted = True
        for engine in engines:
            engine.stop("interrupted")
        for engine in engines:
            engine.wait()
    return [engine.results() for engine in engines], start_epoch, interrupted


# ---- the result ------------------------------------------------------------------------

def _frame(results: list[dict], urls: list[str], mode: str) -> pd.DataFrame:
    """Assemble Run.requests (the columns of docs/design.md) from the clients' column lists."""
    cols: dict[str, list] = {}
    for result in results:
        for key, values in result["columns"].items():
            cols.setdefault(key, []).extend(values)

    def array(key, dtype="float64"):
        return np.asarray([math.nan if v is None else v for v in cols.get(key, [])], dtype=dtype)

    send = array("send_s")
    intended = array("intended_s") if mode == "open" else send
    order = np.lexsort((send, intended))  # by intended start, then by actual send

    def nullable_int(key):
        values = cols.get(key, [])
        return pd.array([values[i] for i in order], dtype="Int64")

    target = array("target", "int64")[order]
    endpoints = [urlsplit(u).path or "/" for u in urls]
    out = pd.DataFrame({
        "request_id": np.arange(len(order), dtype="int64"),
        "url": pd.Series([urls[t] for t in target], dtype="str"),
        "endpoint": pd.Series([endpoints[t] for t in target], dtype="str"),
        "client_thread": array("client_thread", "int64")[order],
        "intended_s": intended[order],
        "send_s": send[order],
        "end_s": array("end_s")[order],
    })
    out["latency_ms"] = (out["end_s"] - out["send_s"]) * 1000.0
    out["latency_intended_ms"] = (out["end_s"] - out["intended_s"]) * 1000.0
    out["schedule_lag_ms"] = (out["send_s"] - out["intended_s"]) * 1000.0
    out["connect_ms"] = array("connect_ms")[order]
    out["status"] = array("status", "int64")[order]
    out["error"] = pd.Series([cols["error"][i] for i in order] if len(order) else [], dtype="str")
    out["ok"] = (out["error"] == "") & (out["status"] >= 200) & (out["status"] < 400)
    for col in ("server_app_ms", "server_cpu_ms", "server_io_ms"):
        out[col] = array(col)[order]
    out["worker_pid"] = nullable_int("worker_pid")
    out["worker_thread"] = nullable_int("worker_thread")
    for col in ("handler_start_s", "handler_end_s"):
        out[col] = array(col)[order]
    out["queue_ms"] = out["latency_ms"] - out["server_app_ms"]
    out["contention_ms"] = out["server_app_ms"] - out["server_cpu_ms"] - out["server_io_ms"]
    return out[REQUEST_COLUMNS]


def _percentiles_ms(values) -> dict:
    values = np.asarray(values, dtype="float64")
    values = values[np.isfinite(values)]
    if not len(values):
        return {"p50": math.nan, "p90": math.nan, "p99": math.nan, "max": math.nan}
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return {"p50": round(float(p50), 3), "p90": round(float(p90), 3), "p99": round(float(p99), 3),
            "max": round(float(values.max()), 3)}


class ErrorCounts(dict):
    """Failed requests by class ({'timeout': 3}); int() of it is the total (lesson 01)."""

    def __int__(self) -> int:
        return int(sum(self.values()))

    @property
    def total(self) -> int:
        """All failed requests."""
        return int(self)


class Summary(dict):
    """A run's headline numbers, as a dict with a wrk-like text view (lesson 01).

    Keys: requests, ok, errors {class: count}, dropped, duration_s, throughput_rps (successful
    responses per second), latency_ms {p50, p90, p99, max} of successful requests,
    latency_intended_ms and schedule_lag_ms (open loop), client_cpu_percent (busiest client
    process, % of one core), client_delay_ms {p50, p90, p99} (how long responses sat in the
    client's sockets before the client read them), client_wait_percent (share of the run the
    client's event loop spent runnable but waiting for a core), saturated, server_cpu_percent,
    cores_busy_percent,
    retried, abandoned, interrupted, stopped_early, plus mode, label, concurrency, urls.
    """

    def text(self) -> str:
        """The summary as a few lines of text, like wrk's."""
        return _summary_text(self)

    def __str__(self) -> str:
        return self.text()

    __repr__ = __str__

    def _repr_pretty_(self, printer, cycle) -> None:
        printer.text(self.text())

    def _repr_html_(self) -> str:
        import html

        return f"<pre style='line-height:1.35'>{html.escape(self.text())}</pre>"


def _fmt_ms(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:,.0f} ms" if value >= 1000 else f"{value:.3g} ms" if value < 10 else f"{value:.1f} ms"


def _latency_line(name: str, pct: dict) -> str:
    return f"  {name:<13}" + "   ".join(f"{k} {_fmt_ms(pct.get(k))}" for k in ("p50", "p90", "p99", "max"))


def _summary_text(s: dict) -> str:
    mode = s.get("mode")
    target = ", ".join(s.get("urls") or [])
    if mode == "open":
        head = (f"Open loop: {s.get('rate_rps', 0):g} req/s ({s.get('arrival')}) for {s.get('duration_s_requested', 0):g} s, "
                f"up to {s.get('concurrency')} in flight")
    elif mode == "burst":
        head = f"Burst: {s.get('concurrency')} requests released at once"
    else:
        length = (f"for {s['duration_s_requested']:g} s" if s.get("duration_s_requested")
                  else f"for {s.get('requests_requested', 0):,} requests")
        head = f"Closed loop: {s.get('concurrency')} connection{'s' * (s.get('concurrency') != 1)} {length}"
    lines = [f"{head} -> {target}" + (f"   [{s['label']}]" if s.get("label") else "")]
    if s.get("server"):
        lines.append(f"  server: {s['server']}")
    errors = s.get("errors") or {}
    err_text = ", ".join(f"{v:,} {k}" for k, v in errors.items()) if errors else "0 errors"
    lines.append(f"  {s['requests']:,} requests in {s['duration_s']:.2f} s: {s['ok']:,} ok, {err_text}"
                 + (f", {s['dropped']:,} dropped (not sent in time)" if s.get("dropped") else ""))
    lines.append(f"  Throughput {s['throughput_rps']:,.1f} req/s (successful responses per second)")
    lines.append(_latency_line("Latency (ok)" if errors else "Latency", s["latency_ms"]))
    if mode == "open":
        lines.append(_latency_line("From intent", s.get("latency_intended_ms") or {}))
        lines.append(_latency_line("Sched. lag", s.get("schedule_lag_ms") or {}))
    client = "  Client   " + (f"CPU {s['client_cpu_percent']:.0f}% of one core" if s.get("client_cpu_percent") is not None
                              else "CPU n/a")
    if (s.get("client_processes") or 1) > 1:
        client += f" (busiest of {s['client_processes']} processes)"
    delay_p50 = (s.get("client_delay_ms") or {}).get("p50")
    if delay_p50 is not None:
        client += f"; read each response {_fmt_ms(delay_p50)} after it arrived (median)"
    lines.append(client)
    if s.get("server_cpu_percent") is not None or s.get("cores_busy_percent") is not None:
        parts = []
        if s.get("server_cpu_percent") is not None:
            parts.append(f"server CPU {s['server_cpu_percent']:.0f}% of one core")
        if s.get("cores_busy_percent") is not None:
            parts.append(f"cores {s['cores_busy_percent']:.0f}% busy on average")
        lines.append("  Machine  " + "; ".join(parts))
    notes = list(s.get("explanations") or [])
    if s.get("retried"):
        notes.append(f"{s['retried']:,} request(s) met a keep-alive connection the server had just closed "
                     f"(no reply at all) and were retried once on a fresh connection.")
    if s.get("stopped_early"):
        notes.append(f"Stopped early: {s['stopped_early']}.")
    if s.get("interrupted"):
        notes.append(f"Interrupted: these are partial results ({s.get('abandoned', 0)} request(s) in flight were "
                     f"abandoned).")
    if s.get("saturated"):
        why = (f"used {s['client_cpu_percent']:.0f}% of a core" if (s.get("client_cpu_percent") or 0)
               >= SATURATED_CPU_PERCENT else f"left responses waiting {s['client_delay_ms']['p50']:.2g} ms "
               f"(median) before reading them: it was short of CPU"
               + (f" (it waited for a core {s['client_wait_percent']:.0f}% of the run)"
                  if s.get("client_wait_percent") else ""))
        notes.append(f"WARNING: the load generator {why}.\n  The client, not the server, may be the limit: "
                     f"read these throughput figures as a floor and the latencies as a ceiling.")
    for note in notes:
        lines.append("  " + note)
    return "\n".join(lines)


class Run:
    """One load run: config, one row per request, resource samples and the machine (lesson 01).

    requests: DataFrame, one row per attempted request (columns in docs/design.md).
    samples:  DataFrame of psutil samples (t_s, kind, name, pid, cpu_percent, rss_mb, uss_mb).
    config:   urls, mode, concurrency, duration_s, requests, rate_rps, timeout_s, arrival,
              isolate, label, server (the DemoServer's config or None), started_at.
    machine:  helpers.machine.machine() at the time of the run.
    client:   the load generator's own figures (CPU, read delay, retries, drops, processes).
    interrupted: True when the run was stopped by an interrupt and holds partial results.
    """

    def __init__(self, config: dict, requests: pd.DataFrame, samples: pd.DataFrame, machine: dict,
                 interrupted: bool = False, client: dict | None = None, path: str | None = None):
        self.config = config
        self.requests = requests
        self.samples = samples
        self.machine = machine
        self.interrupted = bool(interrupted)
        self.client = client or {}
        self.path = path

    @property
    def label(self) -> str | None:
        """The run's label (config['label'])."""
        return self.config.get("label")

    def summary(self) -> Summary:
        """Headline numbers: throughput, latency percentiles, errors, CPU, saturation (lesson 01)."""
        return _summarise(self)

    def save(self, name: str | None = None) -> Path:
        """Save to data/runs/<name>/ (CSV + meta.json, atomically); return the folder (lesson 01)."""
        from helpers import store

        self.path = str(store.save_run(self, name))
        return Path(self.path)

    def plot_timeline(self, **kw):
        """Draw each request as a bar from handler start to end, its queue time beneath (lesson 01); see helpers.plots.plot_timeline."""
        from helpers import plots; return plots.plot_timeline(self, **kw)  # noqa: E702

    def plot_breakdown(self, **kw):
        """Split latency into queue, CPU, I/O and contention (lesson 01); see helpers.plots.plot_breakdown."""
        from helpers import plots; return plots.plot_breakdown(self, **kw)  # noqa: E702

    def plot_resources(self, **kw):
        """Draw CPU and memory of cores, server and client over the run (lesson 02); see helpers.plots."""
        from helpers import plots; return plots.plot_resources(self, **kw)  # noqa: E702

    def plot_latency(self, **kw):
        """Draw the latency percentile spectrum (lesson 04); see helpers.plots.plot_latency."""
        from helpers import plots; return plots.plot_latency(self, **kw)  # noqa: E702

    def __repr__(self) -> str:
        s = self.summary()
        label = f" {self.label!r}" if self.label else ""
        flag = " INTERRUPTED" if self.interrupted else ""
        return (f"<Run {s.get('mode')}{label}{flag}: {s['requests']:,} requests in {s['duration_s']:.2f} s, "
                f"{s['throughput_rps']:,.1f} req/s, p50 {_fmt_ms(s['latency_ms']['p50'])}, "
                f"p99 {_fmt_ms(s['latency_ms']['p99'])}, {int(s['errors'])} errors>")


def _describe_server(cfg: dict | None) -> str | None:
    if not cfg:
        return None
    kind, workers = cfg.get("server", "gunicorn"), cfg.get("workers", 1)
    if kind in ("flask-dev", "aiohttp-dev"):
        return f"{kind} server" + (f", {cfg.get('threads')} thread(s)" if kind == "flask-dev" else "")
    if kind == "aiohttp":
        return f"aiohttp under gunicorn, {workers} worker(s)"
    worker_class = cfg.get("worker_class", "sync")
    text = f"gunicorn, {workers} {worker_class} worker(s)"
    if worker_class == "gthread":
        text += f" x {cfg.get('threads')} threads"
    elif worker_class == "gevent":
        text += f", {cfg.get('worker_connections')} connections each"
    return text


def _summarise(run: Run) -> Summary:
    req, cfg, client = run.requests, run.config, run.client
    ok_rows = req[req["ok"]] if len(req) else req
    errors = ErrorCounts()
    if len(req):
        counts = req.loc[req["error"] != "", "error"].value_counts()
        for name in ERRORS:
            if counts.get(name, 0):
                errors[name] = int(counts[name])
    start = cfg.get("started_at")
    if len(req):
        first = float(req["send_s"].min()) if start is None else min(float(start), float(req["intended_s"].min()))
        duration_s = max(float(req["end_s"].max()) - first, 1e-9)
    else:
        duration_s = float(client.get("wall_s") or 0.0)
    samples = run.samples
    server_cpu = cores_busy = None
    if samples is not None and len(samples):
        window = samples
        if len(req):
            window = samples[(samples["t_s"] >= first) & (samples["t_s"] <= first + duration_s + 0.05)]
        server = window[window["kind"] == "server"]
        if len(server):
            server_cpu = round(float(server.groupby("t_s")["cpu_percent"].sum().mean()), 1)
        cores = window[window["kind"] == "core"]
        if len(cores):
            cores_busy = round(float(cores["cpu_percent"].mean()), 1)
    cpu = client.get("cpu_percent")
    delay = {f"p{q}": client.get(f"delay_p{q}_ms") for q in (50, 90, 99)}
    saturated = bool((cpu is not None and cpu >= SATURATED_CPU_PERCENT)
                     or (delay["p50"] is not None and delay["p50"] >= SATURATED_DELAY_MS))
    summary = Summary(
        requests=int(len(req)), ok=int(len(ok_rows)), errors=errors, dropped=int(client.get("dropped") or 0),
        duration_s=round(duration_s, 3), throughput_rps=round(len(ok_rows) / duration_s, 2) if duration_s else 0.0,
        latency_ms=_percentiles_ms(ok_rows["latency_ms"] if len(ok_rows) else []),
    )
    if cfg.get("mode") == "open":
        summary["latency_intended_ms"] = _percentiles_ms(ok_rows["latency_intended_ms"] if len(ok_rows) else [])
        summary["schedule_lag_ms"] = _percentiles_ms(req["schedule_lag_ms"] if len(req) else [])
    summary.update(
        client_cpu_percent=None if cpu is None else round(cpu, 1),
        client_delay_ms={k: None if v is None else round(v, 3) for k, v in delay.items()},
        client_wait_percent=None if client.get("wait_percent") is None else round(client["wait_percent"], 1),
        saturated=saturated, server_cpu_percent=server_cpu, cores_busy_percent=cores_busy,
        retried=int(client.get("retried") or 0), abandoned=int(client.get("abandoned") or 0),
        interrupted=run.interrupted, stopped_early=client.get("stop_reason") or None,
        client_processes=int(client.get("processes") or 1),
        mode=cfg.get("mode"), label=cfg.get("label"), concurrency=cfg.get("concurrency"), urls=cfg.get("urls"),
        rate_rps=cfg.get("rate_rps"), arrival=cfg.get("arrival"), duration_s_requested=cfg.get("duration_s"),
        requests_requested=cfg.get("requests"), server=_describe_server(cfg.get("server")),
    )
    summary["explanations"] = explain_errors(summary, cfg)
    return summary


# What each failure class means and where it usually comes from (timeouts are explained with the
# run's own numbers in explain_errors).
_FAILURE_CAUSES = {
    "refused": "connection(s) were refused: nothing listened on the port (the server had stopped or died), "
               "or its listen backlog was full.",
    "reset": "connection(s) were closed mid-request: a worker or the whole server died or was stopped while "
             "the request was in flight (server.log_tail() shows which).",
    "http_5xx": "server error(s) (HTTP 5xx): the app failed, or gunicorn killed a worker that exceeded its "
                "timeout (it answers 500; WORKER TIMEOUT in server.log_tail()).",
    "http_4xx": "client error(s) (HTTP 4xx): the URL or a parameter is wrong; the reply's JSON names the parameter.",
    "other": "other failure(s): a malformed reply or an unexpected socket error.",
}


def explain_errors(summary: dict, config: dict) -> list[str]:
    """One plain sentence per kind of failure in a run: what it means and the likely cause (lesson 07).

    Uses what the run recorded (the client timeout, the server's slots, the concurrency), so a
    plot or a notebook can print why requests failed without looking at the server again.
    """
    errors = summary.get("errors") or {}
    server = config.get("server") or {}
    slots, offered = server.get("slots"), config.get("concurrency")
    sentences = []
    if errors.get("timeout"):
        if config.get("mode") == "open" and slots:
            offered_text = f"requests arrived at {config.get('rate_rps', 0):g} per second"
        else:
            offered_text = f"{offered:,} were offered"
        why = (f"the server works on {slots:,} request(s) at once and {offered_text}, so the rest queued "
               f"(in its listen backlog; on Linux a full backlog drops new connections silently, so they time out "
               f"too); a server does not notice a client that gave up, so it may spend its time on requests nobody "
               f"is waiting for any more" if slots and offered and (offered > slots or config.get("mode") == "open")
               else "the server was too slow, or stalled")
        sentences.append(f"{errors['timeout']:,} timed out: no reply within the client's "
                         f"{config.get('timeout_s', 0):g} s timeout, because {why}.")
    for kind, cause in _FAILURE_CAUSES.items():
        if errors.get(kind):
            sentences.append(f"{errors[kind]:,} {cause}")
    if summary.get("dropped"):
        sentences.append(f"{summary['dropped']:,} scheduled request(s) were never sent: all {offered:,} in-flight "
                         f"slots of the client were busy until the run ended (the server fell behind the rate).")
    return sentences


def _client_stats(results: list[dict]) -> dict:
    stats = [r["stats"] for r in results]
    if not stats:
        return {"processes": 0}
    cpus = [s["cpu_percent"] for s in stats if s.get("cpu_percent") is not None]
    reasons = sorted({s["stop_reason"] for s in stats if s.get("stop_reason") and s["stop_reason"] != "interrupted"})
    waits = [s["loop_wait_percent"] for s in stats if s.get("loop_wait_percent") is not None]
    return {"processes": len(stats), "cpu_percent": max(cpus) if cpus else None,
            "wait_percent": max(waits) if waits else None,
            "cpu_percent_total": sum(cpus) if cpus else None,
            **{f"delay_p{q}_ms": max((s[f"delay_p{q}_ms"] for s in stats if s.get(f"delay_p{q}_ms") is not None),
                                      default=None) for q in (50, 90, 99)},
            "retried": sum(s["retried"] for s in stats), "abandoned": sum(s["abandoned"] for s in stats),
            "dropped": sum(s["dropped"] for s in stats), "stop_reason": "; ".join(reasons),
            "wall_s": max(s["wall_s"] for s in stats), "per_process": stats}


# ---- the entry point -------------------------------------------------------------------

def run_load(url, concurrency: int | None = None, duration: float | None = None, requests: int | None = None,
             rate: float | None = None, burst: bool = False, arrival: str | None = None, timeout: float = 10.0,
             label: str | None = None, server=None, isolate: bool = True, quiet: bool = False,
             processes: int | None = None, seed: int | None = None) -> Run:
    """Send HTTP load to a local server and record every request; return a Run (lesson 01).

    Closed loop: `concurrency` clients, each on its own keep-alive connection, each sending
    its next request as soon as the previous one returns, for `duration` seconds or until
    `requests` have been sent (row column client_thread says which client). `url` may be a
    dict {url: concurrency} to run several closed-loop streams at once (lesson 05's convoy).
    Burst: `requests=K, burst=True` releases K threads at the same instant (lesson 02).
    Open loop: `rate` req/s for `duration` s on a precomputed schedule (`arrival` "uniform" or
    "poisson", `seed` for the latter); `concurrency` caps requests in flight; latency is also
    measured from each request's intended start, and requests that could not be sent in time
    are counted as dropped (lesson 04, coordinated omission).

    timeout: per request, seconds. label: a name for plots and saved runs. server: the
    DemoServer being loaded (found from the URL when None) whose config is recorded and whose
    processes are sampled. isolate: run the client in its own process (default) rather than in
    a thread of this one. processes: client processes (None: one event loop, which kept up
    with 8,000 connections; a burst gets one process per 1,000 threads).
    quiet: no progress bar. Errors never raise: each request ends ok or as one error class.
    """
    if label is not None and not isinstance(label, str):
        raise ValueError(f"label must be a string, got {label!r}.")
    if seed is not None and not _is_int(seed):
        raise ValueError(f"seed must be a whole number (or None), got {seed!r}.")
    spec = _validate(url, concurrency, duration, requests, rate, burst, timeout, arrival, processes)
    urls = [u for u, _ in spec["streams"]]
    if server is None:
        from helpers.server import server_for_url

        server = next((s for s in (server_for_url(u) for u in urls) if s is not None), None)
    elif not hasattr(server, "config"):
        raise ValueError(f"server must be a DemoServer (or None to find it from the URL), got {server!r}.")
    n_processes = processes or _auto_processes(spec["mode"], spec["concurrency"])
    if not isolate:
        n_processes = 1 if processes is None else processes
    per_process = math.ceil(spec["concurrency"] / n_processes)
    _ensure_fd_limit(per_process, spec["concurrency"], in_process=not isolate)
    if spec["arrival"] == "poisson" and seed is None:
        seed = random.randrange(2**31)  # recorded in the config, so the schedule can be replayed
    schedule = _schedule(spec["rate_rps"], spec["duration_s"], spec["arrival"], seed) if spec["mode"] == "open" else None
    plans = _plans(spec, n_processes, schedule, MAX_DURATION_S)
    from helpers.monitor import Monitor

    fingerprint = machine()
    progress = _Progress(quiet, spec["duration_s"] if spec["mode"] != "burst" else None,
                         spec["requests"] if spec["mode"] != "burst" else None)
    start_delay_s = 0.05 + spec["concurrency"] * 50e-6  # time for every thread to pass the barrier
    monitor = Monitor(server).start()
    try:
        runner = _run_isolated if isolate else _run_in_process
        results, start_epoch, interrupted = runner(plans, monitor, progress, start_delay_s)
    finally:
        samples = monitor.stop()
        progress.close()
    config = {"urls": urls, "streams": {u: c for u, c in spec["streams"]}, "mode": spec["mode"],
              "concurrency": spec["concurrency"], "duration_s": spec["duration_s"], "requests": spec["requests"],
              "rate_rps": spec["rate_rps"], "timeout_s": spec["timeout_s"], "arrival": spec["arrival"],
              "isolate": bool(isolate), "processes": len(plans), "seed": seed, "label": label,
              "server": server.config() if server is not None else None, "started_at": start_epoch,
              "scheduled": len(schedule) if schedule is not None else None}
    requests_frame = _frame(results, urls, spec["mode"])
    client = _client_stats(results)
    if not isolate:
        client["in_process"] = True
    return Run(config=config, requests=requests_frame, samples=samples, machine=fingerprint,
               interrupted=interrupted, client=client)


def load_run(name_or_path) -> Run:
    """Read a saved run back (by name from data/runs/, or a folder path) (lesson 01)."""
    from helpers.store import load_run as _load

    return _load(name_or_path)


def list_runs():
    """Saved runs as a table, newest first (lesson 01)."""
    from helpers.store import list_runs as _list

    return _list()


# ---- command line: python -m helpers load URL ... ---------------------------------------

class _UsageError(Exception):
    pass


def _parser():
    import argparse

    class Parser(argparse.ArgumentParser):
        def error(self, message):
            raise _UsageError(message)

    parser = Parser(prog="python -m helpers load", description="Send HTTP load to a local server and print a "
                    "wrk-like summary.", add_help=True)
    parser.add_argument("url", help="http://127.0.0.1:PORT/path")
    parser.add_argument("-c", "--concurrency", type=int, default=None, help="connections (closed loop) or max in flight")
    parser.add_argument("-d", "--duration", type=float, default=None, help="seconds (default 5 unless -n)")
    parser.add_argument("-n", "--requests", type=int, default=None, help="number of requests instead of a duration")
    parser.add_argument("--rate", type=float, default=None, help="open loop: requests per second")
    parser.add_argument("--arrival", choices=["uniform", "poisson"], default=None, help="open-loop arrivals")
    parser.add_argument("--burst", action="store_true", help="release -n requests at the same instant")
    parser.add_argument("--timeout", type=float, default=10.0, help="per request, seconds (default 10)")
    parser.add_argument("--label", default=None)
    parser.add_argument("--processes", type=int, default=None, help="client processes (default: automatic)")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    return parser


def cli(argv: list[str]) -> int:
    """Run `python -m helpers load URL -c 200 -d 5 [--rate R] [-n K] [--timeout S] [--json]` (lesson 01).

    Prints a wrk-like summary (or one JSON object). Exit status: 0, or 1 when no request got a
    successful reply, or 2 for bad arguments (one sentence and the usage on stderr).
    """
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except _UsageError as err:
        print(f"error: {err}.\n{parser.format_usage().rstrip()}", file=sys.stderr)
        return 2
    except SystemExit as exit_:  # --help
        return exit_.code if isinstance(exit_.code, int) else 0
    duration = args.duration
    if duration is None and args.requests is None:
        duration = 5.0
    try:
        run = run_load(args.url, concurrency=args.concurrency, duration=duration, requests=args.requests,
                       rate=args.rate, burst=args.burst, arrival=args.arrival, timeout=args.timeout,
                       label=args.label, processes=args.processes, quiet=args.json)
    except ValueError as err:
        print(f"error: {err}\n{parser.format_usage().rstrip()}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except RuntimeError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    summary = run.summary()
    if args.json:
        from helpers.store import _jsonable

        print(json.dumps(_jsonable(dict(summary))))
    else:
        print(summary.text())
    return 1 if summary["requests"] and not summary["ok"] else 0  # nothing answered: say so to scripts


if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
