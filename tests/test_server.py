"""DemoServer against real gunicorn processes: start, serve, stop, and never orphan."""

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request

import psutil
import pytest

from conftest import PYTHON, ROOT, wait_gone
from helpers import DemoServer, ServerStartError, running, stop_all
from helpers.server import server_for_url

pytestmark = pytest.mark.timeout(120)


def get(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.status, dict(resp.headers), resp.read()


def timing(headers):
    parts = dict(p.strip().split(";dur=") for p in headers["Server-Timing"].split(","))
    return {k: float(v) for k, v in parts.items()}


@pytest.mark.parametrize("kwargs", [
    dict(workers=2),
    dict(workers=1, threads=4, worker_class="gthread"),
    dict(workers=2, worker_class="gevent"),
    dict(server="flask-dev", threads=4),
    dict(server="aiohttp", workers=2),
    dict(server="aiohttp-dev"),
], ids=["sync", "gthread", "gevent", "flask-dev", "aiohttp", "aiohttp-dev"])
def test_each_server_kind_serves_and_stops_cleanly(kwargs):
    server = DemoServer(**kwargs)
    with server:
        assert server.alive and server.url.startswith("http://127.0.0.1:")
        if server.server in ("gunicorn", "aiohttp"):
            assert len(server.pids["workers"]) == kwargs["workers"]
        status, headers, body = get(server.url + "/health")
        assert status == 200 and json.loads(body)["status"] == "ok"
        _, headers, _ = get(server.url + "/cpu?ms=20")
        t = timing(headers)
        assert 15 <= t["cpu"] <= 80, t  # CPU work really took ~20 ms of CPU
        assert t["app"] >= t["cpu"] - 1
        _, headers, _ = get(server.url + "/io?ms=100")
        t = timing(headers)
        assert 95 <= t["io"] <= 300 and t["cpu"] < 20, t  # waiting costs almost no CPU
        assert int(headers["X-Worker-Pid"]) in ([server.master_pid] + server.pids["workers"])
        start, end = float(headers["X-Handler-Start"]), float(headers["X-Handler-End"])
        assert abs((end - start) * 1000 - t["app"]) < 5 and abs(start - time.time()) < 10
        pids = [server.master_pid] + server.pids["workers"]
        assert "running" in repr(server)
    assert not server.alive and server.status == "stopped"
    assert wait_gone(pids, 5) == []
    assert "Server-Timing" not in server.log_tail(5)  # log is still readable after stop
    assert server.log_tail(50)


def test_bad_config_raises_one_sentence_and_starts_nothing():
    before = set(psutil.Process().children(recursive=True))
    cases = [dict(workers=0), dict(threads=0), dict(worker_class="eventlet"), dict(worker_class="gevent", threads=4),
             dict(workers=2.5), dict(timeout=0), dict(server="uwsgi"), dict(server="flask-dev", workers=3),
             dict(server="aiohttp", threads=4), dict(server="aiohttp-dev", workers=2)]
    for kwargs in cases:
        with pytest.raises(ValueError) as err:
            DemoServer(**kwargs).start()
        message = str(err.value)
        assert message.endswith(".") and "\n" not in message, message
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ValueError, match=f"port {port} is already in use"):
            DemoServer(port=port).start()
    assert set(psutil.Process().children(recursive=True)) == before


def test_start_failure_raises_with_log_tail_and_cleans_up():
    server = DemoServer(app="labapp:no_such_factory()", start_timeout_s=20)
    with pytest.raises(ServerStartError) as err:
        server.start()
    assert "log tail" in str(err.value) and "no_such_factory" in str(err.value)
    assert not server.alive


def test_explicit_port_and_repr_and_lookup():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = DemoServer(workers=1, threads=3, port=port).start()
    try:
        assert server.port == port and server.worker_class == "gthread"  # sync + threads runs gthread
        assert server.slots == 3 and "threads=3" in repr(server)
        assert server_for_url(server.url + "/io?ms=5") is server
    finally:
        server.stop()
    assert server_for_url(server.url) is None
    server.stop()  # twice is fine


