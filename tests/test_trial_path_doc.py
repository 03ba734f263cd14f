"""docs/trial_path.md follows a trial's config through the files by name: each `file` `function`
it names must still exist, so the page fails here when code moves instead of going stale."""

from __future__ import annotations

import re

from .conftest import REPO

DOC = REPO / "docs" / "trial_path.md"
SRC = REPO / "src"


def _named() -> list[tuple[str, str]]:
    return re.findall(r"`([\w/]+\.py)` `([\w.]+)`", DOC.read_text())


def test_every_file_and_function_the_trace_names_exists():
    pairs = _named()
    assert len(pairs) >= 30  # the reader finds the pairs (a format change would find none)
    missing = []
    for path, name in pairs:
        files = [f for f in SRC.rglob("*.py") if f.as_posix().endswith("/" + path)]
        last = name.split(".")[-1]
        if not any(re.search(rf"^\s*(def|class) {re.escape(last)}\b", f.read_text(), re.M) for f in files):
            missing.append(f"{path} {name}")
    assert not missing, f"docs/trial_path.md names what the code no longer has: {missing}"
