"""Small conveniences that keep lesson notebooks thin: quick mode, the machine line, self-checks,
one timed request, tables and figures that compare a few runs.

Introduced in lesson 00. Each function's docstring names the lesson that first uses it.
Nothing here measures anything new: the figures read Runs (helpers.load) and sweep tables
(helpers.sweep), and the models come from helpers.theory.
"""

from __future__ import annotations

import math
import os
import time

__all__ = ["QUICK", "choose", "lesson_setup", "self_check", "parse_server_timing", "timed_get", "runs_table",
           "combine_runs", "load_grid", "burst_runs", "plot_burst_totals", "memory_by_config", "plot_memory",
           "plot_sweep_vs_reference"]

QUICK = os.environ.get("COURSE_QUICK") == "1"
"""True when COURSE_QUICK=1 (the tests set it): durations and grids shrink, the story stays the same."""


def choose(full, quick):
    """Pick the full-mode value, or the quick-mode one when COURSE_QUICK=1 (lesson 00)."""
    return quick if QUICK else full


def lesson_setup() -> dict:
    """Print one line about this machine and the mode, set plot defaults; return the machine info (lesson 00)."""
    import matplotlib as mpl

    from helpers.machine import describe_machine, machine

    _show_figures_inline()  # first: the inline backend may reset some rcParams
    mpl.rcParams.update({"figure.figsize": (9, 4), "figure.dpi": 100, "axes.grid": True, "grid.alpha": 0.3})
    info = machine()
    mode = "short runs" if QUICK else "full mode"  # describe_machine() already says "quick mode"
    print(f"{describe_machine()} | {mode}")
    return info


def _show_figures_inline() -> None:
    """In a notebook, draw a matplotlib Figure returned as a cell's value as a PNG (no-op elsewhere).

    The course's plots build Figures without pyplot, so nothing registers the inline
    formatter unless we do.
    """
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is None or not hasattr(shell, "kernel"):
        return
    try:
        shell.run_line_magic("matplotlib", "inline")
    except Exception:  # noqa: BLE001 - figures then show as text; the lesson still runs
        pass


def self_check(passed: bool, success: str, hint: str) -> None:
    """Print a cheer when `passed`, else fail with a friendly hint of what to look at (lesson 00)."""
    if not passed:
        raise AssertionError(f"Not yet: {hint}")
    print(f"✔ {success}")


# ---- one request, timed by both ends ---------------------------------------------------------

def parse_server_timing(header: str | None) -> dict:
    """Turn a Server-Timing header into {name: milliseconds}, e.g. {'app': 201.0, 'cpu': 0.5, 'io': 200.5}.

    Lesson 00. Entries without a `dur` are left out; an empty or missing header gives {}.
    """
    timings = {}
    for entry in (header or "").split(","):
        name, _, params = entry.strip().partition(";")
        for param in params.split(";"):
            key, _, value = param.strip().partition("=")
            if key.strip() == "dur" and name.strip():
                try:
                    timings[name.strip()] = float(value.strip().strip('"'))
                except ValueError:
                    pass
    return timings


def timed_get(url: str, timeout: float = 10.0) -> dict:
    """Send one GET; return the notebook's wall time next to the server's own timing, all in ms.

    Lessons 00 and 01. Keys: status; wall_ms (the notebook's clock: connect, send, wait, read
    the reply); app_ms, cpu_ms, io_ms (the Server-Timing header: the handler's wall time, the
    CPU time of the thread that ran it, its simulated I/O wait); wait_ms = app_ms - cpu_ms
    (handler time spent off the CPU); outside_ms = wall_ms - app_ms (connecting, parsing, the
    network); worker_pid.
    """
    import requests

    t0 = time.perf_counter()
    response = requests.get(url, timeout=timeout)
    wall_ms = (time.perf_counter() - t0) * 1000.0
    timing = parse_server_timing(response.headers.get("Server-Timing"))
    app_ms, cpu_ms = timing.get("app", math.nan), timing.get("cpu", math.nan)
    pid = response.headers.get("X-Worker-Pid")
    return {"status": response.status_code, "wall_ms": round(wall_ms, 2), "app_ms": app_ms, "cpu_ms": cpu_ms,
            "io_ms": timing.get("io", math.nan), "wait_ms": round(app_ms - cpu_ms, 2),
            "outside_ms": round(wall_ms - app_ms, 2), "worker_pid": int(pid) if pid else None}


