"""Save runs to disk and read them back: data/runs/<name>/ with two CSVs and a meta.json.

Introduced in lesson 01 (`run.save()`, `load_run(...)`). A saved run is plain files a learner
can open anywhere: requests.csv (one row per attempted request), samples.csv (psutil
samples) and meta.json (config, machine fingerprint, summary, client statistics).

Writes are atomic: a run is assembled in a hidden temporary folder and moved into place with
os.replace, so an interrupted save leaves the previous version or nothing, never half a run.
The data folder is $COURSE_DATA_DIR if set, else <repository>/data.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import tempfile
import time
import uuid
from pathlib import Path

__all__ = ["data_dir", "runs_dir", "save_run", "load_run", "list_runs", "atomic_write_text", "slug",
           "read_requests_csv", "read_samples_csv"]

ROOT = Path(__file__).resolve().parents[1]
FORMAT_VERSION = 1

# dtypes of Run.requests when read back from CSV (the CSV itself cannot say)
REQUEST_DTYPES = {
    "request_id": "int64", "url": "str", "endpoint": "str", "client_thread": "int64",
    "intended_s": "float64", "send_s": "float64", "end_s": "float64", "latency_ms": "float64",
    "latency_intended_ms": "float64", "schedule_lag_ms": "float64", "connect_ms": "float64",
    "status": "int64", "error": "str", "ok": "bool", "server_app_ms": "float64",
    "server_cpu_ms": "float64", "server_io_ms": "float64", "worker_pid": "Int64",
    "worker_thread": "Int64", "handler_start_s": "float64", "handler_end_s": "float64",
    "queue_ms": "float64", "contention_ms": "float64",
}


def data_dir() -> Path:
    """The folder runs and sweeps are saved under: $COURSE_DATA_DIR, else <repo>/data (lesson 01)."""
    return Path(os.environ.get("COURSE_DATA_DIR") or ROOT / "data")


def runs_dir() -> Path:
    """The folder saved runs live in: <data dir>/runs (lesson 01)."""
    return data_dir() / "runs"


def slug(text: str) -> str:
    """A file-name-safe version of text: letters, digits, '-', '_' and '.' only.

    Names saved runs (lesson 01).
    """
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", str(text)).strip("-.")
    return cleaned[:80] or "run"


def _jsonable(value):
    """Turn numpy scalars, NaN and other oddities into plain JSON (NaN becomes null)."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return int(value)
    if hasattr(value, "item") and not isinstance(value, (list, dict)):
        try:
            value = value.item()  # numpy scalar
        except (ValueError, TypeError):
            return str(value)
        return _jsonable(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    return str(value)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write a text file so a reader sees the old version or the new one, never half (lesson 01)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def _check_name(name: str) -> str:
    if not isinstance(name, str) or not name or name != slug(name) or name.startswith("."):
        raise ValueError(f"a run name must be a plain folder name (letters, digits, '-', '_', '.'), got {name!r}; "
                         f"try {slug(name)!r}.")
    return name


def save_run(run, name: str | None = None, directory: str | os.PathLike | None = None) -> Path:
    """Write a Run to <runs dir>/<name>/ (requests.csv, samples.csv, meta.json); return the folder (lesson 01).

    name defaults to the run's start time and label, e.g. 20250101-120000-gevent-io.
    An existing run of that name is replaced, atomically.
    """
    if name is None:
        started = (run.config or {}).get("started_at") or time.time()
        label = (run.config or {}).get("label") or (run.config or {}).get("mode") or "run"
        name = f"{time.strftime('%Y%m%d-%H%M%S', time.localtime(started))}-{slug(label)}"
    _check_name(name)
    base = Path(directory) if directory is not None else runs_dir()
    base.mkdir(parents=True, exist_ok=True)
    final = base / name
    staging = base / f".{name}.{uuid.uuid4().hex[:8]}.tmp"
    staging.mkdir()
    try:
        run.requests.to_csv(staging / "requests.csv", index=False)
        run.samples.to_csv(staging / "samples.csv", index=False)
        meta = {"format": FORMAT_VERSION, "name": name, "saved_at": time.time(), "config": run.config,
                "machine": run.machine, "interrupted": bool(run.interrupted),
                "client": getattr(run, "client", {}) or {}, "summary": dict(run.summary())}
        (staging / "meta.json").write_text(json.dumps(_jsonable(meta), indent=2))
        for child in staging.iterdir():  # data on disk before the rename makes it visible
            with open(child, "rb") as fh:
                os.fsync(fh.fileno())
        if final.exists():
            old = base / f".{name}.{uuid.uuid4().hex[:8]}.old"
            os.replace(final, old)
            os.replace(staging, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return final


def _resolve(name_or_path: str | os.PathLike) -> Path:
    path = Path(name_or_path)
    if path.is_dir() and (path / "meta.json").exists():
        return path
    candidate = runs_dir() / str(name_or_path)
    if candidate.is_dir() and (candidate / "meta.json").exists():
        return candidate
    raise FileNotFoundError(f"no saved run called {str(name_or_path)!r} (looked in {runs_dir()}); "
                            f"list_runs() shows what there is.")


def read_requests_csv(path: str | os.PathLike):
    """Read a requests.csv back with the documented dtypes ('' errors, nullable worker ids).

    What load_run uses (lesson 01); handy for a CSV copied from elsewhere.
    """
    import pandas as pd

    frame = pd.read_csv(path, keep_default_na=False, na_values={c: ["", "NaN", "nan", "<NA>"]
                        for c, d in REQUEST_DTYPES.items() if d not in ("str", "bool")})
    for col, dtype in REQUEST_DTYPES.items():
        if col not in frame:
            continue
        if dtype == "bool":
            frame[col] = frame[col].astype(str).str.lower().isin(["true", "1"])
        elif dtype == "str":
            frame[col] = frame[col].astype("str")
        elif dtype == "Int64":
            frame[col] = pd.to_numeric(frame[col], errors="coerce").astype("Int64")
        else:
            frame[col] = pd.to_numeric(frame[col], errors="coerce").astype(dtype)
    return frame


def read_samples_csv(path: str | os.PathLike):
    """Read a samples.csv back with the documented dtypes (lesson 02's resource samples)."""
    import pandas as pd

    from helpers.monitor import samples_frame

    return samples_frame(pd.read_csv(path))


def load_run(name_or_path: str | os.PathLike):
    """Read a saved run back as a Run (by name from data/runs/, or a folder path) (lesson 01)."""
    from helpers.load import Run

    folder = _resolve(name_or_path)
    meta = json.loads((folder / "meta.json").read_text())
    requests = read_requests_csv(folder / "requests.csv")
    samples = read_samples_csv(folder / "samples.csv")
    return Run(config=meta.get("config") or {}, requests=requests, samples=samples,
               machine=meta.get("machine") or {}, interrupted=bool(meta.get("interrupted")),
               client=meta.get("client") or {}, path=str(folder))


def list_runs(directory: str | os.PathLike | None = None):
    """Saved runs, newest first, as a DataFrame: name, label, mode, requests, throughput_rps, p50_ms, p99_ms, saved_at (lesson 01)."""
    import pandas as pd

    base = Path(directory) if directory is not None else runs_dir()
    rows = []
    if base.is_dir():
        for meta_path in base.glob("*/meta.json"):
            if meta_path.parent.name.startswith("."):
                continue
            try:
                meta = json.loads(meta_path.read_text())
            except (OSError, ValueError):
                continue
            summary = meta.get("summary") or {}
            config = meta.get("config") or {}
            latency = summary.get("latency_ms") or {}
            rows.append({"name": meta_path.parent.name, "label": config.get("label"), "mode": config.get("mode"),
                         "requests": summary.get("requests"), "throughput_rps": summary.get("throughput_rps"),
                         "p50_ms": latency.get("p50"), "p99_ms": latency.get("p99"),
                         "saved_at": pd.Timestamp(meta.get("saved_at", 0), unit="s")})
    columns = ["name", "label", "mode", "requests", "throughput_rps", "p50_ms", "p99_ms", "saved_at"]
    frame = pd.DataFrame(rows, columns=columns)
    return frame.sort_values("saved_at", ascending=False, ignore_index=True)
