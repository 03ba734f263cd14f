"""Export to transformers: the dense ungated model loads as LlamaForCausalLM with the same logits."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
import torch

from core.errors import ConfigError
from model import Transformer
from trainer.export import check_exportable, export, model_config_from_dict
from trainer.loop import run_trial

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


def test_gated_and_moe_models_are_refused_in_one_line(trial_config):
    gated = trial_config("attn=elementwise").model
    with pytest.raises(ConfigError, match="model.attn.gate='elementwise'"):
        check_exportable(gated)
    with pytest.raises(ConfigError, match="model.ffn.type='moe'"):
        check_exportable(trial_config("model=micro-moe").model)
    plain = trial_config().model  # what trial.json records reads back as the same config
    assert model_config_from_dict(json.loads(json.dumps(dataclasses.asdict(plain)))) == plain


def test_the_command_refuses_a_folder_that_is_not_a_trial(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "trainer.export", str(tmp_path), str(tmp_path / "out")],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "no trial.json" in proc.stderr and "Traceback" not in proc.stderr
