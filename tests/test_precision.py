"""train.dtype=auto: the choice follows the machine, says why, and a bf16 CPU trial trains."""

from __future__ import annotations

import math

import pytest
import torch

from smallinit.trainer.loop import run_trial
from smallinit.trainer.machine import precision
from smallinit.trainer.machine.precision import cpu_dtype, measure_cpu_bf16, resolve_dtype


def test_auto_on_this_cpu_is_a_valid_choice_with_a_reason(tmp_path, monkeypatch):
    monkeypatch.setenv("SMALLINIT_CACHE", str(tmp_path))
    choice = resolve_dtype(torch.device("cpu"), "auto")
    assert choice.dtype in ("bf16", "fp32")
    assert "CPU" in choice.reason
    # Measured once, then read from the per-machine cache.
    cached = list((tmp_path / "cpu_dtype").glob("*.json"))
    assert len(cached) == 1
    monkeypatch.setattr(precision, "measure_cpu_bf16", lambda: pytest.fail("measured again despite the cache"))
    assert cpu_dtype() == choice


def test_explicit_dtype_and_cuda_are_not_measured():
    assert resolve_dtype(torch.device("cpu"), "fp32").dtype == "fp32"
    assert resolve_dtype(torch.device("cpu"), "bf16").dtype == "bf16"
    assert resolve_dtype(torch.device("cuda"), "auto").dtype == "bf16"


@pytest.mark.parametrize(
    ("flags", "gflops", "expected"),
    [
        (set(), None, "fp32"),  # no native bf16: not even timed
        ({"avx2", "avx512_bf16"}, {torch.float32: 90.0, torch.bfloat16: 300.0}, "bf16"),
        ({"avx2", "amx_bf16"}, {torch.float32: 90.0, torch.bfloat16: 100.0}, "fp32"),  # present, not faster
    ],
)
def test_choice_follows_flags_and_timing(monkeypatch, flags, gflops, expected):
    monkeypatch.setattr(precision, "_cpu_identity", lambda: ("Test CPU", flags))
    if gflops is None:
        monkeypatch.setattr(precision, "_matmul_gflops", lambda dt: pytest.fail("timed without native bf16"))
    else:
        monkeypatch.setattr(precision, "_matmul_gflops", lambda dt: gflops[dt])
    choice = measure_cpu_bf16()
    assert choice.dtype == expected
    assert "Test CPU" in choice.reason or "x" in choice.reason


def test_bf16_cpu_trial_runs_end_to_end_and_records_its_dtype(trial_config, tmp_path):
    lines = []
    result = run_trial(trial_config("train.dtype=bf16"), tmp_path / "t", log=lines.append)
    assert result.dtype == "bf16"
    assert any(line.startswith("dtype: bf16") for line in lines)
    assert math.isfinite(result.final_val_loss) and result.final_val_loss < result.unigram_entropy + 2


def test_the_timed_ratio_takes_each_dtypes_best_round_alternating(monkeypatch):
    calls = []
    rates = {torch.float32: iter([50.0, 90.0, 70.0]), torch.bfloat16: iter([20.0, 300.0, 280.0])}

    def fake(dtype):
        calls.append(dtype)
        return next(rates[dtype])

    monkeypatch.setattr(precision, "_matmul_gflops", fake)
    assert precision.timed_bf16_ratio() == (90.0, 300.0)
    assert calls == [torch.float32, torch.bfloat16] * 3  # a burst of load lands on both
