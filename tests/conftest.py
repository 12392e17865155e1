"""Shared test set-up: quick mode, a private data dir, and a guard that no test leaks a server."""

import os
import sys
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("COURSE_QUICK", "1")


@pytest.fixture(autouse=True)
def _private_data_dir(tmp_path_factory, monkeypatch):
    """Runs saved by tests go to a temp dir, never into the repo's data/."""
    monkeypatch.setenv("COURSE_DATA_DIR", str(tmp_path_factory.mktemp("data")))


@pytest.fixture(autouse=True)
def _no_leaked_servers():
    """Fail any test that leaves a server of this process running."""
    yield
    from helpers import server as server_mod

    leaked = [s for s in list(server_mod._REGISTRY.values()) if s.alive]
    for s in leaked:
        s.stop()
    assert not leaked, f"test left servers running: {leaked}"


def wait_gone(pids, within_s: float) -> list[int]:
    """Poll until none of `pids` is alive (zombies count as gone); return the survivors."""
    deadline = time.monotonic() + within_s
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if _alive(p)]
        time.sleep(0.05)
    return [p for p in alive if _alive(p)]


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


PYTHON = sys.executable
