"""machine(): effective cores and memory limits, read from real cgroup-shaped files in tmp_path."""

import os
import platform

import pytest

from helpers.machine import (cgroup_cpu_quota, cgroup_memory_limit_mb, describe_machine, effective_cores,
                             machine, memory_limit_mb)


def write(root, rel, text):
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def cgroup_v2(tmp_path, cpu_max=None, memory_max=None, own="/", nested=None):
    """A cgroup v2 tree: /proc/self/cgroup says `own`; files at the root (and in `nested`)."""
    root = tmp_path / "cgroup"
    write(root, "cgroup.controllers", "cpu memory io\n")
    if cpu_max is not None:
        write(root, "cpu.max", cpu_max + "\n")
    if memory_max is not None:
        write(root, "memory.max", memory_max + "\n")
    for rel, files in (nested or {}).items():
        for name, text in files.items():
            write(root, f"{rel.strip('/')}/{name}", text + "\n")
    proc = write(tmp_path, "proc-self-cgroup", f"0::{own}\n")
    return root, proc


def cgroup_v1(tmp_path, quota_us=None, period_us="100000", limit_bytes=None, own="/", controller_dir="cpu,cpuacct"):
    root = tmp_path / "cgroup"
    base = own.strip("/")
    if quota_us is not None:
        write(root, f"{controller_dir}/{base}/cpu.cfs_quota_us".replace("//", "/"), quota_us + "\n")
        write(root, f"{controller_dir}/{base}/cpu.cfs_period_us".replace("//", "/"), period_us + "\n")
    if limit_bytes is not None:
        write(root, f"memory/{base}/memory.limit_in_bytes".replace("//", "/"), limit_bytes + "\n")
    proc = write(tmp_path, "proc-self-cgroup",
                 f"12:memory:{own}\n11:cpu,cpuacct:{own}\n3:cpuset:/\n1:name=systemd:/user.slice\n")
    return root, proc


# ---- cgroup v2 ---------------------------------------------------------------------------

@pytest.mark.parametrize("cpu_max, expected", [
    ("max 100000", None),
    ("200000 100000", 2.0),
    ("150000 100000", 1.5),
    ("50000 100000", 0.5),
    ("100000", 1.0),  # period omitted: the kernel's default 100000
])
def test_v2_cpu_max(tmp_path, cpu_max, expected):
    root, proc = cgroup_v2(tmp_path, cpu_max=cpu_max)
    assert cgroup_cpu_quota(root, proc) == expected


def test_v2_nested_limits_take_the_smallest(tmp_path):
    root, proc = cgroup_v2(tmp_path, cpu_max="400000 100000", memory_max="max", own="/kubepods/pod1/box",
                           nested={"kubepods/pod1": {"cpu.max": "150000 100000", "memory.max": str(2 * 2**30)},
                                   "kubepods/pod1/box": {"cpu.max": "max 100000", "memory.max": str(3 * 2**30)}})
    assert cgroup_cpu_quota(root, proc) == 1.5
    assert cgroup_memory_limit_mb(root, proc) == 2048


def test_v2_memory_max(tmp_path):
    root, proc = cgroup_v2(tmp_path, memory_max="max")
    assert cgroup_memory_limit_mb(root, proc) is None
    root2, proc2 = cgroup_v2(tmp_path / "b", memory_max=str(512 * 2**20))
    assert cgroup_memory_limit_mb(root2, proc2) == 512


def test_v2_own_path_missing_under_the_mount_falls_back_to_the_root(tmp_path):
    # inside a container /proc/self/cgroup names a path the container's mount does not show
    root, proc = cgroup_v2(tmp_path, cpu_max="100000 100000", own="/system.slice/docker-abc.scope")
    assert cgroup_cpu_quota(root, proc) == 1.0


# ---- cgroup v1 ---------------------------------------------------------------------------

@pytest.mark.parametrize("quota, period, expected", [
    ("-1", "100000", None),
    ("200000", "100000", 2.0),
    ("50000", "100000", 0.5),
    ("150000", "50000", 3.0),
])
def test_v1_cfs_quota(tmp_path, quota, period, expected):
    root, proc = cgroup_v1(tmp_path, quota_us=quota, period_us=period)
    assert cgroup_cpu_quota(root, proc) == expected


def test_v1_plain_cpu_hierarchy_and_own_path(tmp_path):
    root, proc = cgroup_v1(tmp_path, quota_us="100000", own="/docker/abc", controller_dir="cpu")
    assert cgroup_cpu_quota(root, proc) == 1.0


