"""Figures that show where a run's time went: timelines, breakdowns, resources, percentiles, sweeps.

Introduced in lesson 01 (timeline and breakdown); lesson 02 adds resources, lesson 03 the
sweep plots with their theory overlay, lesson 04 the latency spectrum. Every function takes
the result it draws (a Run, or a sweep's DataFrame) and nothing else: no plot reaches back
into a server. Each returns the matplotlib Figure it made, or the Axes passed in as `ax=`.
Each title is one line saying what to notice, worked out from the data.

Figures are built without pyplot, so a notebook shows each one exactly once (as the cell's
value) and headless rendering needs no backend set-up.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import FuncFormatter

from helpers import theory

__all__ = ["plot_timeline", "plot_breakdown", "plot_resources", "plot_latency", "latency_percentiles",
           "plot_sweep", "plot_sweep_latency", "describe_server", "save_png"]

OUTCOME_COLOURS = {"ok": "#2e7d32", "refused": "#c62828", "reset": "#ad1457", "timeout": "#ef6c00",
                   "http_4xx": "#6a1b9a", "http_5xx": "#b71c1c", "other": "#616161"}
# Fixed colours for the course's endpoints so every figure agrees; others take the cycle.
ENDPOINT_COLOURS = {"/io": "#1f77b4", "/cpu": "#d62728", "/mixed": "#9467bd", "/oops": "#ff7f0e",
                    "/health": "#7f7f7f"}
CYCLE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf",
         "#bcbd22", "#7f7f7f"]
BREAKDOWN = [  # (column, legend, colour): they add up to the client's latency
    ("queue_ms", "queue + network (outside the handler)", "#b0bec5"),
    ("server_cpu_ms", "CPU (this request's thread)", "#d62728"),
    ("server_io_ms", "I/O wait", "#1f77b4"),
    ("contention_ms", "contention (GIL, run queue, other greenlets)", "#8e44ad"),
]
PERCENTILES = [("p50", 50.0), ("p90", 90.0), ("p99", 99.0), ("p99.9", 99.9), ("max", 100.0)]


# ---- small readers of the Run contract ------------------------------------------------------

def _server_config(run) -> dict:
    return dict((getattr(run, "config", None) or {}).get("server") or {})


def _plural(n, word: str) -> str:
    return f"{n:g} {word}{'' if n == 1 else 's'}"


def describe_server(server_config: dict) -> str:
    """A few words naming a server config, e.g. '2 workers x 4 threads' (lesson 01)."""
    cfg = server_config or {}
    if not cfg:
        return "the server"
    if cfg.get("server") == "flask-dev":
        return f"Flask's dev server ({_plural(cfg.get('threads', 1), 'thread')})"
    if cfg.get("server") == "aiohttp-dev":
        return "aiohttp's own server (1 event loop)"
    if cfg.get("server") == "aiohttp":
        return f"{_plural(cfg.get('workers', 1), 'aiohttp worker')}"
    workers, threads = cfg.get("workers", 1), cfg.get("threads", 1)
    kind = cfg.get("worker_class", "sync")
    if kind == "gevent":
        return f"{_plural(workers, 'gevent worker')}"
    if kind == "gthread":
        return f"{_plural(workers, 'worker')} x {_plural(threads, 'thread')}"
    return f"{_plural(workers, 'worker')} x 1 thread"


def _run_label(run, index: int = 0) -> str:
    cfg = getattr(run, "config", None) or {}
    label = cfg.get("label") or getattr(run, "label", None)
    if label:
        return str(label)
    if _is_open_loop(run):
        return f"open loop {cfg.get('rate_rps') or cfg.get('rate'):g} req/s"
    if cfg.get("mode") == "burst":
        return f"burst of {cfg.get('concurrency')}"
    if cfg.get("concurrency"):
        return f"closed loop c={cfg['concurrency']}"
    return f"run {index + 1}"


def _is_open_loop(run) -> bool:
    cfg = getattr(run, "config", None) or {}
    return cfg.get("mode") == "open" or bool(cfg.get("rate_rps") or cfg.get("rate"))


def _run_start_s(req: pd.DataFrame, run=None) -> float:
    """When the run began (epoch s): its recorded start, or its first intended or actual send."""
    starts = [float(req["send_s"].min())] if len(req) else []
    if len(req) and "intended_s" in req:
        starts.append(float(req["intended_s"].min()))
    started_at = ((getattr(run, "config", None) or {}).get("started_at")) if run is not None else None
    if started_at is not None and np.isfinite(started_at):
        starts.append(float(started_at))
    return min(starts) if starts else math.nan


def _new_axes(ax, width_in: float, height_in: float):
    """Use the caller's Axes, or make a pyplot-free Figure with one Axes."""
    if ax is not None:
        return ax.figure, ax, ax
    fig = Figure(figsize=(width_in, height_in), layout="constrained")
    new_ax = fig.add_subplot()
    return fig, new_ax, fig


def _colour_map(keys) -> dict:
    out, spare = {}, iter(c for c in CYCLE if c not in ENDPOINT_COLOURS.values())
    for key in keys:
        out[key] = ENDPOINT_COLOURS.get(key) or OUTCOME_COLOURS.get(key) or next(spare, "#333333")
    return out


def save_png(fig_or_ax, path, dpi: int = 110) -> str:
    """Write a figure (or the figure of an Axes) to a PNG file; return the path (lesson 01)."""
    fig = fig_or_ax if isinstance(fig_or_ax, Figure) else fig_or_ax.figure
    fig.savefig(path, dpi=dpi)
    return str(path)


def _title_size(text: str, width_in: float):
    """The largest font size (11, 10 or 9 pt) at which `text` fits on one line, else None."""
    for size in (11, 10, 9):
        if len(text) <= width_in * 72 / (size * 0.56):
            return size
    return None


