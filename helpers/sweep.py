"""Run the same load against several server configs and load levels; one tidy table out.

Introduced in lesson 03 (throughput against concurrency); lesson 05 sweeps workers and
threads. Every server is started and stopped by the sweep itself, even when a run fails
or the server dies midway, and the table is written atomically to data/sweeps/<name>.csv
(+ .json with the machine fingerprint) as soon as the sweep ends.

    from helpers.sweep import sweep
    table = sweep([{"workers": 1}, {"workers": 2}], path="/cpu?ms=20", concurrencies=[1, 2, 4])

record_reference() runs the course's key sweeps once per machine and writes them to
data/reference/; load_reference(name) reads them back for the notebooks to compare against.
"""

from __future__ import annotations

import json
import math
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from helpers import theory
from helpers.store import atomic_write_text, data_dir

__all__ = ["sweep", "add_theory", "theory_curve", "save_sweep", "load_sweep", "record_reference",
           "load_reference", "REFERENCE_SWEEPS", "SweepError"]

ROOT = Path(__file__).resolve().parents[1]
SERVER_COLUMNS = ("server", "workers", "threads", "worker_class", "worker_connections", "slots")
SUMMARY_COLUMNS = ("requests", "throughput_rps", "p50_ms", "p90_ms", "p99_ms", "max_ms", "mean_ms",
                   "p50_intended_ms", "p99_intended_ms", "dropped", "errors",
                   "client_cpu_percent", "saturated", "server_cpu_percent", "cores_busy_percent",
                   "server_cpu_ms_mean", "server_io_ms_mean",
                   "server_app_ms_mean", "queue_ms_mean", "contention_ms_mean", "effective_cores",
                   "others_cores")

# The course's reference sweeps: what lessons 03 and 05 compare a learner's machine against.
REFERENCE_SWEEPS = {
    "io_scaling": dict(configs=[{"worker_class": "gthread", "workers": 1, "threads": 32}],
                       path="/io?ms=200", concurrencies=[1, 8, 32, 64], duration=4),
    "cpu_workers": dict(configs=[{"workers": 1}, {"workers": 2}, {"workers": 4}],
                        path="/cpu?ms=20", concurrencies=[4], duration=3),
    "cpu_threads_vs_workers": dict(configs=[{"workers": 1}, {"workers": 1, "threads": 4}, {"workers": 2},
                                            {"workers": 2, "threads": 2}, {"workers": 4}],
                                   path="/cpu?ms=20", concurrencies=[4], duration=3),
    # lesson 05: the first article's 60/40 mix on 4 gevent workers, as connections grow
    "gevent_mix": dict(configs=[{"workers": 4, "worker_class": "gevent", "worker_connections": 2000}],
                       path="/mixed?io_fraction=0.4", concurrencies=[20, 100, 200, 400, 800], duration=8),
    # lesson 06: the fifth article's servers on light CPU work at keep-alive concurrency 20
    "server_kinds_cpu": dict(configs=[{"server": "flask-dev", "threads": 20}, {"server": "aiohttp-dev"},
                                      {"workers": 1}, {"server": "aiohttp"}, {"workers": 4},
                                      {"server": "aiohttp", "workers": 4}],
                             labels=["Flask dev", "aiohttp dev", "Flask gunicorn", "aiohttp gunicorn",
                                     "Flask gunicorn -w 4", "aiohttp gunicorn -w 4"],
                             path="/cpu?ms=1", concurrencies=[20], duration=5),
}


class SweepError(RuntimeError):
    """A sweep run with on_error="raise" failed; every server it started has been stopped.

    Lesson 03 (sweeps).
    """


def _get(summary, key, default=math.nan):
    try:
        value = summary[key]
    except (KeyError, TypeError, IndexError):
        value = getattr(summary, key, default)
    return default if value is None else value


_DEFAULTS = {"worker_connections": 1000, "backlog": None, "preload": False, "max_requests": 0,
             "app": "labapp:create_app()"}


