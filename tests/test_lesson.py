"""The notebook conveniences in helpers.lesson, on a real server."""

import math

import pytest

from helpers import DemoServer
from helpers.lesson import choose, parse_server_timing, runs_table, self_check, timed_get
from helpers.load import run_load

pytestmark = pytest.mark.timeout(120)


def test_parse_server_timing_reads_durations_and_skips_the_rest():
    header = 'app;dur=201.5, cpu;dur=0.4, io;dur=200.0, cache;desc="miss", db;dur=bad'
    assert parse_server_timing(header) == {"app": 201.5, "cpu": 0.4, "io": 200.0}
    assert parse_server_timing(None) == {} and parse_server_timing("") == {}


def test_timed_get_splits_wall_into_server_and_outside_time():
    with DemoServer() as server:
        t = timed_get(server.url + "/io?ms=80")
    assert t["status"] == 200 and t["io_ms"] == 80.0
    assert t["wall_ms"] >= t["app_ms"] >= t["io_ms"]  # the client's view contains the server's
    assert math.isclose(t["outside_ms"], t["wall_ms"] - t["app_ms"], abs_tol=0.02)
    assert t["cpu_ms"] < 20 and t["worker_pid"] > 0


def test_runs_table_has_one_row_per_run():
    with DemoServer(threads=4) as server:
        runs = [run_load(server.url + "/io?ms=20", concurrency=c, requests=8, quiet=True) for c in (1, 4)]
    table = runs_table(runs)
    assert len(table) == 2


def test_self_check_and_choose():
    self_check(True, "fine", "unused")
    with pytest.raises(AssertionError, match="Not yet: look at p99"):
        self_check(False, "fine", "look at p99")
    assert choose(full=10, quick=2) == 2  # the tests run in quick mode (conftest sets COURSE_QUICK=1)
