"""A sweep's local Ray (ray.address=null) starts only as promised, and says why when it does not:
kept to 127.0.0.1 or not started at all (unless ray.listen=all), refused in one line before
anything is written when it could not start (ray.num_cpus=0, a RAY_TMPDIR too long for Ray's
Unix sockets), and a start that fails anyway is one line with Ray's own reason."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path

import pytest

from smallinit.core.errors import ConfigError
from smallinit.sweeper.runtime import cluster, ray_internals, resources

from .conftest import error_line, sweep

LOCAL = {"address": None, "num_cpus": 1, "cpus_per_trial": 1, "gpus_per_trial": 0}


@pytest.fixture
def no_ray_start(monkeypatch):
    """ray.init and the reaper recorded, not run; connect_ray's environment restored after."""
    import ray

    calls = []
    monkeypatch.setattr(ray, "init", lambda **kwargs: calls.append(kwargs))
    monkeypatch.setattr(cluster, "_start_reaper", lambda: calls.append("reaper"))
    monkeypatch.setenv("RAY_CHDIR_TO_TRIAL_DIR", "0")
    return calls


def test_internals_that_moved_start_no_local_ray_and_name_the_setting(monkeypatch, no_ray_start):
    monkeypatch.setattr(ray_internals, "INTERNALS", (*ray_internals.INTERNALS, "ray._private.worker._no_such_name"))
    with pytest.raises(ConfigError) as err:
        cluster.connect_ray(LOCAL)
    message = str(err.value)
    assert "\n" not in message and no_ray_start == []
    assert message.startswith("ray.listen='loopback' cannot be applied, so the local Ray was not started: ray ")
    assert "has no ray._private.worker._no_such_name" in message and "set ray.listen=all" in message


def test_a_ray_outside_the_supported_range_is_refused_before_anything_is_written(monkeypatch, no_ray_start):
    """resources.check_local is the sweep's first check, before the study or any folder."""
    monkeypatch.setattr(ray_internals, "installed_version", lambda: "2.61.0")
    with pytest.raises(ConfigError, match=r"^ray\.listen='loopback' cannot be applied, so the local Ray was not "
                                          r"started: ray 2\.61\.0 is installed and .* set ray\.listen=all "):
        resources.check_local(LOCAL)
    resources.check_local({**LOCAL, "listen": "all"})
    resources.check_local({**LOCAL, "address": "10.0.0.1:6379"})  # a cluster's own Ray: not ours to keep


def test_listen_all_starts_the_local_ray_without_the_internals(monkeypatch, no_ray_start):
    def moved():
        raise ray_internals.RayInternalsMoved("ray 9.9 has no ray._private.worker._global_node")

    monkeypatch.setattr(ray_internals, "listen_on_loopback_only", moved)
    monkeypatch.setattr(ray_internals, "installed_version", lambda: "9.9.0")
    assert cluster.connect_ray({**LOCAL, "listen": "all"})
    assert no_ray_start[0] == "reaper" and no_ray_start[1]["address"] == "local"
    with pytest.raises(ConfigError, match=r"^ray\.listen='everywhere' is invalid: one of \['loopback', 'all'\]$"):
        resources.check_local({**LOCAL, "listen": "everywhere", "address": "10.0.0.1:6379"})


def test_a_ray_tmpdir_too_long_for_unix_sockets_is_refused_naming_its_length_and_the_limit(monkeypatch, tmp_path):
    # <base>/ray/session_<26 characters>_<pid>/sockets/plasma_store: 66 bytes besides base at a 5-digit pid
    room = cluster.SOCKET_PATH_MAX - len(f"/ray/session_{'0' * 26}_{os.getpid()}/sockets/plasma_store")
    fits = "/" + "d" * (room - 1)
    monkeypatch.setenv("RAY_TMPDIR", fits)
    cluster.check_local_start(LOCAL)
    monkeypatch.setenv("RAY_TMPDIR", fits + "d")
    with pytest.raises(ConfigError) as err:
        cluster.check_local_start(LOCAL)
    assert str(err.value) == (
        f"RAY_TMPDIR='{fits}d' is invalid: it is {room + 1} bytes, which makes Ray's socket paths "
        f"{cluster.SOCKET_PATH_MAX + 1} bytes where a Unix socket path holds at most {cluster.SOCKET_PATH_MAX}; "
        f"set RAY_TMPDIR to a folder of at most {room} bytes (e.g. /tmp)")
    monkeypatch.delenv("RAY_TMPDIR")
    monkeypatch.setenv("TMPDIR", fits + "d")  # Ray's fallback on Linux
    with pytest.raises(ConfigError, match=r"^TMPDIR='/d+' is invalid: .* set RAY_TMPDIR to a folder of at most"):
        cluster.check_local_start(LOCAL)


# Ray 2.60's exception when its GCS could not bind the port it was given (RAY_GCS_SERVER_PORT
# set to a port in use), as ray.init raised it on this machine; only the pid and port vary.
GCS_FAILED = (
    "Failed to start GCS.  Last 1 lines of error files:\n[2026-12-02 02:07:18,886 C 13420 13420] (gcs_server) "
    "grpc_server.cc:134:  An unexpected system state has occurred. You have likely discovered a bug in Ray. Please "
    "report this issue at https://github.com/ray-project/ray/issues and we'll work with you to fix it. Check failed: "
    "server_ Failed to start the grpc server. The specified port is 44969. This means that Ray's core components "
    "will not be able to function correctly. If the server startup error message is `Address already in use`, it "
    "indicates the server fails to start because the port is already used by other processes.\n\n.Please check "
    "/tmp/ray/session_2026-12-02_02-07-18_497250_13402/logs/gcs_server.out for details. Last connection error: None")