@pytest.mark.parametrize("limit, expected", [
    ("9223372036854771712", None),  # v1's "unlimited"
    (str(1024 * 2**20), 1024),
])
def test_v1_memory_limit(tmp_path, limit, expected):
    root, proc = cgroup_v1(tmp_path, limit_bytes=limit, own="/process_api/abc")
    assert cgroup_memory_limit_mb(root, proc) == expected


def test_no_cgroup_files_means_no_limits(tmp_path):
    empty = tmp_path / "nothing"
    empty.mkdir()
    proc = write(tmp_path, "proc", "0::/\n")
    assert cgroup_cpu_quota(empty, proc) is None and cgroup_memory_limit_mb(empty, proc) is None
    assert cgroup_cpu_quota(tmp_path / "missing", tmp_path / "missing-proc") is None


def test_effective_cores_is_the_smaller_of_affinity_and_quota(tmp_path):
    affinity = len(os.sched_getaffinity(0))
    root, proc = cgroup_v2(tmp_path, cpu_max="50000 100000")
    assert effective_cores(root, proc) == 0.5
    root2, proc2 = cgroup_v2(tmp_path / "wide", cpu_max=f"{(affinity + 8) * 100000} 100000")
    assert effective_cores(root2, proc2) == affinity and isinstance(effective_cores(root2, proc2), int)
    root3, proc3 = cgroup_v2(tmp_path / "none", cpu_max="max 100000")
    assert effective_cores(root3, proc3) == affinity


def test_memory_limit_is_the_cgroup_or_total_ram(tmp_path):
    root, proc = cgroup_v2(tmp_path, memory_max=str(256 * 2**20))
    assert memory_limit_mb(root, proc) == 256
    root2, proc2 = cgroup_v2(tmp_path / "b", memory_max="max")
    assert memory_limit_mb(root2, proc2) == pytest.approx(machine()["memory_total_mb"], abs=1)


# ---- the fingerprint -----------------------------------------------------------------------

def test_machine_fingerprint_keys_and_values():
    info = machine()
    for key in ("effective_cores", "os_cpu_count", "memory_limit_mb", "memory_total_mb", "python", "versions",
                "platform", "hostname", "on_binder", "on_jupyterhub", "quick_mode"):
        assert key in info
    assert 0 < info["effective_cores"] <= info["os_cpu_count"]
    assert info["effective_cores"] <= len(os.sched_getaffinity(0))
    assert 0 < info["memory_limit_mb"] <= info["memory_total_mb"] + 1
    assert info["python"] == platform.python_version()
    assert set(info["versions"]) == {"flask", "gunicorn", "gevent", "psutil", "numpy", "pandas"}
    assert all(isinstance(v, str) for v in info["versions"].values())


def test_environment_flags(monkeypatch):
    for key in [k for k in os.environ if k.startswith("BINDER_")]:
        monkeypatch.delenv(key)
    monkeypatch.delenv("JUPYTERHUB_SERVICE_PREFIX", raising=False)
    monkeypatch.setenv("COURSE_QUICK", "0")
    info = machine()
    assert not info["on_binder"] and not info["on_jupyterhub"] and not info["quick_mode"]
    assert describe_machine(info).endswith("— local")
    monkeypatch.setenv("BINDER_LAUNCH_HOST", "https://mybinder.org/")
    monkeypatch.setenv("JUPYTERHUB_SERVICE_PREFIX", "/user/someone/")
    monkeypatch.setenv("COURSE_QUICK", "1")
    info = machine()
    assert info["on_binder"] and info["on_jupyterhub"] and info["quick_mode"]
    assert "Binder" in describe_machine(info) and "quick mode" in describe_machine(info)


def test_describe_machine_is_one_line():
    line = describe_machine()
    cores = machine()["effective_cores"]
    assert "\n" not in line and line.startswith(f"{cores} effective core")
    assert "cgroup quota:" in line and "GiB memory limit" in line and platform.python_version() in line
    stored = {"effective_cores": 1.5, "cpu_quota_cores": 1.5, "memory_limit_mb": 2048, "python": "3.12.1"}
    assert describe_machine(stored) == ("1.5 effective cores (cgroup quota: 1.5 cores), 2.0 GiB memory limit, "
                                        "Python 3.12.1 — local")
