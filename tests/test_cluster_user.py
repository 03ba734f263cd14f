"""The cluster recipe of docs/sweeps.md, run as a user runs it: `ray start --head`, one `ray start
--address` worker, a sweep with ray.address=auto, `ray stop`, under token authentication as
Ray 2.60 sets it up (RAY_AUTH_MODE=token, the token in ~/.ray/auth_token).

`ray stop` stops every Ray process it can see, so the recipe runs in a PID namespace of its
own (`unshare --pid`): there it sees only this cluster, not another session's Ray, and whatever
outlives the script dies with the namespace. The cluster's folders are its own too: RAY_TMPDIR
(short, for Ray's socket paths), HOME (the token) and the ports."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd
import pytest

from .conftest import REPO, TINY

VENV_BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def namespaces_allowed() -> bool:
    try:
        return subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True,
                              timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def run_in_own_pid_namespace(script: str, env: dict[str, str], timeout: float) -> str:
    """Run a bash script as PID 1 of a new PID namespace; its stdout and stderr together.
    --kill-child: if unshare is killed (the timeout), the namespace goes with it."""
    proc = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "bash", "-c", script],
                          env=env, capture_output=True, text=True, timeout=timeout)
    return proc.stdout + proc.stderr


def step_codes(output: str) -> dict[str, int]:
    return {name: int(rc) for name, rc in re.findall(r"^STEP (\S+) rc=(\d+)$", output, flags=re.M)}


def step_output(output: str, name: str) -> str:
    return output.split(f"BEGIN {name}\n", 1)[1].split(f"\nSTEP {name} rc=", 1)[0]


@pytest.mark.slow
@pytest.mark.skipif(not namespaces_allowed(), reason="needs `unshare --pid` (root) to keep `ray stop` to this cluster")
def test_a_user_started_cluster_with_token_auth_runs_a_sweep_on_both_nodes_and_stops(tmp_path, data_cache):
    ray_tmp = Path(tempfile.mkdtemp(prefix="rc", dir="/tmp"))  # Ray's socket paths must stay short
    home = tmp_path / "home"
    home.mkdir()
    port, dashboard_port = free_port(), free_port()
    tiny = " ".join(shlex.quote(a) for a in [*TINY, "init.gamma=0.5,1.0", "ray.cpus_per_trial=1"])
    sweep = f"python {shlex.quote(str(REPO / 'sweep.py'))} -m {tiny}"
    # The recipe's commands, each followed by its exit code; the sizes and ports are the test's.
    script = f"""
exec 2>&1  # one stream, in order: each step's output lies between its BEGIN and STEP lines
step() {{ name=$1; shift; echo "BEGIN $name"; "$@"; printf "\\nSTEP %s rc=%d\\n" "$name" $?; }}
export RAY_AUTH_MODE=token
step token ray get-auth-token --generate
step head ray start --head --port={port} --num-cpus=1 --dashboard-port={dashboard_port} --disable-usage-stats
RAY_AUTH_TOKEN=not-the-token step wrong_token ray status
step worker ray start --address=$(cat "$RAY_TMPDIR/ray/ray_current_cluster") --num-cpus=1 --disable-usage-stats
cd {shlex.quote(str(tmp_path))}
step sweep {sweep} ray.address=auto name=cluster
# a driver that names the head but lacks RAY_AUTH_MODE sends no token (the recipe's warning)
step no_auth_mode env -u RAY_AUTH_MODE {sweep} ray.address=$(cat "$RAY_TMPDIR/ray/ray_current_cluster") name=noauth
step stop ray stop
echo LEFT; ps -e -o pid=,args= | grep -v -e 'ps -e' -e grep -e '^ *1 ' ; echo END
"""
    env = {**os.environ, "PATH": f"{VENV_BIN}:{os.environ['PATH']}", "PYTHONPATH": os.pathsep.join([os.path.join(REPO, "src"), str(REPO)]),
           "RAY_TMPDIR": str(ray_tmp), "HOME": str(home), "SMALLINIT_CACHE": str(data_cache)}
    for var in ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):  # only the recipe's own settings
        env.pop(var, None)
    try:
        output = run_in_own_pid_namespace(script, env, timeout=900)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    codes = step_codes(output)
    assert codes == {"token": 0, "head": 0, "wrong_token": 1, "worker": 0, "sweep": 0, "no_auth_mode": 1,
                     "stop": 0}, output[-4000:]
    # the cluster checks tokens: a wrong one is turned away at once
    assert "AuthenticationError: RPC error: InvalidAuthToken" in step_output(output, "wrong_token")
    error = step_output(output, "no_auth_mode").strip().splitlines()[-1]
    assert error.startswith("error: ray.address=") and "could not connect (Failed to connect to Ray cluster at" in error
    assert error.endswith("if the cluster uses token authentication, set RAY_AUTH_MODE=token here and the "
                          "cluster's token in ~/.ray/auth_token or RAY_AUTH_TOKEN"), error
    assert (home / ".ray" / "auth_token").stat().st_size > 0
    left = output.split("LEFT", 1)[1].split("END", 1)[0].strip()
    assert left == "", f"`ray stop` left these running: {left}"
    df = pd.read_parquet(tmp_path / "sweeps" / "cluster" / "results.parquet")
    assert sorted(df["config/init.gamma"]) == [0.5, 1.0] and set(df["state"]) == {"COMPLETE"}
    assert (df["final_val_loss"] > 0).all()
    assert df["node_id"].nunique() == 2, "one trial per 1-CPU node: both nodes must have run one"



@pytest.mark.slow  # ~60 s: a user's cluster stopped under a running sweep, then the rerun on a new one
@pytest.mark.skipif(not namespaces_allowed(), reason="needs `unshare --pid` (root)")
def test_a_cluster_stopped_under_a_sweep_ends_it_in_seconds_with_its_table_and_the_rerun_resumes(tmp_path, data_cache):
    ray_tmp = Path(tempfile.mkdtemp(prefix="rc", dir="/tmp"))
    port, dashboard_port = free_port(), free_port()
    tiny = " ".join(shlex.quote(a) for a in [*TINY, "init.gamma=0.5", "train.max_tokens=32768",
                                              "train.ckpt_every=8", "train.probe_every=0", "ray.cpus_per_trial=1"])
    sweep = f"python {shlex.quote(str(REPO / 'sweep.py'))} -m {tiny} ray.address=auto name=lost"
    head = f"ray start --head --port={port} --num-cpus=1 --dashboard-port={dashboard_port} --disable-usage-stats"
    script = f"""
