"""bench/base/cpu_account.py: process roles from command lines, and CPU seconds read from /proc."""

import subprocess
import sys
import time
from pathlib import Path

import pytest

from smallinit.bench.base.cpu_account import CpuAccount, descendants, role

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def test_roles_from_command_lines():
    # A Ray worker's command line names the raylet's socket; it is still a worker.
    worker = "python\0.../ray/_private/workers/default_worker.py\0--raylet-name=/tmp/ray/session/sockets/raylet"
    assert role(worker, False) == "trial workers"
    assert role("ray::ImplicitFunc.train", False) == "trial workers"
    assert role(".../ray/core/src/ray/raylet/raylet\0--node_ip_address=127.0.0.1", False) == "ray: raylet"
    assert role(".../ray/core/src/ray/gcs/gcs_server\0--port=0", False) == "ray: gcs_server"
    assert role("/x/wandb/bin/wandb-core\0--port-filename", False) == "wandb-core"
    # the reaper's real command line, as cluster.py starts it
    from smallinit.sweeper.runtime import cluster

    script = str(Path(cluster.__file__).with_name("reaper.py"))
    assert role(f"/venv/bin/python\0-I\0-S\0{script}\0SMALLINIT_OWNER\0tag\0123", False) == "reaper"
    assert role("python\0sweep.py\0-m", True) == "driver"
    assert role("/usr/bin/sleep\x0010", False) == "other: sleep"


def test_busy_child_is_counted_by_its_role():
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass\ntime.sleep(5)"
    child = subprocess.Popen([sys.executable, "-c", burn])
    try:
        account = CpuAccount(root=child.pid)
        deadline = time.time() + 10
        while time.time() < deadline:
            account.sample(descendants(child.pid))
            if account.by_role().get("driver", 0) >= 0.5:
                break
            time.sleep(0.2)
        assert 0.5 <= account.by_role()["driver"] < 3
        assert account.worker_threads() == {}
    finally:
        child.kill()
        child.wait()
