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


def _stays() -> list[str]:
    """The files of the trace in order, a short name (`space.py`) read as the path it named last,
    consecutive mentions of one file one stay."""
    text = DOC.read_text()
    body = text[text.index("- Driver"):text.index("Why it returns")]
    last: dict[str, str] = {}
    stays: list[str] = []
    for name in re.findall(r"`([\w/]+\.py)`", body):
        path = name if "/" in name else last.get(name, name)
        last[path.split("/")[-1]] = path
        if not stays or stays[-1] != path:
            stays.append(path)
    return stays


def test_the_counts_the_page_states_are_the_trace_it_lists():
    """The page's stated counts once fell behind its own list (27 returns stated, 28 listed, 31 once
    the unmarked ones were marked): the counts are read off the list, and every return is marked ↩."""
    stays = _stays()
    returns = sum(f in stays[:i] for i, f in enumerate(stays))
    stated = re.search(r"\((\d+) stays, (\d+) files, (\d+) returns", DOC.read_text())
    assert stated and tuple(map(int, stated.groups())) == (len(stays), len(set(stays)), returns)
    text = DOC.read_text()
    assert text[text.index("- Driver"):text.index("Why it returns")].count("↩") == returns
