"""How fast DemoServer starts and stops, and how soon servers die with their owner.

    .venv/bin/python benchmarks/bench_server.py [--repeats 10]

Targets (issue 2): ready in <= 1 s for 4 sync workers on the 2-core box; servers gone
within 5 s of their owning kernel being SIGKILLed. Prints medians and maxima.
"""

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers import DemoServer  # noqa: E402
from helpers.machine import describe_machine  # noqa: E402

CONFIGS = {
    "4 sync": dict(workers=4),
    "1 sync": dict(workers=1),
    "2 gthread x 8": dict(workers=2, threads=8),
    "2 gevent": dict(workers=2, worker_class="gevent"),
    "4 sync, preload": dict(workers=4, preload=True),
    "2 aiohttp": dict(workers=2, server="aiohttp"),
}

OWNER = """
import json
from helpers import DemoServer
s = DemoServer(workers=4).start()
print(json.dumps([s.master_pid] + s.pids["workers"]), flush=True)
input()
"""


def time_start_stop(kwargs, repeats):
    ready, stop = [], []
    for _ in range(repeats):
        server = DemoServer(**kwargs)
        t0 = time.perf_counter()
        server.start()
        ready.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        server.stop()
        stop.append(time.perf_counter() - t0)
    return ready, stop


def time_orphan_cleanup(repeats):
    gone_s = []
    for _ in range(repeats):
        owner = subprocess.Popen([sys.executable, "-c", OWNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 text=True, start_new_session=True)
        pids = json.loads(owner.stdout.readline())
        owner.kill()
        owner.wait()
        t0 = time.perf_counter()
        while any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids):
            if time.perf_counter() - t0 > 30:
                break
            time.sleep(0.01)
        gone_s.append(time.perf_counter() - t0)
    return gone_s


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    print(describe_machine())
    print(f"{'config':<18} {'ready median':>13} {'ready max':>10} {'stop median':>12}")
    for name, kwargs in CONFIGS.items():
        ready, stop = time_start_stop(kwargs, args.repeats)
        print(f"{name:<18} {statistics.median(ready) * 1000:>10.0f} ms {max(ready) * 1000:>7.0f} ms "
              f"{statistics.median(stop) * 1000:>9.0f} ms")
    gone = time_orphan_cleanup(max(3, args.repeats // 2))
    print(f"owner SIGKILLed -> all 5 processes gone: median {statistics.median(gone):.2f} s, max {max(gone):.2f} s")


if __name__ == "__main__":
    main()
