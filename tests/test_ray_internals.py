"""The Ray internals in sweeper/ray_internals.py still exist in the installed Ray.

Fails on the Ray upgrade that moves one, naming it, rather than letting the sweep quietly
lose the speed-up (or its fast error) that the internal buys."""

from __future__ import annotations

import pytest

from sweeper import ray_internals


@pytest.mark.parametrize("dotted", ray_internals.INTERNALS)
def test_each_internal_resolves(dotted):
    try:
        ray_internals.resolve(dotted)
    except (ImportError, AttributeError) as e:
        pytest.fail(f"Ray moved {dotted} ({e}): update sweeper/ray_internals.py")


def test_check_passes_on_the_installed_ray():
    ray_internals.check()


def test_internals_were_read_from_the_installed_ray():
    import ray

    assert ray.__version__ == ray_internals.CHECKED_AGAINST, (
        f"ray {ray.__version__} is installed, sweeper/ray_internals.py was read against "
        f"{ray_internals.CHECKED_AGAINST}: if the other tests here pass, set CHECKED_AGAINST")


def test_a_moved_internal_is_reported_in_one_line(monkeypatch):
    monkeypatch.setattr(ray_internals, "INTERNALS", (*ray_internals.INTERNALS, "ray._private.worker._no_such_name"))
    with pytest.raises(ray_internals.RayInternalsMoved) as err:
        ray_internals.check()
    message = str(err.value)
    assert "\n" not in message
    assert "ray._private.worker._no_such_name" in message and ray_internals.CHECKED_AGAINST in message


def test_stop_ray_kills_the_monitor_of_a_local_head(monkeypatch):
    """Node.all_processes and ProcessInfo.process exist only on a live node: start one."""
    import ray

    from sweeper.cluster import connect_ray, stop_ray

    monkeypatch.setenv("RAY_CHDIR_TO_TRIAL_DIR", "0")  # connect_ray sets it; restored after
    assert connect_ray({"num_cpus": 1})
    try:
        monitors = ray_internals.local_monitor_processes()
        assert len(monitors) == 1, "the local head's autoscaler monitor was not found"
    finally:
        stop_ray()
    assert not ray.is_initialized()
    assert all(p.poll() is not None for p in monitors)


def test_stop_ray_shuts_down_the_slow_way_when_the_internals_moved(monkeypatch, caplog):
    import ray

    from sweeper import cluster

    def moved():
        raise ray_internals.RayInternalsMoved("ray 9.9 has no ray._private.worker._global_node")

    calls = []
    monkeypatch.setattr(ray_internals, "local_monitor_processes", moved)
    monkeypatch.setattr(ray, "shutdown", lambda: calls.append("shutdown"))
    cluster.stop_ray()
    assert calls == ["shutdown"]
    assert "ray 9.9 has no ray._private.worker._global_node" in caplog.text