# ---- a few runs side by side ----------------------------------------------------------------

def _path_of(url: str) -> str:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return parts.path + (f"?{parts.query}" if parts.query else "")


def _run_label(run, index: int) -> str:
    label = getattr(run, "label", None) or (run.config or {}).get("label")
    if label:
        return str(label)
    urls = (run.config or {}).get("urls") or []
    return " + ".join(_path_of(u) for u in urls) + f" c={(run.config or {}).get('concurrency')}" if urls \
        else f"run {index + 1}"


def runs_table(runs, labels=None, by_endpoint: bool = False):
    """One row per run: what it sent, how long it took, throughput, latency and the mean time split.

    Lessons 01-04. Columns: label, path, concurrency, server, requests, total_s (first send to
    last answer), throughput_rps, mean_ms, p50_ms, p99_ms (answered requests), and the mean
    queue_ms, cpu_ms, io_ms and contention_ms per request (they add up to mean_ms).
    by_endpoint=True gives one row per run and endpoint (for runs that mixed endpoints).
    """
    import numpy as np
    import pandas as pd

    from helpers.plots import describe_server

    runs = list(runs)
    labels = list(labels) if labels is not None else [_run_label(r, i) for i, r in enumerate(runs)]
    if len(labels) != len(runs):
        raise ValueError(f"{len(runs)} runs but {len(labels)} labels.")
    rows = []
    for run, label in zip(runs, labels):
        req, cfg = run.requests, run.config or {}
        groups = req.groupby("endpoint", sort=False) if by_endpoint else [(None, req)]
        for endpoint, part in groups:
            ok = part[part["ok"].astype(bool)]
            urls = sorted({u for u in part["url"]}) if len(part) else cfg.get("urls") or []
            total_s = float(part["end_s"].max() - part["send_s"].min()) if len(part) else math.nan
            latency = ok["latency_ms"].to_numpy(dtype=float)
            rows.append({
                "label": label if endpoint is None else f"{label}: {endpoint}",
                "path": " + ".join(_path_of(u) for u in urls),
                "concurrency": cfg.get("concurrency") if endpoint is None else (cfg.get("streams") or {}).get(urls[0]),
                "server": describe_server(cfg.get("server") or {}),
                "requests": int(len(part)), "errors": int((~part["ok"].astype(bool)).sum()),
                "total_s": round(total_s, 3),
                "throughput_rps": round(len(ok) / total_s, 2) if total_s and total_s > 0 else math.nan,
                "mean_ms": round(float(latency.mean()), 1) if len(latency) else math.nan,
                "p50_ms": round(float(np.percentile(latency, 50)), 1) if len(latency) else math.nan,
                "p99_ms": round(float(np.percentile(latency, 99)), 1) if len(latency) else math.nan,
                **{name: round(float(ok[col].clip(lower=0).mean()), 1) if len(ok) else math.nan
                   for name, col in (("queue_ms", "queue_ms"), ("cpu_ms", "server_cpu_ms"),
                                     ("io_ms", "server_io_ms"), ("contention_ms", "contention_ms"))},
            })
    return pd.DataFrame(rows).set_index("label")


