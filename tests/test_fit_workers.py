"""ray.fit_device_gib: each trial on the fewest FSDP workers whose per-device estimate
(trainer/machine/memory.py) fits a device of that size, so one sweep over sizes gives each its own."""

from __future__ import annotations

import numpy as np
import pytest

from smallinit.core.errors import ConfigError
from smallinit.core.trial_dir import TrialDir
from smallinit.sweeper.runtime.resources import trial_workers
from smallinit.trainer.config import trial_config_from_dict
from smallinit.trainer.machine.memory import GIB, HEADROOM, estimate, planned_dtype

from .conftest import TINY, run_cli


@pytest.fixture
def gpu_form(tmp_path, compose):
    """gpu_form(preset, *overrides) -> (trial, ray config) of gpu/scaling_law, composed as the driver does."""
    tokens = tmp_path / "train.bin"
    np.random.default_rng(0).integers(0, 32768, 50_000).astype(np.uint16).tofile(tokens)

    def build(preset: str, *overrides: str):
        cfg = compose("+experiment=gpu/scaling_law", f"data.paths={tokens}", f"model={preset}", *overrides, tiny=False)
        return trial_config_from_dict(cfg), cfg["ray"]

    return build


def test_gpu_form_gives_small_presets_one_worker_and_large_ones_the_fewest_that_fit_80_gib(gpu_form):
    small, ray_cfg = gpu_form("0.1b")
    assert ray_cfg["fit_device_gib"] == 80 and small.train.parallel == "fsdp"
    # train.device=auto on this CPU machine: the trial asks Ray for a GPU, so it is planned in bf16.
    assert small.train.device == "auto" and planned_dtype(small, gpu=True) == "bf16"
    assert trial_workers(small, ray_cfg) == 1
    for preset in ("1b", "1.5b"):
        trial, ray_cfg = gpu_form(preset)
        n = trial_workers(trial, ray_cfg)
        assert n > 1 and trial.train.batch_size % n == 0
        assert estimate(trial, n, "fsdp", "bf16").fits(80)
        assert not estimate(trial, n // 2, "fsdp", "bf16").fits(80)  # the fewest: half as many do not fit


def test_without_fit_device_gib_every_trial_gets_workers_per_trial(gpu_form):
    trial, ray_cfg = gpu_form("1.5b", "ray.fit_device_gib=null", "ray.workers_per_trial=2")
    assert trial_workers(trial, ray_cfg) == 2


def test_a_trial_no_worker_count_fits_is_refused_in_one_line_naming_its_preset_and_estimate(gpu_form):
    trial, ray_cfg = gpu_form("0.1b", "ray.fit_device_gib=0.5")
    with pytest.raises(ConfigError) as e:
        trial_workers(trial, ray_cfg)
    message = str(e.value)
    assert message.startswith("ray.fit_device_gib=0.5 is invalid for model=0.1b: no FSDP worker count from "
                              "ray.workers_per_trial=1 up to 64 fits, and on 32 its memory per device (32 workers, fsdp, bf16): ")
    assert message.endswith(", above the 85% of 0.5 GiB planned for; raise it, or lower train.batch_size or "
                            "train.seq_len") and "fits a" not in message
    assert "\n" not in message


def test_fit_device_gib_needs_fsdp(gpu_form):
    trial, ray_cfg = gpu_form("0.1b", "train.parallel=ddp")
    with pytest.raises(ConfigError, match="^ray.fit_device_gib=80 is invalid: needs train.parallel=fsdp .*"
                                          "not train.parallel=ddp$"):
        trial_workers(trial, ray_cfg)


@pytest.mark.slow  # minutes on 2 busy cores: Ray started once, a 1-worker and a 2-worker trial
def test_a_sweep_runs_each_trial_on_its_own_worker_count(tmp_path, data_cache, trial_config):
    """The real CLI on a 2-CPU local Ray: nano fits the given GiB on 1 worker, micro needs 2."""
    base = ["train.dtype=fp32", "train.parallel=fsdp"]
    nano, micro = (trial_config(*base, f"model={m}") for m in ("nano", "micro"))
    need = [estimate(t, n, "fsdp", "fp32").total / HEADROOM / GIB for t, n in ((nano, 1), (micro, 2), (micro, 1))]
    gib = max(need[:2]) * 1.001
    assert gib < need[2], need  # micro on 1 worker does not fit it
    args = ["-m", *[t for t in TINY if not t.startswith("model=")], *base, "model=nano,micro", f"ray.fit_device_gib={gib}",
            "ray.num_cpus=2", "hydra.sweeper.asha.enabled=false", "name=fit"]
    proc = run_cli(args, cwd=tmp_path, env={"SMALLINIT_CACHE": str(data_cache), "WANDB_API_KEY": ""})
    assert proc.returncode == 0, proc.stderr[-3000:]
    folders = {d.path.name: d for d in TrialDir.all_in_sweep(tmp_path / "sweeps" / "fit")}
    one, two = folders[nano.identity()], folders[micro.identity(2)]  # 2 workers: part of micro's identity
    assert "[rank" not in one.log.read_text()  # one process
    log = two.log.read_text()
    for rank in (0, 1):
        assert log.count(f"[rank {rank}] rank {rank}/2 of trial {two.path.name}") == 1, log
    assert one.read_result() is not None and two.read_result() is not None
