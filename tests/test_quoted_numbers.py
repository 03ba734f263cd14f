"""Docs quote only numbers a record holds: every `<!-- quotes: PATH -->` passage of README.md
and docs/ is checked against its record (records/quoted.py)."""

from __future__ import annotations

import json

import pytest

from records import quoted

# Pages whose measured facts once stood in no record; each now quotes one, so the check has work to do.
QUOTING = ("docs/paper.md", "docs/training.md", "docs/gpu.md")


def test_a_number_the_record_does_not_hold_is_named(tmp_path):
    (tmp_path / "r.json").write_text(json.dumps({"fp32": {"tokens_per_s": 2659.19}, "mfu": 0.3801,
                                                 "why": "bf16 matmul 192 GFLOP/s vs fp32 101", "ok": True}))
    page = tmp_path / "p.md"
    page.write_text("<!-- quotes: r.json -->2,659 tokens/s, 38.0% MFU, 192 against 101 GFLOP/s, batch `32`"
                    "<!-- /quotes --> and outside a passage 7 is not checked")
    assert quoted.check(page, tmp_path) == []
    page.write_text("<!-- quotes: r.json -->2,660 tokens/s, 38% MFU at 94 GFLOP/s<!-- /quotes -->")
    assert quoted.check(page, tmp_path) == ["p.md: 2,660 is not in r.json", "p.md: 94 is not in r.json"]
    page.write_text("wrap it in `<!-- quotes: PATH -->` 1 ... `<!-- /quotes -->`")  # shown as code: not a passage
    assert quoted.check(page, tmp_path) == []
    page.write_text("<!-- quotes: gone.json -->1<!-- /quotes -->")
    assert quoted.check(page, tmp_path) == ["p.md: quotes gone.json, which does not exist"]


@pytest.mark.parametrize("page", quoted.pages(), ids=lambda p: str(p.relative_to(quoted.REPO)))
def test_every_quoted_number_is_in_its_record(page):
    assert quoted.check(page) == []


@pytest.mark.parametrize("name", QUOTING)
def test_the_measured_pages_quote_their_records(name):
    assert quoted.QUOTES.search((quoted.REPO / name).read_text()), f"{name} quotes no record"


def test_a_reading_may_write_as_a_decimal_what_its_section_shows_in_e_notation():
    """Prose writes 698,000 and 0.0000182 where the generated section prints 6.98e+05 and 1.82e-05;
    a different figure is still stray."""
    from records.quoted import stray

    shown = "D* = 6.98e+05 tokens, p 1.82e-05"
    assert stray("D* = 698,000 tokens (p 0.0000182)", shown) == []
    assert stray("D* = 697,000 tokens", shown) == ["697,000"]
    assert stray("D* = 700,000 or -698,000, p -0.0000182", shown) == ["-0.0000182", "-698,000", "700,000"]
