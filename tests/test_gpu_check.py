"""bench.gpu.gpu_check runs where only torch and numpy exist (the lent GPU machine): checked here
in its CPU smoke form with the project's other dependencies made unimportable."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from .conftest import REPO

BLOCKED = ("ray", "hydra", "omegaconf", "optuna", "wandb", "tokenizers", "pandas", "pyarrow", "scipy", "matplotlib")
# None in sys.modules: `import x` fails and importlib.util.find_spec("x") says absent, as there.
RUNNER = f"""
import sys
for name in {BLOCKED!r}:
    sys.modules[name] = None
from smallinit.bench.gpu.gpu_check import main
sys.exit(main(sys.argv[1:]))
"""


def test_gpu_check_needs_only_torch_and_writes_its_record(data_cache, tmp_path):
    data = next(data_cache.glob("bilingual-*"))
    proc = subprocess.run([sys.executable, "-c", RUNNER, "--data", str(data), "--out", str(tmp_path), "--tiny",
                           "--device", "cpu", "--tokens", "2048", "--commit", "c0ffee"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads((tmp_path / "gpu_check.json").read_text())
    units = record["units"]
    assert list(units) == ["mfu-nano-cpu-smoke", "train-g0.5-lr0.001", "train-g1-lr0.001", "train-g0.5-lr0.003",
                           "train-g1-lr0.003", "fsdp"]
    assert not [name for name, u in units.items() if "error" in u or "skipped" in u]
    runs = [u for name, u in units.items() if name.startswith("train-")]
    assert [(r["gamma"], r["lr"]) for r in runs] == [(0.5, 1e-3), (1.0, 1e-3), (0.5, 3e-3), (1.0, 3e-3)]
    for r in runs:
        assert r["tokens"] == 2048 and math.isfinite(r["final_val_loss"]) and len(r["val_curve"]) >= 2
    # FSDP2 on one gloo rank, against the same steps unsharded: in fp32 the losses agree.
    f = units["fsdp"]
    assert (f["preset"], f["dtype"], f["backend"], f["world"]) == ("nano", "fp32", "gloo", 1)
    a, b = f["unsharded"], f["fsdp"]
    assert [s for s, _ in a["train_loss"]] == [s for s, _ in b["train_loss"]] == list(range(1, f["steps"] + 1))
    for (_, x), (_, y) in zip(a["train_loss"], b["train_loss"]):
        assert y == pytest.approx(x, rel=1e-5)
    assert b["final_val_loss"] == pytest.approx(a["final_val_loss"], rel=1e-5)
    assert f["losses_agree"] is True and f["max_rel_loss_diff"] <= 1e-5
    assert a["tokens_per_s"] > 0 and b["tokens_per_s"] > 0 and a["peak_memory_gb"] is None
    assert not list(tmp_path.glob("fsdp-warmup*"))
    # The record is stamped like every other; a named commit wins over the .git beside the files
    # (on a lent machine it may be older than them), which is kept beside it.
    stamp = record["provenance"]
    assert stamp["commit"] == "c0ffee" and stamp["commit_from"] == "--commit"
    assert stamp["git_on_this_machine"]["commit"] and stamp["machine"]["accelerator"]["device"] == "cpu"


def test_gpu_check_arms_confirms_each_arm_at_the_lr_its_tune_seed_chose(data_cache, tmp_path):
    data = next(data_cache.glob("bilingual-*"))
    proc = subprocess.run([sys.executable, "-c", RUNNER, "--data", str(data), "--out", str(tmp_path), "--tiny",
                           "--device", "cpu", "--tokens", "2048", "--units", "arms"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    units = json.loads((tmp_path / "gpu_check.json").read_text())["units"]
    from smallinit.bench.gpu.gpu_check import ARM_LRS, ARMS, CONFIRM_SEEDS, TUNE_SEED

    for arm in ARMS:
        tune = [u for u in units.values() if u["role"] == "tune" and u["arm"] == arm]
        assert sorted(u["lr"] for u in tune) == sorted(ARM_LRS) and {u["seed"] for u in tune} == {TUNE_SEED}
        best = min(tune, key=lambda u: u["final_val_loss"])["lr"]
        confirm = [u for u in units.values() if u["role"] == "confirm" and u["arm"] == arm]
        assert [u["seed"] for u in confirm] == list(CONFIRM_SEEDS) and {u["lr"] for u in confirm} == {best}
        assert {(u["gamma"], u["eps"], u["gate"]) for u in tune + confirm} == {tuple(ARMS[arm].values())}


def test_a_failing_unit_is_recorded_and_the_rest_still_run(tmp_path):
    """On a one-shot machine an error in one unit must not cost the others, and a unit the
    deadline passed is recorded as skipped, not left out."""
    from smallinit.bench.gpu.gpu_check import Record

    rec = Record(tmp_path / "gpu_check.json", deadline_s=3600, head={"provenance": {}})
    rec.run("broken", lambda: 1 / 0, log=lambda *_: None)
    rec.run("fine", lambda: {"value": 1}, log=lambda *_: None)
    rec.deadline_s = -1.0
    rec.run("late", lambda: {"value": 2}, log=lambda *_: None)
    units = json.loads((tmp_path / "gpu_check.json").read_text())["units"]
    assert units["broken"]["error"] == "ZeroDivisionError: division by zero" and "1 / 0" in units["broken"]["traceback"]
    assert units["fine"]["value"] == 1
    assert "deadline" in units["late"]["skipped"] and "value" not in units["late"]


def test_gpu_check_refuses_a_folder_without_tokens(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "smallinit.bench.gpu.gpu_check", "--data", str(tmp_path), "--tiny"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "no train.bin" in proc.stderr


def test_the_gpu_check_trains_train_gpus_batch_and_sequence(tmp_path, monkeypatch):
    """Its 0.1B trial is conf/train/gpu.yaml's batch x sequence, evaluated at least as often,
    read from the file (a changed file changes the trial)."""
    import yaml

    from smallinit.bench.gpu import gpu_bench
    from smallinit.bench.gpu.gpu_check import trial_for

    assert gpu_bench.gpu_train_preset() == yaml.safe_load(gpu_bench.GPU_TRAIN_YAML.read_text())
    assert (gpu_bench.SEQ_LEN, gpu_bench.START_BATCH["0.1b"]) == (gpu_bench.gpu_train_preset()["seq_len"],
                                                                 gpu_bench.gpu_train_preset()["batch_size"])
    changed = tmp_path / "gpu.yaml"
    changed.write_text("# a comment\nbatch_size: 8\nseq_len: 512  # tokens\neval_every: 3\ncompile: true\n")
    monkeypatch.setattr(gpu_bench, "GPU_TRAIN_YAML", changed)
    for split in ("train", "val"):
        np.zeros(4096, dtype=np.uint16).tofile(tmp_path / f"{split}.bin")
    trial = trial_for("0.1b", 1.0, 1e-3, tmp_path, 32768, 100 * 8 * 512, "cpu", False)
    assert (trial.train.batch_size, trial.train.seq_len, trial.train.eval_every) == (8, 512, 3)


def test_an_earlier_runs_record_is_refused_before_any_unit_unless_overwrite(tmp_path, capsys):
    """The lent machine's one-shot record: a second run into the same --out does not write over
    the first's gpu_check.json (core/written.py), and --overwrite takes it over."""
    from smallinit.bench.gpu.gpu_check import main

    data = tmp_path / "data"
    data.mkdir()
    for name in ("train.bin", "val.bin"):
        (data / name).write_bytes(b"\0\0" * 64)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "gpu_check.json").write_text('{"units": {"kept": 1}}\n')
    assert main(["--data", str(data), "--out", str(tmp_path / "out"), "--device", "cpu", "--tiny"]) == 2
    assert "holds gpu_check.json from an earlier run: give another --out, or --overwrite" in capsys.readouterr().err
    assert (tmp_path / "out" / "gpu_check.json").read_text() == '{"units": {"kept": 1}}\n'


