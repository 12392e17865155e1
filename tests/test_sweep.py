"""Sweeps: a real sweep gives one tidy row per run, saved atomically; every server is cleaned up
even when a config fails to start or a server is killed midway."""

import json
import os
import signal
import threading
import time
import urllib.request

import pandas as pd
import pytest

from helpers import sweep as sweep_mod
from helpers.server import running
from helpers.sweep import SweepError, load_reference, load_sweep, record_reference, sweep
from conftest import wait_gone

BAD_APP = {"app": "labapp:no_such_factory()"}  # gunicorn exits at once: the app cannot load


def _my_servers() -> list[dict]:
    return [entry for entry in running() if entry["owner_pid"] == os.getpid()]


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:
            return resp.status == 200
    except OSError:
        return False


def test_sweep_rows_columns_theory_and_files():
    table = sweep([{"workers": 1}, {"workers": 2}], path="/cpu?ms=10", concurrencies=[1, 2],
                  duration=0.8, name="two-configs", quiet=True)
    assert len(table) == 4
    for col in ("config", "workers", "threads", "worker_class", "slots", "concurrency", "repeat",
                "throughput_rps", "p50_ms", "p90_ms", "p99_ms", "errors", "client_cpu_percent", "saturated",
                "server_cpu_ms_mean", "effective_cores", "theory_throughput_rps", "theory_latency_ms", "failure"):
        assert col in table, col
    assert (table["failure"] == "").all()
    assert (table["throughput_rps"] > 0).all()
    assert table["server_cpu_ms_mean"].between(7, 20).all()  # /cpu?ms=10 burns 10 ms of this thread's CPU
    # one worker: Little's law and the CPU ceiling both say about 1 / 10 ms = 100 req/s
    one = table[table["workers"] == 1]
    assert one["theory_throughput_rps"].between(70, 110).all()
    assert not _my_servers()
    saved = load_sweep("two-configs")
    pd.testing.assert_series_equal(saved["throughput_rps"], table["throughput_rps"], check_names=False)
    meta = json.loads((sweep_mod.data_dir() / "sweeps" / "two-configs.json").read_text())
    assert meta["path"] == "/cpu?ms=10" and meta["rows"] == 4 and "effective_cores" in meta["machine"]
    assert not list((sweep_mod.data_dir() / "sweeps").glob(".*tmp"))  # no half-written leftovers


def test_a_config_that_fails_to_start_is_recorded_and_the_rest_runs():
    table = sweep([{"workers": 1}, BAD_APP, {"workers": 1, "threads": 2}], path="/io?ms=20",
                  concurrencies=[2], duration=0.6, save=False, quiet=True)
    assert list(table["failure"] == "") == [True, False, True]
    assert "did not start" in table.loc[1, "failure"]
    assert table.loc[[0, 2], "throughput_rps"].gt(0).all()
    assert not _my_servers()


def test_a_server_killed_midway_is_noted_restarted_and_cleaned_up():
    masters: list[int] = []
    done = threading.Event()

    def kill_first_server_mid_run():
        while not done.is_set():
            mine = [entry for entry in _my_servers() if entry["url"]]
            if mine and _answers(mine[0]["url"] + "/health"):
                masters.append(mine[0]["master_pid"])
                time.sleep(0.5)  # well inside the first 1.5 s run
                os.kill(mine[0]["master_pid"], signal.SIGKILL)  # a server this test started
                return
            time.sleep(0.02)

    killer = threading.Thread(target=kill_first_server_mid_run, daemon=True)
    killer.start()
    try:
        table = sweep([{"workers": 2}], path="/io?ms=20", concurrencies=[2, 4], duration=1.5,
                      save=False, quiet=True)
    finally:
        done.set()
        killer.join(timeout=5)
    assert masters, "the server never showed up in running()"
    assert "died" in table.loc[0, "failure"]
    assert table.loc[1, "failure"] == "" and table.loc[1, "throughput_rps"] > 0  # restarted for the next point
    assert not _my_servers()
    assert not wait_gone(masters, within_s=5)


def test_on_error_raise_stops_everything_first():
    with pytest.raises(SweepError, match="did not start"):
        sweep([{"workers": 1}, BAD_APP], path="/io?ms=5", concurrencies=[1], duration=0.4,
              save=False, quiet=True, on_error="raise")
    assert not _my_servers()


def test_open_loop_sweep_past_capacity():
    from helpers import plots

    table = sweep([{"workers": 1, "threads": 2}], path="/io?ms=50", rates=[10, 100], duration=1.0,
                  save=False, quiet=True)
    low, high = table.loc[0], table.loc[1]
    assert pd.isna(low["concurrency"]) and low["rate_rps"] == 10
    assert 8 <= low["throughput_rps"] <= 11
    assert high["throughput_rps"] <= 2 / 0.05 * 1.15  # 2 slots x 50 ms: 40 req/s at most
    assert high["p50_intended_ms"] > 2 * low["p50_intended_ms"]  # the queue grows past capacity
    assert low["theory_throughput_rps"] == pytest.approx(10, rel=0.01)
    fig = plots.plot_sweep_latency(table)
    assert fig.axes[0].get_ylabel().startswith("p50 latency from intended start")


