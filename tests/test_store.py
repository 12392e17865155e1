"""Saving and loading runs: a real run goes to disk and comes back the same, atomically."""

import json
import os

import pandas as pd
import pytest

from helpers import DemoServer
from helpers.load import Run, list_runs, load_run, run_load
from helpers.store import atomic_write_text, data_dir, runs_dir, save_run

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def real_run():
    """One short real run with errors among its rows (module-scoped: its server stops inside)."""
    with DemoServer(workers=1, threads=4) as server:
        return run_load({server.url + "/io?ms=20": 2, server.url + "/io?ms=abc": 1}, duration=0.6, quiet=True,
                        label="store test")


def test_data_dir_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_DATA_DIR", str(tmp_path / "elsewhere"))
    assert data_dir() == tmp_path / "elsewhere" and runs_dir() == tmp_path / "elsewhere" / "runs"
    monkeypatch.delenv("COURSE_DATA_DIR")
    assert data_dir().name == "data" and (data_dir().parent / "helpers").is_dir()


def test_save_and_load_round_trip(real_run):
    folder = real_run.save("round-trip")
    assert folder == runs_dir() / "round-trip"
    assert sorted(p.name for p in folder.iterdir()) == ["meta.json", "requests.csv", "samples.csv"]
    back = load_run("round-trip")
    assert isinstance(back, Run) and back.path == str(folder)
    pd.testing.assert_frame_equal(back.requests, real_run.requests, check_exact=False, rtol=1e-9)
    pd.testing.assert_frame_equal(back.samples, real_run.samples, check_exact=False, rtol=1e-9)
    assert back.config == json.loads(json.dumps(real_run.config))
    assert back.machine == real_run.machine and back.interrupted == real_run.interrupted
    assert back.summary() == real_run.summary()
    n_4xx = int((real_run.requests["error"] == "http_4xx").sum())
    assert back.summary()["errors"] == {"http_4xx": n_4xx} and 0 < n_4xx < len(back.requests)
    assert len(back.samples) > 0 and set(back.samples["kind"]) >= {"core", "server", "client"}
    assert str(back.summary()) == str(real_run.summary())
    # by folder path too
    assert len(load_run(folder).requests) == len(real_run.requests)


def test_default_name_and_listing(real_run):
    folder = real_run.save()
    assert folder.name.endswith("store-test")
    table = list_runs()
    assert folder.name in set(table["name"])
    row = table[table["name"] == folder.name].iloc[0]
    assert row["requests"] == len(real_run.requests) and row["label"] == "store test" and row["mode"] == "closed"


def test_saving_again_replaces_atomically_and_leaves_no_debris(real_run):
    real_run.save("again")
    real_run.save("again")
    leftovers = [p.name for p in runs_dir().iterdir() if p.name.startswith(".")]
    assert leftovers == [] and len(load_run("again").requests) == len(real_run.requests)


def test_a_failed_save_keeps_the_previous_version(real_run):
    real_run.save("keep-me")
    before = (runs_dir() / "keep-me" / "meta.json").read_text()

    class Unwritable:
        def to_csv(self, *args, **kwargs):
            raise OSError("disk full")

    broken = Run(config=real_run.config, requests=real_run.requests, samples=Unwritable(),
                 machine=real_run.machine)
    with pytest.raises(OSError):
        save_run(broken, "keep-me")
    assert (runs_dir() / "keep-me" / "meta.json").read_text() == before
    assert [p.name for p in runs_dir().iterdir() if p.name.startswith(".")] == []


@pytest.mark.parametrize("name", ["../escape", "a/b", ".hidden", "", "with space"])
def test_bad_names_are_refused(real_run, name):
    with pytest.raises(ValueError):
        real_run.save(name)


def test_missing_run_says_where_it_looked():
    with pytest.raises(FileNotFoundError) as info:
        load_run("no-such-run")
    assert "list_runs()" in str(info.value)


def test_atomic_write_text(tmp_path):
    path = atomic_write_text(tmp_path / "sub" / "x.json", '{"a": 1}')
    assert json.loads(path.read_text()) == {"a": 1}
    assert os.listdir(tmp_path / "sub") == ["x.json"]


def test_meta_json_is_strict_json(real_run):
    folder = real_run.save("strict")
    text = (folder / "meta.json").read_text()
    assert "NaN" not in text and "Infinity" not in text
    meta = json.loads(text)
    assert meta["summary"]["requests"] == len(real_run.requests) and meta["config"]["label"] == "store test"
    assert meta["machine"]["effective_cores"] >= 1 and "client" in meta