def _set_title(ax, text: str, figure_title: bool = False) -> None:
    """One line saying what to notice; smaller type if it would not fit, two lines only as a last resort."""
    width_in = ax.figure.get_figwidth() * (0.95 if figure_title else ax.get_position().width)
    size = _title_size(text, width_in)
    if size is None:
        cut = text.rfind(" ", 0, len(text) // 2 + 10)
        text, size = text[:cut] + "\n" + text[cut + 1:], 10
    if figure_title:
        ax.figure.suptitle(text, fontsize=size)
    else:
        ax.set_title(text, fontsize=size)


def _max_overlap(starts: np.ndarray, ends: np.ndarray) -> int:
    """Most intervals open at one instant (an end at the same time as a start closes first)."""
    if len(starts) == 0:
        return 0
    times = np.concatenate([starts, ends])
    steps = np.concatenate([np.ones(len(starts)), -np.ones(len(ends))])
    order = np.lexsort((steps, times))
    return int(np.cumsum(steps[order]).max())


# ---- timeline -----------------------------------------------------------------------------

def _lanes(served: pd.DataFrame, max_lanes: int, pack: bool = False) -> tuple[pd.Series, list[str], list[int]]:
    """Give each served request a lane: its worker pid x thread, or packed lanes (gevent, or too many)."""
    pids = list(pd.unique(served.sort_values("handler_start_s")["worker_pid"]))
    pids.sort(key=lambda p: (math.inf if pd.isna(p) else p))
    threads = served.groupby(["worker_pid", "worker_thread"], dropna=False)["handler_start_s"].min()
    lane_of = pd.Series(0, index=served.index, dtype=int)
    labels, boundaries = [], []
    packed = pack or len(threads) > max_lanes
    for w_index, pid in enumerate(pids, start=1):
        in_pid = served[served["worker_pid"] == pid] if not pd.isna(pid) else served[served["worker_pid"].isna()]
        boundaries.append(len(labels))
        if not packed:
            firsts = threads.loc[pid].sort_values() if pid in threads.index.get_level_values(0) else pd.Series()
            for t_index, thread in enumerate(firsts.index, start=1):
                rows = in_pid.index[in_pid["worker_thread"] == thread]
                lane_of.loc[rows] = len(labels)
                labels.append(f"w{w_index}·t{t_index}")
        else:  # packing: as many lanes as requests ever ran at once in this worker, lowest free lane first
            ordered = in_pid.sort_values("handler_start_s")
            busy: list[tuple[float, int]] = []  # heap of (end, lane)
            free: list[int] = []  # heap of free lane numbers
            n_lanes = 0
            lanes = np.empty(len(ordered), dtype=int)
            for i, (start, end) in enumerate(zip(ordered["handler_start_s"].to_numpy(),
                                                 ordered["handler_end_s"].to_numpy())):
                while busy and busy[0][0] <= start:
                    heapq.heappush(free, heapq.heappop(busy)[1])
                if free:
                    lane = heapq.heappop(free)
                else:
                    lane, n_lanes = n_lanes, n_lanes + 1
                lanes[i] = lane
                heapq.heappush(busy, (end, lane))
            lane_of.loc[ordered.index] = len(labels) + lanes
            labels.extend(f"w{w_index}·{k + 1}" for k in range(n_lanes))
        labels_pid = f"pid {int(pid)}" if not pd.isna(pid) else "unknown worker"
        labels[boundaries[-1]] = f"{labels[boundaries[-1]]} ({labels_pid})" if labels else labels_pid
    return lane_of, labels, boundaries


def _add_bars(ax, y, left, width, height: float, **style):
    """Draw horizontal bars centred on y as one PolyCollection (far quicker than barh for many)."""
    y, left, width = (np.asarray(v, dtype=float) for v in (y, left, width))
    x0, x1, y0, y1 = left, left + width, y - height / 2, y + height / 2
    verts = np.stack([np.column_stack(pair) for pair in ((x0, y0), (x0, y1), (x1, y1), (x1, y0))], axis=1)
    bars = PolyCollection(verts, **style)
    ax.add_collection(bars, autolim=False)
    if len(verts):
        ax.update_datalim(np.column_stack([np.r_[x0.min(), x1.max()], np.r_[y0.min(), y1.max()]]))
        ax.autoscale_view()
    return bars


def _timeline_story(run, req: pd.DataFrame, served: pd.DataFrame) -> str:
    cfg = _server_config(run)
    n = len(req)
    span_s = float(req["end_s"].max() - req["send_s"].min()) if n else 0.0
    if n == 0:
        return "This run holds no requests"
    head = f"{n} requests took {span_s:.1f} s on {describe_server(cfg)}"
    failed = req["error"][req["error"] != ""]
    if len(failed):
        counts = failed.value_counts()
        head += f" ({len(failed)} failed, mostly {counts.index[0]})"
    if len(served) == 0:
        return f"{head}: none reached a handler"
    if len(served) < 2:
        return head
    starts, ends = served["handler_start_s"].to_numpy(), served["handler_end_s"].to_numpy()
    peak = _max_overlap(starts, ends)
    peak_in_pid = max(_max_overlap(g["handler_start_s"].to_numpy(), g["handler_end_s"].to_numpy())
                      for _, g in served.groupby("worker_pid"))
    endpoints = set(served["endpoint"])
    if cfg.get("worker_class") == "gevent" and "/oops" in endpoints:
        oops = served[served["endpoint"] == "/oops"]
        others = served[served["endpoint"] != "/oops"]
        hit = np.zeros(len(others), dtype=bool)
        for _, o in oops.iterrows():
            hit |= ((others["worker_pid"] == o["worker_pid"]) & (others["handler_start_s"] < o["handler_end_s"])
                    & (others["handler_end_s"] > o["handler_start_s"])).to_numpy()
        # compare like with like: the commonest endpoint, caught by a stall or not
        same = (others["endpoint"] == others["endpoint"].mode().iloc[0]).to_numpy() if len(others) else hit
        if (hit & same).any() and (~hit & same).any():
            app_ms = others["server_app_ms"].to_numpy()
            ratio = np.median(app_ms[hit & same]) / np.median(app_ms[~hit & same])
            return (f"{head}: a blocking /oops call froze its gevent worker; {others['endpoint'].mode().iloc[0]} "
                    f"requests caught with it took {ratio:.1f}x longer")
        return f"{head}: a blocking /oops call froze its gevent worker and every request in it"
    if peak == 1:
        return f"{head}: they ran one after another"
    slots = cfg.get("slots")
    what = "greenlets" if cfg.get("worker_class") == "gevent" else "threads"
    if slots and peak >= slots and cfg.get("worker_class") != "gevent":
        story = f"{head}: all {peak} slots busy"
    else:
        story = f"{head}: up to {peak} ran at once"
    if peak_in_pid > 1 and cfg.get("workers", 1) > 1:
        story += f", up to {peak_in_pid} {what} interleaving in one process"
    elif peak_in_pid > 1:
        story += f", {what} interleaving in one process"
    cpu = served["server_cpu_ms"].median()
    app = served["server_app_ms"].median()
    io = served["server_io_ms"].median()
    if cpu >= io and app > 1.5 * cpu:  # CPU-bound work stretched by sharing a core (the GIL)
        story += f", each taking {app / cpu:.1f}x its CPU time"
    elif served["queue_ms"].median() > 0.5 * app > 0:
        story += ", the rest queued"
    return story


def plot_timeline(run, color_by: str = "endpoint", ax=None, max_lanes: int = 64, prediction=None,
                  title: str | None = None):
    """Draw one lane per worker process x thread and a bar per request, queue time shaded before it.

    Lesson 01. Each request is a solid bar from handler start to end in the lane of the
    worker pid and thread that served it; the thin pale strip beneath shows the same
    request waiting (client send → handler start), so overlapping strips darken where
    many wait. color_by="endpoint" or "outcome". Requests with no response sit in a
    lane of their own, marked x. With more than `max_lanes` threads or greenlets, each
    worker's requests are packed into as many lanes as ran at once. x: seconds since the
    run started. prediction: how many seconds you expected the whole run to take; drawn as
    a dashed line, the gap in the legend.
    """
    req = run.requests
    if color_by not in ("endpoint", "outcome"):
        raise ValueError(f"color_by must be 'endpoint' or 'outcome', got {color_by!r}.")
    t0 = _run_start_s(req, run) if len(req) else 0.0
    has_handler = req["handler_start_s"].notna() & req["handler_end_s"].notna()
    served, failed = req[has_handler], req[~has_handler]
    greenlets = _server_config(run).get("worker_class") == "gevent"  # a greenlet per connection: pack them
    lane_of, labels, boundaries = (_lanes(served, max_lanes, pack=greenlets) if len(served)
                                   else (pd.Series(dtype=int), [], []))
    n_lanes = len(labels) + (1 if len(failed) else 0)
    fig, ax, ret = _new_axes(ax, 11, min(2.0 + 0.32 * max(n_lanes, 1), 14))
    key = req["endpoint"] if color_by == "endpoint" else req["error"].where(req["error"] != "", "ok")
    colours = _colour_map(list(pd.unique(key)))
    # One collection per colour: tens of thousands of requests still draw in a second.
    for value, colour in colours.items():
        rows = served[key[served.index] == value]
        if len(rows) == 0:
            continue
        y = lane_of[rows.index].to_numpy()
        start = rows["handler_start_s"].to_numpy() - t0
        _add_bars(ax, y, start, rows["handler_end_s"].to_numpy() - rows["handler_start_s"].to_numpy(), 0.62,
                  facecolor=colour, edgecolor="white", linewidth=0.4 if len(labels) <= 80 else 0, label=value)
        wait = np.clip(rows["handler_start_s"].to_numpy() - rows["send_s"].to_numpy(), 0, None)
        _add_bars(ax, y + 0.41, rows["send_s"].to_numpy() - t0, wait, 0.16, facecolor=colour, alpha=0.22,
                  linewidth=0)
    if greenlets:  # a call that never yields blocks the whole worker: shade it across its lanes
        for _, o in served[served["endpoint"] == "/oops"].iterrows():
            lanes_of_pid = lane_of[served.index[served["worker_pid"] == o["worker_pid"]]]
            lo, hi = int(lanes_of_pid.min()), int(lanes_of_pid.max())
            ax.add_patch(Rectangle((o["handler_start_s"] - t0, lo - 0.5), o["handler_end_s"] - o["handler_start_s"],
                                   hi - lo + 1, color=ENDPOINT_COLOURS["/oops"], alpha=0.12, linewidth=0, zorder=0))
    if len(failed):
        y_fail = len(labels)
        for value, colour in colours.items():
            rows = failed[key[failed.index] == value]
            if len(rows):
                ax.barh(np.full(len(rows), y_fail), (rows["end_s"] - rows["send_s"]).to_numpy(),
                        left=(rows["send_s"] - t0).to_numpy(), height=0.5, color=colour, alpha=0.3, hatch="//")
                ax.plot((rows["end_s"] - t0).to_numpy(), np.full(len(rows), y_fail), "x", color="#c62828")
        labels = labels + [f"no response ({len(failed)})"]
    for b in boundaries[1:]:
        ax.axhline(b - 0.5, color="#9e9e9e", linewidth=0.6)
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels(labels, fontsize=7 if len(labels) > 24 else 8)
    if len(labels) > 40:  # too many to read: keep the first lane of each worker
        ax.set_yticks(boundaries)
        ax.set_yticklabels([labels[b] for b in boundaries], fontsize=8)
    ax.set_ylim(max(len(labels), 1) - 0.4, -0.6)
    ax.set_xlim(left=0)
    ax.set_xlabel("time since the run started (s)")
    ax.set_ylabel("worker · greenlet (lane)" if greenlets else "worker · thread (lane)")
    if prediction is not None:
        span_s = float(req["end_s"].max() - t0) if len(req) else math.nan
        gap = theory.compare_prediction(prediction, span_s, unit="s")
        ax.axvline(float(prediction), color="black", linestyle="--", linewidth=1.2,
                   label=f"your prediction: {float(prediction):.3g} s ({_gap_words(gap)})")
        left, right = ax.get_xlim()
        ax.set_xlim(left, max(right, float(prediction) * 1.05))  # a late guess stays on the page
    handles, names = ax.get_legend_handles_labels()
    handles.append(Patch(color="#607d8b", alpha=0.3))
    names.append("waiting: sent, handler not started")
    if greenlets and (served["endpoint"] == "/oops").any():
        handles.append(Patch(color=ENDPOINT_COLOURS["/oops"], alpha=0.12))
        names.append("/oops blocking the whole worker")
    ax.legend(handles, names, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, framealpha=0.85)
    ax.grid(axis="x", alpha=0.3)
    _set_title(ax, title or _timeline_story(run, req, served))
    return ret


# ---- breakdown ---------------------------------------------------------------------------

def _components(req: pd.DataFrame) -> pd.DataFrame:
    parts = req[[col for col, _, _ in BREAKDOWN]].astype(float).clip(lower=0)
    return parts


def plot_breakdown(run, by: str = "endpoint", ax=None, max_requests: int = 300, prediction=None,
                   title: str | None = None):
    """Stack each request's latency into queue, CPU, I/O wait and contention (they add up to it).

    Lesson 01. by="endpoint" (mean per endpoint), "request" (one bar per request in send
    order, thinned evenly past `max_requests`) or any other column of run.requests, such
    as "worker_pid". Only answered requests with Server-Timing count; the black tick is
    the mean latency the client saw, which the stack should reach. prediction: the latency
    (ms) you expected, one number or one per bar; drawn as stars, the gap in the legend.
    """
    req = run.requests
    req = req[req["ok"].astype(bool) & req["server_app_ms"].notna()].sort_values("request_id")
    if len(req) == 0:
        raise ValueError("no answered request carries Server-Timing, so there is nothing to break down.")
    parts = _components(req)
    if by == "request":
        pick = np.unique(np.linspace(0, len(req) - 1, min(len(req), max_requests)).round().astype(int))
        table = parts.iloc[pick]
        totals = req["latency_ms"].iloc[pick]
        names = req["request_id"].iloc[pick].astype(int).astype(str).tolist()
        counts = pd.Series(1, index=table.index)
        thinned = f", every {len(req) / len(pick):.1f}th" if len(pick) < len(req) else ""
        xlabel = f"request id (in send order){thinned}"
    else:
        if by not in req.columns:
            raise ValueError(f"by must be 'endpoint', 'request' or a column of run.requests, got {by!r}.")
        group = req[by].astype(str)
        table = parts.groupby(group).mean()
        totals = req.groupby(group)["latency_ms"].mean()
        counts = req.groupby(group).size()
        names = table.index.tolist()
        xlabel = by.replace("_", " ")
    fig, ax, ret = _new_axes(ax, 10 if by == "request" else 7, 4.6)
    x = np.arange(len(table))
    bottom = np.zeros(len(table))
    width = 0.9 if by == "request" else 0.6
    for col, legend, colour in BREAKDOWN:
        values = table[col].fillna(0).to_numpy()
        ax.bar(x, values, width, bottom=bottom, color=colour, label=legend, linewidth=0)
        bottom += values
    ax.plot(x, totals.to_numpy(), "_", color="black", markersize=12 if by != "request" else 4,
            markeredgewidth=2, label="client latency (mean)" if by != "request" else "client latency")
    if prediction is not None:
        pred = np.broadcast_to(np.asarray(prediction, dtype=float), (len(x),)) if np.ndim(prediction) == 0 \
            else np.asarray(prediction, dtype=float)
        if len(pred) != len(x):
            raise ValueError(f"give one predicted latency (ms) or one per bar: {len(x)} numbers.")
        gap = theory.compare_prediction(pred if np.ndim(prediction) else float(prediction),
                                        totals.to_numpy() if np.ndim(prediction) else float(totals.mean()), unit="ms")
        ax.plot(x, pred, "*", color="black", markersize=11 if by != "request" else 5,
                label=f"your prediction ({_gap_words(gap)})")
    if by == "request":
        step = max(1, len(x) // 12)
        ax.set_xticks(x[::step])
        ax.set_xticklabels(names[::step], fontsize=8)
    else:
        ax.set_xticks(x)
        ax.set_xticklabels([f"{nm}\n({counts[nm]} req)" for nm in names], fontsize=9)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("time per request (ms)" + ("" if by == "request" else ", mean"))
    ax.set_ylim(0, max(float(np.nanmax(bottom)), float(totals.max())) * 1.5)  # room for the legend
    ax.legend(fontsize=8, loc="upper left" if by == "request" else "best", framealpha=0.85)
    if by != "request":
        ax.set_xlim(-0.5 - 0.4 * (len(x) < 3), len(x) - 0.5 + 0.4 * (len(x) < 3))  # no slab-wide lone bar
    ax.grid(axis="y", alpha=0.3)
    _set_title(ax, title or _breakdown_story(req, parts, by, _server_config(run).get("worker_class")))
    return ret


_WHY = {"contention_ms": " (waiting for the GIL or a core)", "queue_ms": " (waiting for a free worker)"}
_SHORT = {"queue_ms": "queue", "server_cpu_ms": "CPU", "server_io_ms": "I/O wait", "contention_ms": "contention"}


def _breakdown_story(req, parts, by, worker_class=None) -> str:
    if by == "request":
        group_name, rows = "Each request", parts
        total = req["latency_ms"].mean()
    else:
        biggest = req[by].astype(str).value_counts().index[0]
        mask = (req[by].astype(str) == biggest).to_numpy()
        rows = parts[mask]
        total = req["latency_ms"][mask].mean()
        group_name = biggest if by == "endpoint" else f"{by} {biggest}"
    means = rows.mean()
    whole = max(float(means.sum()), 1e-9)
    top = means.idxmax()
    why = _WHY.get(top, "")
    if top == "contention_ms" and worker_class == "gevent":
        why = " (waiting for other greenlets to yield)"
    story = f"{group_name}: {means[top] / whole:.0%} of its {total:.0f} ms is {_SHORT[top]}{why}"
    second = means.drop(top).idxmax()
    if means[second] / whole >= 0.15:
        story += f", {means[second] / whole:.0%} {_SHORT[second]}"
    return story


# ---- resources ---------------------------------------------------------------------------

RESOURCE_PANELS = ("cores", "processes", "memory")


def plot_resources(run, panels: Sequence[str] = RESOURCE_PANELS, ax=None, prediction=None,
                   title: str | None = None):
    """Plot CPU % per core, CPU % per server process (and the client), and memory per worker.

    Lesson 02. Reads run.samples; x is seconds since the run started. panels picks and
    orders the panels ("cores", "processes", "memory"); ax= takes one Axes per panel (a
    single Axes for one panel). Memory: RSS solid, USS (memory unique to the process) dashed.
    prediction: how busy (%) you expected the cores to be on average; drawn on the cores
    panel, the gap in its legend.
    """
    samples = run.samples
    panels = [panels] if isinstance(panels, str) else list(panels)
    unknown = set(panels) - set(RESOURCE_PANELS)
    if unknown or not panels:
        raise ValueError(f"panels must be chosen from {RESOURCE_PANELS}, got {panels!r}.")
    if samples is None or len(samples) == 0:
        raise ValueError("this run has no resource samples (was it run with sampling off?).")
    req = run.requests
    t0 = _run_start_s(req, run) if len(req) else float(samples["t_s"].min())
    t_end = float(req["end_s"].max() - t0) if len(req) else None
    s = samples.assign(t=samples["t_s"] - t0)
    if ax is None:
        fig = Figure(figsize=(10, 2.6 * len(panels) + 0.6), layout="constrained")
        axes = list(fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0])
        ret = fig
    else:
        axes = list(ax) if isinstance(ax, (list, tuple, np.ndarray)) else [ax]
        if len(axes) != len(panels):
            raise ValueError(f"pass one Axes per panel: {len(panels)} panel(s), {len(axes)} Axes.")
        fig, ret = axes[0].figure, (axes if len(axes) > 1 else axes[0])
    server_pids = s[s["kind"] == "server"].groupby("pid", dropna=False)["t"].min().sort_values().index
    colours = {pid: CYCLE[i % len(CYCLE)] for i, pid in enumerate(server_pids)}  # one colour per process
    for panel, a in zip(panels, axes):
        {"cores": _panel_cores, "processes": _panel_processes, "memory": _panel_memory}[panel](a, s, colours)
        if t_end is not None:
            a.axvspan(0, t_end, color="#fff59d", alpha=0.25, linewidth=0, zorder=0)
        a.grid(alpha=0.3)
        a.set_xlim(left=min(0.0, float(s["t"].min())))
    if prediction is not None and "cores" in panels:
        a = axes[panels.index("cores")]
        in_run = s[(s["kind"] == "core") & (s["t"] >= 0) & (s["t"] <= (t_end if t_end is not None else math.inf))]
        gap = theory.compare_prediction(prediction, float(in_run["cpu_percent"].mean()), unit="%")
        a.axhline(float(prediction), color="black", linestyle="--", linewidth=1.2,
                  label=f"your prediction: {float(prediction):.0f}% ({_gap_words(gap)})")
        a.legend(fontsize=7, loc="lower right", ncol=3)
    axes[-1].set_xlabel("time since the run started (s); the pale band is the run")
    story = title or _resources_story(run, s, t_end)
    if ax is None:
        _set_title(axes[0], story, figure_title=True)
    else:
        _set_title(axes[0], story)
    return ret


def _panel_cores(a, s, colours):
    cores = s[s["kind"] == "core"]
    for i, (name, g) in enumerate(sorted(cores.groupby("name"), key=lambda kv: _natural(kv[0]))):
        a.plot(g["t"], g["cpu_percent"], linewidth=1, color=CYCLE[i % len(CYCLE)], label=name)
    a.set_ylim(0, 105)
    a.set_ylabel("CPU per core (%)")
    if len(cores):
        a.legend(fontsize=7, loc="upper right", ncol=min(8, cores["name"].nunique()))


def _natural(name: str):
    digits = "".join(ch for ch in str(name) if ch.isdigit())
    return (str(name).rstrip("0123456789"), int(digits) if digits else -1)


def _process_label(name, pid) -> str:
    return f"{name} {int(pid)}" if pd.notna(pid) else str(name)


def _panel_processes(a, s, colours):
    procs = s[s["kind"].isin(["server", "client"])]
    top = 100.0
    for (kind, name, pid), g in procs.groupby(["kind", "name", "pid"], dropna=False, sort=True):
        style = ":" if kind == "client" else "-"
        colour = "#424242" if kind == "client" else colours.get(pid, "#333333")
        a.plot(g["t"], g["cpu_percent"], style, linewidth=1.1, color=colour, label=_process_label(name, pid))
        top = max(top, float(g["cpu_percent"].max()))
    a.set_ylim(0, top * 1.08)
    a.set_ylabel("CPU per process (% of a core)")
    if len(procs):
        a.legend(fontsize=7, loc="upper right", ncol=3)


def _panel_memory(a, s, colours):
    procs = s[(s["kind"] == "server") & s["rss_mb"].notna()]
    for (name, pid), g in procs.groupby(["name", "pid"], dropna=False):
        colour = colours.get(pid, "#333333")
        a.plot(g["t"], g["rss_mb"], "-", color=colour, linewidth=1.1, label=_process_label(name, pid))
        uss = g.dropna(subset=["uss_mb"])  # USS is costlier to read, so it may be sampled less often
        if len(uss):
            a.plot(uss["t"], uss["uss_mb"], "--", color=colour, linewidth=1.1, marker="." if len(uss) < 5 else None)
    a.set_ylabel("memory (MB)")
    a.set_ylim(bottom=0)
    if len(procs):
        handles, names = a.get_legend_handles_labels()
        handles += [Line2D([], [], color="#555555", linestyle="-"), Line2D([], [], color="#555555", linestyle="--")]
        names += ["RSS (resident)", "USS (its own pages)"]
        a.legend(handles, names, fontsize=7, loc="lower right", ncol=3)


def _resources_story(run, s, t_end) -> str:
    during = s[(s["t"] >= 0) & (s["t"] <= (t_end if t_end is not None else math.inf))]
    cores = during[during["kind"] == "core"]
    server = during[during["kind"] == "server"]
    workers = server[server["name"] != "master"]
    if len(cores) == 0:
        return "Server processes over the run"
    n_cores = cores["name"].nunique()
    busy = cores["cpu_percent"].mean()
    ours_cores = (during[during["kind"].isin(["server", "client"])].groupby(["t_s"])["cpu_percent"].sum().mean()
                  / 100.0 if len(server) else 0.0)  # server + client, in cores
    busy_cores = busy / 100.0 * n_cores
    story = f"The {n_cores} cores were {busy:.0f}% busy on average"
    hottest = workers.groupby("pid")["cpu_percent"].mean() if len(workers) else pd.Series(dtype=float)
    if busy >= 85 and ours_cores < 0.6 * busy_cores:
        story += (f", but the server and client used only {ours_cores:.1f} of them: "
                  f"other programs took the rest")
    elif busy >= 85:
        story += ": the CPU was the limit"
    elif len(hottest) and hottest.max() >= 85 and len(hottest) < n_cores:
        story += f", yet one worker sat at {hottest.max():.0f}% of a core: the GIL, not the machine, was the limit"
    elif busy < 40:
        story += ": they mostly sat idle, so the limit was elsewhere"
    uss = server.groupby("pid")["uss_mb"].max()
    if uss.notna().any() and len(story) < 80:
        story += f"; workers held {uss.sum():.0f} MB of their own memory"
    return story


# ---- latency spectrum ----------------------------------------------------------------------

def _latency_values(run, intended) -> tuple[np.ndarray, bool]:
    req = run.requests
    ok = req[req["ok"].astype(bool)]
    use_intended = _is_open_loop(run) if intended is None else bool(intended)
    column = "latency_intended_ms" if use_intended and "latency_intended_ms" in ok else "latency_ms"
    return ok[column].dropna().to_numpy(dtype=float), column == "latency_intended_ms"


def latency_percentiles(run, intended: bool | None = None) -> dict:
    """p50, p90, p99, p99.9 and max of a run's answered requests, in ms (lesson 04).

    intended=None uses latency from the intended start for open-loop runs (so a stalled
    client cannot hide the wait) and from the actual send otherwise.
    """
    values, _ = _latency_values(run, intended)
    if len(values) == 0:
        return {name: math.nan for name, _ in PERCENTILES}
    return {name: float(np.percentile(values, q)) for name, q in PERCENTILES}


def plot_latency(run_or_runs, labels: Sequence[str] | None = None, intended: bool | None = None,
                 prediction=None, ax=None, title: str | None = None):
    """Draw the latency percentile spectrum (p50 … p99.9, max) on a log axis, one line per run.

    Lesson 04. Several runs go side by side, e.g. closed loop vs open loop; open-loop runs
    are measured from the intended send time (latency_intended_ms) unless intended=False.
    prediction: a number (ms, compared with the first run's p50) or one number per
    percentile; drawn as stars, the gap named in the legend.
    """
    runs = list(run_or_runs) if isinstance(run_or_runs, (list, tuple)) else [run_or_runs]
    labels = list(labels) if labels is not None else [_run_label(r, i) for i, r in enumerate(runs)]
    if len(labels) != len(runs):
        raise ValueError(f"{len(runs)} runs but {len(labels)} labels.")
    fig, ax, ret = _new_axes(ax, 7.5, 4.6)
    x = np.arange(len(PERCENTILES))
    table = {}
    for i, (run, label) in enumerate(zip(runs, labels)):
        pct = latency_percentiles(run, intended)
        _, from_intended = _latency_values(run, intended)
        table[label] = pct
        suffix = " (from intended start)" if from_intended else ""
        values = [pct[name] for name, _ in PERCENTILES]
        ax.plot(x, values, "o-", color=CYCLE[i % len(CYCLE)], label=label + suffix, linewidth=1.6)
        for xi, v in zip(x, values):
            if np.isfinite(v):
                ax.annotate(f"{v:.0f}" if v >= 10 else f"{v:.1f}", (xi, v), textcoords="offset points",
                            xytext=(7, -3), ha="left", fontsize=7, color=CYCLE[i % len(CYCLE)])
    gap = None
    if prediction is not None:
        first = table[labels[0]]
        if np.ndim(prediction) == 0:
            gap = theory.compare_prediction(prediction, first["p50"], unit="ms", what="p50")
            ax.plot([0], [prediction], "*", color="black", markersize=13,
                    label=f"your prediction: {float(prediction):.0f} ms ({_gap_words(gap)})")
        else:
            pred = np.asarray(prediction, dtype=float)
            if len(pred) != len(PERCENTILES):
                raise ValueError(f"give one predicted value per percentile: {len(PERCENTILES)} numbers.")
            gap = theory.compare_prediction(pred, [first[n] for n, _ in PERCENTILES], unit="ms")
            ax.plot(x, pred, "*", color="black", markersize=12, label=f"your prediction ({_gap_words(gap)})")
    ax.set_yscale("log")
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    ax.yaxis.set_major_formatter(plain)
    finite = [v for pct in table.values() for v in pct.values() if np.isfinite(v) and v > 0]
    narrow = bool(finite) and max(finite) / min(finite) < 20  # under ~a decade: label every minor tick
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if narrow or f"{v:g}"[0] in "25" else ""))
    ax.tick_params(axis="y", which="minor", labelsize=7)
    ax.set_xlim(-0.3, len(PERCENTILES) - 0.4)
    ax.set_xticks(x)
    ax.set_xticklabels([name for name, _ in PERCENTILES])
    ax.set_xlabel("percentile of answered requests")
    ax.set_ylabel("latency (ms, log scale)")
    ax.grid(which="both", axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    _set_title(ax, title or _latency_story(table))
    return ret


def _gap_words(gap) -> str:
    if np.ndim(gap.ratio) == 0:
        r = gap.ratio
        return "no measurement" if not np.isfinite(r) else f"measured {gap.measured:.3g}, {r:.2f}x yours"
    worst = np.nanmax(np.abs(np.log(np.where(gap.ratio > 0, gap.ratio, np.nan))))
    return f"off by up to {math.exp(worst):.2f}x"


def _latency_story(table: dict) -> str:
    labels = list(table)
    first = table[labels[0]]
    if len(labels) == 1:
        if not np.isfinite(first["p50"]):
            return "No request was answered"
        ratio = first["p99"] / first["p50"]
        return (f"p99 is {ratio:.1f}x the p50: 1 in 100 requests waited {first['p99']:.0f} ms or more "
                f"(median {first['p50']:.0f} ms)")
    def spread(label):
        ratio = table[label]["p99"] / first["p99"] if first["p99"] else math.nan
        return abs(math.log(ratio)) if ratio > 0 else -1.0

    other = max(labels[1:], key=spread)
    slow, fast = (other, labels[0]) if table[other]["p99"] >= first["p99"] else (labels[0], other)
    ratio = table[slow]["p99"] / table[fast]["p99"]
    return (f"At p99, {slow} waits {ratio:.1f}x as long as {fast} "
            f"({table[slow]['p99']:.0f} vs {table[fast]['p99']:.0f} ms)")


# ---- sweeps ------------------------------------------------------------------------------

_X_LABELS = {"concurrency": "concurrency (clients in flight)", "rate_rps": "offered load (req/s)",
             "workers": "workers (processes)", "threads": "threads per worker", "slots": "slots (workers x threads)"}
_Y_LABELS = {"throughput_rps": "throughput (req/s)", "p50_ms": "p50 latency (ms)", "p90_ms": "p90 latency (ms)",
             "p99_ms": "p99 latency (ms)", "max_ms": "max latency (ms)", "mean_ms": "mean latency (ms)",
             "p50_intended_ms": "p50 latency from intended start (ms)",
             "p99_intended_ms": "p99 latency from intended start (ms)"}


def _pick_x(df: pd.DataFrame) -> str:
    for col in ("concurrency", "rate_rps"):
        if col in df and df[col].nunique(dropna=True) > 1:
            return col
    varying = [c for c in ("workers", "threads") if c in df and df[c].nunique() > 1]
    if len(varying) == 1 and df["config"].nunique() == df[varying[0]].nunique():
        return varying[0]
    return "config"


def plot_sweep(sweep_df: pd.DataFrame, x: str | None = None, y: str = "throughput_rps", theory_overlay: bool = True,
               usl: bool | None = None, prediction=None, ax=None, title: str | None = None):
    """Plot a sweep: throughput (or latency) against load or workers, mean ± sd of repeats, theory dashed.

    Lesson 03. x defaults to whatever the sweep varied: concurrency (or rate_rps), one line
    per config; else workers or threads, one line across the configs; else one bar per
    config. The dashed line is the prediction from Little's law capped by the CPU ceiling
    (helpers.sweep.add_theory). usl=True (the default when x is workers or threads with 3+
    values) overlays a Universal Scalability Law fit. prediction: a learner's numbers, one
    per x value (of the first config), or one number; drawn as stars, the gap in the legend.
    """
    from helpers.sweep import add_theory, theory_curve

    df = sweep_df.copy()
    if "failure" in df:
        df = df[df["failure"].fillna("") == ""]
    if len(df) == 0:
        raise ValueError("the sweep has no successful rows to plot.")
    if y not in df:
        raise ValueError(f"y must be a column of the sweep, such as {', '.join(_Y_LABELS)}; got {y!r}.")
    x = x or _pick_x(df)
    if x != "config" and x not in df:
        raise ValueError(f"x must be 'config' or a column of the sweep such as concurrency or workers; got {x!r}.")
    if "theory_throughput_rps" not in df:
        df = add_theory(df)
    is_latency = y != "throughput_rps"
    theory_col = "theory_latency_ms" if is_latency else "theory_throughput_rps"
    draw_theory = theory_overlay and y in ("throughput_rps", "p50_ms", "mean_ms", "p50_intended_ms")
    # series: one per config against load; a single one across configs against workers/threads
    df["series"] = df["config"] if x in ("concurrency", "rate_rps") else "measured"
    keys = ["config"] if x == "config" else ["series", x]
    grouped = df.groupby(keys, sort=False)[y].agg(["mean", "std", "count"]).reset_index()
    if x != "config":
        grouped = grouped.sort_values(x, kind="stable")
    repeats = int(grouped["count"].max())
    note = f" (mean ± sd of {repeats} repeats)" if repeats > 1 else ""
    fig, ax, ret = _new_axes(ax, 7.5, 4.6)
    if x == "config":
        pos = np.arange(len(grouped))
        ax.bar(pos, grouped["mean"], yerr=grouped["std"].fillna(0) if repeats > 1 else None, capsize=4,
               color=[CYCLE[i % len(CYCLE)] for i in range(len(grouped))], alpha=0.85, label="measured" + note)
        if draw_theory:
            t = df.groupby("config", sort=False)[theory_col].mean().reindex(grouped["config"])
            ax.plot(pos, t.to_numpy(), "_", color="black", markersize=28, markeredgewidth=2.2,
                    label="theory: Little's law + CPU ceiling")
        ax.set_xticks(pos)
        ax.set_xticklabels(grouped["config"], rotation=15 if len(pos) > 3 else 0, fontsize=9)
        pred_x, first = pos, grouped
    else:
        series_names = list(pd.unique(grouped["series"]))
        for i, series in enumerate(series_names):
            g = grouped[grouped["series"] == series]
            colour = CYCLE[i % len(CYCLE)]
            ax.errorbar(g[x], g["mean"], yerr=g["std"].fillna(0) if repeats > 1 else None, fmt="o-", color=colour,
                        capsize=4, linewidth=1.6, label=series + note)
            if draw_theory and x in ("concurrency", "rate_rps"):
                rows = df[df["series"] == series]
                xs = np.linspace(float(g[x].min()), float(g[x].max()), 300)
                curve = theory_curve(rows, xs, x=x, y="latency_ms" if is_latency else "throughput_rps")
                if curve is not None:
                    ax.plot(xs, curve, "--", color=colour, alpha=0.8, linewidth=1.3,
                            label="theory" + ("" if len(series_names) == 1 else f" ({series})"))
                if x == "rate_rps":  # past capacity an open loop's queue grows without bound
                    capacity = float(theory_curve(rows, [np.inf], x="concurrency", y="throughput_rps")[0]) \
                        if curve is not None else math.nan
                    if np.isfinite(capacity):
                        ax.axvline(capacity, color=colour, linestyle=":", linewidth=1.2,
                                   label=f"capacity ≈{capacity:.0f} req/s (theory)")
        if draw_theory and x not in ("concurrency", "rate_rps"):
            t = df.groupby(x)[theory_col].mean().sort_index()
            ax.plot(t.index, t.to_numpy(), "--", color="black", alpha=0.7, linewidth=1.3,
                    label="theory: Little's law + CPU ceiling")
        if df[x].nunique() <= 10:
            ax.set_xticks(sorted(df[x].unique()))
        first = grouped[grouped["series"] == series_names[0]]
        pred_x = first[x].to_numpy()
    if usl is None:
        usl = x in ("workers", "threads") and df[x].nunique() >= 3 and not is_latency
    if usl:
        if x == "config" or is_latency:
            raise ValueError("a USL fit needs throughput against a number (workers, threads or concurrency).")
        unit = {"concurrency": "client", "rate_rps": "client"}.get(x, x.rstrip("s"))
        fit = theory.fit_usl(df[x], df[y], unit=unit)
        xs = np.linspace(float(df[x].min()), float(df[x].max()), 200)
        ax.plot(xs, fit.predict(xs), ":", color="#37474f", linewidth=1.6,
                label=f"USL fit: σ={fit.sigma:.2f}, κ={fit.kappa:.2g}, λ={fit.lam:.3g} req/s")
    if prediction is not None:
        measured = first["mean"].to_numpy()
        if np.ndim(prediction) == 0:
            target = float(np.max(measured)) if not is_latency else float(measured[-1])
            gap = theory.compare_prediction(prediction, target, unit=_unit(y))
            ax.axhline(float(prediction), color="black", linestyle="-.", linewidth=1,
                       label=f"your prediction {float(prediction):.3g} ({_gap_words(gap)})")
        else:
            pred = np.asarray(prediction, dtype=float)
            if len(pred) != len(measured):
                raise ValueError(f"give one predicted value per point: {len(measured)} numbers.")
            gap = theory.compare_prediction(pred, measured, unit=_unit(y))
            ax.plot(pred_x, pred, "*", color="black", markersize=13, label=f"your prediction ({_gap_words(gap)})")
    others = df["others_cores"].mean() if "others_cores" in df else math.nan
    if np.isfinite(others) and others >= 0.25:  # a shared machine: say so where the numbers are
        ax.text(0.99, 0.02, f"other programs used ≈{others:.1f} cores during this sweep", transform=ax.transAxes,
                ha="right", va="bottom", fontsize=8, color="#b71c1c")
        free = "theory_free_throughput_rps"
        if draw_theory and y == "throughput_rps" and free in df and x != "rate_rps" \
                and (df[free] < 0.97 * df["theory_throughput_rps"]).any():
            t = df.groupby("config" if x == "config" else x, sort=False)[free].mean()
            if x == "config":
                t = t.reindex(grouped["config"])
                ax.plot(np.arange(len(t)), t.to_numpy(), "_", color="#b71c1c", markersize=28, markeredgewidth=1.6,
                        label="theory on the cores left free")
            elif x in ("concurrency",) and df["series"].nunique() > 1:
                pass  # one curve per config would crowd the plot; the note says enough
            else:
                t = t.sort_index()
                ax.plot(t.index, t.to_numpy(), ":", color="#b71c1c", linewidth=1.3,
                        label="theory on the cores left free")
    ax.set_xlabel(_X_LABELS.get(x, x))
    ax.set_ylabel(_Y_LABELS.get(y, y))
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best", framealpha=0.85)
    _set_title(ax, title or _sweep_story(df, grouped, x, y))
    return ret


def _unit(y: str) -> str:
    return "req/s" if y == "throughput_rps" else "ms"


def plot_sweep_latency(sweep_df: pd.DataFrame, x: str | None = None, y: str | None = None, **kwargs):
    """Plot latency against load from a sweep, with Little's-law theory; see plot_sweep (lesson 03).

    y: "p50_ms" (the default for closed loops; theory drawn), "p90_ms", "p99_ms", "mean_ms",
    "max_ms", or for open loops "p50_intended_ms" (their default) and "p99_intended_ms".
    """
    if y is None:
        open_loop = "rate_rps" in sweep_df and sweep_df["rate_rps"].notna().any()
        y = "p50_intended_ms" if open_loop and "p50_intended_ms" in sweep_df else "p50_ms"
    return plot_sweep(sweep_df, x=x, y=y, **kwargs)


def _sweep_story(df, grouped, x, y) -> str:
    unit = _unit(y)
    what = "throughput" if y == "throughput_rps" else f"latency ({y.split('_')[0]})"
    if y.endswith("_intended_ms"):
        what += " from intended start"
    if x in ("concurrency", "rate_rps") and grouped["series"].nunique() > 1:
        at = grouped[x].max()
        last = grouped[grouped[x] == at].set_index("series")["mean"]
        hi, lo = (last.idxmax(), last.idxmin()) if y == "throughput_rps" else (last.idxmin(), last.idxmax())
        where = f"c={at:g}" if x == "concurrency" else f"{at:g} req/s offered"
        ratio = last[hi] / last[lo] if y == "throughput_rps" else last[lo] / last[hi]
        return f"At {where}, {hi} gives {last[hi]:.0f} {unit}, {lo} {last[lo]:.0f} ({ratio:.1f}x apart)"
    if x == "config":
        best = grouped.loc[grouped["mean"].idxmax() if y == "throughput_rps" else grouped["mean"].idxmin()]
        worst = grouped.loc[grouped["mean"].idxmin() if y == "throughput_rps" else grouped["mean"].idxmax()]
        return (f"{best['config']} gives {best['mean']:.0f} {unit}, {worst['config']} {worst['mean']:.0f}"
                + (f": {max(best['mean'], worst['mean']) / min(best['mean'], worst['mean']):.1f}x apart"
                   if min(best["mean"], worst["mean"]) > 0 else ""))
    xs, ys = grouped[x].to_numpy(dtype=float), grouped["mean"].to_numpy(dtype=float)
    if x in ("workers", "threads"):
        story = f"{xs[0]:g} → {xs[-1]:g} {x}: {what} x{ys[-1] / ys[0]:.2f}"
        theory_col = "theory_throughput_rps" if y == "throughput_rps" else None
        t = df.groupby(x)[theory_col].mean().sort_index() if theory_col in df else pd.Series(dtype=float)
        if len(t) >= 2 and t.notna().all() and t.iloc[0] > 0:
            cores = df["effective_cores"].median() if "effective_cores" in df else math.nan
            limit = f" on {cores:g} cores" if np.isfinite(cores) and t.iloc[-1] / t.iloc[0] < xs[-1] / xs[0] else ""
            return story + f"; theory says x{t.iloc[-1] / t.iloc[0]:.1f}{limit}"
        return story + f" (perfect scaling would give x{xs[-1] / xs[0]:g})"
    load = "concurrency" if x == "concurrency" else "offered load"
    if y == "throughput_rps":
        peak = ys.max()
        if ys[-1] < 0.85 * peak:
            return f"Throughput peaks at {peak:.0f} req/s (at {xs[np.argmax(ys)]:g}), then falls as load grows"
        theory_max = df["theory_throughput_rps"].max()
        knee = xs[np.argmax(ys >= 0.9 * peak)]
        if knee == xs[-1]:
            story = f"Throughput keeps rising with {load}: {peak:.0f} req/s at {knee:g}"
        else:
            story = f"Throughput rises with {load} until ≈{knee:g}, then levels off at ≈{peak:.0f} req/s"
        return story + (f" (theory {theory_max:.0f})" if np.isfinite(theory_max) else "")
    low = ys.min()
    flat = xs[ys <= 1.25 * low]
    knee = flat.max() if len(flat) else xs[0]
    if ys[-1] <= 1.25 * low:
        return f"{what[0].upper() + what[1:]} stays near {low:.0f} ms across the sweep: no queue builds"
    return (f"{what[0].upper() + what[1:]} stays near {low:.0f} ms up to {knee:g}, then climbs to {ys[-1]:.0f} ms "
            f"at {xs[-1]:g}: requests queue")