def test_bad_arguments_fail_before_any_server_starts():
    with pytest.raises(ValueError):
        sweep([{"workers": 1}], concurrencies=[1], rates=[5])
    with pytest.raises(ValueError):
        sweep([{"workers": 1}, {"workers": 0}], concurrencies=[1])  # the typo is in the last config
    with pytest.raises(TypeError):
        sweep([{"wokers": 2}], concurrencies=[1])
    with pytest.raises(TypeError):  # a typo meant for run_load: raised at the first run, server stopped
        sweep([{"workers": 1}], path="/io?ms=5", concurrencies=[1], duration=0.3, save=False, quiet=True,
              timout=3)
    assert not _my_servers()


def test_record_and_load_reference(tmp_path, monkeypatch):
    tiny = {"io_tiny": dict(configs=[{"workers": 1, "threads": 4}], path="/io?ms=20", concurrencies=[1, 4],
                            duration=0.6)}
    monkeypatch.setattr(sweep_mod, "REFERENCE_SWEEPS", tiny)
    paths = record_reference(out_dir=tmp_path, repeats=1, quiet=True)
    assert [p.name for p in paths] == ["io_tiny.csv"]
    ref = load_reference("io_tiny", directory=tmp_path)
    assert len(ref) == 2 and ref.attrs["reference"] is True
    assert ref.attrs["machine"]["effective_cores"] > 0
    assert ref["throughput_rps"].iloc[1] > 2 * ref["throughput_rps"].iloc[0]  # 4 threads wait in parallel
    with pytest.raises(FileNotFoundError, match="io_tiny"):
        load_reference("nope", directory=tmp_path)
    with pytest.raises(ValueError):
        record_reference(out_dir=tmp_path, names=["not-a-sweep"])


# ---- accuracy the lessons rely on: loose bounds (precise figures: benchmarks/bench_accuracy.py) ----

def _skip_if_machine_busy(table):
    others = table["others_cores"].mean()
    if others > 1.0:
        pytest.skip(f"other programs used ≈{others:.1f} cores meanwhile: CPU-bound figures would be noise")


def test_io_scaling_follows_littles_law_up_to_the_slots():
    table = sweep([{"worker_class": "gthread", "workers": 1, "threads": 8}], path="/io?ms=100",
                  concurrencies=[1, 4, 8, 16], duration=1.0, save=False, quiet=True)
    by_c = table.set_index("concurrency")
    for c in (1, 4, 8):
        assert 0.75 <= by_c.loc[c, "throughput_rps"] / (c / 0.1) <= 1.15, by_c.loc[c, "throughput_rps"]
    assert by_c.loc[16, "throughput_rps"] <= 8 / 0.1 * 1.15  # 8 slots: no more than 80 req/s
    knee = by_c.loc[16, "p50_ms"] / by_c.loc[8, "p50_ms"]
    assert 1.5 <= knee <= 2.6, knee  # twice the clients, twice the wait
    assert (table["throughput_rps"] / table["theory_throughput_rps"]).between(0.75, 1.15).all()


def test_cpu_scaling_processes_help_threads_do_not():
    table = sweep([{"workers": 1}, {"workers": 2}, {"workers": 1, "threads": 4}], path="/cpu?ms=20",
                  concurrencies=[4], duration=1.5, save=False, quiet=True)
    one, two, threads = (table.loc[i] for i in range(3))
    # the GIL: 4 threads share one core, so each request's handler takes several times its CPU
    assert threads["server_app_ms_mean"] > 1.8 * threads["server_cpu_ms_mean"]
    assert threads["p50_ms"] > 1.3 * one["server_app_ms_mean"]
    _skip_if_machine_busy(table)
    # against the CPU ceiling on the cores other programs left free, so a busy neighbour cannot fail it
    for row in (one, two):
        assert 0.65 <= row["throughput_rps"] / row["theory_free_throughput_rps"] <= 1.15, row.to_dict()
    assert threads["throughput_rps"] <= 1.3 * one["throughput_rps"]
    if table["others_cores"].max() < 0.3:  # a quiet machine: the second process must show
        assert two["throughput_rps"] >= 1.3 * one["throughput_rps"]


def test_convoy_a_cpu_bound_thread_slows_io_requests():
    from helpers.load import run_load
    from helpers.server import DemoServer

    with DemoServer(workers=1, threads=4) as server:
        io_url = server.url + "/io?ms=10"
        alone = run_load(io_url, concurrency=1, duration=1.0, quiet=True)
        beside = run_load({io_url: 1, server.url + "/cpu?ms=200": 1}, duration=1.5, quiet=True)
    io_alone = alone.requests.query("ok")["latency_ms"].median()
    io_beside = beside.requests.query("ok and endpoint == '/io'")["latency_ms"].median()
    assert io_beside > 1.2 * io_alone, (io_alone, io_beside)


ONE_CORE = """
import warnings
from helpers.sweep import warn_if_one_core
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    print(warn_if_one_core("/cpu?ms=20"), warn_if_one_core("/io?ms=200"))
print(caught[0].message if caught else "no warning")
"""


def test_cpu_heavy_sweeps_warn_on_one_core_only():
    import subprocess
    import sys

    pinned = subprocess.run(["taskset", "-c", "0", sys.executable, "-c", ONE_CORE], capture_output=True, text=True,
                            timeout=60)
    assert pinned.stdout.splitlines()[0] == "True False", pinned.stdout + pinned.stderr
    assert "1 effective core(s)" in pinned.stdout and "load_reference('cpu_workers')" in pinned.stdout
    both = subprocess.run([sys.executable, "-c", ONE_CORE], capture_output=True, text=True, timeout=60)
    assert both.stdout.splitlines() == ["False False", "no warning"], both.stdout + both.stderr
