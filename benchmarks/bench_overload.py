"""Overload scenarios: does every run end on time and keep every request?

    .venv/bin/python benchmarks/bench_overload.py

For each scenario prints the requested duration, the wall time the call took, the client
timeout, rows vs requests the client attempted, and errors by class. A run must end within
duration + timeout + a few seconds, whatever the server does.
"""

import signal
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers import DemoServer  # noqa: E402
from helpers.load import run_load  # noqa: E402
from helpers.machine import describe_machine  # noqa: E402


def scenario(name, server_kwargs, load_kwargs, during=None):
    with DemoServer(**server_kwargs) as server:
        if during:
            threading.Timer(1.0, during, (server,)).start()
        t0 = time.perf_counter()
        run = run_load(server.url + load_kwargs.pop("path"), quiet=True, **load_kwargs)
        wall_s = time.perf_counter() - t0
    s = run.summary()
    requested = load_kwargs.get("duration") or 0
    errors = ", ".join(f"{k} {v:,}" for k, v in s["errors"].items()) or "none"
    print(f"{name:<44} {requested:>4g} s -> {wall_s:5.1f} s (timeout {load_kwargs.get('timeout', 10):g} s) | "
          f"rows {len(run.requests):,} = attempts {s['requests']:,}, ok {s['ok']:,}, dropped {s['dropped']:,} | {errors}")
    for sentence in s["explanations"]:
        print(f"    {sentence}")


def main():
    print(describe_machine())
    scenario("1 sync, /io?ms=200, closed loop c=1000", dict(workers=1),
             dict(path="/io?ms=200", concurrency=1000, duration=3, timeout=2))
    scenario("1 sync, /io?ms=200, open loop 500 req/s", dict(workers=1),
             dict(path="/io?ms=200", rate=500, duration=3, timeout=2))
    scenario("1 sync, backlog 16, closed loop c=1000", dict(workers=1, backlog=16),
             dict(path="/io?ms=200", concurrency=1000, duration=3, timeout=2))
    scenario("2 gthread x 4, master SIGKILLed after 1 s", dict(workers=2, threads=4),
             dict(path="/io?ms=20", concurrency=16, duration=4, timeout=2),
             during=lambda server: server.proc.send_signal(signal.SIGKILL))
    scenario("1 sync timeout=1, /io?ms=3000", dict(workers=1, timeout=1),
             dict(path="/io?ms=3000", concurrency=2, duration=4, timeout=5))


if __name__ == "__main__":
    main()
