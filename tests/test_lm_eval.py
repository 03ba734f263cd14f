"""lm-evaluation-harness runs an export: its HF model scores the two offline tasks in
tests/lm_eval_tasks/ (a loglikelihood task and a generate_until task) with the numbers our own
model gives in torch. Needs the eval extra: `make install EXTRAS=dev,dashboard,eval`."""

from __future__ import annotations

import json
import math
import sys

import pytest
import torch

from smallinit.data.corpus import EOT
from smallinit.model import Transformer
from smallinit.trainer.export import export
from smallinit.trainer.loop import run_trial

from .conftest import REPO

pytest.importorskip("lm_eval", reason="lm-eval is not installed (make install EXTRAS=dev,dashboard,eval)")
pytest.importorskip("accelerate", reason="lm-eval's HF model needs accelerate: install lm-eval[hf] (the eval extra)")
transformers = pytest.importorskip("transformers", reason="transformers is not installed (the export extra)")

TASKS = REPO / "tests" / "lm_eval_tasks"


def _items(name: str) -> list[dict]:
    return [json.loads(line) for line in (TASKS / f"{name}.jsonl").read_text(encoding="utf-8").splitlines() if line]


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """No network and no writes to ~/.cache: what a cluster node without internet sees."""
    for key in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(key, "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))
    if "datasets" in sys.modules:  # read at import: set on the module too if an earlier test imported it
        monkeypatch.setattr(sys.modules["datasets"].config, "HF_DATASETS_CACHE", tmp_path / "hf-datasets")
        monkeypatch.setattr(sys.modules["datasets"].config, "HF_HUB_OFFLINE", True)


class Ours:
    """The trial's model.Transformer and tokenizer, with lm-eval's encoding rules written out."""

    def __init__(self, trial, trial_dir, tokenizer):
        self.model = Transformer(trial.model).eval()
        self.model.load_state_dict(torch.load(trial_dir / "model.pt", weights_only=False)["model"])
        self.tok, self.eot = tokenizer, tokenizer.token_to_id(EOT)

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    @torch.no_grad()
    def loglikelihood(self, context: str, continuation: str) -> float:
        """log p(continuation | context): an empty context is the bos token alone; trailing
        spaces of the context belong to the continuation (lm-eval's _encode_pair)."""
        if context:
            n = len(context) - len(context.rstrip())
            context, continuation = context[:len(context) - n], context[len(context) - n:] + continuation
            ctx = self.encode(context)
            cont = self.encode(context + continuation)[len(ctx):]
        else:
            ctx, cont = [self.eot], self.encode(continuation)
        ids = torch.tensor([ctx + cont])
        logp = torch.log_softmax(self.model(ids)[0, :-1].double(), dim=-1)  # (T-1, V): next-token log-probs
        return sum(logp[len(ctx) - 1 + i, t].item() for i, t in enumerate(cont))

    @torch.no_grad()
    def greedy(self, context: str, max_tokens: int, until: list[str]) -> str:
        ids = self.encode(context)
        out: list[int] = []
        for _ in range(max_tokens):
            nxt = int(self.model(torch.tensor([ids + out]))[0, -1].argmax())
            if nxt == self.eot:
                break
            out.append(nxt)
        text = self.tok.decode(out)
        for stop in until:
            text = text.split(stop)[0]
        return text


def test_lm_eval_scores_an_export_as_our_model_does(trial_config, tmp_path, offline):
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager
    from tokenizers import Tokenizer

    trial = trial_config("train.max_tokens=512", "init.gamma=1.0")
    run_trial(trial, tmp_path / "trial", log=lambda *_: None)
    out = export(tmp_path / "trial", tmp_path / "hf")
    ours = Ours(trial, tmp_path / "trial", Tokenizer.from_file(str(out / "tokenizer.json")))

    # The special ids lm-eval reads: <|endoftext|> everywhere, not LlamaConfig's defaults 1 and 2.
    config, generation = (json.loads((out / f).read_text()) for f in ("config.json", "generation_config.json"))
    assert ours.eot is not None
    assert [config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")] == [ours.eot] * 3
    assert [generation[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")] == [ours.eot] * 3
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    assert (hf_tok.bos_token, hf_tok.eos_token, hf_tok.pad_token) == (EOT, EOT, EOT)

    # batch_size=2: generation pads on the left, which needs the pad token. include_defaults=False:
    # indexing lm-eval's thousands of built-in tasks would take most of the test's time.
    lm = HFLM(pretrained=str(out), dtype="float32", device="cpu", batch_size=2)
    assert lm.prefix_token_id == lm.eot_token_id == ours.eot
    results = simple_evaluate(model=lm, tasks=["smallinit_choice", "smallinit_continue"],
                              task_manager=TaskManager(include_path=str(TASKS), include_defaults=False), log_samples=True,
                              random_seed=0, numpy_random_seed=0, torch_random_seed=0, fewshot_random_seed=0)

    choice = sorted(results["samples"]["smallinit_choice"], key=lambda s: s["doc_id"])
    assert [s["doc"] for s in choice] == _items("smallinit_choice")
    correct = []
    for s in choice:
        doc = s["doc"]
        theirs = [ll for ll, _ in s["filtered_resps"]]
        mine = [ours.loglikelihood(doc["context"], " " + c) for c in doc["choices"]]
        assert all(math.isfinite(x) and x < 0 for x in mine)
        assert theirs == pytest.approx(mine, abs=1e-4), doc["context"]  # float32 sums: ~3e-6 apart
        correct.append(float(max(range(len(mine)), key=mine.__getitem__) == doc["answer"]))
    assert results["results"]["smallinit_choice"]["acc,none"] == pytest.approx(sum(correct) / len(correct))

    cont = sorted(results["samples"]["smallinit_continue"], key=lambda s: s["doc_id"])
    assert [s["doc"] for s in cont] == _items("smallinit_continue")
    generated = [s["filtered_resps"][0] for s in cont]
    assert generated == [ours.greedy(s["doc"]["context"], 8, ["\n"]) for s in cont]
    assert any(generated), "the model generated nothing: the comparison would be empty"
    matches = [float(g == s["doc"]["target"]) for g, s in zip(generated, cont)]
    assert results["results"]["smallinit_continue"]["exact_match,none"] == pytest.approx(sum(matches) / len(matches))
