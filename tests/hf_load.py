"""Load an exported folder as a transformers user would, and record what that transformers saw.

Standalone on purpose (torch and transformers only, nothing of smallinit): tests/test_export.py
runs `observe` with the installed transformers, and runs this file as a script under the oldest
transformers pyproject.toml admits, a Python of its own (.ci/oldest-transformers builds it):

    python tests/hf_load.py EXPORT_DIR OUT.json
"""

from __future__ import annotations

import json
import sys

EOT = "<|endoftext|>"
TEXT = "In the beginning God created the heaven and the earth. 起初神创造天地。"
ORDINARY = 3  # new tokens generated as the model chooses before <|endoftext|> is made the likeliest
MAX_NEW = 20


def observe(folder: str) -> dict:
    import torch
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    enc = tok(TEXT, return_tensors="pt")  # passed whole to generate, as users do: no key Llama refuses
    eot = tok.convert_tokens_to_ids(EOT)
    prompt = enc["input_ids"].shape[1]
    with torch.no_grad():
        logits = model(**enc).logits[0]
        # A tiny trained model may never choose <|endoftext|> itself: from the (ORDINARY+1)-th new
        # token on it is made the likeliest, so stopping there, not at MAX_NEW, is the export's
        # eos_token_id at work (generation_config.json and the tokenizer).
        out = model.generate(**enc, max_new_tokens=MAX_NEW, do_sample=False,
                             logits_processor=transformers.LogitsProcessorList([_EndAfter(prompt + ORDINARY, eot)]))
    new = out[0, prompt:].tolist()
    gen = model.generation_config
    return {
        "transformers": transformers.__version__,
        "tokenizer_class": type(tok).__name__,
        "input_names": sorted(enc.keys()),
        "ids": enc["input_ids"][0].tolist(),
        "decoded": tok.decode(enc["input_ids"][0]),
        "logits": logits.tolist(),
        "eot": eot,
        "tokenizer_ids": [tok.bos_token_id, tok.eos_token_id, tok.pad_token_id],
        "config_ids": [model.config.bos_token_id, model.config.eos_token_id, model.config.pad_token_id],
        "generation_ids": [gen.bos_token_id, gen.eos_token_id],
        "generated": new,
        "generated_text": tok.decode(new),
    }


class _EndAfter:
    """Logits processor: <|endoftext|> far above every other token once the sequence is `start` long."""

    def __init__(self, start: int, eot: int):
        self.start, self.eot = start, eot

    def __call__(self, input_ids, scores):
        if input_ids.shape[1] >= self.start:
            scores[:, self.eot] = scores.max() + 100.0
        return scores


if __name__ == "__main__":
    with open(sys.argv[2], "w") as f:
        json.dump(observe(sys.argv[1]), f)
