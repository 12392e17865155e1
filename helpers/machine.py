"""What machine a run was measured on: effective cores, memory limit, versions, where it ran.

Introduced in lesson 00. A container may see 16 CPUs in os.cpu_count() yet be allowed the
time of only 2 (a cgroup quota) or be pinned to a few (CPU affinity); every number the
course predicts from "cores" uses the smaller, effective figure. The cgroup readers take a
root folder so that tests can point them at fixture files.
"""

from __future__ import annotations

import functools
import math
import os
import platform
import socket
import sys
from pathlib import Path

__all__ = ["machine", "describe_machine", "effective_cores", "cgroup_cpu_quota", "cgroup_memory_limit_mb",
           "memory_limit_mb"]

_UNLIMITED_BYTES = 1 << 60  # cgroup v1 spells "no limit" as a huge number near 2**63
_PACKAGES = ("flask", "gunicorn", "gevent", "psutil", "numpy", "pandas")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _cgroup_paths(proc_cgroup: Path) -> dict:
    """Map controller -> this process's cgroup path, from /proc/self/cgroup ('' key for v2)."""
    paths = {}
    text = _read(proc_cgroup) or ""
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            paths[""] = path
        for name in controllers.split(","):
            if name:
                paths[name] = path
    return paths


def _candidate_dirs(base: Path, rel: str | None) -> list[Path]:
    """The process's cgroup folder and its ancestors up to `base` (limits nest: the smallest wins).

    Inside a container the recorded path often does not exist under the mount (the mount
    shows the container's own cgroup as its root), so `base` itself is always included.
    """
    dirs = []
    if rel:
        current = base / rel.lstrip("/")
        while True:
            if current.is_dir():
                dirs.append(current)
            if current == base or base not in current.parents:
                break
            current = current.parent
    if base not in dirs and base.is_dir():
        dirs.append(base)
    return dirs


def cgroup_cpu_quota(root: str | os.PathLike = "/sys/fs/cgroup",
                     proc_cgroup: str | os.PathLike = "/proc/self/cgroup") -> float | None:
    """CPU cores' worth of time the cgroup allows (quota / period), or None when unlimited.

    Reads cgroup v2 `cpu.max` ("max 100000" or "200000 100000") and cgroup v1
    `cpu.cfs_quota_us` / `cpu.cfs_period_us` (quota -1 = unlimited) under `root`.
    Introduced in lesson 00.
    """
    root = Path(root)
    paths = _cgroup_paths(Path(proc_cgroup))
    quotas = []
    # cgroup v2: one unified tree
    if (root / "cgroup.controllers").exists() or (root / "cpu.max").exists():
        for folder in _candidate_dirs(root, paths.get("")):
            text = _read(folder / "cpu.max")
            if not text:
                continue
            fields = text.split()
            if fields[0] != "max" and len(fields) >= 1:
                try:
                    period = float(fields[1]) if len(fields) > 1 else 100000.0
                    quotas.append(float(fields[0]) / period)
                except (ValueError, ZeroDivisionError):
                    pass
    # cgroup v1: a cpu (or cpu,cpuacct) hierarchy
    for name in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
        base = root / name
        if not base.is_dir():
            continue
        for folder in _candidate_dirs(base, paths.get("cpu")):
            quota, period = _read(folder / "cpu.cfs_quota_us"), _read(folder / "cpu.cfs_period_us")
            try:
                q, p = float(quota), float(period)
            except (TypeError, ValueError):
                continue
            if q > 0 and p > 0:
                quotas.append(q / p)
        break
    return min(quotas) if quotas else None


def cgroup_memory_limit_mb(root: str | os.PathLike = "/sys/fs/cgroup",
                           proc_cgroup: str | os.PathLike = "/proc/self/cgroup") -> float | None:
    """The cgroup's memory limit in MiB (v2 memory.max, v1 memory.limit_in_bytes), or None.

    Introduced in lesson 00.
    """
    root = Path(root)
    paths = _cgroup_paths(Path(proc_cgroup))
    limits = []
    if (root / "cgroup.controllers").exists() or (root / "memory.max").exists():
        for folder in _candidate_dirs(root, paths.get("")):
            text = _read(folder / "memory.max")
            if text and text != "max":
                try:
                    limits.append(int(text))
                except ValueError:
                    pass
    base = root / "memory"
    if base.is_dir():
        for folder in _candidate_dirs(base, paths.get("memory")):
            text = _read(folder / "memory.limit_in_bytes")
            try:
                value = int(text)
            except (TypeError, ValueError):
                continue
            if 0 < value < _UNLIMITED_BYTES:
                limits.append(value)
    return min(limits) / 2**20 if limits else None


