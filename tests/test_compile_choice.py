"""train.compile=auto: compile where the steps left repay the compile cost, on this machine's figures."""

from __future__ import annotations

import json

import pytest
import torch

from smallinit.trainer.distributed import Single
from smallinit.trainer.loop import run_trial
from smallinit.trainer.machine import compile_choice
from smallinit.trainer.machine.compile_choice import (
    PROBE_STEPS,
    RunCompiler,
    decide,
    measured,
    record,
)


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SMALLINIT_CACHE", str(tmp_path / "cache"))


def test_a_long_run_compiles_and_a_short_one_does_not_on_the_priors():
    # priors: 60 s to compile, 1.3x: 0.1 s eager steps save 0.023 s each, ~2,600 steps to repay
    assert decide(4080, 0.1, "shape").compile
    short = decide(44, 0.1, "shape")
    assert not short.compile and "priors" in short.reason and "44 steps left" in short.reason


def test_the_machines_measurement_replaces_the_priors():
    record("shape", compile_s=3.0, speedup=1.5)
    assert measured("shape") == {"compile_s": 3.0, "speedup": 1.5}
    assert measured("other shape") is None
    choice = decide(300, 0.1, "shape")  # 300 x 0.1 x (1/3) = 10 s saved > 3 s
    assert choice.compile and "measured on this machine" in choice.reason


def test_a_damaged_ledger_falls_back_to_the_priors():
    record("shape", compile_s=3.0, speedup=1.5)
    path = compile_choice._ledger_path("shape")
    path.write_text("{not json")
    assert measured("shape") is None
    path.write_text(json.dumps({"compile_s": 3.0, "speedup": 0}))
    assert measured("shape") is None


def _steps(compiler, durations, total, model):
    """Feeds step seconds as the trainer does; returns the step count at which it compiled."""
    at = None
    for i, s in enumerate(durations):
        if compiler.after_step(s, total - (i + 1), model) is not None:
            assert at is None, "compiled twice"
            at = i + 1
    return at


def test_auto_probes_then_decides_once_then_records_what_it_measured():
    model, lines = torch.nn.Linear(2, 2), []
    compiler = RunCompiler("auto", "shape", Single(), lines.append)
    assert compiler.forward(model) is model and compiler.reason is None
    eager = [0.5] * 4 + [0.1] * (PROBE_STEPS - 4)  # the first steps are slow: left out of the median
    compiled = [2.1] + [0.05] * RunCompiler.MEASURE_STEPS  # the first compiled step pays the compile
    at = _steps(compiler, eager + compiled + [0.05] * 10, 5000, model)
    assert at == PROBE_STEPS and compiler.compiled
    assert lines == [f"compile: {compiler.reason}"] and "compiled" in compiler.reason
    assert measured("shape") == {"compile_s": 2.0, "speedup": 2.0}


def test_auto_stays_eager_when_the_run_ends_within_its_probe():
    compiler = RunCompiler("auto", "shape", Single(), lambda *_: None)
    assert _steps(compiler, [0.1] * 5, 5, torch.nn.Linear(2, 2)) is None
    assert not compiler.compiled and "ended within its 5-step probe" in compiler.reason


@pytest.mark.parametrize("mode", ["true", "false"])
def test_true_and_false_act_at_the_start_and_never_probe(mode):
    model = torch.nn.Linear(2, 2)
    compiler = RunCompiler(mode, "shape", Single(), lambda *_: None)
    assert (compiler.forward(model) is not model) == (mode == "true")
    assert _steps(compiler, [0.1] * 40, 5000, model) is None and compiler.reason == f"train.compile={mode}"


def test_a_trial_records_its_compile_and_dtype_choice_with_the_reason(trial_config, tmp_path):
    result = run_trial(trial_config(), tmp_path / "t", log=lambda *_: None)
    assert result.made_by["compile"].startswith("train.compile=auto: eager")
    assert result.made_by["dtype"]  # the reason line precision.resolve_dtype gave
    assert json.loads((tmp_path / "t" / "result.json").read_text())["made_by"]["compile"] == result.made_by["compile"]


def test_the_sweeps_first_screen_says_the_dtype_and_how_compilation_is_chosen(trial_config):
    from smallinit.trainer.machine.compile_choice import shape_key, speed_line

    trial = trial_config("train.dtype=fp32")
    line = speed_line(trial)
    assert line.startswith("trials on this machine: fp32 (train.dtype=fp32); train.compile=auto: each trial times")
    assert "priors 60 s and 1.30x" in line
    record(shape_key(trial), compile_s=4.0, speedup=1.4)
    assert "this machine compiled this shape in 4 s for 1.40x" in speed_line(trial)
    assert speed_line(trial_config("train.compile=false")).endswith("train.compile=false")


def test_a_cuda_trial_announced_from_a_driver_without_a_gpu_does_not_stop_the_sweep(trial_config):
    from smallinit.trainer.machine.compile_choice import speed_line

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert speed_line(trial_config("train.device=cuda", "train.compile=false")) == (
        "trials: train.dtype=auto on their workers' cuda; train.compile=false")
