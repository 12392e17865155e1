"""Measure how closely this machine reproduces the numbers the lessons rely on.

Run it with the course's Python from the repository root:

    .venv/bin/python benchmarks/bench_accuracy.py [--repeats 3] [--quick]

It prints one line per check (measured, expected, ratio, pass/fail) and writes the figures
to benchmarks/results/accuracy-<time>.json. The checks (lessons 03 and 05):
  * I/O scaling: gthread 1 worker x 32 threads on /io?ms=200 at concurrency 1, 8, 32, 64;
    throughput within ±10% of concurrency / 0.2 s up to 32, capped at 32 / 0.2 s beyond,
    where latency roughly doubles (the knee).
  * CPU scaling: sync workers on /cpu?ms=20 at concurrency 4; 2 workers ≥ 1.6x one;
    1 worker x 4 threads ≤ 1.15x one sync worker, with each request slower.
  * CPU ceiling: the overlay (effective cores / CPU ms) within ±15% of the measured plateau.
  * Convoy effect: /io?ms=10 latency under gthread, alone and next to a thread burning CPU
    on /cpu?ms=200 in a loop; the factor is reported.
The machine is small and may be shared: figures move by several percent between runs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from helpers.load import run_load  # noqa: E402
from helpers.server import DemoServer  # noqa: E402
from helpers.sweep import sweep  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def check(name: str, measured: float, expected: str, ok: bool, **extra) -> dict:
    """Print one check and return it as a record."""
    print(f"{'PASS' if ok else 'FAIL'}  {name:<58} {measured:10.3f}   expected {expected}")
    return {"check": name, "measured": measured, "expected": expected, "ok": bool(ok), **extra}


def io_scaling(repeats: int, duration: float) -> list[dict]:
    table = sweep([{"worker_class": "gthread", "workers": 1, "threads": 32}], path="/io?ms=200",
                  concurrencies=[1, 8, 32, 64], duration=duration, repeats=repeats, save=False, quiet=True)
    by_c = table.groupby("concurrency")[["throughput_rps", "p50_ms", "theory_throughput_rps"]].mean()
    print(f"      (I/O sweep: other programs used ≈{table['others_cores'].mean():.2f} cores meanwhile)")
    out = []
    for c in (1, 8, 32):
        ideal = c / 0.2
        x = by_c.loc[c, "throughput_rps"]
        out.append(check(f"io gthread 1x32: c={c} throughput / (c / 0.2 s)", x / ideal, "0.90..1.10",
                         0.9 <= x / ideal <= 1.1, throughput_rps=x, ideal_rps=ideal))
    x64 = by_c.loc[64, "throughput_rps"]
    out.append(check("io gthread 1x32: c=64 throughput / (32 / 0.2 s)", x64 / 160.0, "<= 1.10",
                     x64 <= 160 * 1.1, throughput_rps=x64))
    knee = by_c.loc[64, "p50_ms"] / by_c.loc[32, "p50_ms"]
    out.append(check("io gthread 1x32: p50 latency c=64 / c=32 (the knee)", knee, "about 2 (1.6..2.4)",
                     1.6 <= knee <= 2.4, p50_ms_32=by_c.loc[32, "p50_ms"], p50_ms_64=by_c.loc[64, "p50_ms"]))
    theory_gap = (by_c["throughput_rps"] / by_c["theory_throughput_rps"]).to_dict()
    out.append(check("io gthread 1x32: worst measured / theory over c", min(theory_gap.values()), "0.90..1.10",
                     all(0.9 <= v <= 1.1 for v in theory_gap.values()), ratios=theory_gap))
    return out


def cpu_scaling(repeats: int, duration: float) -> list[dict]:
    configs = [{"workers": 1}, {"workers": 2}, {"workers": 1, "threads": 4}, {"workers": 4}]
    table = sweep(configs, path="/cpu?ms=20", concurrencies=[4], duration=duration, repeats=repeats,
                  save=False, quiet=True)
    by = table.groupby("config_index")[["throughput_rps", "p50_ms", "theory_throughput_rps", "client_cpu_percent",
                                        "others_cores", "server_cpu_ms_mean", "effective_cores", "workers"]].mean()
    # the same ceiling with only the cores other programs left free: tells theory from a busy machine apart
    free = (by["effective_cores"] - by["others_cores"]).clip(lower=0.1)
    by["free_ceiling_rps"] = free.where(free < by["workers"], by["workers"]) / (by["server_cpu_ms_mean"] / 1000.0)
    one, two, threads, four = (by.loc[i] for i in range(4))
    print(f"      (CPU sweep: other programs used ≈{table['others_cores'].mean():.2f} cores meanwhile)")
    out = [
        check("cpu sync: 2 workers / 1 worker throughput", two.throughput_rps / one.throughput_rps, ">= 1.6",
              two.throughput_rps >= 1.6 * one.throughput_rps,
              one_rps=one.throughput_rps, two_rps=two.throughput_rps),
        check("cpu: gthread 1x4 / 1 sync worker throughput", threads.throughput_rps / one.throughput_rps,
              "<= 1.15", threads.throughput_rps <= 1.15 * one.throughput_rps, threads_rps=threads.throughput_rps),
        check("cpu: gthread 1x4 / 1 sync worker, per-request handler time",
              table[table.config_index == 2]["server_app_ms_mean"].mean()
              / table[table.config_index == 0]["server_app_ms_mean"].mean(), "> 1.5 (GIL sharing)",
              table[table.config_index == 2]["server_app_ms_mean"].mean()
              > 1.5 * table[table.config_index == 0]["server_app_ms_mean"].mean()),
    ]
    for label, row in (("1 sync worker", one), ("2 sync workers", two), ("4 sync workers", four),
                       ("gthread 1x4", threads)):
        ratio = row.throughput_rps / row.theory_throughput_rps
        out.append(check(f"cpu ceiling overlay: measured / theory, {label}", ratio, "0.85..1.15",
                         0.85 <= ratio <= 1.15, theory_rps=row.theory_throughput_rps,
                         measured_rps=row.throughput_rps, client_cpu_percent=row.client_cpu_percent,
                         others_cores=row.others_cores, free_ceiling_rps=row.free_ceiling_rps))
        print(f"      measured / ceiling on the cores left free ({row.effective_cores - row.others_cores:.2f}): "
              f"{row.throughput_rps / row.free_ceiling_rps:.3f}")
    return out


def convoy(duration: float) -> list[dict]:
    """/io?ms=10 alone, then beside a stream that keeps one thread on /cpu?ms=200 back to back."""
    with DemoServer(workers=1, threads=4) as server:
        io_url = server.url + "/io?ms=10"
        alone = run_load(io_url, concurrency=1, duration=duration, quiet=True)
        beside = run_load({io_url: 1, server.url + "/cpu?ms=200": 1}, duration=duration, quiet=True)
    io_alone = alone.requests.query("ok")["latency_ms"]
    io_beside = beside.requests.query("ok and endpoint == '/io'")["latency_ms"]
    factor = io_beside.median() / io_alone.median()
    return [check("convoy: /io?ms=10 p50 next to a CPU-bound thread / alone", factor, "> 1.3 (report it)",
                  factor > 1.3, p50_alone_ms=io_alone.median(), p50_beside_ms=io_beside.median(),
                  p99_alone_ms=io_alone.quantile(0.99), p99_beside_ms=io_beside.quantile(0.99),
                  io_requests_alone=len(io_alone), io_requests_beside=len(io_beside))]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="1 repeat, shorter runs")
    args = parser.parse_args(argv)
    repeats = 1 if args.quick else args.repeats
    duration = 2.0 if args.quick else 4.0
    started = time.time()
    records = io_scaling(repeats, duration) + cpu_scaling(repeats, duration - 1) + convoy(duration)
    from helpers.machine import machine

    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / time.strftime("accuracy-%Y%m%d-%H%M%S.json")
    out.write_text(json.dumps({"machine": machine(), "repeats": repeats, "seconds": time.time() - started,
                               "checks": records}, indent=2, default=str))
    failed = [r for r in records if not r["ok"]]
    print(f"{len(records) - len(failed)}/{len(records)} checks passed in {time.time() - started:.0f} s; "
          f"figures in {out.relative_to(ROOT)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
