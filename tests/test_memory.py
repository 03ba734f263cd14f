"""The per-device memory plan (trainer/machine/memory.py): its split over workers, the peak a real
training step reaches, and the line `--show` prints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from statistics import median

import pytest

from smallinit.trainer.machine.memory import estimate, saved_activation_bytes

from .conftest import REPO, run_cli

# One training step in a fresh process: the resident set before the step (weights, AdamW state)
# and its high-water mark during it, per repeat. glibc is told to map every allocation above
# 64 KiB on its own and to give freed memory back at once, so the resident set follows the live
# tensors (by default it keeps freed memory, and the step's peak hides in what it kept).
ALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}
MEASURE = r"""
import json, sys, torch, torch.nn.functional as F
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from smallinit.model.transformer import Transformer
from tests.conftest import CONF, TINY
from smallinit.trainer.config import trial_config_from_dict
torch.manual_seed(0); torch.set_num_threads(1)
with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
    trial = trial_config_from_dict(OmegaConf.to_container(compose("config", overrides=[*TINY, *sys.argv[1:]]), resolve=True))
model = Transformer(trial.model); opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x = torch.randint(0, trial.model.vocab_size, (trial.train.batch_size, trial.train.seq_len))
def status(field):
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith(field))
def step():
    logits, _ = model(x, return_aux=True)
    F.cross_entropy(logits.float().flatten(0, 1), x.flatten()).backward()
    opt.step(); opt.zero_grad(set_to_none=True)
step()
peaks = []
for _ in range(3):
    before = status("VmRSS")
    open("/proc/self/clear_refs", "w").write("5")  # the high-water mark starts again from here
    step()
    peaks.append(status("VmHWM") - before)
print(json.dumps(peaks))
"""


@pytest.mark.parametrize("model", ["micro", pytest.param("micro-moe", marks=pytest.mark.slow)])
def test_the_estimate_is_within_20_percent_of_a_real_steps_peak(trial_config, model):
    overrides = (f"model={model}", "train.batch_size=16", "train.seq_len=128", "train.max_tokens=65536",
                 "train.dtype=fp32")
    proc = subprocess.run([sys.executable, "-c", MEASURE, *overrides], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env={**os.environ, **ALLOC_ENV, "PYTHONPATH": os.pathsep.join([os.path.join(REPO, "src"), str(REPO)])})
    assert proc.returncode == 0, proc.stderr[-3000:]
    measured = median(json.loads(proc.stdout.strip().splitlines()[-1]))
    e = estimate(trial_config(*overrides), workers=1, dtype="fp32")
    step = e.total - e.weights - e.optimizer  # what the step allocates on top of what persists
    assert abs(step - measured) <= 0.2 * measured, (step, measured)


def test_activations_are_what_autograd_saves_at_the_workers_share_of_the_batch(trial_config):
    trial = trial_config("model=micro", "train.batch_size=16", "train.seq_len=64", "train.max_tokens=65536")
    one = saved_activation_bytes(trial.model, 16, 64, "fp32")
    assert saved_activation_bytes(trial.model, 8, 64, "fp32") == pytest.approx(one / 2, rel=0.01)
    assert saved_activation_bytes(trial.model, 16, 64, "bf16") < 0.75 * one  # bf16 saves half of most
    # Fused attention saves no seq x seq probabilities: doubling seq doubles the bytes.
    assert saved_activation_bytes(trial.model, 16, 128, "fp32") == pytest.approx(2 * one, rel=0.02)


def test_fsdp_shards_the_state_and_ddp_keeps_it_whole(trial_config):
    trial = trial_config("model=micro", "train.batch_size=16", "train.max_tokens=65536")
    alone, ddp, fsdp = (estimate(trial, w, p, "fp32") for w, p in ((1, "ddp"), (4, "ddp"), (4, "fsdp")))
    n = trial.model.num_params()
    assert (alone.weights, alone.grads, alone.optimizer, alone.gathered) == (4 * n, 4 * n, 8 * n, 0)
    assert (ddp.weights, ddp.optimizer, ddp.gathered) == (4 * n, 8 * n, 4 * n)  # buckets: another grads
    assert fsdp.weights == pytest.approx(n, abs=1) and fsdp.optimizer == pytest.approx(2 * n, abs=1)
    assert 0 < fsdp.gathered < ddp.gathered
    assert ddp.activations == fsdp.activations == pytest.approx(alone.activations / 4, rel=0.01)


@pytest.mark.slow  # make test stays under 10 min on 2 cores; CI runs it after
def test_show_prints_the_plan_per_device_and_how_many_fsdp_workers_fit_a_large_preset(tmp_path, data_cache):
    proc = run_cli(["--show", "model=1.5b", "train=gpu", "train.device=cuda"], cwd=tmp_path,
                   env={"SMALLINIT_CACHE": str(data_cache)})
    line = next(x for x in proc.stdout.splitlines() if "memory per device" in x)
    assert "(1 worker, bf16)" in line and "fits no device up to 141 GB" in line
    assert "with ray.workers_per_trial=4 train.parallel=fsdp it fits an 80 GB device" in line
    proc = run_cli(["--show", "-m", "model=1.5b", "train=gpu", "train.device=cuda", "ray.workers_per_trial=4",
                    "train.parallel=fsdp", "init.gamma=0.5,1.0"], cwd=tmp_path, env={"SMALLINIT_CACHE": str(data_cache)})
    lines = [x for x in proc.stdout.splitlines() if "memory per device" in x]
    assert len(lines) == 1 and "# each trial: memory per device (4 workers, fsdp, bf16)" in lines[0]  # gamma: no bytes
    assert "fits a 80 GB device" in lines[0] or "fits a 40 GB device" in lines[0]
