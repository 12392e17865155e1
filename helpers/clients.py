"""Three ways to send N requests from Python: one after another, from a thread pool, with asyncio.

Introduced in lesson 06 (async on both sides). The notebook calls one function and gets one
result back:

    result = compare_clients(server.url + "/io?ms=100", n=100, threads=10)
    result              # a table: one row per way, wall time, client CPU, req/s, speed-up
    result.plot()       # the same as a figure

Each way fetches the same URL `n` times and keeps one row per request:

  sequential  one requests.Session, a plain for-loop: each request waits for the previous one;
  threads     a ThreadPoolExecutor of `threads` threads, each with its own requests.Session
              (a Session is not guaranteed to be thread-safe, so none is shared);
  asyncio     one aiohttp.ClientSession and asyncio.gather over all `n` requests, at most
              `limit` connections open at once.

Unlike helpers.load.run_load (the course's lean load generator, which runs in its own
process), these clients run inside the notebook's kernel, as a learner's own script would,
and they use the everyday libraries. That is the point of lesson 06's second half: the same
requests from a heavier client can make the client, not the server, the bottleneck.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import aiohttp  # imported here, not per call: the first fetch must not pay for the import
import numpy as np
import pandas as pd
import requests

__all__ = ["compare_clients", "fetch_sequential", "fetch_threaded", "fetch_async", "plot_clients", "ClientComparison", "WAYS", "METRICS"]

WAYS = ("sequential", "threads", "asyncio")
MAX_REQUESTS = 20_000
MAX_THREADS = 256
MAX_LIMIT = 2_000
WAY_COLOURS = {"sequential": "#8d6e63", "threads": "#1f77b4", "asyncio": "#2ca02c"}
OTHER_COLOURS = ["#9467bd", "#ff7f0e", "#17becf", "#7f7f7f"]
REQUEST_COLUMNS = ["way", "request_index", "start_s", "end_s", "latency_ms", "status", "ok", "error"]


# ---- argument checks: one sentence per mistake -------------------------------------------

def _check_url(url) -> str:
    if not isinstance(url, str):
        raise ValueError(f"url must be a string such as 'http://127.0.0.1:8000/io?ms=100', got {url!r}.")
    parts = urlsplit(url)
    if parts.scheme != "http" or parts.hostname not in ("127.0.0.1", "localhost"):
        raise ValueError(f"the course's clients only call this machine over http (127.0.0.1), got {url!r}.")
    return url


def _check_count(name: str, value, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 1 <= value <= high:
        raise ValueError(f"{name} must be a whole number from 1 to {high:,}, got {value!r}.")
    return int(value)


def _check_timeout(timeout) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 600:
        raise ValueError(f"timeout must be a number of seconds between 0 and 600, got {timeout!r}.")
    return float(timeout)


# ---- the three ways ------------------------------------------------------------------------

def _rows(way: str, records: list[tuple], t0: float) -> pd.DataFrame:
    """One row per request from (index, start, end, status, error) tuples; times relative to t0."""
    frame = pd.DataFrame(records, columns=["request_index", "start", "end", "status", "error"])
    frame = frame.sort_values("request_index", kind="stable").reset_index(drop=True)
    out = pd.DataFrame({
        "way": way,
        "request_index": frame["request_index"].astype("int64"),
        "start_s": frame["start"] - t0,
        "end_s": frame["end"] - t0,
    })
    out["latency_ms"] = (out["end_s"] - out["start_s"]) * 1000.0
    out["status"] = frame["status"].astype("int64")
    out["error"] = frame["error"].astype(str)
    out["ok"] = (out["error"] == "") & (out["status"] >= 200) & (out["status"] < 400)
    return out[REQUEST_COLUMNS]


def _error_name(exc: BaseException) -> str:
    name = type(exc).__name__.lower()
    if "timeout" in name:
        return "timeout"
    if "refused" in name or "connect" in name:
        return "refused"
    return "other"


def _get_with(session, url: str, index: int, timeout: float) -> tuple:
    start = time.perf_counter()
    try:
        resp = session.get(url, timeout=timeout)
        resp.content  # noqa: B018 - read the whole body, as a real client would
        return index, start, time.perf_counter(), resp.status_code, ""
    except Exception as exc:  # noqa: BLE001 - every request ends as a row, never as an exception
        return index, start, time.perf_counter(), 0, _error_name(exc)


def fetch_sequential(url: str, n: int = 100, timeout: float = 10.0) -> tuple[pd.DataFrame, dict]:
    """Fetch `url` n times, one after another, on one requests.Session (lesson 06).

    Returns (rows, totals): one row per request, and wall_s / cpu_s for the whole batch.
    """
    url, n, timeout = _check_url(url), _check_count("n", n, MAX_REQUESTS), _check_timeout(timeout)
    records = []
    c0, t0 = time.process_time(), time.perf_counter()
    with requests.Session() as session:
        for i in range(n):
            records.append(_get_with(session, url, i, timeout))
    wall_s, cpu_s = time.perf_counter() - t0, time.process_time() - c0
    return _rows("sequential", records, t0), {"wall_s": wall_s, "cpu_s": cpu_s, "parallel": 1}


def fetch_threaded(url: str, n: int = 100, threads: int = 10, timeout: float = 10.0) -> tuple[pd.DataFrame, dict]:
    """Fetch `url` n times from a pool of `threads` threads, one requests.Session each (lesson 06).

    Returns (rows, totals) like fetch_sequential.
    """
    url, n, timeout = _check_url(url), _check_count("n", n, MAX_REQUESTS), _check_timeout(timeout)
    threads = _check_count("threads", threads, MAX_THREADS)
    local = threading.local()
    sessions, lock = [], threading.Lock()

    def one(index: int) -> tuple:
        session = getattr(local, "session", None)
        if session is None:  # one Session per thread: Sessions are not promised to be thread-safe
            session = local.session = requests.Session()
            with lock:
                sessions.append(session)
        return _get_with(session, url, index, timeout)

    c0, t0 = time.process_time(), time.perf_counter()
    try:
        with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="fetch") as pool:
            records = list(pool.map(one, range(n)))
    finally:
        for session in sessions:
            session.close()
    wall_s, cpu_s = time.perf_counter() - t0, time.process_time() - c0
    return _rows("threads", records, t0), {"wall_s": wall_s, "cpu_s": cpu_s, "parallel": threads}


async def _fetch_all_async(url: str, n: int, limit: int, timeout: float) -> list[tuple]:
    async def one(session, index: int) -> tuple:
        start = time.perf_counter()
        try:
            async with session.get(url) as resp:
                await resp.read()
                return index, start, time.perf_counter(), resp.status, ""
        except Exception as exc:  # noqa: BLE001
            return index, start, time.perf_counter(), 0, _error_name(exc)

    connector = aiohttp.TCPConnector(limit=limit)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=timeout)) as session:
        return list(await asyncio.gather(*(one(session, i) for i in range(n))))


def _run_in_own_loop(coro_factory):
    """Run a coroutine to completion on a fresh event loop in a helper thread.

    A Jupyter kernel already runs an event loop in its main thread, where asyncio.run()
    refuses to start a second one; a thread of our own has no loop yet.
    """
    box: dict = {}

    def target():
        try:
            box["value"] = asyncio.run(coro_factory())
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = exc

    worker = threading.Thread(target=target, name="fetch-asyncio")
    worker.start()
    worker.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def fetch_async(url: str, n: int = 100, limit: int = 100, timeout: float = 10.0) -> tuple[pd.DataFrame, dict]:
    """Fetch `url` n times with asyncio + aiohttp, at most `limit` connections at once (lesson 06).

    All n requests are started together (asyncio.gather); aiohttp's connector holds the
    excess until a connection frees up. Returns (rows, totals) like fetch_sequential.
    """
    url, n, timeout = _check_url(url), _check_count("n", n, MAX_REQUESTS), _check_timeout(timeout)
    limit = _check_count("limit", limit, MAX_LIMIT)
    c0, t0 = time.process_time(), time.perf_counter()
    records = _run_in_own_loop(lambda: _fetch_all_async(url, n, limit, timeout))
    wall_s, cpu_s = time.perf_counter() - t0, time.process_time() - c0
    return _rows("asyncio", records, t0), {"wall_s": wall_s, "cpu_s": cpu_s, "parallel": min(limit, n)}


# ---- the result --------------------------------------------------------------------------

@dataclass
class ClientComparison:
    """What compare_clients measured (lesson 06).

    table:    one row per way: requests, ok, parallel (connections at once), wall_s, cpu_s,
              client_cpu_percent (of one core), throughput_rps, speedup (vs sequential).
    requests: one row per request: way, request_index, start_s, end_s (s since that way
              began), latency_ms, status, ok, error.
    url:      what was fetched.
    """

    table: pd.DataFrame
    requests: pd.DataFrame
    url: str = ""
    notes: list = field(default_factory=list)

    def wall_s(self, way: str) -> float:
        """Seconds the given way took for all its requests."""
        return float(self.table.set_index("way").loc[way, "wall_s"])

    def with_run(self, run, way: str = "run_load (course client)") -> "ClientComparison":
        """A copy with one more row: a helpers.load Run, so both kinds of client sit in one table.

        Lesson 06 uses it to hold a requests-in-threads client against run_load at the same
        concurrency: the Run's throughput, wall time and busiest client process's CPU.
        """
        summary = run.summary()
        wall_s = float(summary["duration_s"])
        cpu_pct = summary.get("client_cpu_percent")
        row = {"way": way, "requests": int(summary["requests"]), "ok": int(summary["ok"]),
               "parallel": int(summary.get("concurrency") or 1), "wall_s": wall_s,
               "cpu_s": math.nan if cpu_pct is None else cpu_pct / 100.0 * wall_s,
               "client_cpu_percent": math.nan if cpu_pct is None else float(cpu_pct),
               "throughput_rps": float(summary["throughput_rps"])}
        table = pd.concat([self.table, pd.DataFrame([row])], ignore_index=True)
        return ClientComparison(_with_speedup(table), self.requests, self.url, list(self.notes))

    def plot(self, prediction=None, metric: str = "wall_s", title: str | None = None):
        """Two panels: wall time (or req/s) per way, and the client's CPU (lesson 06).

        metric: "wall_s" (seconds for the whole batch) or "throughput_rps". prediction: your
        figure in that metric's unit, one number per way (in table order) or a dict {way: value};
        drawn as stars, the gap named in the legend.
        """
        return plot_clients(self, prediction=prediction, metric=metric, title=title)

    def _repr_html_(self) -> str:
        shown = self.table.copy()
        return (f"<p><code>{self.url}</code></p>" + shown.to_html(index=False, float_format=lambda v: f"{v:,.3g}")
                + "".join(f"<p><small>{note}</small></p>" for note in self.notes))

    def __repr__(self) -> str:
        return f"ClientComparison({self.url})\n{self.table.to_string(index=False)}"


def _with_speedup(table: pd.DataFrame) -> pd.DataFrame:
    table = table.copy()
    base = table.loc[table["way"] == "sequential", "wall_s"]
    table["speedup"] = float(base.iloc[0]) / table["wall_s"] if len(base) else math.nan
    return table


def compare_clients(url: str, n: int = 100, threads: int = 10, limit: int = 100, ways=WAYS,
                    timeout: float = 10.0) -> ClientComparison:
    """Fetch `url` n times each way (sequential, thread pool, asyncio); return a ClientComparison (lesson 06).

    threads: size of the thread pool. limit: most connections the asyncio client opens at
    once. ways: any of "sequential", "threads", "asyncio", in the order to run them.
    Errors never raise: a failed request is a row with ok=False and its error class.
    """
    ways = [ways] if isinstance(ways, str) else list(ways)
    unknown = [w for w in ways if w not in WAYS]
    if unknown or not ways:
        raise ValueError(f"ways must be chosen from {WAYS}, got {ways!r}.")
    url = _check_url(url)
    runners = {"sequential": lambda: fetch_sequential(url, n, timeout),
               "threads": lambda: fetch_threaded(url, n, threads, timeout),
               "asyncio": lambda: fetch_async(url, n, limit, timeout)}
    frames, rows = [], []
    for way in ways:
        requests_frame, totals = runners[way]()
        frames.append(requests_frame)
        ok = int(requests_frame["ok"].sum())
        rows.append({"way": way, "requests": len(requests_frame), "ok": ok, "parallel": totals["parallel"],
                     "wall_s": totals["wall_s"], "cpu_s": totals["cpu_s"],
                     "client_cpu_percent": 100.0 * totals["cpu_s"] / max(totals["wall_s"], 1e-9),
                     "throughput_rps": ok / max(totals["wall_s"], 1e-9)})
    table = _with_speedup(pd.DataFrame(rows))
    notes = []
    failed = int((~pd.concat(frames)["ok"]).sum())
    if failed:
        notes.append(f"{failed} request(s) failed; see .requests['error'].")
    return ClientComparison(table, pd.concat(frames, ignore_index=True), url, notes)


# ---- the figure --------------------------------------------------------------------------

def _colour(way: str, i: int) -> str:
    return WAY_COLOURS.get(way, OTHER_COLOURS[i % len(OTHER_COLOURS)])


def _predictions(prediction, ways: list[str]) -> np.ndarray | None:
    if prediction is None:
        return None
    if isinstance(prediction, dict):
        return np.array([float(prediction.get(w, math.nan)) for w in ways])
    values = np.atleast_1d(np.asarray(prediction, dtype=float))
    if len(values) == 1:
        return np.full(len(ways), values[0])
    if len(values) != len(ways):
        raise ValueError(f"give one predicted value per way: {len(ways)} numbers, or a dict {{way: value}}.")
    return values


METRICS = {"wall_s": ("s", "wall time for {n} requests (s)"),
           "throughput_rps": ("req/s", "throughput (req/s, successful responses)")}


def plot_clients(result: ClientComparison, prediction=None, metric: str = "wall_s", title: str | None = None):
    """Draw a ClientComparison: wall time or req/s per way, and client CPU per way (lesson 06).

    A wall-time axis turns logarithmic when the bars are a decade or more apart.
    """
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    from helpers import theory

    if metric not in METRICS:
        raise ValueError(f"metric must be one of {', '.join(METRICS)}, got {metric!r}.")
    unit, ylabel = METRICS[metric]
    table = result.table
    ways = table["way"].tolist()
    values = table[metric].to_numpy(dtype=float)
    colours = [_colour(w, i) for i, w in enumerate(ways)]
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    ax_main, ax_cpu = fig.subplots(1, 2, width_ratios=[3, 2])
    x = np.arange(len(ways))
    ax_main.bar(x, values, color=colours, alpha=0.85)
    for xi, (wall, rps) in enumerate(zip(table["wall_s"], table["throughput_rps"])):
        ax_main.annotate(f"{wall:.3g} s\n{rps:,.0f} req/s", (xi, values[xi]), textcoords="offset points",
                         xytext=(0, 3), ha="center", fontsize=8)
    pred = _predictions(prediction, ways)
    if pred is not None:
        keep = np.isfinite(pred)
        gap = theory.compare_prediction(pred[keep], values[keep], unit=unit)
        ratios = np.atleast_1d(gap.ratio)
        worst = float(np.nanmax(np.abs(np.log(ratios[ratios > 0])))) if np.any(ratios > 0) else math.nan
        words = f"off by up to {math.exp(worst):.2f}x" if math.isfinite(worst) else "no comparison"
        ax_main.plot(x[keep], pred[keep], "*", color="black", markersize=13, label=f"your prediction ({words})")
        ax_main.legend(fontsize=8, loc="upper right")
    ax_main.set_xticks(x)
    ax_main.set_xticklabels([f"{w}\n({p} at once)" for w, p in zip(ways, table["parallel"])], fontsize=9)
    n = int(table["requests"].iloc[0])
    shown = np.concatenate([values, pred if pred is not None else []])
    shown = shown[np.isfinite(shown) & (shown > 0)]
    top = float(shown.max()) if len(shown) else 1.0
    ylabel = ylabel.format(n=n)
    if metric == "wall_s" and top / float(shown.min()) > 8:  # a decade apart: only a log axis shows every bar
        ax_main.set_yscale("log")
        ax_main.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax_main.set_ylim(float(shown.min()) / 2, top * 3)
        ylabel = ylabel.replace("(s)", "(s, log scale)")
    else:
        ax_main.set_ylim(0, top * 1.3)
    ax_main.set_ylabel(ylabel)
    ax_main.grid(axis="y", which="both", alpha=0.3)
    ax_cpu.bar(x, table["client_cpu_percent"], color=colours, alpha=0.85)
    for xi, pct in enumerate(table["client_cpu_percent"]):
        if np.isfinite(pct):
            ax_cpu.annotate(f"{pct:.0f}%", (xi, pct), textcoords="offset points", xytext=(0, 3), ha="center",
                            fontsize=8)
    ax_cpu.axhline(100, color="#c62828", linestyle=":", linewidth=1.2, label="one core fully busy")
    ax_cpu.set_xticks(x)
    ax_cpu.set_xticklabels(ways, fontsize=8, rotation=15 if len(ways) > 3 else 0)
    ax_cpu.set_ylabel("client CPU (% of one core)")
    ax_cpu.set_ylim(0, max(110.0, float(np.nanmax(table["client_cpu_percent"])) * 1.2))
    ax_cpu.legend(fontsize=8, loc="upper left")
    ax_cpu.grid(axis="y", alpha=0.3)
    fig.suptitle(title or _story(table, metric), fontsize=11)
    return fig


def _story(table: pd.DataFrame, metric: str = "wall_s") -> str:
    if metric == "throughput_rps":
        best = table.loc[table["throughput_rps"].idxmax()]
        worst = table.loc[table["throughput_rps"].idxmin()]
        story = (f"{best['way']} reached {best['throughput_rps']:,.0f} req/s, {best['throughput_rps'] / max(worst['throughput_rps'], 1e-9):.1f}x "
                 f"{worst['way']} ({worst['throughput_rps']:,.0f})")
    else:
        fastest = table.loc[table["wall_s"].idxmin()]
        slowest = table.loc[table["wall_s"].idxmax()]
        story = (f"{fastest['way']} did it in {fastest['wall_s']:.3g} s, {slowest['wall_s'] / fastest['wall_s']:.0f}x faster "
                 f"than {slowest['way']} ({slowest['wall_s']:.3g} s)")
    cpu = table["client_cpu_percent"]
    if cpu.notna().any() and cpu.max() >= 85:
        story += f"; {table.loc[cpu.idxmax(), 'way']} kept a whole core busy"
    return story
