"""Every trial is held against its corpus before anything launches (trainer/data_check.py):
the budget's passes over the training tokens, and data too short, undecodable or out of the
vocabulary, each one line from the real CLI with nothing written. Then the shard recipe, raw
text to a trained trial (data/make_shards.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from smallinit.core.errors import ConfigError
from smallinit.data import make_shards
from smallinit.trainer.data_check import check_trials

from .conftest import TINY, run_cli


@pytest.fixture
def token_files(tmp_path):
    """12,800 training tokens and 400 validation tokens, ids < 500: with TINY's 128-token
    steps, 100 steps are exactly one pass."""
    ((np.arange(12_800) * 7) % 500).astype(np.uint16).tofile(tmp_path / "train.bin")
    ((np.arange(400) * 3) % 500).astype(np.uint16).tofile(tmp_path / "val.bin")
    return [f"data.paths=[{tmp_path / 'train.bin'},{tmp_path / 'val.bin'}]", "data=tokens", "data.vocab_size=500"]


@pytest.mark.parametrize("steps, max_epochs, ok", [(400, 4, True), (401, 4, False), (800, 8, True), (801, None, True)])
def test_the_budget_may_take_at_most_max_epochs_passes(trial_config, token_files, steps, max_epochs, ok):
    trial = trial_config(*token_files, f"train.max_steps={steps}", f"train.max_epochs={max_epochs or 'null'}")
    if ok:
        (prepared,) = check_trials([trial], log=lambda _: None).values()
        assert prepared.n_train_tokens == 12_800
        return
    with pytest.raises(ConfigError) as e:
        check_trials([trial], log=lambda _: None)
    assert str(e.value).startswith("train.max_epochs=4 is invalid for this budget: 51,328 tokens per trial "
                                   "is 4.0 passes over the 12,800 training tokens of data=tokens")
    assert "python -m smallinit.data.make_shards" in str(e.value)


def test_max_epochs_is_a_guard_not_part_of_the_identity(trial_config, token_files):
    a, b = (trial_config(*token_files, f"train.max_epochs={m}") for m in (4, 100))
    assert a.identity() == b.identity()


def test_data_shorter_than_a_sequence_or_a_validation_window(trial_config, tmp_path):
    np.arange(20, dtype=np.uint16).tofile(tmp_path / "tiny.bin")
    trial = trial_config("data=tokens", f"data.paths=[{tmp_path / 'tiny.bin'}]", "data.vocab_size=500")
    with pytest.raises(ConfigError, match=r"^data.paths=.* 19 training token\(s\) in .*fewer than one sequence "
                                          r"\(train.seq_len \+ 1 = 33\)"):
        check_trials([trial], log=lambda _: None)
    np.arange(400, dtype=np.uint16).tofile(tmp_path / "short.bin")  # 380 train, 20 held out
    trial = trial_config("data=tokens", f"data.paths=[{tmp_path / 'short.bin'}]", "data.vocab_size=500")
    with pytest.raises(ConfigError, match=r"20 validation token\(s\) in .*fewer than one window"):
        check_trials([trial], log=lambda _: None)


def _bad_inputs(root):
    """name -> (overrides, the start of the one line the command must print)."""
    text = root / "text"
    text.mkdir()
    (text / "empty.txt").write_text("")
    (text / "three.txt").write_text("abc")
    (text / "binary.txt").write_bytes(bytes(range(128, 256)) * 4)
    ((np.arange(5000) * 7) % 500).astype(np.uint32).tofile(root / "wide.bin")
    ((np.arange(5000) * 7) % 900).astype(np.uint16).tofile(root / "big_ids.bin")
    np.arange(30, dtype=np.uint16).tofile(root / "short.bin")
    tokens = ["data=tokens", "data.vocab_size=500"]
    return {
        "empty": (["data=text", f"data.paths=[{text / 'empty.txt'}]"], "error: data.paths="),
        "three_chars": (["data=text", f"data.paths=[{text / 'three.txt'}]"], "error: data.paths="),
        "binary": (["data=text", f"data.paths=[{text / 'binary.txt'}]"], "error: data.paths="),
        "wrong_dtype": ([*tokens, f"data.paths=[{root / 'wide.bin'}]"], "error: data.dtype='uint16' is invalid"),
        "ids_beyond_vocab": ([*tokens, f"data.paths=[{root / 'big_ids.bin'}]"], "error: data.vocab_size=500 is invalid"),
        "too_short": ([*tokens, f"data.paths=[{root / 'short.bin'}]"], "error: data.paths="),
        "gpu_form_on_the_bundled_corpus": (["+experiment=gpu/gamma_scan", "ray.cpus_per_trial=1", "ray.gpus_per_trial=0"], "error: train.max_epochs=4 is invalid"),
    }


BAD = ["empty", "three_chars", "binary", "wrong_dtype", "ids_beyond_vocab", "too_short", "gpu_form_on_the_bundled_corpus"]
MESSAGES = {"empty": "0 document(s)", "three_chars": "1 document(s)", "binary": "binary.txt is not UTF-8 text",
            "wrong_dtype": "wide.bin", "ids_beyond_vocab": "big_ids.bin holds id 899", "too_short": "fewer than one sequence",
            "gpu_form_on_the_bundled_corpus": "passes over the"}


# The GPU form composes a 0.1B model (~30 s on 2 cores): in the slow set.
@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c.startswith("gpu_") else c for c in BAD])
def test_bad_data_is_one_line_before_ray_and_nothing_is_written(case, tmp_path, data_cache):
    overrides, start = _bad_inputs(tmp_path)[case]
    tiny = [] if case.startswith("gpu") else TINY
    proc = run_cli(["-m", *tiny, *overrides, "name=bad", "wandb.mode=disabled"], cwd=tmp_path,
                   env={"SMALLINIT_CACHE": str(data_cache), "RAY_ADDRESS": ""}, timeout=300)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode != 0 and lines, proc.stdout[-2000:]
    assert lines[-1].startswith(start) and MESSAGES[case] in lines[-1], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "ray" not in proc.stdout.lower()
    sweep = tmp_path / "sweeps" / "bad"
    assert not (sweep / "optuna.db").exists() and not (sweep / "trials").exists()


@pytest.mark.slow  # make test stays under 10 min on 2 cores; CI runs it after
def test_show_states_the_passes_and_the_refusal(tmp_path, data_cache):
    proc = run_cli(["--show", "-m", "+experiment=gpu/gamma_scan"], cwd=tmp_path,
                   env={"SMALLINIT_CACHE": str(data_cache)}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    passes = next(line for line in proc.stdout.splitlines() if "passes over the" in line)
    assert passes.startswith("# ") and "training tokens of data=bilingual (train.max_epochs=4)" in passes
    assert float(passes.split()[1].replace(",", "")) > 4  # 2.0B tokens on a ~2M-token corpus
    assert "# a launch would be refused: error: train.max_epochs=4" in proc.stdout


def _text_folder(root):
    """(folder, documents): 60 chapters of the King James Bible, 30 in a .txt, 30 as .jsonl."""
    from smallinit.data.corpus import bundled_files, read_kjv

    docs = [d.text for d in read_kjv(bundled_files()["kjv"])[:60]]
    folder = root / "text"
    folder.mkdir()
    (folder / "a.txt").write_text("\n\n".join(docs[:30]), encoding="utf-8")
    (folder / "b.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs[30:]), encoding="utf-8")
    return folder, docs


@pytest.mark.slow  # ~60 s: tokenizer training and a trial; `make test-full`
def test_the_shard_recipe_goes_from_text_to_a_trained_trial(tmp_path, data_cache):
    out = tmp_path / "shards"
    folder, docs = _text_folder(tmp_path)
    make_shards.main([str(folder), str(out), "--vocab-size", "512", "--shard-tokens", "20000",
                      "--val-fraction", "0.1"])
    meta = json.loads((out / "shards.json").read_text())
    assert meta["documents"] == 60 and len(meta["train_shards"]) >= 2 and meta["val_shards"] == ["val_000000.bin"]
    # Every document ends with <|endoftext|>: 54 train documents (every 10th, from the first, validates).
    train = np.concatenate([np.fromfile(out / s, dtype=np.uint16, offset=1024) for s in meta["train_shards"]])
    assert len(train) == meta["train_tokens"] and int((train == meta["eot_id"]).sum()) == 54
    # The trained tokenizer decodes the shards back to the text.
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    first = train[: int(np.flatnonzero(train == meta["eot_id"])[0])]
    assert tok.decode(first.tolist()) == docs[1]  # chapter 2: chapter 1 validates

    run_dir = tmp_path / "run"
    proc = run_cli([*TINY, "train.max_tokens=null", "train.max_steps=2", "data=tokens", f"data.paths={out}",
                    f"data.vocab_size={meta['vocab_size']}", f"hydra.run.dir={run_dir}"],
                   cwd=tmp_path, env={"SMALLINIT_CACHE": str(data_cache)}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((run_dir / "result.json").read_text())
    assert result["steps"] == 2 and result["corpus_tokens"] == meta["train_tokens"]
    assert np.isfinite(result["final_val_loss"])


def test_each_worker_opens_the_corpus_the_driver_prepared(tiny_sweep):
    # The driver prepares and checks the corpus once; its workers open that cache as it is
    # rather than hashing the inputs again (a worker elsewhere prepares its own: still_usable).
    logs = [p.read_text() for p in (tiny_sweep / "trials").glob("*/trial.log")]
    assert logs and all(", prepared by the driver" in log and "data: cache hit" not in log for log in logs)


def test_a_corpus_prepared_elsewhere_is_not_used_here(tmp_path, data_cache):
    import dataclasses

    from smallinit.data.config import BilingualData
    from smallinit.data.pipeline import prepare, still_usable

    prepared = prepare(BilingualData(cache_dir=str(data_cache)), log=lambda *_: None)
    assert still_usable(prepared) is None
    elsewhere = dataclasses.replace(prepared, dir=tmp_path / "on-another-node")
    assert still_usable(elsewhere) == f"{tmp_path / 'on-another-node'} is not on this machine"
