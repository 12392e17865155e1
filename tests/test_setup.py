"""The two commands learners type: `make lab` really opens JupyterLab on the lessons."""

import json
import os
import secrets
import signal
import socket
import subprocess
import time
import urllib.request

import pytest

from conftest import ROOT

pytestmark = pytest.mark.timeout(120)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_make_lab_serves_the_lessons_with_the_course_kernel(tmp_path):
    port, token = free_port(), secrets.token_hex(8)
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"), JUPYTER_CONFIG_DIR=str(tmp_path / "config"))
    args = f"--no-browser --ip 127.0.0.1 --port {port} --ServerApp.token={token}"
    proc = subprocess.Popen(["make", "--no-print-directory", "lab", f"LAB_ARGS={args}"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2) as resp:
                    assert resp.status == 200
                    break
            except OSError:
                assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
                assert time.monotonic() < deadline, "JupyterLab did not answer within 60 s"
                time.sleep(0.3)
        with urllib.request.urlopen(f"{base}/api/contents?token={token}", timeout=10) as resp:
            names = {item["name"] for item in json.load(resp)["content"]}
        assert "00-welcome.ipynb" in names  # opened on notebooks/
        with urllib.request.urlopen(f"{base}/api/kernelspecs?token={token}", timeout=10) as resp:
            specs = json.load(resp)["kernelspecs"]
        assert "python3" in specs and "Python 3 (course)" in specs["python3"]["spec"]["display_name"]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