exec 2>&1
step() {{ name=$1; shift; echo "BEGIN $name"; "$@"; printf "\\nSTEP %s rc=%d\\n" "$name" $?; }}
cd {shlex.quote(str(tmp_path))}
{head} > /dev/null
(step sweep {sweep}) > sweep.out 2>&1 &
for i in $(seq 1 600); do ls sweeps/lost/trials/*/checkpoint.pt > /dev/null 2>&1 && break; sleep 0.2; done
stopped=$(date +%s.%N); ray stop > /dev/null 2>&1; wait
echo "SECONDS $(python -c "print($(date +%s.%N) - $stopped)")"
cat sweep.out
{head} > /dev/null
step rerun {sweep}
ray stop > /dev/null 2>&1
"""
    env = {**os.environ, "PATH": f"{VENV_BIN}:{os.environ['PATH']}", "PYTHONPATH": os.pathsep.join([os.path.join(REPO, "src"), str(REPO)]),
           "RAY_TMPDIR": str(ray_tmp), "HOME": str(tmp_path), "SMALLINIT_CACHE": str(data_cache)}
    for var in ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE"):
        env.pop(var, None)
    try:
        output = run_in_own_pid_namespace(script, env, timeout=600)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert step_codes(output) == {"sweep": 1, "rerun": 0}, output[-4000:]
    seconds = float(re.search(r"^SECONDS (\S+)$", output, re.M).group(1))
    assert seconds < 30, f"the driver took {seconds:.0f} s to notice its cluster was gone"  # Ray alone: 60+
    lost = step_output(output, "sweep")
    assert "Traceback (most recent call last):\n  File \"" + str(REPO) not in lost  # none of ours
    assert re.search(r"^error: the Ray cluster at \S+ stopped answering \(.*\): recording the sweep without it; "
                     r"rerun the same command once a cluster answers", lost, re.M), lost[-3000:]
    assert "results: " in lost and "(1 interrupted)" in lost
    assert "1 resume from a checkpoint" in step_output(output, "rerun")
    df = pd.read_parquet(tmp_path / "sweeps" / "lost" / "results.parquet")
    assert df["state"].tolist() == ["COMPLETE"]


# ---- ray.address=auto finds what ray.init(address="auto") finds, or says where it looked ----

CHECK = """
import socket, sys, threading
from smallinit.core.errors import ConfigError
from smallinit.sweeper.runtime.cluster import check_reachable
listener = socket.create_server(("0.0.0.0", 0))  # Ray swaps 127.0.0.1 for the node IP
def answer_as_grpc():  # an HTTP/2 SETTINGS frame, as a GCS answers the probe (cluster._grpc_answer)
    while True:
        conn, _ = listener.accept()
        conn.sendall(bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))
threading.Thread(target=answer_as_grpc, daemon=True).start()
closed = socket.create_server(("127.0.0.1", 0))
ports = {"open": listener.getsockname()[1], "closed": closed.getsockname()[1]}
closed.close()
address, file, path = sys.argv[1:]
if file:
    with open(path, "w") as f:
        f.write(file.format(**ports))
try:
    check_reachable(address.format(**ports))
    print("REACHABLE")
except ConfigError as e:
    print("ERROR", e)
"""


def check_in_own_pid_namespace(address: str, ray_tmpdir: Path, file: str = "",
                               env: dict[str, str] | None = None) -> str:
    """check_reachable(address) in a fresh PID namespace, where Ray's last resort for "auto"
    (a Ray head running on this machine) sees no other session's Ray. A `file` is written as
    $RAY_TMPDIR/ray/ray_current_cluster; {open} and {closed} in it become a listening port
    and a closed one."""
    (ray_tmpdir / "ray").mkdir()
    full_env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    full_env.update({"PYTHONPATH": os.pathsep.join([os.path.join(REPO, "src"), str(REPO)]), "RAY_TMPDIR": str(ray_tmpdir), **(env or {})})
    proc = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", sys.executable, "-c", CHECK,
                           address, file, str(ray_tmpdir / "ray" / "ray_current_cluster")],
                          env=full_env, capture_output=True, text=True, timeout=120)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(("REACHABLE", "ERROR"))]
    assert proc.returncode == 0 and len(lines) == 1, proc.stdout + proc.stderr[-2000:]
    return lines[0]


needs_namespaces = pytest.mark.skipif(not namespaces_allowed(), reason="needs `unshare --pid` (root)")


@needs_namespaces
def test_auto_reads_the_address_file_under_ray_tmpdir(tmp_path):
    assert check_in_own_pid_namespace("auto", tmp_path, file="127.0.0.1:{open}") == "REACHABLE"


@needs_namespaces
def test_auto_with_a_stale_address_file_names_the_address_ray_found(tmp_path):
    line = check_in_own_pid_namespace("auto", tmp_path, file="127.0.0.1:{closed}")
    # Ray swaps 127.0.0.1 for this machine's address
    assert re.match(r"ERROR ray.address='auto' \(Ray found [\d.]+:\d+\) is invalid: cannot reach [\d.]+:\d+ \(", line), line


@needs_namespaces
def test_auto_with_no_cluster_names_the_file_it_read(tmp_path):
    line = check_in_own_pid_namespace("auto", tmp_path)
    assert line == (f"ERROR ray.address='auto' is invalid: no running Ray cluster found (RAY_ADDRESS is unset, "
                    f"{tmp_path}/ray/ray_current_cluster does not exist and no Ray head runs on this machine); "
                    "start one with `ray start --head`, or leave ray.address=null for a local Ray")


@needs_namespaces
def test_auto_takes_ray_address_first(tmp_path):
    line = check_in_own_pid_namespace("auto", tmp_path, file="127.0.0.1:{open}", env={"RAY_ADDRESS": "127.0.0.1:1"})
    assert re.match(r"ERROR ray.address='auto' \(Ray found [\d.]+:1\) is invalid: cannot reach [\d.]+:1 \(", line), line


def test_ray_client_addresses_are_refused_in_one_line():
    from smallinit.core.errors import ConfigError
    from smallinit.sweeper.runtime.cluster import check_reachable

    with pytest.raises(ConfigError) as err:
        check_reachable("ray://head:10001")
    assert str(err.value) == ("ray.address='ray://head:10001' is invalid: Ray Client (ray://) is not supported; "
                              "run the sweep on a node of the cluster with ray.address=auto or "
                              "ray.address=<head-ip>:6379")


LOCAL = """
from smallinit.sweeper.runtime import ray_internals
from smallinit.sweeper.runtime.cluster import connect_ray, stop_ray
assert connect_ray({"num_cpus": 1})
print("HEAD", bool(ray_internals.local_monitor_processes()))
stop_ray()
"""


@pytest.mark.integration
@needs_namespaces
@pytest.mark.slow
def test_a_local_sweep_starts_its_own_ray_beside_a_user_started_cluster():
    """ray.address=null is a Ray of the driver's own, though RAY_ADDRESS and a `ray start --head`
    address file (both of a cluster that is gone, here) would make a plain ray.init() join them."""
    ray_tmp = Path(tempfile.mkdtemp(prefix="rc", dir="/tmp"))  # Ray's socket paths must stay short
    try:
        (ray_tmp / "ray").mkdir()
        (ray_tmp / "ray" / "ray_current_cluster").write_text("127.0.0.1:1")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.join(REPO, "src"), str(REPO)]), "RAY_TMPDIR": str(ray_tmp), "RAY_ADDRESS": "127.0.0.1:1"}
        proc = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", sys.executable, "-c",
                               LOCAL], env=env, capture_output=True, text=True, timeout=300)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert proc.returncode == 0 and "HEAD True" in proc.stdout, proc.stdout + proc.stderr[-3000:]