def _affinity_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def effective_cores(root: str | os.PathLike = "/sys/fs/cgroup",
                    proc_cgroup: str | os.PathLike = "/proc/self/cgroup") -> float:
    """Cores this process can really use: the smaller of CPU affinity and the cgroup quota (lesson 00).

    An int when whole (2), else a float (1.5 for a quota of 150000/100000).
    """
    cores = float(_affinity_cores())
    quota = cgroup_cpu_quota(root, proc_cgroup)
    if quota is not None:
        cores = min(cores, quota)
    return int(cores) if float(cores).is_integer() else round(cores, 2)


def _total_memory_mb() -> float:
    try:
        import psutil

        return psutil.virtual_memory().total / 2**20
    except Exception:  # psutil missing or unreadable /proc: fall back to sysconf
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20


def memory_limit_mb(root: str | os.PathLike = "/sys/fs/cgroup",
                    proc_cgroup: str | os.PathLike = "/proc/self/cgroup") -> float:
    """Memory this process may use, in MiB: the cgroup limit, or total RAM when there is none (lesson 00)."""
    total = _total_memory_mb()
    limit = cgroup_memory_limit_mb(root, proc_cgroup)
    return min(total, limit) if limit is not None else total


@functools.lru_cache(maxsize=1)
def _static_facts() -> dict:
    """The parts that cannot change while this Python process lives (versions, platform)."""
    from importlib import metadata

    versions = {}
    for name in _PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {"python": platform.python_version(), "implementation": platform.python_implementation(),
            "platform": platform.platform(), "hostname": socket.gethostname(), "versions": versions}


def machine() -> dict:
    """Fingerprint of this machine, stored with every run (lesson 00).

    Keys: effective_cores, affinity_cores, cpu_quota_cores (None = no quota), os_cpu_count,
    memory_limit_mb, memory_total_mb, python, implementation, platform, hostname,
    versions {flask, gunicorn, gevent, psutil, numpy, pandas}, on_binder, on_jupyterhub,
    quick_mode.
    """
    quota = cgroup_cpu_quota()
    affinity = _affinity_cores()
    cores = float(affinity) if quota is None else min(float(affinity), quota)
    total_mb = _total_memory_mb()
    limit = cgroup_memory_limit_mb()
    facts = dict(_static_facts())
    facts["versions"] = dict(facts["versions"])
    return {
        "effective_cores": int(cores) if cores.is_integer() else round(cores, 2),
        "affinity_cores": affinity,
        "cpu_quota_cores": None if quota is None else round(quota, 3),
        "os_cpu_count": os.cpu_count(),
        "memory_limit_mb": round(min(total_mb, limit) if limit is not None else total_mb, 1),
        "memory_total_mb": round(total_mb, 1),
        **facts,
        "on_binder": any(key.startswith("BINDER_") for key in os.environ),
        "on_jupyterhub": bool(os.environ.get("JUPYTERHUB_SERVICE_PREFIX")),
        "quick_mode": os.environ.get("COURSE_QUICK") == "1",
    }


def describe_machine(info: dict | None = None) -> str:
    """One line about this machine (or a stored fingerprint), e.g. for a figure's caption (lesson 00).

    "2 effective cores (cgroup quota: none), 23.4 GiB memory limit, Python 3.11.7 — local"
    """
    info = machine() if info is None else info
    cores = info.get("effective_cores")
    quota = info.get("cpu_quota_cores")
    quota_text = "none" if quota is None else f"{quota:g} cores"
    where = "Binder" if info.get("on_binder") else "JupyterHub" if info.get("on_jupyterhub") else "local"
    if info.get("quick_mode"):
        where += ", quick mode"
    memory_gib = (info.get("memory_limit_mb") or math.nan) / 1024
    plural = "" if cores == 1 else "s"
    return (f"{cores} effective core{plural} (cgroup quota: {quota_text}), {memory_gib:.1f} GiB memory limit, "
            f"Python {info.get('python', sys.version.split()[0])} — {where}")
