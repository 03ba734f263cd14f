"""The repository stands alone: outside facts are cited from docs/paper.md, every
`docs/paper.md#<heading>` a tracked file cites is a heading there, and every link of the README
and docs/ resolves (each doc reachable from the README)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAPER = REPO / "docs" / "paper.md"
# Spelled in two parts so that this file does not cite it itself.
OUTSIDE_NOTES = "RESEARCH" + ".md"
# Committed records (copies of a report's summary.json) quote the claim text of the code that
# wrote them; they are not edited by hand and lose the old citation when `make experiments`
# rewrites them. Only this exact quotation is allowed in them.
RECORDED_QUOTE = f"the effect needs width; {OUTSIDE_NOTES}: damping ~0.93 at d=128, ~0.15 at d=2048"
CITATION = re.compile(r"docs/paper\.md#([\w-]+)")
LOCAL_LINK = re.compile(r"\]\(#([\w-]+)\)")
MD_LINK = re.compile(r"\]\(([^)\s]+)\)")


def tracked_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"not a git checkout ({e}): no list of tracked files")
    return [REPO / p for p in out.decode().split("\0") if p and (REPO / p).is_file()]


def is_record(path: Path, repo: Path = REPO) -> bool:
    rel = path.relative_to(repo)
    return rel.parts[:2] == ("docs", "results") and rel.name == "summary.json"


def cites_outside_notes(path: Path, repo: Path = REPO) -> bool:
    text = path.read_bytes().decode("utf-8", errors="replace")
    if is_record(path, repo):
        text = text.replace(RECORDED_QUOTE, "")
    return OUTSIDE_NOTES in text


def anchor(heading: str) -> str:
    """GitHub's anchor for a Markdown heading: lower case, punctuation dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    in_code = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        m = None if in_code else re.match(r"#{1,6} (.+)", line)
        if m:
            a = anchor(m.group(1))
            n = seen.get(a, 0)
            seen[a] = n + 1
            out.add(a if n == 0 else f"{a}-{n}")  # GitHub numbers a repeated heading
    return out


def missing_anchors(cited: dict[str, set[str]], headings: set[str]) -> dict[str, list[str]]:
    return {f: sorted(a - headings) for f, a in cited.items() if a - headings}


def test_no_tracked_file_cites_the_outside_notes():
    offenders = [str(p.relative_to(REPO)) for p in tracked_files() if cites_outside_notes(p)]
    assert not offenders, f"cite docs/paper.md#<heading> instead of {OUTSIDE_NOTES}: {offenders}"


def test_the_check_sees_a_citation_and_only_excuses_the_recorded_quote(tmp_path):
    record = tmp_path / "docs" / "results" / "eps_fix" / "summary.json"
    record.parent.mkdir(parents=True)
    record.write_text(f'{{"paper": "removes saturation ({RECORDED_QUOTE})"}}')
    assert not cites_outside_notes(record, tmp_path)
    record.write_text(f'{{"paper": "see {OUTSIDE_NOTES}"}}')
    assert cites_outside_notes(record, tmp_path)
    code = tmp_path / "model" / "init.py"
    code.parent.mkdir()
    code.write_text(f'"""gamma = 1 ({RECORDED_QUOTE})."""')  # the excuse is for records only
    assert cites_outside_notes(code, tmp_path)


def test_every_cited_paper_anchor_is_a_heading():
    headings = anchors(PAPER.read_text())
    cited: dict[str, set[str]] = {}
    for p in tracked_files():
        if p.suffix in {".png", ".parquet", ".pt"}:
            continue
        text = p.read_bytes().decode("utf-8", errors="replace")
        found = set(CITATION.findall(text)) | (set(LOCAL_LINK.findall(text)) if p == PAPER else set())
        if found:
            cited[str(p.relative_to(REPO))] = found
    assert len(cited) >= 6, f"expected the code, tests, conf and README to cite docs/paper.md: {sorted(cited)}"
    assert not missing_anchors(cited, headings), f"no such heading in docs/paper.md: {missing_anchors(cited, headings)}"


def test_anchors_follow_github_and_a_missing_one_is_reported():
    md = "# Title\n## Gated attention (Qiu et al.)\n```\n# not a heading\n```\n### CPU bf16 matmuls\n## Notes\n## Notes\n"
    assert anchors(md) == {"title", "gated-attention-qiu-et-al", "cpu-bf16-matmuls", "notes", "notes-1"}
    assert missing_anchors({"a.py": {"notes", "not-a-heading"}}, anchors(md)) == {"a.py": ["not-a-heading"]}


def relative_links(path: Path) -> list[str]:
    return [t for t in MD_LINK.findall(path.read_text()) if not re.match(r"[a-z]+:", t)]


def broken_links(path: Path) -> list[str]:
    """The relative links of a Markdown file whose file, or whose #heading in it, is not there."""
    out = []
    for target in relative_links(path):
        file, _, heading = target.partition("#")
        dest = (path.parent / file) if file else path
        if not dest.exists() or (heading and dest.suffix == ".md" and heading not in anchors(dest.read_text())):
            out.append(target)
    return out


def test_readme_and_docs_links_resolve_and_every_doc_is_reachable_from_the_readme():
    readme, docs = REPO / "README.md", sorted((REPO / "docs").glob("*.md"))
    broken = {str(p.relative_to(REPO)): b for p in [readme, *docs] if (b := broken_links(p))}
    assert not broken, f"links to no file or no such heading: {broken}"
    linked = {(REPO / t.partition("#")[0]).resolve() for t in relative_links(readme)}
    assert not [str(d.relative_to(REPO)) for d in docs if d.resolve() not in linked], "link each doc from the README"


def test_a_link_to_a_missing_file_or_heading_is_reported(tmp_path):
    (tmp_path / "a.md").write_text("# A\n## The results table: `x`\n")
    page = tmp_path / "b.md"
    page.write_text("[ok](a.md#the-results-table-x) [web](https://x.org/y) [gone](c.md) [no](a.md#nope) [self](#b)\n# B\n")
    assert broken_links(page) == ["c.md", "a.md#nope"]
