"""The items of the two tasks beside this file, read from their .jsonl without a network or a
datasets cache (lm-eval calls these through `custom_dataset: !function items.<name>`)."""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _read(name: str):
    import datasets

    rows = [json.loads(line) for line in (HERE / name).read_text(encoding="utf-8").splitlines() if line.strip()]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


def choice(**_metadata):
    return _read("smallinit_choice.jsonl")


def continuation(**_metadata):
    return _read("smallinit_continue.jsonl")
