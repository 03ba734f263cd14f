"""Export to transformers: the dense ungated model loads as LlamaForCausalLM with the same logits."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys

import pytest
import torch
from packaging.version import Version

from smallinit.core.errors import ConfigError
from smallinit.data import make_shards
from smallinit.data.config import BilingualData
from smallinit.data.corpus import EOT, bundled_files, read_kjv
from smallinit.data.pipeline import prepare
from smallinit.model import Transformer
from smallinit.trainer.export import check_exportable, export, model_config_from_dict
from smallinit.trainer.loop import run_trial

from . import hf_load
from .conftest import REPO

transformers = pytest.importorskip("transformers", reason="transformers is not installed (the export extra)")


@pytest.mark.parametrize("overrides", [("model.tie_embeddings=true",), ("model=micro", "model.d_model=64",
                                                                         "model.n_layers=2", "model.n_kv_heads=2")])
def test_an_exported_trial_gives_the_same_logits_in_transformers(trial_config, tmp_path, overrides):
    trial = trial_config("train.max_tokens=256", "init.gamma=1.0", "norm.eps=1e-12", *overrides)
    run_trial(trial, tmp_path / "trial", log=lambda *_: None)
    out = export(tmp_path / "trial", tmp_path / "hf")

    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    tok = transformers.AutoTokenizer.from_pretrained(out)
    ours = Transformer(trial.model).eval()
    ours.load_state_dict(torch.load(tmp_path / "trial" / "model.pt", weights_only=False)["model"])
    ids = torch.tensor([tok("In the beginning God created the heaven and the earth. 起初神创造天地。")["input_ids"]])
    assert ids.shape[1] > 8 and int(ids.max()) < trial.model.vocab_size
    with torch.no_grad():
        assert (ours(ids) - hf(ids).logits).abs().max().item() < 1e-4
    assert json.loads((out / "smallinit.json").read_text())["config"]["model"]["norm"]["eps"] == 1e-12
    # <|endoftext|> is bos, eos and pad in the tokenizer and in both configs (not LlamaConfig's 1 and 2).
    eot = tok.convert_tokens_to_ids(EOT)
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (eot, eot, eot) and tok.decode([eot]) == EOT
    assert (hf.config.bos_token_id, hf.config.eos_token_id, hf.config.pad_token_id) == (eot, eot, eot)
    assert (hf.generation_config.bos_token_id, hf.generation_config.eos_token_id) == (eot, eot)


def test_gated_and_moe_models_are_refused_in_one_line(trial_config):
    gated = trial_config("attn=elementwise").model
    with pytest.raises(ConfigError, match="model.attn.gate='elementwise'"):
        check_exportable(gated)
    with pytest.raises(ConfigError, match="model.ffn.type='moe'"):
        check_exportable(trial_config("model=micro-moe").model)
    plain = trial_config().model  # what trial.json records reads back as the same config
    assert model_config_from_dict(json.loads(json.dumps(dataclasses.asdict(plain)))) == plain


def test_the_command_refuses_a_folder_that_is_not_a_trial(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "smallinit.trainer.export", str(tmp_path), str(tmp_path / "out")],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "no trial.json" in proc.stderr and "Traceback" not in proc.stderr


def test_a_tokens_trial_exports_the_tokenizer_its_shards_were_made_with(trial_config, tmp_path, data_cache):
    tokenizer = prepare(BilingualData(cache_dir=str(data_cache)), log=lambda *_: None).tokenizer_path
    (tmp_path / "text").mkdir()
    (tmp_path / "text" / "kjv.txt").write_text("\n\n".join(d.text for d in read_kjv(bundled_files()["kjv"])[:20]))
    shards = tmp_path / "shards"
    meta = make_shards.make_shards(tmp_path / "text", shards, tokenizer, val_fraction=0.1, log=lambda *_: None)
    trial = trial_config("data=tokens", f"data.paths={shards}", f"data.vocab_size={meta['vocab_size']}",
                         "train.max_tokens=256")
    run_trial(trial, tmp_path / "trial", log=lambda *_: None)

    out = export(tmp_path / "trial", tmp_path / "hf")
    assert (out / "tokenizer.json").read_bytes() == tokenizer.read_bytes()
    assert json.loads((out / "config.json").read_text())["eos_token_id"] == meta["eot_id"] is not None

    # A tokenizer changed after make_shards (or none recorded) is refused in one line naming --tokenizer,
    # before anything is written; --tokenizer then exports.
    (shards / "tokenizer.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"changed after make_shards.*pass --tokenizer") as e:
        export(tmp_path / "trial", tmp_path / "hf2")
    assert "\n" not in str(e.value) and not (tmp_path / "hf2").exists()
    (shards / "shards.json").unlink()
    proc = subprocess.run([sys.executable, "-m", "smallinit.trainer.export", str(tmp_path / "trial"), str(tmp_path / "hf2")],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "no shards.json" in proc.stderr and "--tokenizer" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "hf2").exists()
    assert export(tmp_path / "trial", tmp_path / "hf2", tokenizer).joinpath("tokenizer.json").is_file()


@pytest.fixture
def exported(trial_config, tmp_path):
    """(folder, our model): a trial exported with a RoPE base other than 10000, the default a
    transformers that misread config.json would silently fall back to. gamma 0.5's larger weights
    make attention far from uniform, so that would move the logits by ~3, not ~4e-4."""
    trial = trial_config("train.max_tokens=256", "model.rope_theta=500000", "init.gamma=0.5")
    run_trial(trial, tmp_path / "trial", log=lambda *_: None)
    out = export(tmp_path / "trial", tmp_path / "hf")
    ours = Transformer(trial.model).eval()
    ours.load_state_dict(torch.load(tmp_path / "trial" / "model.pt", weights_only=False)["model"])
    return out, ours


def check_load(seen: dict, ours) -> None:
    """What a transformers user gets from the folder: the trained tokenizer, the same logits, and
    generation that stops at <|endoftext|>."""
    assert seen["tokenizer_class"] in ("PreTrainedTokenizerFast", "TokenizersBackend")  # 5's name for the same class
    assert seen["input_names"] == ["attention_mask", "input_ids"] and len(seen["ids"]) > 8
    assert seen["decoded"].strip() == hf_load.TEXT
    with torch.no_grad():
        logits = ours(torch.tensor([seen["ids"]]))[0]
    assert (logits - torch.tensor(seen["logits"])).abs().max().item() < 1e-4
    eot = seen["eot"]
    assert seen["tokenizer_ids"] == seen["config_ids"] == [eot] * 3 and seen["generation_ids"] == [eot, eot]
    new = seen["generated"]
    assert new[-1] == eot and eot not in new[:-1] and len(new) <= hf_load.ORDINARY + 1, new
    assert seen["generated_text"].endswith(EOT)


def test_the_export_loads_and_generation_stops_at_end_of_text(exported):
    folder, ours = exported
    # Version-neutral files (trainer/export.py): no class only one transformers has.
    assert json.loads((folder / "tokenizer_config.json").read_text())["tokenizer_class"] == "PreTrainedTokenizerFast"
    check_load(hf_load.observe(str(folder)), ours)


def oldest_transformers() -> str:
    """The floor of the export extra in pyproject.toml: the oldest transformers users may have."""
    return re.search(r'"transformers>=([0-9.]+)"', (REPO / "pyproject.toml").read_text()).group(1)


@pytest.mark.slow  # a second Python, with the oldest transformers: .ci/run builds it (~1 min)
def test_the_export_loads_in_the_oldest_transformers_admitted(request, tmp_path):
    python = os.environ.get("SMALLINIT_OLDEST_TRANSFORMERS_PYTHON")
    if not python:
        pytest.skip(f"SMALLINIT_OLDEST_TRANSFORMERS_PYTHON is not set: build a Python with transformers=="
                    f"{oldest_transformers()} by `bash .ci/oldest-transformers DIR` and set it to what that prints")
    folder, ours = request.getfixturevalue("exported")  # trained only when there is a Python to load it in
    proc = subprocess.run([python, str(REPO / "tests" / "hf_load.py"), str(folder), str(tmp_path / "seen.json")],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert Version(seen["transformers"]) == Version(oldest_transformers()), \
        f"{python} has transformers {seen['transformers']}: rebuild it with .ci/oldest-transformers"
    check_load(seen, ours)
    assert seen["generated"] == hf_load.observe(str(folder))["generated"]  # greedy: the same tokens in both


def test_export_writes_only_where_it_may_and_replaces_only_what_it_wrote(trial_config, tmp_path):
    """New or empty folder, or this trial's earlier export: written. Another trial's export:
    refused, or with --overwrite its listed files replaced. Anything an export did not write (a
    user's config.json): refused, always, with nothing written."""
    def snapshot(folder):
        return {p.name: p.read_bytes() for p in folder.iterdir()}

    for name, gamma in (("a", "0.5"), ("b", "1.0")):
        run_trial(trial_config("train.max_tokens=256", f"init.gamma={gamma}"), tmp_path / name, log=lambda *_: None)
    out = export(tmp_path / "a", tmp_path / "hf")
    mark = json.loads((out / "smallinit.json").read_text())
    assert sorted(mark["files"]) == sorted(p.name for p in out.iterdir() if p.name != "smallinit.json")
    export(tmp_path / "a", out)  # its own earlier export: written again
    tokenizer = (out / "tokenizer.json").read_bytes()
    export(tmp_path / "a", out, tokenizer=out / "tokenizer.json")  # its own tokenizer, replaced as the export goes
    assert (out / "tokenizer.json").read_bytes() == tokenizer
    before = snapshot(out)
    with pytest.raises(ConfigError, match=r"holds the export of trial \w+, not \w+; give another folder, or --overwrite"):
        export(tmp_path / "b", out)
    assert snapshot(out) == before
    export(tmp_path / "b", out, overwrite=True)
    assert json.loads((out / "smallinit.json").read_text())["identity"] != mark["identity"]

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "config.json").write_text('{"mine": true}')
    proc = subprocess.run([sys.executable, "-m", "smallinit.trainer.export", str(tmp_path / "a"), str(mine), "--overwrite"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == (f"error: OUT_DIR={mine} is invalid: it holds files an export did not write (config.json); "
                                   "give a new or empty folder (nothing was written)")
    assert snapshot(mine) == {"config.json": b'{"mine": true}'}