@pytest.mark.parametrize("kwargs", [dict(worker_class="gevent"), dict(server="aiohttp")], ids=["gevent", "aiohttp"])
def test_event_loop_yields_on_io_but_oops_blocks_the_worker(kwargs):
    """The first article's point: one non-yielding call stalls every request in its worker."""
    from concurrent.futures import ThreadPoolExecutor

    with DemoServer(workers=1, **kwargs) as server:
        def latency_of_short_io_beside(slow_path):
            with ThreadPoolExecutor(2) as pool:
                slow = pool.submit(get, server.url + slow_path)
                time.sleep(0.05)  # the slow call is under way
                t0 = time.perf_counter()
                get(server.url + "/io?ms=10")
                short_ms = (time.perf_counter() - t0) * 1000
                slow.result()
            return short_ms

        beside_yielding = latency_of_short_io_beside("/io?ms=400")
        beside_blocking = latency_of_short_io_beside("/oops?ms=400")
    assert beside_yielding < 150, beside_yielding
    assert beside_blocking > 250, beside_blocking


def test_max_requests_recycles_workers_and_boots_are_recorded():
    with DemoServer(workers=1, max_requests=5) as server:
        first = server.pids["workers"]
        for _ in range(12):
            get(server.url + "/health")
        boots = server.worker_boots()
    assert len(boots) >= 2, boots  # the worker was replaced at least once
    assert all(b["boot_ms"] is not None and 0 < b["boot_ms"] < 10_000 for b in boots)
    assert first


# Stands in for a Jupyter kernel: like ipykernel, it handles SIGINT before running anything.
OWNER = """
import json, signal, sys, time
signal.signal(signal.SIGINT, lambda *_: print("interrupted", flush=True))
from helpers import DemoServer
s = DemoServer(workers=2, worker_class=sys.argv[1]).start()
print(json.dumps({"url": s.url, "pids": [s.master_pid] + s.pids["workers"]}), flush=True)
while True:
    time.sleep(60)
"""


def spawn_owner(worker_class="sync", env=None):
    proc = subprocess.Popen([PYTHON, "-c", OWNER, worker_class], stdout=subprocess.PIPE, text=True,
                            cwd=ROOT, start_new_session=True, env=env)
    info = json.loads(proc.stdout.readline())
    return proc, info


@pytest.mark.parametrize("worker_class", ["sync", "gevent"])
def test_no_orphans_after_owner_is_sigkilled(worker_class):
    owner, info = spawn_owner(worker_class)
    assert get(info["url"] + "/health")[0] == 200
    owner.kill()
    owner.wait()
    assert wait_gone(info["pids"], 5.0) == [], "servers outlived their killed owner by more than 5 s"


def test_server_survives_sigint_to_owner_process_group():
    owner, info = spawn_owner()
    try:
        os.killpg(owner.pid, signal.SIGINT)  # what JupyterLab's Interrupt button does
        assert owner.stdout.readline().strip() == "interrupted"
        time.sleep(0.5)
        assert get(info["url"] + "/io?ms=10")[0] == 200
        assert all(psutil.pid_exists(p) for p in info["pids"])
    finally:
        owner.terminate()
        owner.wait()
    assert wait_gone(info["pids"], 5.0) == []


def test_stale_server_is_listed_and_stopped_from_a_fresh_process():
    env = dict(os.environ, COURSE_WATCH_OWNER="0")  # as if the owner could not watch: a stale server
    owner, info = spawn_owner(env=env)
    owner.kill()
    owner.wait()
    time.sleep(1.0)
    try:
        mine = [e for e in running() if e["master_pid"] == info["pids"][0]]
        assert mine and not mine[0]["owner_alive"] and mine[0]["url"] == info["url"]
        assert stop_all(stale=True) >= 1
        assert wait_gone(info["pids"], 8.0) == []
        assert not [e for e in running() if e["master_pid"] == info["pids"][0]]
    finally:
        for pid in info["pids"]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_stop_all_stops_half_started_and_running_servers():
    a = DemoServer(workers=1).start()
    b = DemoServer(workers=1, worker_class="gevent").start()
    pids = [a.master_pid, b.master_pid] + a.pids["workers"] + b.pids["workers"]
    assert stop_all() == 2
    assert wait_gone(pids, 5) == []


