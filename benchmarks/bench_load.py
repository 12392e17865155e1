"""How close does run_load come to wrk (and ab) on the same server? Not a test: a measurement.

    .venv/bin/python benchmarks/bench_load.py [--repeats 3] [--duration 5] [--quick]

Starts one gevent server (2 workers) and, for each scenario, runs `repeats` rounds; each round
runs wrk and run_load back to back (alternating which goes first) and then ab. On a shared,
noisy machine the back-to-back pair sees nearly the same background load, so the verdict uses
the median of the per-round ratios run_load / wrk; the median throughput of each tool and the
client CPU it used (% of one core, from the kernel's accounting) are printed too.
Targets: >= 0.95x wrk on /io?ms=200 at 400 connections, >= 0.75x wrk on /health at 50.

wrk and ab are installed with apt-get when missing (and when that is allowed); a tool that
cannot be had is skipped with a message.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from helpers.load import run_load  # noqa: E402
from helpers.machine import describe_machine  # noqa: E402
from helpers.server import DemoServer  # noqa: E402

SCENARIOS = [  # (path, connections, target ratio to wrk)
    ("/io?ms=200", 400, 0.95),
    ("/health", 50, 0.75),
]


def ensure_tools() -> dict:
    """Paths of wrk and ab, installing them with apt-get if they are missing and we may."""
    tools = {"wrk": shutil.which("wrk"), "ab": shutil.which("ab")}
    if all(tools.values()):
        return tools
    if shutil.which("apt-get") and os.geteuid() == 0:
        print("installing wrk and apache2-utils with apt-get ...", flush=True)
        subprocess.run("apt-get update -qq && apt-get install -y -qq wrk apache2-utils", shell=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
        tools = {"wrk": shutil.which("wrk"), "ab": shutil.which("ab")}
    for name, path in tools.items():
        if not path:
            print(f"note: {name} is not available (apt-get missing, not root, or offline); skipping it.")
    return tools


def run_timed(cmd: list[str]) -> tuple[str, float, float]:
    """Run a command; return its output, wall seconds and CPU seconds (user + system)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = proc.stdout.read().decode("utf-8", "replace")
    _, status, usage = os.wait4(proc.pid, 0)  # wait4 hands back the child's CPU accounting
    proc.returncode = os.waitstatus_to_exitcode(status)
    return out, time.perf_counter() - t0, usage.ru_utime + usage.ru_stime


def bench_wrk(wrk: str, url: str, connections: int, duration_s: float) -> tuple[float, float]:
    out, _, cpu_s = run_timed([wrk, "-t2", f"-c{connections}", f"-d{duration_s:g}s", "--timeout", "10s", url])
    match = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if not match:
        raise RuntimeError(f"wrk output not understood:\n{out}")
    return float(match.group(1)), 100.0 * cpu_s / duration_s


def bench_ab(ab: str, url: str, connections: int, duration_s: float) -> tuple[float, float]:
    out, wall_s, cpu_s = run_timed([ab, "-k", "-q", "-c", str(connections), "-t", f"{duration_s:g}",
                                    "-n", "10000000", "-s", "10", url])
    match = re.search(r"Requests per second:\s+([\d.]+)", out)
    if not match:
        raise RuntimeError(f"ab output not understood:\n{out[-2000:]}")
    return float(match.group(1)), 100.0 * cpu_s / max(wall_s, duration_s)


def bench_ours(url: str, connections: int, duration_s: float, **kw) -> tuple[float, float, dict]:
    run = run_load(url, concurrency=connections, duration=duration_s, quiet=True, **kw)
    s = run.summary()
    if s["errors"]:
        print(f"  (run_load saw errors: {dict(s['errors'])})")
    return s["throughput_rps"], s["client_cpu_percent"], s


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--quick", action="store_true", help="one repeat of 3 s each")
    parser.add_argument("--processes", type=int, default=None, help="client processes for run_load")
    args = parser.parse_args()
    repeats, duration_s = (1, 3.0) if args.quick else (args.repeats, args.duration)
    tools = ensure_tools()
    print(describe_machine())
    print(f"load average before: {os.getloadavg()[0]:.2f} (other work on this machine skews all tools alike)\n")
    ok = True
    with DemoServer(workers=2, worker_class="gevent") as server:
        for path, connections, target in SCENARIOS:
            url = server.url + path
            results: dict[str, list[tuple[float, float]]] = {"wrk": [], "ab": [], "run_load": []}
            ratios = []
            for round_no in range(repeats):
                pair = {}
                order = ["wrk", "run_load"] if round_no % 2 == 0 else ["run_load", "wrk"]
                for tool in order:
                    if tool == "wrk" and tools["wrk"]:
                        pair["wrk"] = bench_wrk(tools["wrk"], url, connections, duration_s)
                    elif tool == "run_load":
                        rps, cpu, _ = bench_ours(url, connections, duration_s, processes=args.processes)
                        pair["run_load"] = (rps, cpu)
                    time.sleep(0.3)
                for tool, value in pair.items():
                    results[tool].append(value)
                if "wrk" in pair:
                    ratios.append(pair["run_load"][0] / pair["wrk"][0])
                if tools["ab"]:
                    results["ab"].append(bench_ab(tools["ab"], url, connections, duration_s))
                    time.sleep(0.3)
            print(f"{path} with {connections} connections, {duration_s:g} s x {repeats} rounds "
                  f"(load average now {os.getloadavg()[0]:.1f}):")
            med = {}
            for name, values in results.items():
                if not values:
                    continue
                med[name] = statistics.median(v[0] for v in values)
                cpu = statistics.median(v[1] for v in values)
                each = ", ".join(f"{v[0]:,.0f}" for v in values)
                print(f"  {name:<9} {med[name]:>9,.0f} req/s (runs: {each})   client CPU {cpu:5.0f}% of one core")
            if ratios:
                ratio = statistics.median(ratios)
                verdict = "meets" if ratio >= target else "MISSES"
                ok &= ratio >= target
                print(f"  run_load / wrk = {ratio:.2f} (median of paired rounds: "
                      f"{', '.join(f'{r:.2f}' for r in ratios)}; {verdict} the {target:.2f} target)")
            if "ab" in med:
                print(f"  run_load / ab  = {med['run_load'] / med['ab']:.2f} (medians)")
            print()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
