"""Monitor: psutil samples of real server, client and cores while real load runs."""

import os
import subprocess
import time

import pytest

from conftest import PYTHON
from helpers import DemoServer
from helpers.load import run_load
from helpers.monitor import SAMPLE_COLUMNS, Monitor

pytestmark = pytest.mark.timeout(60)


def test_samples_every_series_about_ten_times_a_second():
    with DemoServer(workers=2) as server:
        with Monitor(server) as monitor:
            time.sleep(1.2)
        samples = monitor.frame()
        pids = {server.master_pid, *server.pids["workers"]}
    assert list(samples.columns) == SAMPLE_COLUMNS
    cores = samples[samples["kind"] == "core"]
    assert set(cores["name"]) == {f"cpu{i}" for i in range(os.cpu_count())} and cores["pid"].isna().all()
    server_rows = samples[samples["kind"] == "server"]
    assert set(server_rows["pid"].astype(int)) == pids
    assert set(server_rows["name"]) == {"master", "worker"}
    per_pid = server_rows.groupby("pid").size()
    assert per_pid.between(6, 16).all(), per_pid  # ~10 per second over 1.2 s, loosely
    assert (server_rows["rss_mb"] > 5).all() and server_rows["cpu_percent"].between(0, 400).all()
    uss = server_rows.dropna(subset=["uss_mb"])
    assert set(uss["pid"].astype(int)) == pids  # USS too, but less often
    assert len(uss) < len(server_rows) and (uss["uss_mb"] <= uss["rss_mb"] + 1).all()


def test_a_busy_worker_shows_its_cpu_and_the_client_is_sampled():
    with DemoServer(workers=1) as server:
        run = run_load(server.url + "/cpu?ms=50", concurrency=1, duration=1.5, quiet=True)
        worker = server.pids["workers"][0]
    s = run.samples
    busy = s[(s["kind"] == "server") & (s["pid"] == worker)]["cpu_percent"]
    assert busy.median() > 40, busy.describe()  # one worker burning CPU back to back
    client = s[s["kind"] == "client"]
    assert len(client) >= 5 and client["pid"].nunique() == 1 and client["pid"].iloc[0] != os.getpid()
    assert run.summary()["server_cpu_percent"] > 40


def test_recycled_workers_show_up_as_new_series():
    with DemoServer(workers=1, max_requests=15) as server:
        first = server.pids["workers"][0]
        run = run_load(server.url + "/io?ms=20", concurrency=1, requests=60, quiet=True)
    workers = run.samples[run.samples["name"] == "worker"]["pid"].dropna().astype(int)
    served_by = set(run.requests["worker_pid"].dropna().astype(int))
    assert len(served_by) >= 3 and first in served_by  # max_requests recycled the worker
    assert len(set(workers)) >= 2, set(workers)  # the monitor found the replacements


def test_without_a_server_it_samples_cores_and_clients():
    sleeper = subprocess.Popen([PYTHON, "-c", "import time; time.sleep(5)"])
    try:
        monitor = Monitor(None, interval_s=0.05).start()
        monitor.add_client(sleeper.pid)
        time.sleep(0.4)
        samples = monitor.stop()
    finally:
        sleeper.kill()
        sleeper.wait()
    assert set(samples["kind"]) == {"core", "client"}
    client = samples[samples["kind"] == "client"]
    assert (client["pid"] == sleeper.pid).all() and len(client) >= 4 and client["cpu_percent"].max() < 50


def test_a_process_that_exits_mid_run_is_simply_no_longer_sampled():
    short = subprocess.Popen([PYTHON, "-c", "import time; time.sleep(0.3)"])
    monitor = Monitor(None).start()
    monitor.add_client(short.pid)
    short.wait()
    time.sleep(0.5)
    samples = monitor.stop()
    client = samples[samples["kind"] == "client"]
    assert len(client) >= 1 and client["t_s"].max() < samples["t_s"].max()


def test_interval_must_be_positive():
    with pytest.raises(ValueError):
        Monitor(None, interval_s=0)
