"""The CPU trial's allocator setting (trainer/machine/host_memory.py): what it chooses and why, and that
it does what it claims, freed memory reused instead of faulted in again."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

from smallinit.core.errors import ConfigError
from smallinit.trainer.machine import host_memory

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"



def _clean_env(**env) -> dict:
    kept = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    return {**kept, **env}


def _training_steps(side: str) -> dict:
    """Four bare training steps of the default micro trial (bench/cpu/allocator_bench.py's child)."""
    out = subprocess.run([sys.executable, "-m", "smallinit.bench.cpu.allocator_bench", "--child", "4", "train.device=cpu",
                          "train.threads=1"], cwd=REPO, env=_clean_env(SMALLINIT_CPU_ALLOCATOR=side, OMP_NUM_THREADS="1"),
                         capture_output=True, text=True, check=True, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.skipif(not GLIBC, reason="the setting applies to glibc only")
def test_training_steps_reuse_freed_memory_instead_of_faulting_it_in_again():
    default, kept = _training_steps("default"), _training_steps("retain")
    # glibc's defaults hand the step's large tensors (logits and their gradients) back to the
    # kernel when freed, so every step faults them in again: ~36k pages per step measured on a
    # Zen 4 machine (2.6k kept), ~48k on an AVX2 one (10.5-11k kept). A setting that did nothing
    # would keep the two equal; a third is below every machine measured.
    assert default["faults_per_step"] > 10_000
    assert kept["faults_per_step"] < default["faults_per_step"] / 3
    assert kept["peak_rss_mb"] < 1.5 * default["peak_rss_mb"]


@pytest.mark.skipif(not GLIBC, reason="the setting applies to glibc only")
def test_the_users_own_malloc_settings_win():
    code = f"import sys; sys.path.insert(0, {os.path.join(REPO, 'src')!r}); from smallinit.trainer.machine.host_memory import retain_freed_memory as r; print(r())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=_clean_env(SMALLINIT_CPU_ALLOCATOR="retain", MALLOC_TRIM_THRESHOLD_="131072"))
    assert out.stdout.strip() == "left as the environment sets it (MALLOC_TRIM_THRESHOLD_)"


def test_a_bad_switch_is_named_with_what_is_allowed(monkeypatch):
    monkeypatch.setenv(host_memory.ENV_SWITCH, "jemalloc")
    with pytest.raises(ConfigError, match=r"SMALLINIT_CPU_ALLOCATOR='jemalloc'.*'retain'.*'default'"):
        host_memory.check_switch()


@pytest.mark.parametrize("args", [["-m", "init.gamma=0.5,1.0"], []], ids=["sweep", "single run"])
def test_a_bad_switch_stops_the_command_before_any_trial(tmp_path, args):
    env = {**os.environ, host_memory.ENV_SWITCH: "fast", "PYTHONPATH": os.pathsep.join([os.path.join(REPO, "src"), str(REPO)])}
    proc = subprocess.run([sys.executable, os.path.join(REPO, "sweep.py"), *args, "model=nano", "wandb.mode=disabled"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1] == ("error: SMALLINIT_CPU_ALLOCATOR='fast': use 'retain' (keep freed "
                                                    "memory, the default) or 'default' (glibc's own)")
    assert not list(tmp_path.rglob("trial.json"))


def test_a_cpu_trial_says_what_its_allocator_does(trial_config, tmp_path):
    from smallinit.trainer.loop import run_trial

    lines = []
    run_trial(trial_config(), tmp_path / "t", log=lines.append)
    said = [line for line in lines if line.startswith("host allocator: ")]
    assert said == [f"host allocator: {host_memory.retain_freed_memory()}"]


@pytest.mark.parametrize("env, expected", [
    ({}, host_memory.RETAIN_ENV if GLIBC else {}),
    ({host_memory.ENV_SWITCH: "default"}, {}),
    ({"MALLOC_ARENA_MAX": "4"}, {}),  # the user's own setting is left alone
    ({"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"}, {}),
])
def test_what_the_sweep_hands_its_workers(monkeypatch, env, expected):
    for var in (*host_memory.USER_ALLOCATOR_VARS, host_memory.ENV_SWITCH, "LD_PRELOAD"):
        monkeypatch.delenv(var, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert host_memory.worker_env() == expected


@pytest.mark.parametrize("gpus, expected", [(None, True), (0, True), (0.5, False), (1, False)])
def test_only_cpu_trials_workers_get_the_setting(monkeypatch, gpus, expected):
    from smallinit.sweeper.runtime.cluster import allocator_env

    for var in (*host_memory.USER_ALLOCATOR_VARS, host_memory.ENV_SWITCH, "LD_PRELOAD"):
        monkeypatch.delenv(var, raising=False)
    got = allocator_env({"gpus_per_trial": gpus})
    assert got == (host_memory.worker_env() if expected else {})
    if expected and GLIBC:
        assert got == host_memory.RETAIN_ENV


@pytest.mark.skipif(not GLIBC, reason="the setting applies to glibc only")
def test_applied_from_another_thread_it_says_what_it_cannot_cover():
    code = (f"import sys, threading; sys.path.insert(0, {os.path.join(REPO, 'src')!r}); from smallinit.trainer.machine import host_memory as h\n"
            "t = threading.Thread(target=lambda: print(h.retain_freed_memory())); t.start(); t.join()")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=_clean_env(SMALLINIT_CPU_ALLOCATOR="retain"))
    assert out.stdout.strip().endswith("start the process with MALLOC_MMAP_THRESHOLD_=1073741824 "
                                       "MALLOC_TRIM_THRESHOLD_=1073741824 MALLOC_ARENA_MAX=1 to cover it")
