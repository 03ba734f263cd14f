"""The Ray internals in sweeper/runtime/ray_internals.py still exist in the installed Ray.

Fails on the Ray upgrade that moves one, naming it, rather than letting the sweep quietly
lose the speed-up (or its fast error) that the internal buys."""

from __future__ import annotations

import pytest

from smallinit.sweeper.runtime import ray_internals

from .conftest import REPO


@pytest.mark.parametrize("dotted", ray_internals.INTERNALS)
def test_each_internal_resolves(dotted):
    try:
        ray_internals.resolve(dotted)
    except (ImportError, AttributeError) as e:
        pytest.fail(f"Ray moved {dotted} ({e}): update sweeper/runtime/ray_internals.py")


def test_check_passes_on_the_installed_ray():
    ray_internals.check()


def test_the_installed_ray_and_pyproject_are_the_range_the_internals_are_vouched_for():
    """pip installs what pyproject.toml allows; the internals are vouched for in SUPPORTED only:
    the two are one range, holding the Ray they were read from and the installed one."""
    import tomllib

    import ray
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet

    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    (required,) = [r for r in map(Requirement, deps) if r.name == "ray"]
    assert required.specifier == SpecifierSet(ray_internals.SUPPORTED), (
        f"pyproject.toml allows ray{required.specifier}, sweeper/runtime/ray_internals.py vouches for "
        f"ray{ray_internals.SUPPORTED}: make them one range")
    assert ray_internals.CHECKED_AGAINST in required.specifier
    assert ray.__version__ == ray_internals.installed_version()
    assert ray.__version__ in required.specifier, (
        f"ray {ray.__version__} is installed, outside ray{ray_internals.SUPPORTED}: if the other tests here "
        "pass, widen SUPPORTED and pyproject.toml together")


@pytest.mark.parametrize("version", ["2.59.9", "2.61.0", "3.0.0", "2.61.0rc1"])
def test_a_ray_outside_the_range_counts_as_moved_in_one_line(monkeypatch, version):
    monkeypatch.setattr(ray_internals, "installed_version", lambda: version)
    with pytest.raises(ray_internals.RayInternalsMoved) as err:
        ray_internals.check()
    assert str(err.value) == (f"ray {version} is installed and sweeper/runtime/ray_internals.py is checked against "
                              f"ray{ray_internals.SUPPORTED} only (pip install 'ray[tune]{ray_internals.SUPPORTED}')")
    monkeypatch.setattr(ray_internals, "installed_version", lambda: "2.60.3")
    ray_internals.check()  # a patch release of the one minor version


def test_a_moved_internal_is_reported_in_one_line(monkeypatch):
    monkeypatch.setattr(ray_internals, "INTERNALS", (*ray_internals.INTERNALS, "ray._private.worker._no_such_name"))
    with pytest.raises(ray_internals.RayInternalsMoved) as err:
        ray_internals.check()
    message = str(err.value)
    assert "\n" not in message
    assert "ray._private.worker._no_such_name" in message and ray_internals.CHECKED_AGAINST in message


@pytest.mark.integration
def test_stop_ray_kills_the_monitor_of_a_local_head(monkeypatch):
    """Node.all_processes and ProcessInfo.process exist only on a live node: start one."""
    import ray

    from smallinit.sweeper.runtime.cluster import connect_ray, stop_ray

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

    from smallinit.sweeper.runtime import cluster

    def moved():
        raise ray_internals.RayInternalsMoved("ray 9.9 has no ray._private.worker._global_node")

    calls = []
    monkeypatch.setattr(ray_internals, "local_monitor_processes", moved)
    monkeypatch.setattr(ray, "shutdown", lambda: calls.append("shutdown"))
    cluster.stop_ray()
    assert calls == ["shutdown"]
    assert "ray 9.9 has no ray._private.worker._global_node" in caplog.text