def combine_runs(runs, labels=None, endpoint: str | None = None):
    """Join runs into one Run whose requests carry a `run` column, to draw them side by side.

    Lessons 01 and 04: `combine_runs([alone, mixed], ["alone", "mixed"]).plot_breakdown(by="run")`
    stacks one bar per run, or per run and endpoint when a run mixed endpoints. Labels get a
    number ("1 · alone") so the bars keep the order given. endpoint="/io" keeps only that
    endpoint's requests. The result is for drawing only: its config is the first run's, its
    samples all runs' together.
    """
    import pandas as pd

    from helpers.load import Run

    runs = list(runs)
    if not runs:
        raise ValueError("give at least one run.")
    labels = list(labels) if labels is not None else [_run_label(r, i) for i, r in enumerate(runs)]
    if len(labels) != len(runs):
        raise ValueError(f"{len(runs)} runs but {len(labels)} labels.")
    frames = []
    for number, (run, label) in enumerate(zip(runs, labels), start=1):
        req = run.requests if endpoint is None else run.requests[run.requests["endpoint"] == endpoint]
        req = req.copy()
        mixed = req["endpoint"].nunique() > 1
        req["run"] = [f"{number} · {label}" + (f": {ep}" if mixed else "") for ep in req["endpoint"]]
        frames.append(req)
    requests = pd.concat(frames, ignore_index=True)
    requests["request_id"] = range(len(requests))
    samples = [r.samples for r in runs if r.samples is not None and len(r.samples)]
    config = dict(runs[0].config or {}, label=" vs ".join(labels))
    return Run(config=config, requests=requests, samples=pd.concat(samples, ignore_index=True) if samples else None,
               machine=runs[0].machine)


def load_grid(server, paths, concurrencies, duration: float, settle_s: float = 0.2, **load_kwargs) -> list:
    """Run each path at each concurrency (closed loop) against one running server; return the Runs.

    Lesson 01. Runs go path by path, concurrency by concurrency, each labelled "PATH c=N"
    (e.g. "/io?ms=100 c=4"), for `duration` seconds. Extra keywords go to run_load.
    """
    from helpers.load import run_load

    runs = []
    for path in ([paths] if isinstance(paths, str) else paths):
        for concurrency in ([concurrencies] if isinstance(concurrencies, int) else concurrencies):
            runs.append(run_load(server.url + path, concurrency=int(concurrency), duration=duration,
                                 label=f"{path} c={concurrency}", **load_kwargs))
            time.sleep(settle_s)
    return runs


# ---- lesson 02: bursts --------------------------------------------------------------------

def burst_runs(server, path: str, sizes, settle_s: float = 0.3, **load_kwargs) -> list:
    """Release a burst of each size at a running server, one burst after another; return the Runs.

    Lesson 02. Each burst sends all its requests at the same instant (run_load(burst=True))
    and is labelled "burst of N". settle_s: pause between bursts so one does not spill into
    the next. Extra keywords go to run_load.
    """
    from helpers.load import run_load

    runs = []
    for size in sizes:
        runs.append(run_load(server.url + path, requests=int(size), burst=True, label=f"burst of {size}",
                             quiet=True, **load_kwargs))
        time.sleep(settle_s)
    return runs


def _new_figure(width_in: float = 7.5, height_in: float = 4.4):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width_in, height_in), layout="constrained")
    return fig, fig.add_subplot()