def _config_label(config: dict) -> str:
    """'2 workers x 4 threads', plus any setting that differs from DemoServer's default."""
    from helpers.plots import describe_server

    extras = [f"{key}={config.get(key)}" for key, default in _DEFAULTS.items()
              if config.get(key, default) != default
              and not (key == "worker_connections" and config.get("worker_class") != "gevent")]
    return describe_server(config) + (f" ({', '.join(extras)})" if extras else "")


def _row_from_run(run) -> dict:
    """The summary numbers of one run, flattened into a sweep row."""
    summary = run.summary()
    latency = _get(summary, "latency_ms", {}) or {}
    req = run.requests
    ok = req[req["ok"].astype(bool)] if len(req) else req
    machine = getattr(run, "machine", None) or {}

    def mean_of(col):
        return float(ok[col].mean()) if col in ok and len(ok) else math.nan

    samples = getattr(run, "samples", None)
    n_cores = samples.loc[samples["kind"] == "core", "name"].nunique() if samples is not None and len(samples) else 0
    busy, server_pct, client_pct = (float(_get(summary, key)) for key in
                                    ("cores_busy_percent", "server_cpu_percent", "client_cpu_percent"))
    # CPU the cores spent on neither the server nor the client: other programs on a shared machine
    others_cores = (busy * n_cores - server_pct - np.nan_to_num(client_pct)) / 100.0 if n_cores else math.nan
    return {
        "requests": int(len(req)),
        "throughput_rps": float(_get(summary, "throughput_rps")),
        "p50_ms": float(_get(latency, "p50")), "p90_ms": float(_get(latency, "p90")),
        "p99_ms": float(_get(latency, "p99")), "max_ms": float(_get(latency, "max")),
        "mean_ms": mean_of("latency_ms"),
        # open loop: measured from each request's intended start, so a backed-up client cannot hide waits
        "p50_intended_ms": float(_get(_get(summary, "latency_intended_ms", {}) or {}, "p50")),
        "p99_intended_ms": float(_get(_get(summary, "latency_intended_ms", {}) or {}, "p99")),
        "dropped": int(_get(summary, "dropped", 0) or 0),
        "errors": int(_get(summary, "errors", 0) or 0),
        "client_cpu_percent": float(_get(summary, "client_cpu_percent")),
        "saturated": bool(_get(summary, "saturated", False)),
        "server_cpu_percent": float(_get(summary, "server_cpu_percent")),
        "cores_busy_percent": float(_get(summary, "cores_busy_percent")),
        "server_cpu_ms_mean": mean_of("server_cpu_ms"), "server_io_ms_mean": mean_of("server_io_ms"),
        "server_app_ms_mean": mean_of("server_app_ms"), "queue_ms_mean": mean_of("queue_ms"),
        "contention_ms_mean": mean_of("contention_ms"),
        "effective_cores": float(machine.get("effective_cores", math.nan) or math.nan),
        "others_cores": max(others_cores, 0.0) if math.isfinite(others_cores) else math.nan,
    }


CPU_HEAVY_ENDPOINTS = ("/cpu", "/mixed", "/mystery")


def warn_if_one_core(path: str) -> bool:
    """Warn (and return True) when a CPU-heavy sweep runs on a machine with fewer than 2 effective cores.

    Lesson 04: on 1 core (Binder) CPU-bound throughput cannot grow with workers, and the load
    generator competes with the server for that core; the reference data shows what 2 cores do.
    """
    from urllib.parse import urlsplit

    from helpers.machine import machine

    cores = machine().get("effective_cores") or 1
    if urlsplit(path).path not in CPU_HEAVY_ENDPOINTS or cores >= 2:
        return False
    warnings.warn(f"this machine has {cores:g} effective core(s), so CPU-bound throughput cannot grow with "
                  f"workers here and the load generator shares that core with the server; compare with "
                  f"load_reference('cpu_workers'), measured on 2 cores.", RuntimeWarning, stacklevel=3)
    return True


