"""Learners do everything wrong: overload, kill, interrupt, crowd the machine. Nothing hangs, nothing is lost."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from conftest import PYTHON, ROOT, wait_gone
from helpers import DemoServer
from helpers.load import ERRORS, run_load

pytestmark = pytest.mark.timeout(180)


def assert_every_attempt_is_a_row(run):
    rows = run.requests
    summary = run.summary()
    assert summary["requests"] == len(rows)
    assert set(rows.error.unique()) <= set(ERRORS) | {""}
    assert (rows.ok == (rows.error == "")).all()
    assert summary["ok"] + sum(summary["errors"].values()) == len(rows)


def test_closed_loop_overload_on_one_sync_worker_ends_on_time_and_keeps_every_row():
    duration_s, timeout_s = 3, 2
    with DemoServer(workers=1) as server:
        t0 = time.perf_counter()
        run = run_load(server.url + "/io?ms=200", concurrency=1000, duration=duration_s, timeout=timeout_s, quiet=True)
        wall_s = time.perf_counter() - t0
        assert server.alive
    assert wall_s < duration_s + timeout_s + 8, wall_s  # margin: start-up of the client and its 1,000 sockets
    assert_every_attempt_is_a_row(run)
    summary = run.summary()
    assert summary["errors"].get("timeout", 0) > 100  # most of 1,000 queued clients give up
    assert summary["ok"] <= (duration_s + timeout_s) / 0.2 + 2  # one slot, 200 ms each: a hard ceiling


def test_open_loop_far_above_capacity_ends_on_time_and_accounts_for_every_scheduled_request():
    with DemoServer(workers=1) as server:
        t0 = time.perf_counter()
        run = run_load(server.url + "/io?ms=200", rate=300, duration=2, timeout=1, quiet=True)
        wall_s = time.perf_counter() - t0
    assert wall_s < 2 + 1 + 8, wall_s
    assert_every_attempt_is_a_row(run)
    summary = run.summary()
    assert len(run.requests) + summary.get("dropped", 0) == 600  # sent or dropped: none vanish
    assert summary["ok"] <= 3 / 0.2 + 2


def test_server_killed_mid_run_ends_promptly_and_reports_the_death():
    server = DemoServer(workers=2, worker_class="gthread", threads=4).start()
    try:
        threading.Timer(1.0, os.kill, (server.master_pid, signal.SIGKILL)).start()
        t0 = time.perf_counter()
        run = run_load(server.url + "/io?ms=20", concurrency=8, duration=6, timeout=2, quiet=True)
        wall_s = time.perf_counter() - t0
        assert wall_s < 6 + 2 + 5
        assert_every_attempt_is_a_row(run)
        errors = run.summary()["errors"]
        assert run.summary()["ok"] > 20 and errors.get("refused", 0) + errors.get("reset", 0) > 0, errors
        assert server.status.startswith("died") and not server.alive
        assert "Booting worker" in server.log_tail(50)
    finally:
        server.stop()


def test_worker_timeout_is_recorded_and_shows_in_the_log():
    with DemoServer(workers=1, timeout=1) as server:
        run = run_load(server.url + "/io?ms=4000", requests=1, concurrency=1, timeout=8, quiet=True)
        row = run.requests.iloc[0]
        assert row.error in ("reset", "http_5xx", "other"), row.error
        deadline = time.monotonic() + 5
        while "WORKER TIMEOUT" not in server.log_tail(40) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "WORKER TIMEOUT" in server.log_tail(40)
        assert row.latency_ms < 3900  # the master killed the worker well before the 4 s wait ended
        ok = run_load(server.url + "/health", requests=3, concurrency=1, quiet=True)
        assert ok.summary()["ok"] == 3  # a fresh worker took its place


def test_servers_bind_loopback_only():
    with DemoServer(workers=1) as server:
        listening = [c for c in psutil.Process(server.master_pid).net_connections(kind="inet")
                     if c.status == psutil.CONN_LISTEN]
    assert listening and all(c.laddr.ip == "127.0.0.1" for c in listening), listening


NEIGHBOUR = """
import json
from helpers import DemoServer
from helpers.load import run_load
with DemoServer(workers=1, threads=4) as a, DemoServer(workers=1, worker_class="gevent") as b:
    runs = [run_load(s.url + "/io?ms=20", concurrency=4, duration=1.5, quiet=True) for s in (a, b)]
    print(json.dumps({"ports": [a.port, b.port], "dirs": [str(a.state_dir), str(b.state_dir)],
                      "ok": [r.summary()["ok"] for r in runs], "errors": [sum(r.summary()["errors"].values()) for r in runs]}))
"""


def test_two_kernels_side_by_side_never_collide():
    procs = [subprocess.Popen([PYTHON, "-c", NEIGHBOUR], stdout=subprocess.PIPE, text=True, cwd=ROOT)
             for _ in range(2)]
    results = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    ports = [port for r in results for port in r["ports"]]
    dirs = [d for r in results for d in r["dirs"]]
    assert len(set(ports)) == 4 and len(set(dirs)) == 4
    for r in results:
        assert all(ok > 20 for ok in r["ok"]) and r["errors"] == [0, 0], r


FD_LIMITED = """
import resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (200, 200))
from helpers import DemoServer
from helpers.load import run_load
with DemoServer(workers=1, worker_class="gevent") as s:
    try:
        run_load(s.url + "/health", concurrency=1000, duration=1, quiet=True, isolate=False)
    except ValueError as err:
        print("ValueError:", err)
"""


def test_concurrency_beyond_the_file_descriptor_limit_is_a_clear_error():
    out = subprocess.run([PYTHON, "-c", FD_LIMITED], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.stdout.startswith("ValueError:"), out.stdout + out.stderr[-2000:]
    assert "1,000" in out.stdout and "allows 200" in out.stdout and "Traceback" not in out.stderr


INTERRUPTED = """
import json
from helpers import DemoServer
from helpers.load import run_load
with DemoServer(workers=1, threads=8) as s:
    print("ready", flush=True)
    run = run_load(s.url + "/io?ms=50", concurrency=8, duration=30, quiet=True)
    print(json.dumps({"interrupted": run.interrupted, "rows": len(run.requests), "ok": run.summary()["ok"]}), flush=True)
"""


def test_interrupting_a_run_keeps_the_rows_measured_so_far():
    proc = subprocess.Popen([PYTHON, "-c", INTERRUPTED], stdout=subprocess.PIPE, text=True, cwd=ROOT,
                            start_new_session=True)
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(2.5)
    os.kill(proc.pid, signal.SIGINT)  # the Interrupt button reaches the kernel, not the server
    out, _ = proc.communicate(timeout=30)
    result = json.loads(out.strip().splitlines()[-1])
    assert result["interrupted"] is True and result["rows"] > 50 and result["ok"] > 50, result
    assert proc.returncode == 0


def test_summary_explains_overload_failures_in_words():
    with DemoServer(workers=1) as server:
        run = run_load(server.url + "/io?ms=300", concurrency=40, duration=1, timeout=0.5, quiet=True)
    text = str(run.summary())
    assert "timed out" in text and "works on 1 request(s) at once and 40 were offered" in text, text
    refused = run_load("http://127.0.0.1:9/health", requests=3, concurrency=1, quiet=True)
    assert "refused" in str(refused.summary()) and "nothing listened" in str(refused.summary())