def test_bad_query_parameters_get_400_json():
    with DemoServer() as server:
        for path, name in [("/io?ms=abc", "ms"), ("/cpu?ms=-5", "ms"), ("/io?ms=10001", "ms"),
                           ("/oops?ms=nan", "ms"), ("/mixed?io_fraction=1.5", "io_fraction"),
                           ("/mixed?oops_fraction=-1", "oops_fraction")]:
            with pytest.raises(urllib.error.HTTPError) as err:
                get(server.url + path)
            assert err.value.code == 400
            body = json.loads(err.value.read())
            assert body["parameter"] == name and "allowed" in body, body
        status, headers, body = get(server.url + "/mixed?io_fraction=0")
        assert body.startswith(b"ok cpu") and timing(headers)["io"] == 0
        with pytest.raises(urllib.error.HTTPError) as err:
            get(server.url + "/mystery?case=9")
        assert err.value.code == 400 and json.loads(err.value.read())["parameter"] == "case"
        _, headers, _ = get(server.url + "/mystery?case=2")
        t = timing(headers)
        assert 20 <= t["cpu"] <= 80 and t["io"] > 0, t  # case 2 is CPU-heavy with a short wait


def test_cli_serve_prints_url_and_stops_on_ctrl_c():
    proc = subprocess.Popen([PYTHON, "-m", "helpers", "serve", "--workers", "2", "--threads", "2",
                             "--worker-class", "gthread"], stdout=subprocess.PIPE, text=True, cwd=ROOT,
                            start_new_session=True)
    try:
        line = proc.stdout.readline()
        url = line.split()[-1] if "http://" in line else ""
        assert url.startswith("http://127.0.0.1:"), line
        assert get(url + "/health")[0] == 200
        pids = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=10) == 0
        assert wait_gone(pids, 5) == []
    finally:
        if proc.poll() is None:
            proc.kill()


def test_cli_bad_arguments_exit_2_without_traceback():
    result = subprocess.run([PYTHON, "-m", "helpers", "serve", "--workers", "0"], capture_output=True,
                            text=True, cwd=ROOT, timeout=30)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and "workers must be" in result.stderr


def test_memory_budget_refuses_a_config_that_would_not_fit(monkeypatch):
    monkeypatch.setenv("COURSE_MEMORY_LIMIT_MB", "300")  # a small Binder-like limit: budget 240 MB
    with pytest.raises(ValueError, match=r"over the 240 MB budget .*300 MB memory limit"):
        DemoServer(workers=8).start()
    with DemoServer(workers=4) as first:  # 20 + 4 x 30 = 140 MB fits
        assert first.alive
        with pytest.raises(ValueError, match=r"the 1 already running about 140 MB"):
            DemoServer(workers=4).start()  # together 280 MB would not
        with DemoServer(workers=2) as second:  # 80 MB more fits
            assert second.alive


def test_memory_per_process_and_preload_shares_the_app():
    """Workers forked after --preload share the loaded app: less memory of their own (USS)."""
    def mean_worker_uss(preload):
        with DemoServer(workers=2, preload=preload) as server:
            for _ in range(4):
                get(server.url + "/cpu")
            rows = server.memory()
        assert [r["role"] for r in rows].count("worker") == 2 and rows[0]["role"] == "master"
        assert all(r["uss_mb"] <= r["pss_mb"] <= r["rss_mb"] for r in rows), rows
        return sum(r["uss_mb"] for r in rows if r["role"] == "worker") / 2

    plain, preloaded = mean_worker_uss(False), mean_worker_uss(True)
    assert 3 < preloaded < plain < 200, (plain, preloaded)


@pytest.mark.parametrize("kwargs,at_least_ms", [(dict(threads=2), 2), (dict(worker_class="gevent"), 300)],
                         ids=["gthread", "gevent"])
def test_waiting_for_the_cpu_after_io_is_reported_as_contention_not_io(kwargs, at_least_ms):
    """/io is asleep when a CPU hog starts: its I/O stays 50 ms, the wait to run again is contention.

    Under gevent the hog holds the hub until it finishes (~550 ms late); under gthread the GIL
    is handed over every 5 ms (sys.getswitchinterval), so each wake-up waits a few ms.
    """
    from concurrent.futures import ThreadPoolExecutor

    with DemoServer(workers=1, **kwargs) as server, ThreadPoolExecutor(2) as pool:
        victim = pool.submit(get, server.url + "/io?ms=50")
        time.sleep(0.02)  # the victim is asleep in its I/O now
        hog = pool.submit(get, server.url + "/cpu?ms=600")
        _, headers, _ = victim.result()
        hog.result()
    t = timing(headers)
    contention = t["app"] - t["cpu"] - t["io"]
    assert abs(t["io"] - 50) < 1, t  # the I/O itself took what it was asked
    assert contention > at_least_ms, t  # the rest was waiting to run again
