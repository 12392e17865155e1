"""helpers.clients (lesson 06): three ways to send N requests, against a real server over real HTTP."""

import asyncio
import socket

import pytest
from matplotlib.figure import Figure

from helpers import DemoServer
from helpers.clients import ClientComparison, compare_clients, fetch_async, fetch_sequential, fetch_threaded
from helpers.load import run_load

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def aio_server():
    """The aiohttp twin: one process awaits any number of /io requests at once."""
    server = DemoServer(server="aiohttp").start()
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def _no_leaked_servers():
    """The module's shared server is stopped by its fixture, not after every test (overrides conftest)."""
    yield


def test_each_way_overlaps_as_much_as_it_says(aio_server):
    url = aio_server.url + "/io?ms=50"
    result = compare_clients(url, n=20, threads=5)
    table = result.table.set_index("way")
    assert list(table.index) == ["sequential", "threads", "asyncio"]
    assert (table["ok"] == 20).all() and (table["requests"] == 20).all()
    # one at a time: at least 20 x 50 ms; five at a time: about 4 rounds; all at once: about one round
    assert table.loc["sequential", "wall_s"] >= 20 * 0.050
    assert 4 * 0.050 <= table.loc["threads", "wall_s"] < table.loc["sequential", "wall_s"] / 2
    assert 0.050 <= table.loc["asyncio", "wall_s"] < table.loc["sequential", "wall_s"] / 3
    assert table.loc["sequential", "speedup"] == pytest.approx(1.0)
    assert table.loc["asyncio", "speedup"] > 3
    assert list(table["parallel"]) == [1, 5, 20]
    assert ((table["client_cpu_percent"] >= 0) & (table["client_cpu_percent"] < 400)).all()
    rows = result.requests
    assert len(rows) == 60 and rows["ok"].all() and set(rows["way"]) == {"sequential", "threads", "asyncio"}
    assert (rows["latency_ms"] >= 45).all()  # every request really waited on the server
    seq = rows[rows["way"] == "sequential"].sort_values("request_index")
    assert (seq["start_s"].diff().dropna() >= 0.045).all()  # each began after the previous ended


def test_fetch_functions_return_rows_and_totals(aio_server):
    url = aio_server.url + "/io?ms=20"
    for fetch, kwargs in ((fetch_sequential, {}), (fetch_threaded, {"threads": 3}), (fetch_async, {"limit": 2})):
        rows, totals = fetch(url, n=6, **kwargs)
        assert len(rows) == 6 and rows["ok"].all() and list(rows["request_index"]) == list(range(6))
        assert totals["wall_s"] > 0 and totals["cpu_s"] >= 0
    rows, totals = fetch_async(url, n=6, limit=2)
    assert totals["wall_s"] >= 3 * 0.020  # the connector let only two through at a time


def test_async_client_works_inside_a_running_event_loop(aio_server):
    """A Jupyter kernel runs an event loop already; asyncio.run() alone would refuse to start there."""
    url = aio_server.url + "/io?ms=10"

    async def notebook_cell():
        return fetch_async(url, n=5)

    rows, _ = asyncio.run(notebook_cell())
    assert rows["ok"].all()


def test_failures_become_rows_not_exceptions():
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = compare_clients(f"http://127.0.0.1:{port}/io", n=3, threads=2, timeout=2)
    assert len(result.requests) == 9 and not result.requests["ok"].any()
    assert set(result.requests["error"]) <= {"refused", "other", "timeout"}
    assert (result.table["ok"] == 0).all()
    assert result.notes and "failed" in result.notes[0]


@pytest.mark.parametrize("kwargs, words", [
    (dict(url="http://example.com/io"), "this machine"),
    (dict(url="http://127.0.0.1:1/io", n=0), "n must be"),
    (dict(url="http://127.0.0.1:1/io", threads=10_000), "threads must be"),
    (dict(url="http://127.0.0.1:1/io", ways=["curl"]), "ways must be"),
    (dict(url="http://127.0.0.1:1/io", timeout=0), "timeout must be"),
])
def test_bad_arguments_are_one_sentence(kwargs, words):
    with pytest.raises(ValueError, match=words):
        compare_clients(**kwargs)


def test_a_run_joins_the_table_and_the_figure_draws(aio_server):
    url = aio_server.url + "/cpu?ms=0.5"
    naive = compare_clients(url, n=50, threads=4, ways=["threads"])
    run = run_load(url, concurrency=4, requests=50, quiet=True)
    both = naive.with_run(run, way="run_load")
    assert isinstance(both, ClientComparison) and list(both.table["way"]) == ["threads", "run_load"]
    row = both.table.set_index("way").loc["run_load"]
    assert row["requests"] == 50 and row["ok"] == 50 and row["parallel"] == 4 and row["throughput_rps"] > 0
    fig = both.plot(prediction={"threads": 1.0, "run_load": 0.5})
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    assert any("your prediction" in t.get_text() for t in fig.axes[0].get_legend().get_texts())
    assert both.wall_s("threads") > 0
    assert "<table" in both._repr_html_()
    with pytest.raises(ValueError, match="one predicted value"):
        both.plot(prediction=[1, 2, 3])


def test_the_figure_can_show_throughput_instead(aio_server):
    result = compare_clients(aio_server.url + "/io?ms=5", n=10, threads=2, ways=["sequential", "asyncio"])
    fig = result.plot(prediction=[100, 1000], metric="throughput_rps")
    assert "req/s" in fig.axes[0].get_ylabel() and fig.axes[0].get_yscale() == "linear"
    with pytest.raises(ValueError, match="metric must be"):
        result.plot(metric="p99")