def sweep(configs, path: str = "/cpu?ms=20", concurrencies=None, rates=None, duration: float = 3,
          repeats: int = 1, name: str | None = None, save: bool = True, quiet: bool = False,
          on_error: str = "record", settle_s: float = 0.2, **load_kwargs) -> pd.DataFrame:
    """Run `path` at each load point against each server config; return one row per run.

    Lesson 03. configs: DemoServer keyword dicts, e.g. [{"workers": 1}, {"workers": 2}].
    concurrencies (closed loop) or rates (req/s, open loop) list the load points; each runs
    `duration` seconds, `repeats` times (3 gives error bars). Extra keywords go to run_load.
    Rows carry the config, the load point, the run's summary, mean server CPU/I/O ms, the
    machine's effective cores and the theory columns (see add_theory); a run that failed
    has its reason in `failure`. on_error="raise" stops at the first failure instead
    (after stopping the server). Interrupting the kernel ends the sweep after the current
    run and keeps the rows so far (attrs["interrupted"]). Saved to data/sweeps/<name>.csv
    and .json unless save=False.
    """
    from tqdm.auto import tqdm

    from helpers.load import run_load
    from helpers.server import DemoServer, ServerStartError

    configs = [configs] if isinstance(configs, dict) else list(configs)
    if not configs:
        raise ValueError("give at least one server config, e.g. [{'workers': 1}].")
    if (concurrencies is None) == (rates is None):
        raise ValueError("give exactly one of concurrencies=[...] (closed loop) or rates=[...] (open loop).")
    points = list(concurrencies if concurrencies is not None else rates)
    if not points:
        raise ValueError("the list of load points is empty.")
    warn_if_one_core(path)
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a whole number of at least 1, got {repeats!r}.")
    if on_error not in ("record", "raise"):
        raise ValueError(f"on_error must be 'record' or 'raise', got {on_error!r}.")
    if not path.startswith("/"):
        path = "/" + path
    # Build every server object first: a typo in the last config fails now, not in ten minutes.
    servers = [DemoServer(**cfg) for cfg in configs]
    labels = [_config_label(s.config()) for s in servers]
    labels = [lb if labels.count(lb) == 1 else f"{lb} #{i + 1}" for i, lb in enumerate(labels)]
    name = name or time.strftime("sweep-%Y%m%d-%H%M%S")
    rows: list[dict] = []
    machine: dict = {}
    closed = concurrencies is not None
    interrupted = False
    bar = tqdm(total=len(configs) * len(points) * repeats, desc=name, disable=quiet, leave=True)

    def base_row(index, server, point, repeat):
        cfg = server.config()
        row = {"name": name, "config": labels[index], "config_index": index, "path": path,
               **{col: cfg.get(col) for col in SERVER_COLUMNS},
               "concurrency": point if closed else math.nan, "rate_rps": math.nan if closed else point,
               "repeat": repeat, "duration_s": float(duration), "failure": ""}
        return row

    try:
        for index, server in enumerate(servers):
            try:
                server.start()
            except ServerStartError as err:
                if on_error == "raise":
                    raise SweepError(f"{labels[index]} did not start: {err}") from err
                reason = f"server did not start: {str(err).splitlines()[0]}"
                for point in points:
                    for repeat in range(repeats):
                        rows.append({**base_row(index, server, point, repeat), "failure": reason})
                        bar.update(1)
                continue
            try:
                for point in points:
                    for repeat in range(repeats):
                        bar.set_postfix_str(f"{labels[index]}, {'c' if closed else 'rate'}={point}")
                        row = base_row(index, server, point, repeat)
                        if not server.alive:  # it died and could not be brought back
                            row["failure"] = "server was down"
                            rows.append(row)
                            bar.update(1)
                            continue
                        load = dict(load_kwargs, duration=duration, quiet=True, server=server,
                                    label=f"{labels[index]} {'c' if closed else 'rate'}={point} #{repeat + 1}")
                        if closed:
                            load["concurrency"] = point
                        else:
                            load["rate"] = point
                        try:
                            run = run_load(server.url + path, **load)
                            row.update(_row_from_run(run))
                            machine = machine or dict(getattr(run, "machine", None) or {})
                            if getattr(run, "interrupted", False):  # the learner pressed Interrupt
                                row["failure"] = "interrupted"
                                interrupted = True
                        except Exception as err:  # noqa: BLE001 - recorded, the sweep goes on
                            if isinstance(err, (TypeError, ValueError)) and server.alive:
                                raise  # a mistake in the arguments: every run would fail the same way
                            if on_error == "raise":
                                raise SweepError(f"{row['config']} at {point}: {err}") from err
                            row["failure"] = f"{type(err).__name__}: {err}"
                        if not server.alive:
                            row["failure"] = "; ".join(
                                part for part in (f"server died during the run ({server.status})", row["failure"])
                                if part)
                            if on_error == "raise":
                                raise SweepError(f"{row['config']} died during the run at {point}.")
                            server.stop()
                            try:
                                server.start()
                            except ServerStartError:
                                server.stop()
                        rows.append(row)
                        bar.update(1)
                        if interrupted:
                            break
                        time.sleep(settle_s)  # let closed connections drain before the next run
                    if interrupted:
                        break
            finally:
                server.stop()
            if interrupted:
                break
    finally:
        for server in servers:  # whatever happened, nothing this sweep started stays up
            server.stop()
        bar.close()
    table = pd.DataFrame(rows)
    for col in SUMMARY_COLUMNS:  # present even when every run failed
        if col not in table:
            table[col] = math.nan
    table = add_theory(table)
    table.attrs.update(name=name, machine=_jsonable(machine), interrupted=interrupted)
    if save:
        csv_path = save_sweep(table, name, meta={"path": path, "configs": configs, "duration_s": duration,
                                                  "repeats": repeats, "concurrencies": concurrencies,
                                                  "rates": rates})
        table.attrs["csv_path"] = str(csv_path)
    return table


