"""Plots: each renders to PNG headless on a real run without a warning, with labelled axes and a
title computed from the data that names what to notice."""

import warnings

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")

from matplotlib.figure import Figure  # noqa: E402

from helpers import plots  # noqa: E402
from helpers.load import run_load  # noqa: E402
from helpers.server import DemoServer  # noqa: E402
from helpers.sweep import sweep  # noqa: E402


@pytest.fixture(scope="module")
def runs():
    """A few short real runs, each showing one of the stories the timeline must make visible."""
    out = {}
    with DemoServer() as server:  # 1 worker x 1 thread: requests run one after another
        out["serial"] = run_load(server.url + "/io?ms=100", concurrency=5, requests=5, quiet=True)
    with DemoServer(workers=1, threads=4) as server:  # threads interleave on the GIL
        out["threads"] = run_load(server.url + "/cpu?ms=20", concurrency=4, duration=1.0, quiet=True)
    with DemoServer(worker_class="gevent") as server:  # many at once, stalled by a call that never yields
        out["gevent"] = run_load({server.url + "/io?ms=100": 12, server.url + "/oops?ms=200": 1},
                                 duration=1.2, quiet=True)
    return out


def _render(make, tmp_path, name):
    """Draw and save to PNG with every warning turned into an error; return the figure."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = make()
        fig = result if isinstance(result, Figure) else result.figure
        path = tmp_path / f"{name}.png"
        fig.savefig(path, dpi=60)
    assert path.stat().st_size > 5000
    return result


def _assert_labelled(fig: Figure):
    axes = [a for a in fig.axes if a.get_visible()]
    assert axes
    assert any(a.get_xlabel() for a in axes), "no x label"
    for a in axes:
        assert a.get_ylabel(), "an Axes without a y label"
    titles = [a.get_title() for a in axes] + [fig._suptitle.get_text() if fig._suptitle else ""]
    assert any(len(t) > 20 for t in titles), "no title saying what to notice"


def test_timeline_serial_says_one_after_another(runs, tmp_path):
    fig = _render(lambda: plots.plot_timeline(runs["serial"], prediction=0.1), tmp_path, "timeline-serial")
    _assert_labelled(fig)
    legend = " ".join(t.get_text() for t in fig.axes[0].get_legend().get_texts())
    assert "your prediction: 0.1 s" in legend  # 5 x 100 ms one after another: about 5x that
    title = fig.axes[0].get_title()
    assert "5 requests" in title and "one after another" in title and "1 worker x 1 thread" in title
    assert len(fig.axes[0].get_yticklabels()) == 1  # one lane: one worker, one thread


def test_timeline_threads_interleave(runs, tmp_path):
    fig = _render(lambda: plots.plot_timeline(runs["threads"], color_by="outcome"), tmp_path, "timeline-threads")
    _assert_labelled(fig)
    assert "interleaving" in fig.axes[0].get_title()
    assert len(fig.axes[0].get_yticklabels()) == 4  # 4 threads, 4 lanes


def test_timeline_gevent_oops_stall(runs, tmp_path):
    fig = _render(lambda: plots.plot_timeline(runs["gevent"]), tmp_path, "timeline-gevent")
    _assert_labelled(fig)
    title = fig.axes[0].get_title()
    assert "ran at once" in title or "/oops" in title


def test_timeline_into_a_given_axes(runs, tmp_path):
    fig = Figure()
    ax = fig.add_subplot()
    assert plots.plot_timeline(runs["serial"], ax=ax) is ax
    _render(lambda: fig, tmp_path, "given-axes")


def test_breakdown_adds_up_and_names_the_biggest_part(runs, tmp_path):
    fig = _render(lambda: plots.plot_breakdown(runs["threads"]), tmp_path, "breakdown")
    _assert_labelled(fig)
    title = fig.axes[0].get_title()
    assert title.startswith("/cpu:") and "%" in title
    ax = fig.axes[0]
    stacked = sum(p.get_height() for p in ax.patches)
    mean_latency = runs["threads"].requests.query("ok")["latency_ms"].mean()
    assert stacked == pytest.approx(mean_latency, rel=0.1)  # queue + CPU + I/O + contention = latency
    fig2 = _render(lambda: plots.plot_breakdown(runs["serial"], by="request", prediction=100), tmp_path,
                   "breakdown-req")
    _assert_labelled(fig2)
    assert "I/O wait" in fig2.axes[0].get_title() or "queue" in fig2.axes[0].get_title()


def test_resources_panels(runs, tmp_path):
    fig = _render(lambda: plots.plot_resources(runs["threads"], prediction=50), tmp_path, "resources")
    _assert_labelled(fig)
    assert len(fig.axes) == 3
    assert "cores" in fig._suptitle.get_text()
    one = Figure().add_subplot()
    assert plots.plot_resources(runs["threads"], panels="memory", ax=one) is one


def test_latency_spectrum_side_by_side_with_a_prediction(runs, tmp_path):
    fig = _render(lambda: plots.plot_latency([runs["serial"], runs["gevent"]], labels=["sync 1x1", "gevent"],
                                             prediction=150), tmp_path, "latency")
    _assert_labelled(fig)
    ax = fig.axes[0]
    assert ax.get_yscale() == "log"
    legend = " ".join(t.get_text() for t in ax.get_legend().get_texts())
    assert "your prediction" in legend and "x yours" in legend
    assert "p99" in ax.get_title()


def test_sweep_plots_with_theory_repeats_and_prediction(tmp_path):
    table = sweep([{"workers": 1, "threads": 4}], path="/io?ms=50", concurrencies=[1, 4, 8], duration=0.6,
                  repeats=2, save=False, quiet=True)
    fig = _render(lambda: plots.plot_sweep(table, prediction=[20, 80, 80]), tmp_path, "sweep")
    _assert_labelled(fig)
    ax = fig.axes[0]
    legend = " ".join(t.get_text() for t in ax.get_legend().get_texts())
    assert "theory" in legend and "repeats" in legend and "your prediction" in legend
    assert "levels off" in ax.get_title() or "rises" in ax.get_title()
    fig2 = _render(lambda: plots.plot_sweep_latency(table), tmp_path, "sweep-latency")
    _assert_labelled(fig2)
    assert "latency (p50)" in fig2.axes[0].get_title().lower()


def test_sweep_plot_by_workers_with_usl_and_by_config():
    rows = []
    for workers, rps in [(1, 48.0), (2, 90.0), (3, 118.0), (4, 120.0)]:
        for repeat, noise in enumerate((0.97, 1.03)):
            rows.append({"config": f"{workers} workers", "config_index": workers, "workers": workers, "threads": 1,
                         "worker_class": "sync", "server": "gunicorn", "worker_connections": 1000,
                         "slots": workers, "concurrency": 4, "rate_rps": np.nan, "repeat": repeat, "failure": "",
                         "throughput_rps": rps * noise, "p50_ms": 4000 / rps, "server_cpu_ms_mean": 20.0,
                         "server_io_ms_mean": 0.0, "effective_cores": 2.0})
    import pandas as pd

    table = pd.DataFrame(rows)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig = plots.plot_sweep(table)
        ax = fig.axes[0]
        assert ax.get_xlabel().startswith("workers")
        legend = " ".join(t.get_text() for t in ax.get_legend().get_texts())
        assert "USL fit" in legend and "theory" in legend
        assert "theory says x2.0 on 2 cores" in ax.get_title()
        fig2 = plots.plot_sweep(table, x="config", prediction=100)
        assert "apart" in fig2.axes[0].get_title()
        fig.savefig(__import__("io").BytesIO(), format="png")
        fig2.savefig(__import__("io").BytesIO(), format="png")