def plot_burst_totals(runs, service_s: float, prediction=None):
    """Plot how long each burst took against its size, next to ceil(N / slots) x the time per request.

    Lesson 02. runs: bursts against one server (e.g. from burst_runs). service_s: one
    request's time alone (1.0 for /io?ms=1000). prediction: your guessed seconds, one per
    burst; drawn as stars with the gap in the legend. Returns the Figure.
    """
    import numpy as np

    from helpers import theory
    from helpers.plots import describe_server

    sizes = np.array([len(r.requests) for r in runs])
    totals = np.array([float(r.requests["end_s"].max() - r.requests["send_s"].min()) for r in runs])
    cfg = (runs[0].config or {}).get("server") or {}
    slots = int(cfg.get("slots") or 1)
    fig, ax = _new_figure()
    xs = np.arange(1, sizes.max() + 1)
    ax.plot(xs, np.ceil(xs / slots) * service_s, "--", marker=".", color="#555555",
            label=f"queueing model: ceil(N / {slots} slot{'s' * (slots > 1)}) x {service_s:g} s")
    ax.plot(sizes, totals, "o-", color="#1f77b4", linewidth=1.8, markersize=8, label="measured")
    for n, t in zip(sizes, totals):
        ax.annotate(f"{t:.2f} s", (n, t), textcoords="offset points", xytext=(6, -12), fontsize=8)
    if prediction is not None:
        pred = np.asarray(prediction, dtype=float)
        if pred.shape != totals.shape:
            raise ValueError(f"give one predicted time per burst: {len(totals)} numbers.")
        gap = theory.compare_prediction(pred, totals, unit="s")
        worst = float(np.nanmax(np.abs(np.log(np.where(gap.ratio > 0, gap.ratio, np.nan)))))
        ax.plot(sizes, pred, "*", color="black", markersize=13,
                label=f"your prediction (off by up to {math.exp(worst):.2f}x)")
    ax.set_xlabel("requests released at the same instant (N)")
    ax.set_ylabel("time until the last answer (s)")
    ax.set_xlim(0, sizes.max() + 0.5)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title(f"{describe_server(cfg)}: {sizes[-1]} requests took {totals[-1]:.2f} s, "
                 f"{totals[-1] / service_s:.1f}x one request's {service_s:g} s", fontsize=10)
    return fig


# ---- lesson 03: what a slot costs -----------------------------------------------------------

def memory_by_config(configs, warm_path: str = "/io?ms=50"):
    """Start each server config, busy every slot once, record each process's memory, stop it.

    Lesson 03. configs: DemoServer keyword dicts, e.g. [{"threads": 8}, {"workers": 8}].
    Returns one row per process: config, slots, pid, role (master or worker), rss_mb, uss_mb,
    pss_mb (see DemoServer.memory). Warming with a burst of `slots` requests makes a threaded
    worker create all its threads before it is measured.
    """
    import pandas as pd

    from helpers.load import run_load
    from helpers.plots import describe_server
    from helpers.server import DemoServer

    rows = []
    for cfg in ([configs] if isinstance(configs, dict) else configs):
        with DemoServer(**cfg) as server:
            run_load(server.url + warm_path, requests=server.slots, burst=True, quiet=True)
            label = describe_server(server.config())
            rows += [{"config": label, "slots": server.slots, **proc} for proc in server.memory()]
    return pd.DataFrame(rows)


def plot_memory(table, prediction=None):
    """Stack each config's memory as USS per process (master, then each worker): one bar per config.

    Lesson 03. table: from memory_by_config. A diamond marks what adding up RSS would claim
    (it counts the pages workers share with the master once per process). prediction: your
    guessed total in MB for the last config, or one per config; drawn as stars.
    """
    import numpy as np

    from helpers import theory

    configs = list(dict.fromkeys(table["config"]))
    fig, ax = _new_figure()
    totals, rss_totals = [], []
    for i, name in enumerate(configs):
        rows = table[table["config"] == name].sort_values("role")  # master first
        bottom = 0.0
        for k, (_, proc) in enumerate(rows.iterrows()):
            colour = "#90a4ae" if proc["role"] == "master" else ("#1f77b4" if k % 2 else "#64b5f6")
            ax.bar(i, proc["uss_mb"], 0.55, bottom=bottom, color=colour, edgecolor="white", linewidth=0.6)
            bottom += proc["uss_mb"]
        totals.append(bottom)
        rss_totals.append(float(rows["rss_mb"].sum()))
        n_workers = int((rows["role"] == "worker").sum())
        ax.annotate(f"{bottom:.0f} MB\n({n_workers} worker{'s' * (n_workers != 1)})", (i, bottom),
                    textcoords="offset points", xytext=(0, 4), ha="center", fontsize=8)
    ax.plot(range(len(configs)), rss_totals, "D", color="#ef6c00", label="sum of RSS (counts shared pages again)")
    ax.bar([0], [0], color="#90a4ae", label="master (USS)")
    ax.bar([0], [0], color="#1f77b4", label="one worker each (USS)")
    if prediction is not None:
        pred = np.asarray(prediction, dtype=float)
        measured = np.asarray(totals if pred.ndim else totals[-1], dtype=float)
        gap = theory.compare_prediction(pred, measured, unit="MB")
        xs = range(len(configs)) if pred.ndim else [len(configs) - 1]
        ax.plot(list(xs), np.atleast_1d(pred), "*", color="black", markersize=13,
                label=f"your prediction ({gap.sentence.split(': ', 1)[-1].rstrip('.')})"[:90])
    ax.set_xticks(range(len(configs)))
    ax.set_xticklabels(configs)
    ax.set_ylabel("memory (MB of USS, stacked per process)")
    ax.set_ylim(0, max(max(totals), max(rss_totals)) * 1.3)
    ax.legend(fontsize=8, loc="upper left")
    ratio = totals[-1] / totals[0] if totals[0] else math.nan
    ax.set_title(f"{configs[-1]} holds {totals[-1]:.0f} MB, {configs[0]} {totals[0]:.0f} MB "
                 f"({ratio:.1f}x) for the same slots", fontsize=10)
    return fig