@pytest.mark.parametrize("damage, says", [
    ("zero-byte val.bin", "no val.bin of uint16 token ids there"),
    ("--device cud", "--device=cud is invalid: "),
    ("--out a file", "is invalid: it is a file; give a folder"),
    ("our own earlier record", "holds gpu_check.json from an earlier run"),
])
def test_gpu_check_refuses_what_a_unit_would_trip_on_in_one_line_before_writing(tmp_path, capsys, damage, says):
    from smallinit.bench.gpu.gpu_check import main
    from smallinit.core import written

    data, out = tmp_path / "data", tmp_path / "out"
    data.mkdir()
    for name in ("train.bin", "val.bin"):
        (data / name).write_bytes(b"\0\0" * 64)
    args = ["--data", str(data), "--out", str(out), "--device", "cpu", "--tiny"]
    if damage == "zero-byte val.bin":
        (data / "val.bin").write_bytes(b"")
    elif damage == "--device cud":
        args[5] = "cud"
    elif damage == "--out a file":
        out.write_text("mine")
    else:  # a record this tool wrote, unchanged: still the lent machine's only copy
        written.write_outputs(out, {"gpu_check.json": '{"units": {}}\n'}, by="smallinit.bench.gpu.gpu_check")
    before = sorted(p.name for p in tmp_path.rglob("*"))
    assert main(args) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.rglob("*")) == before

