"""The simulated work behind the demo endpoints, independent of any web framework.

Both the Flask app and its aiohttp twin call these, so every server in the course
does exactly the same work per request. Each function returns the milliseconds it
spent waiting on (simulated) I/O, so the timing layer can report `io` honestly.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from dataclasses import dataclass

# Bounds on what a query string may ask for: no request may run for minutes.
MAX_MS = 10_000.0

# The first article's I/O distribution: a 100 ms floor plus a lognormal wait.
IO_FLOOR_S = 0.100
IO_MEDIAN_S = 0.300
IO_SIGMA = 0.2
# Its non-yielding call is a little shorter and tighter.
OOPS_MEDIAN_S = 0.250
OOPS_SIGMA = 0.12
# Its CPU work: json.dumps of a dict of 500..2000 entries.
CPU_MIN_ENTRIES = 500
CPU_MAX_ENTRIES = 2000

_CHUNK = {str(i): i for i in range(64)}  # one slice of CPU work, about 20-50 us


class BadParameter(ValueError):
    """A query parameter is missing its form or its range; becomes HTTP 400."""

    def __init__(self, name: str, value: str, allowed: str):
        super().__init__(f"parameter {name!r} must be {allowed}, got {value!r}")
        self.name, self.value, self.allowed = name, value, allowed


def parse_number(args, name: str, low: float, high: float, default=None):
    """Read a float query parameter and check it lies in [low, high]."""
    raw = args.get(name)
    if raw is None or raw == "":
        return default
    allowed = f"a number from {low:g} to {high:g}"
    try:
        value = float(raw)
    except ValueError:
        raise BadParameter(name, raw, allowed) from None
    if not math.isfinite(value) or not (low <= value <= high):
        raise BadParameter(name, raw, allowed)
    return value


def lognormal_wait_s(median_s: float, sigma: float) -> float:
    """The article's wait: a floor plus a lognormal draw around the median."""
    return IO_FLOOR_S + random.lognormvariate(math.log(median_s), sigma)


def wait_io(ms: float | None, sleep=time.sleep) -> float:
    """Block on simulated I/O for `ms` (or the article's distribution); return the I/O's own ms.

    `sleep` is time.sleep, which gevent's monkey-patching turns into a yield. The I/O itself
    takes exactly the time asked of it; if the thread then waits to run again (for the GIL,
    or for a gevent hub busy with another greenlet), that wait is not I/O: the timing layer
    reports it as contention (app - cpu - io).
    """
    seconds = ms / 1000.0 if ms is not None else lognormal_wait_s(IO_MEDIAN_S, IO_SIGMA)
    sleep(seconds)
    return seconds * 1000.0


def unpatched_sleep():
    """time.sleep as it was before gevent patched it: a call that never yields."""
    try:
        from gevent import monkey

        return monkey.get_original("time", "sleep")
    except ImportError:  # gevent absent: time.sleep is already the original
        return time.sleep


def wait_io_blocking(ms: float | None) -> float:
    """Simulated I/O that blocks the whole process even under gevent (the /oops call); returns its ms."""
    seconds = ms / 1000.0 if ms is not None else lognormal_wait_s(OOPS_MEDIAN_S, OOPS_SIGMA)
    unpatched_sleep()(seconds)
    return seconds * 1000.0


def burn_cpu(ms: float | None) -> float:
    """Do real Python work (holding the GIL); return 0.0 ms of I/O.

    With `ms`, work until this thread's CPU clock has advanced that much, so the
    CPU cost is the same whether or not other threads compete for the core.
    Without it, the article's json.dumps of a dict of 500..2000 entries.
    """
    if ms is None:
        size = random.randint(CPU_MIN_ENTRIES, CPU_MAX_ENTRIES)
        json.dumps({str(i): i for i in range(size)})
        return 0.0
    deadline = time.thread_time() + ms / 1000.0
    while time.thread_time() < deadline:
        json.dumps(_CHUNK)
    return 0.0


# ---- /mystery: the capstone's service with a hidden profile ------------------------------
# Each request does some CPU work, then waits on I/O; a few may block without yielding.
# The learner measures which resource binds, without reading this table first.
@dataclass(frozen=True)
class MysteryCase:
    cpu_ms: float         # CPU per request
    io_median_ms: float   # lognormal wait per request
    blocking_fraction: float = 0.0  # share of requests whose wait does not yield under gevent


MYSTERY_CASES = {
    "1": MysteryCase(cpu_ms=2.0, io_median_ms=150.0),
    "2": MysteryCase(cpu_ms=25.0, io_median_ms=10.0),
    "3": MysteryCase(cpu_ms=8.0, io_median_ms=120.0, blocking_fraction=0.03),
}
MYSTERY_DEFAULT_ENV = "LABAPP_MYSTERY"


@dataclass(frozen=True)
class MysteryStep:
    cpu_ms: float
    io_ms: float
    blocking: bool


def mystery_case(args) -> MysteryCase:
    """The case named by ?case=, else by $LABAPP_MYSTERY, else case 1."""
    name = args.get("case") or os.environ.get(MYSTERY_DEFAULT_ENV) or "1"
    if name not in MYSTERY_CASES:
        raise BadParameter("case", name, f"one of {', '.join(MYSTERY_CASES)}")
    return MYSTERY_CASES[name]


def mystery_step(case: MysteryCase) -> MysteryStep:
    """Draw one request's work from its case."""
    io_ms = random.lognormvariate(math.log(case.io_median_ms), 0.3) if case.io_median_ms else 0.0
    return MysteryStep(case.cpu_ms, min(io_ms, MAX_MS), random.random() < case.blocking_fraction)
