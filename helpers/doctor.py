"""`python -m helpers doctor`: check this machine is ready for the course, one screen, with fixes.

Run it before a workshop (learners/setup.md). Exit code 0 when nothing is broken, 1 otherwise;
warnings (1 CPU, low limits) leave the exit code at 0 but say what changes in the lessons.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import sys
import time
from importlib import metadata
from pathlib import Path

OK, WARN, FAIL = "ok", "warn", "FAIL"
REQUIREMENTS = Path(__file__).resolve().parents[1] / "requirements.txt"


def pinned_requirements(path: Path = REQUIREMENTS) -> dict[str, str]:
    """Package name -> pinned version from requirements.txt (names normalised as pip does).

    Pins under a `# --- test-only` heading are left out: learners on Binder/conda don't have them.
    """
    pins = {}
    if path.exists():
        for line in path.read_text().splitlines():
            heading = re.match(r"^\s*#\s*---\s*(.*?)\s*-*\s*$", line)
            if heading and heading.group(1).startswith("test-only"):
                break
            match = re.match(r"^\s*([A-Za-z0-9_.\-]+)\s*==\s*([^\s#;]+)", line)
            if match:
                pins[re.sub(r"[-_.]+", "-", match.group(1)).lower()] = match.group(2)
    return pins


def check_python():
    version = ".".join(map(str, sys.version_info[:3]))
    if sys.version_info < (3, 11):
        return FAIL, f"Python {version}", "the course needs Python 3.11 or newer: run `make lab` or use environment.yml"
    return OK, f"Python {version} ({sys.executable})", ""


def check_packages():
    pins = pinned_requirements()
    missing, different = [], []
    for name, want in pins.items():
        try:
            have = metadata.version(name)
        except metadata.PackageNotFoundError:
            missing.append(name)
            continue
        if have != want:
            different.append(f"{name} {have} (pinned {want})")
    if missing:
        return FAIL, f"missing packages: {', '.join(missing)}", "run `make setup` (or `pip install -r requirements.txt`)"
    if different:
        return WARN, f"versions differ from the pins: {', '.join(different)}", "figures may differ from the lessons'; `make setup` installs the pinned set"
    return OK, f"{len(pins)} pinned packages installed", ""


def check_worker_classes():
    from helpers.server import DemoServer

    timings, failures = [], []
    for kwargs in (dict(workers=1), dict(workers=1, threads=2), dict(workers=1, worker_class="gevent")):
        server = DemoServer(start_timeout_s=20, **kwargs)
        t0 = time.perf_counter()
        try:
            server.start()
            timings.append(f"{server.worker_class} {1000 * (time.perf_counter() - t0):.0f} ms")
        except Exception as err:  # report every failure, keep checking the others
            failures.append(f"{server.worker_class}: {str(err).splitlines()[0]}")
        finally:
            server.stop()
    if failures:
        return FAIL, "could not start: " + "; ".join(failures), "run `python -m helpers serve` to see the full log"
    return OK, "started and stopped " + ", ".join(timings), ""


def check_cores_and_memory():
    from helpers.machine import machine

    info = machine()
    cores, memory_mb = info["effective_cores"], info["memory_limit_mb"]
    text = f"{cores:g} effective core(s), {memory_mb / 1024:.1f} GiB memory limit"
    if cores < 2:
        return WARN, text, "CPU-scaling lessons (04, 09) will overlay the 2-core reference data to show what more cores do"
    if memory_mb < 1500:
        return WARN, text, "keep to few workers: each gunicorn worker costs ~30-60 MB"
    return OK, text, ""


def check_open_files():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    text = f"open-file limit {soft} (hard {hard})"
    if hard != resource.RLIM_INFINITY and hard < 2048:
        return WARN, text, "load tests above ~1,000 connections will be refused a socket; raise `ulimit -n`"
    return OK, text + ("; load runs raise the soft limit as needed" if soft < 4096 else ""), ""


def check_somaxconn():
    try:
        value = int(Path("/proc/sys/net/core/somaxconn").read_text())
    except (OSError, ValueError):
        return OK, "somaxconn unknown (not Linux?)", ""
    if value < 1024:
        return WARN, f"net.core.somaxconn = {value}", "gunicorn's backlog is capped by it: overload lessons show refusals sooner"
    return OK, f"net.core.somaxconn = {value}", ""


def check_where():
    from helpers.machine import machine

    info = machine()
    where = "Binder" if info.get("on_binder") else "JupyterHub" if info.get("on_jupyterhub") else "local machine"
    return OK, f"running on: {where}", ""


def check_stale_servers():
    from helpers.server import running

    stale = [e for e in running() if not e["owner_alive"]]
    if stale:
        return WARN, f"{len(stale)} course server(s) left by earlier kernels", "run `helpers.stop_all(stale=True)` in a notebook"
    return OK, "no stray course servers", ""


def check_data_dir():
    data = Path(os.environ.get("COURSE_DATA_DIR") or Path(__file__).resolve().parents[1] / "data")
    try:
        data.mkdir(parents=True, exist_ok=True)
        probe = data / f".doctor-{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as err:
        return FAIL, f"cannot write to {data}: {err.strerror}", "set COURSE_DATA_DIR to a writable folder"
    return OK, f"results are saved under {data}", ""


CHECKS = [("python", check_python), ("packages", check_packages), ("servers", check_worker_classes),
          ("machine", check_cores_and_memory), ("where", check_where), ("open files", check_open_files),
          ("backlog", check_somaxconn), ("strays", check_stale_servers), ("data", check_data_dir)]


def run_checks() -> list[tuple[str, str, str, str]]:
    """Run every check; each result is (name, level, what was found, how to fix it)."""
    results = []
    for name, check in CHECKS:
        try:
            level, text, fix = check()
        except Exception as err:  # a check that crashes is itself a finding
            level, text, fix = FAIL, f"check crashed: {type(err).__name__}: {err}", "report this to your instructor"
        results.append((name, level, text, fix))
    return results


def cli(argv: list[str]) -> int:
    """Print the doctor's one-screen verdict; exit 1 when something is broken (lesson 00)."""
    parser = argparse.ArgumentParser(prog="python -m helpers doctor", description=__doc__.splitlines()[0])
    parser.parse_args(argv)
    results = run_checks()
    width = max(len(name) for name, *_ in results)
    for name, level, text, fix in results:
        print(f"[{level:>4}] {name:<{width}}  {text}")
        if fix:
            print(f"{'':>7} {'':<{width}}  -> {fix}")
    broken = [r for r in results if r[1] == FAIL]
    warned = [r for r in results if r[1] == WARN]
    if broken:
        print(f"\nVerdict: NOT READY - {len(broken)} problem(s) to fix above.")
        return 1
    print("\nVerdict: ready" + (f", with {len(warned)} note(s) above." if warned else "."))
    return 0
