"""`python -m helpers doctor` on this machine: a real verdict, and a real failure."""

import os
import subprocess

import pytest

from conftest import PYTHON, ROOT

pytestmark = pytest.mark.timeout(120)


def doctor(env_extra=None):
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run([PYTHON, "-m", "helpers", "doctor"], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=90)


def test_doctor_reports_ready_here_with_every_check():
    result = doctor()
    assert result.returncode == 0, result.stdout + result.stderr
    for name in ("python", "packages", "servers", "machine", "open files", "backlog", "strays", "data"):
        assert f"] {name}" in result.stdout
    assert "started and stopped sync" in result.stdout and "gevent" in result.stdout
    assert "Verdict: ready" in result.stdout and "Traceback" not in result.stderr


def test_doctor_fails_with_a_fix_when_results_cannot_be_saved(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    result = doctor({"COURSE_DATA_DIR": str(blocker / "data")})
    assert result.returncode == 1
    assert "[FAIL] data" in result.stdout and "set COURSE_DATA_DIR" in result.stdout
    assert "NOT READY" in result.stdout


def test_doctor_warns_on_one_cpu_but_stays_ready():
    result = subprocess.run(["taskset", "-c", "0", PYTHON, "-m", "helpers", "doctor"], capture_output=True,
                            text=True, cwd=ROOT, timeout=90)
    assert result.returncode == 0, result.stdout
    assert "[warn] machine     1 effective core(s)" in result.stdout
    assert "reference data" in result.stdout
