"""The folders and the study agree at every run: a finished trial whose folder is gone, or whose
result.json cannot be reported, is named in one line and trained again; a rerun in which every
trial stays failed exits non-zero. Real sweeps (tiny configs, local Ray), files damaged by hand."""

from __future__ import annotations

import math
import shutil

import pytest

from .conftest import DIVERGES, sweep, table

GRID = ["init.gamma=0.5,0.75,1.0", "wandb.mode=disabled", "name=rec"]


@pytest.mark.slow  # two sweeps, five trials: ~1 min on two idle cores
def test_a_lost_or_damaged_finished_trial_is_named_and_trained_again(tmp_path, data_cache):
    first = sweep(tmp_path, data_cache, *GRID)
    assert first.returncode == 0, first.stderr[-3000:]
    sweep_dir = tmp_path / "sweeps" / "rec"
    before = table(tmp_path, "rec").sort_values("config/init.gamma").reset_index(drop=True)
    assert before["state"].tolist() == ["COMPLETE"] * 3
    gone, garbage, bad_meta = (sweep_dir / p for p in before["trial_dir"])
    shutil.rmtree(gone)  # rm -rf trials/<id>
    (garbage / "result.json").write_bytes(b"\x80\xff\x00 not json at all")
    (bad_meta / "trial.json").write_bytes(b"\xfe\xfe")

    again = sweep(tmp_path, data_cache, *GRID)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "Traceback" not in again.stderr and "3 trials (1 already done)" in again.stdout, again.stdout
    assert (f"its folder sweeps/rec/trials/{gone.name} is gone; the trial trains again") in again.stdout
    assert (f"study: sweeps/rec/trials/{garbage.name}/result.json is damaged (not readable JSON (cut off or "
            "overwritten)): set aside as result.json.corrupt-") in again.stdout
    assert len(list(garbage.glob("result.json.corrupt-*"))) == 1  # kept for a look, not deleted
    # A damaged trial.json of a finished trial: its twin in sweep.json gives back the very bytes.
    assert (f"sweeps/rec/trials/{bad_meta.name}/trial.json was cut short (2 bytes; the trial wrote") in again.stdout
    assert "rewritten from sweep.json, which holds the same record" in again.stdout
    assert (bad_meta / "trial.json").read_bytes() != b"\xfe\xfe" and len(list(bad_meta.glob("trial.json.corrupt-*"))) == 1

    after = table(tmp_path, "rec").sort_values("config/init.gamma").reset_index(drop=True)
    assert after["state"].tolist() == ["COMPLETE"] * 3 and after["identity"].tolist() == before["identity"].tolist()
    assert all(math.isfinite(v) for v in after["final_val_loss"]) and (after["n_params"] > 0).all()
    # Same config, same seed, same machine: the trial trained again gives the same loss.
    assert after["final_val_loss"][0] == before["final_val_loss"][0]
    assert after["final_val_loss"][2] == before["final_val_loss"][2]  # untouched: not trained again
    assert (bad_meta / "result.json").stat().st_mtime < (garbage / "result.json").stat().st_mtime


@pytest.mark.slow  # make test stays under 10 min on 2 cores; CI runs it after
def test_a_rerun_in_which_every_trial_stays_failed_exits_non_zero_and_says_so(tmp_path, data_cache):
    first = sweep(tmp_path, data_cache, *DIVERGES, "name=allfail")
    assert first.returncode == 1 and table(tmp_path, "allfail")["state"].tolist() == ["FAIL"], first.stderr[-2000:]
    again = sweep(tmp_path, data_cache, *DIVERGES, "name=allfail")
    assert "1 trials (1 already done)" in again.stdout
    assert again.returncode == 1
    last = again.stderr.strip().splitlines()[-1]
    assert last.startswith("error: the one trial of this sweep failed in an earlier run and was not run again"), \
        again.stderr[-2000:]
    assert "hydra.sweeper.retry_failed=true trains them again" in last
    assert "diverged at" in again.stdout  # the reason, under 'failed'