def _jsonable(value):
    """Plain JSON: numpy scalars to numbers, NaN to null, anything odd to its string."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        try:
            value = value.item()
        except (ValueError, TypeError):
            return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def save_sweep(table: pd.DataFrame, name: str, directory=None, meta: dict | None = None) -> Path:
    """Write a sweep table to <dir>/<name>.csv and its metadata to <name>.json, atomically (lesson 03)."""
    directory = Path(directory) if directory is not None else data_dir() / "sweeps"
    if not name or any(ch in name for ch in "/\\") or name.startswith("."):
        raise ValueError(f"a sweep name must be a plain file name, got {name!r}.")
    csv_path = directory / f"{name}.csv"
    info = {"name": name, "created_at": time.time(), "rows": len(table),
            "machine": table.attrs.get("machine", {}), **(meta or {})}
    directory.mkdir(parents=True, exist_ok=True)
    atomic_write_text(csv_path, table.to_csv(index=False))
    atomic_write_text(directory / f"{name}.json", json.dumps(_jsonable(info), indent=2))
    return csv_path


def load_sweep(name_or_path, directory=None) -> pd.DataFrame:
    """Read a saved sweep back (by name from data/sweeps/, or a .csv path); metadata in .attrs (lesson 03)."""
    path = Path(name_or_path)
    if path.suffix != ".csv":
        path = (Path(directory) if directory is not None else data_dir() / "sweeps") / f"{name_or_path}.csv"
    if not path.exists():
        raise FileNotFoundError(f"no saved sweep at {path}.")
    table = pd.read_csv(path)
    if "failure" in table:  # an empty cell means "no failure": keep it "", not NaN
        failure = table["failure"].astype("object")
        table["failure"] = failure.where(failure.notna(), "").astype(str)
    meta_path = path.with_suffix(".json")
    if meta_path.exists():
        table.attrs.update(json.loads(meta_path.read_text()))
    table.attrs["csv_path"] = str(path)
    return table


# ---- theory columns ------------------------------------------------------------------------

def _service_ms(rows: pd.DataFrame) -> float:
    """One request's handler time with no competition: its CPU plus its I/O wait."""
    ms = (rows["server_cpu_ms_mean"].fillna(0) + rows["server_io_ms_mean"].fillna(0))
    ms = ms[ms > 0]
    return float(ms.median()) if len(ms) else math.nan