def test_a_failed_start_is_one_line_with_rays_reason_and_where_its_logs_are(monkeypatch, tmp_path):
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    logs = tmp_path / "ray" / f"session_2026-12-02_02-07-18_497250_{os.getpid()}" / "logs"
    logs.mkdir(parents=True)
    assert cluster.start_failure(RuntimeError(GCS_FAILED)) == (
        "the local Ray (ray.address=null) did not start: Failed to start GCS: server_ Failed to start the grpc "
        f"server. The specified port is 44969.; Ray's logs are in {logs}")
    logs.rmdir()
    error = NotADirectoryError(20, "Not a directory")
    assert cluster.start_failure(error) == ("the local Ray (ray.address=null) did not start: [Errno 20] Not a "
                                            f"directory; RAY_TMPDIR='{tmp_path}' must be a folder this user can "
                                            "write, with free space")


@pytest.fixture
def ray_tmp():
    """A RAY_TMPDIR of this test's own: short enough for Ray's socket paths, and empty unless a
    Ray started there (/tmp/ray's session_latest moves with any other session's Ray)."""
    path = Path(tempfile.mkdtemp(prefix="rl", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_ray_tmpdir_that_is_a_file_is_refused_before_anything_is_written(tmp_path, data_cache, ray_tmp):
    """RAY_TMPDIR names a file, where Ray would make its folder: once found only when Ray failed
    to start (after the study and the trial folders were written), now before."""
    not_a_folder = ray_tmp / "file"
    not_a_folder.write_text("")
    proc = sweep(tmp_path, data_cache, "init.gamma=0.5", "name=nostart", env={"RAY_TMPDIR": str(not_a_folder)},
                 timeout=300)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    # Found before the study or any folder is written (sweeper/runtime/cluster.py check_local_start).
    assert error_line(proc) == (f"error: RAY_TMPDIR='{not_a_folder}' is invalid: it is not a folder this user can "
                                "write, and the local Ray keeps its sessions there; point it at one (e.g. /tmp)")
    assert not (tmp_path / "sweeps").exists()


REFUSED = [
    (["ray.num_cpus=0"], "", "error: ray.num_cpus=0 is invalid: must be a whole number >= 1, or null for all of "
                             "this machine's cores"),
    (["ray.listen=everywhere"], "", "error: ray.listen='everywhere' is invalid: one of ['loopback', 'all']"),
    ([], "r" * 60, "error: RAY_TMPDIR='/tmp/rl"),
    (["ray.address=127.0.0.1:1"], "", "error: ray.address='127.0.0.1:1' is invalid: cannot reach 127.0.0.1:1"),
]


@pytest.mark.parametrize("args, below, message", REFUSED, ids=["num_cpus=0", "listen", "RAY_TMPDIR", "unreachable"])
def test_a_local_ray_that_could_not_start_is_refused_and_nothing_is_left_behind(tmp_path, data_cache, ray_tmp, args,
                                                                              below, message):
    env = {"RAY_TMPDIR": str(ray_tmp / below)}  # a name too long for Ray's sockets where `below` is one
    proc = sweep(tmp_path, data_cache, "init.gamma=0.5,1.0", *args, "name=refused", env=env, timeout=180)
    assert proc.returncode == 1 and error_line(proc).startswith(message), proc.stderr[-2000:]
    assert list(tmp_path.iterdir()) == [] and list(ray_tmp.iterdir()) == []  # no study, no folder, no Ray


@pytest.mark.parametrize("reply", [b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n",
                                   pytest.param(b"", marks=pytest.mark.slow)], ids=["web", "silent"])
def test_an_address_where_no_ray_head_listens_is_refused_before_anything_is_written(tmp_path, data_cache, ray_tmp,
                                                                                   reply):
    """A port that accepts connections but is no GCS (the dashboard's 8265, a web server, a
    silent service): ray.init would retry it for minutes after the study was written."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def answer():
        conn, _ = server.accept()
        with conn:
            conn.recv(64)
            if reply:
                conn.sendall(reply)
            time.sleep(8)  # silent: the probe's 5 s pass with nothing read

    threading.Thread(target=answer, daemon=True).start()
    try:
        proc = sweep(tmp_path, data_cache, "init.gamma=0.5,1.0", f"ray.address=127.0.0.1:{port}", "name=notray",
                     env={"RAY_TMPDIR": str(ray_tmp)}, timeout=180)
    finally:
        server.close()
    said = "it answered b'HTTP/1.1 '" if reply else "it sent nothing in 5 s"
    assert proc.returncode == 1 and error_line(proc) == (
        f"error: ray.address='127.0.0.1:{port}' is invalid: 127.0.0.1:{port} is not a Ray head's GCS ({said}); give "
        "the address `ray start --head` prints (port 6379 unless --port; 8265 is the dashboard)"), proc.stderr[-2000:]
    assert list(tmp_path.iterdir()) == [] and list(ray_tmp.iterdir()) == []  # no study, no folder, no Ray
