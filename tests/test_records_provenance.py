"""Every record committed to the repository names what made it: commit, dirty flag, lock file,
package versions and machine (core/provenance.py), and a report's summary the hash of each
results table it read, with a CSV copy committed beside it. The records made before records were stamped are listed, with why, in
docs/records_without_provenance.json; that list may only shrink."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from smallinit.core.provenance import file_sha256, missing

REPO = Path(__file__).resolve().parents[1]
UNSTAMPED = REPO / "docs" / "records_without_provenance.json"


def committed_records() -> dict[str, dict | None]:
    """Record name -> its provenance block (None where it has none). A report's summary, a
    precision check and a lent GPU's check are one record each; bench/results.json is one record
    per benchmark entry, docs/records/test_times.json one per test tier."""
    out: dict[str, dict | None] = {}
    found = [*REPO.glob("docs/results/*/summary.json"), *REPO.glob("docs/precision/*.json"),
             *REPO.glob("docs/results/gpu/*.json")]
    for path in sorted(found):
        out[str(path.relative_to(REPO))] = json.loads(path.read_text()).get("provenance")
    times = REPO / "docs" / "records" / "test_times.json"
    for tier, entry in (json.loads(times.read_text())["tiers"] if times.is_file() else {}).items():
        out[f"docs/records/test_times.json#{tier}"] = entry.get("provenance")
    bench = json.loads((REPO / "bench" / "results.json").read_text())
    for name, entry in bench["benchmarks"].items():
        out[f"bench/results.json#{name}"] = entry.get("provenance")
    return out


def unstamped() -> dict[str, dict]:
    return json.loads(UNSTAMPED.read_text())["records"]


def test_the_walker_finds_the_committed_records():
    found = committed_records()
    assert any(k.startswith("docs/results/") for k in found) and any(k.startswith("bench/") for k in found)
    assert "docs/results/gpu/gpu_check.json" in found


@pytest.mark.parametrize("name", sorted(committed_records()))
def test_each_committed_record_carries_its_provenance_or_is_listed_with_why(name):
    block = committed_records()[name]
    listed = unstamped()
    if block is None:
        assert name in listed, (f"{name} has no provenance block: write it with core.provenance.record() "
                                f"(a record made before stamping goes in {UNSTAMPED.name} with why)")
        return
    assert name not in listed, f"{name} now carries its provenance: remove it from {UNSTAMPED.name}"
    assert not missing(block), f"{name}: provenance lacks {missing(block)}"
    assert re.fullmatch(r"[0-9a-f]{40}", block["commit"]), f"{name}: commit {block['commit']!r}"
    if name.endswith("summary.json"):
        hashes = block.get("results_sha256")
        assert hashes and all(re.fullmatch(r"[0-9a-f]{64}", h or "") for h in hashes.values()), \
            f"{name}: no sha256 of the results table(s) it read: {hashes}"
        tables = block.get("results_tables") or {}
        assert set(tables) == set(hashes), f"{name}: a results table per sweep read, committed beside it: {tables}"
        for sweep, table in tables.items():
            path = (REPO / name).parent / table["file"]
            assert path.exists(), f"{name}: {sweep}'s results table {path.name} is not committed beside it"
            assert file_sha256(path) == table["sha256"], f"{path.relative_to(REPO)} is not the table {name} was built from"


def test_the_list_of_unstamped_records_names_only_records_that_exist_and_says_why():
    found = committed_records()
    for name, why in unstamped().items():
        assert name in found, f"{UNSTAMPED.name} lists {name}, which is not a committed record"
        assert why.get("reason") and re.fullmatch(r"[0-9a-f]{7,40}", why.get("committed_in", "")), name


def test_missing_names_each_absent_field():
    from smallinit.core.provenance import record

    block = record()
    assert missing(block) == []
    del block["packages"]["torch"], block["machine"]["cpu_flags"], block["lock_sha256"]
    assert missing(block) == ["lock_sha256", "packages.torch", "machine.cpu_flags"]