# ---- lesson 04: your machine against the reference ------------------------------------------

def plot_sweep_vs_reference(table, reference: str, always: bool = False, **kwargs):
    """plot_sweep, plus the recorded reference sweep when this machine has other effective cores.

    Lesson 04. reference: a name from data/reference/ ("cpu_workers", "cpu_threads_vs_workers").
    On a machine with as many effective cores as the reference machine (2) the figure is
    plot_sweep's alone, unless always=True; otherwise (e.g. 1 core on Binder) the reference
    means are drawn in grey, so you see what the second core would have added. Extra
    keywords go to plot_sweep. Returns the Figure.
    """
    import numpy as np

    from helpers.machine import machine
    from helpers.plots import plot_sweep
    from helpers.sweep import load_reference

    fig = plot_sweep(table, **kwargs)
    ax = fig.axes[0]
    ref = load_reference(reference)
    ref = ref[ref["failure"].fillna("") == ""] if "failure" in ref else ref
    ref_cores = (ref.attrs.get("machine") or {}).get("effective_cores")
    cores = machine()["effective_cores"]
    if not always and ref_cores == cores:
        return fig
    y = kwargs.get("y", "throughput_rps")
    name = (f"reference, recorded on {ref_cores:g} cores" if ref_cores else "reference, recorded") \
        + f" (this machine: {cores:g} core{'s' * (cores != 1)})"
    x = kwargs.get("x")
    if x is None:  # what plot_sweep picks: workers or threads when only that varies, else one bar per config
        varying = [col for col in ("workers", "threads") if table[col].nunique() > 1]
        x = varying[0] if len(varying) == 1 and table["config"].nunique() == table[varying[0]].nunique() else "config"
    if x == "config":
        ticks = [t.get_text() for t in ax.get_xticklabels()]
        means = ref.groupby("config")[y].mean()
        xs = [i for i, t in enumerate(ticks) if t in means.index]
        ax.plot(xs, [means[ticks[i]] for i in xs], "D", color="#757575", markersize=9, label=name)
    else:
        means = ref.groupby(x)[y].mean().sort_index()
        ax.plot(means.index, means.to_numpy(), "D-.", color="#757575", linewidth=1.4, label=name)
    # axhline keeps its y data as a list, so go through numpy for every line
    top = np.nanmax([np.nanmax(np.asarray(line.get_ydata(), dtype=float)) for line in ax.get_lines()
                     if len(line.get_ydata())] + [1.0])
    ax.set_ylim(0, max(ax.get_ylim()[1], top * 1.15))
    ax.legend(fontsize=8, loc="best", framealpha=0.85)
    return fig