def _row_server(rows: pd.DataFrame) -> dict:
    first = rows.iloc[0]
    return {col: (None if pd.isna(first.get(col)) else first.get(col)) for col in SERVER_COLUMNS}


def theory_curve(rows: pd.DataFrame, xs, x: str = "concurrency", y: str = "throughput_rps",
                 free_cores_only: bool = False):
    """Theory for one config's rows at load points xs: throughput_rps or latency_ms (lesson 03).

    Little's law with the config's slots and the measured uncontended service time, capped
    by the CPU ceiling (effective cores, one per worker process, over mean CPU ms).
    free_cores_only=True counts only the cores other programs left free (a shared machine).
    """
    service_ms = _service_ms(rows)
    if not math.isfinite(service_ms):
        return None
    cpu_ms = float(rows["server_cpu_ms_mean"].median())
    cores = float(rows["effective_cores"].median()) if "effective_cores" in rows else math.nan
    if free_cores_only:
        others = float(rows["others_cores"].median()) if "others_cores" in rows else math.nan
        cores = max(cores - (others if math.isfinite(others) else 0.0), 0.1)
    cpu_args = (cpu_ms, cores) if cpu_ms > 0 and math.isfinite(cores) else (None, None)
    cfg = _row_server(rows)
    xs = np.asarray(xs, dtype=float)
    if x == "rate_rps":
        capacity = theory.predict_throughput_rps(np.inf, cfg["slots"], service_ms / 1000.0, *cpu_args,
                                                 processes=cfg["workers"])
        if y == "throughput_rps":
            return np.minimum(xs, capacity)
        return np.where(xs < capacity, service_ms, np.nan)
    out = theory.predict_for_server(cfg, xs, service_ms / 1000.0, *cpu_args)
    return np.asarray(out[y], dtype=float)


def add_theory(table: pd.DataFrame) -> pd.DataFrame:
    """Add the theory columns to a sweep table: throughput, latency, service time (lesson 03).

    theory_throughput_rps and theory_latency_ms use all effective cores;
    theory_free_throughput_rps only the cores other programs left free (see others_cores).
    """
    table = table.copy()
    for col in ("theory_throughput_rps", "theory_latency_ms", "theory_free_throughput_rps", "service_ms"):
        table[col] = math.nan
    if len(table) == 0 or "server_cpu_ms_mean" not in table:
        return table
    for _, rows in table.groupby("config_index" if "config_index" in table else "config"):
        good = rows[rows["failure"].fillna("") == ""] if "failure" in rows else rows
        if len(good) == 0:
            continue
        closed = good["concurrency"].notna().all()
        x, xs = ("concurrency", rows["concurrency"]) if closed else ("rate_rps", rows["rate_rps"])
        throughput = theory_curve(good, xs, x=x, y="throughput_rps")
        if throughput is None:
            continue
        table.loc[rows.index, "theory_throughput_rps"] = throughput
        table.loc[rows.index, "theory_latency_ms"] = theory_curve(good, xs, x=x, y="latency_ms")
        table.loc[rows.index, "theory_free_throughput_rps"] = theory_curve(good, xs, x=x, y="throughput_rps",
                                                                           free_cores_only=True)
        table.loc[rows.index, "service_ms"] = _service_ms(good)
    return table


# ---- reference data -------------------------------------------------------------------------

def _reference_dir(out_dir=None) -> Path:
    return Path(out_dir) if out_dir is not None else data_dir() / "reference"


def record_reference(out_dir=None, repeats: int = 3, names=None, quiet: bool = False, attempts: int = 1,
                     quiet_cores: float = 0.3) -> list[Path]:
    """Run the course's reference sweeps and write each as <out_dir>/<name>.csv + .json (lesson 03).

    The sweeps are REFERENCE_SWEEPS (I/O scaling on gthread 1x32, CPU scaling with sync
    workers, threads vs workers on CPU); each file carries this machine's fingerprint.
    Takes about three minutes per attempt. On a shared machine, attempts > 1 runs a sweep
    again (after a pause) while other programs used more than `quiet_cores` cores, and keeps
    the quietest attempt; the .json records how busy the machine was (others_cores_mean,
    and a "note" when it was busy). Returns the CSV paths written.
    """
    out = _reference_dir(out_dir)
    names = list(names) if names is not None else list(REFERENCE_SWEEPS)
    unknown = set(names) - set(REFERENCE_SWEEPS)
    if unknown:
        raise ValueError(f"unknown reference sweep(s) {sorted(unknown)}; choose from {list(REFERENCE_SWEEPS)}.")
    if not isinstance(attempts, int) or attempts < 1:
        raise ValueError(f"attempts must be a whole number of at least 1, got {attempts!r}.")
    written = []
    for name in names:
        spec = REFERENCE_SWEEPS[name]
        best, best_others, tried = None, math.inf, 0
        while tried < attempts and best_others > quiet_cores:
            if tried:
                time.sleep(10)  # give the neighbours a moment
            table = sweep(spec["configs"], path=spec["path"], concurrencies=spec["concurrencies"],
                          duration=spec["duration"], repeats=repeats, name=name, save=False, quiet=quiet)
            if "labels" in spec:  # short names the lesson's bar chart uses
                table["config"] = table["config_index"].map(dict(enumerate(spec["labels"])))
            tried += 1
            others = float(table["others_cores"].mean()) if table["others_cores"].notna().any() else math.nan
            if best is None or (math.isfinite(others) and others < best_others):
                best, best_others = table, others
        table, others = best, best_others
        fingerprint = table.attrs.get("machine")
        if not fingerprint:  # every run failed: still say which machine it was
            from helpers.machine import machine as machine_fingerprint

            fingerprint = _jsonable(machine_fingerprint())
        table.attrs["machine"] = fingerprint
        note = (f"shared machine: other programs used ≈{others:.1f} cores on average while this was recorded"
                if math.isfinite(others) and others >= 0.25 else "")
        written.append(save_sweep(table, name, directory=out,
                                  meta={"reference": True, **_jsonable(spec), "repeats": repeats,
                                        "recorded_at": time.strftime("%Y-%m-%d %H:%M:%S %z"),
                                        "attempts": tried, "others_cores_mean": others, "note": note}))
    return written


def load_reference(name: str, directory=None) -> pd.DataFrame:
    """Read one reference sweep (e.g. "io_scaling") with its machine fingerprint in .attrs (lesson 03).

    Looks in `directory`, else data/reference/ under $COURSE_DATA_DIR and then the one
    shipped with the course.
    """
    candidates = [Path(directory)] if directory is not None else [data_dir() / "reference", ROOT / "data" / "reference"]
    for folder in candidates:
        if (folder / f"{name}.csv").exists():
            return load_sweep(folder / f"{name}.csv")
    known = sorted({p.stem for folder in candidates if folder.exists() for p in folder.glob("*.csv")})
    raise FileNotFoundError(f"no reference sweep named {name!r}; recorded ones: {known or 'none'} "
                            f"(python -m helpers record-reference writes them).")
