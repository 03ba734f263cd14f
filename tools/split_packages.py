#!/usr/bin/env python3
"""Split src/smallinit/experiments/ and src/smallinit/sweeper/ into sub-packages by concern.

    python tools/split_packages.py REPO_ROOT [--no-ruff]

REPO_ROOT is a clean git checkout of the src layout with experiments/ and sweeper/ still flat.
A move and an import rewrite only: no module's code changes beyond its import lines (and, for
the two renamed modules, the name they are used under). The script changes the working tree and
the index (git mv, git add) and commits nothing. It stops with `split_packages: error: ...` when
the tree is not what it expects (already split, dirty, a module it does not place); a tree it
stopped on is half-moved: `git reset -q --hard && git clean -fdq src` and run it again.

Re-applying to a newer main: a module added to either package since must be placed in MAP
below first (the script refuses a module it does not place).

What it does, in order:
  1. Rewrites in every tracked text file (src, tests, docs, README, Makefile, pyproject, .ci),
     done while every `smallinit.experiments.<x>` in the tree still names an old module:
     `from smallinit.experiments import a, b` (split by folder), every dotted module path
     `smallinit.sweeper.core[.name]` (imports, `-m` paths, monkeypatch strings), unprefixed
     dotted names in prose (`experiments.stats`), and file paths
     (`src/smallinit/experiments/stats.py`, `sweeper/schema.py`), with GitHub anchors of
     headings that name them. A renamed module bound by its bare name (`from . import protocol`,
     `from smallinit.sweeper import core`) is used under its new name in that file.
     Not rewritten: records (bench/results.json, bench/results.md, *.json, the "Written ... by"
     lines of docs/results/**/status.md) and this script.
  2. Relative imports of the moved modules: within one folder they stay relative
     (`from .paired import ...`), across folders they become absolute
     (`from smallinit.experiments.stats.paired import ...`); `from . import a, b` is split by
     folder.
  3. git mv each module to its folder (MAP), two renamed on the way:
     sweeper/core.py -> sweeper/driver.py (it collided with the package smallinit.core),
     experiments/protocol.py -> experiments/report/sections_protocol.py (sweeper/config/
     protocol.py is the select-then-confirm protocol; this one is the report's sections on it).
     Each folder gets an __init__.py whose docstring says what it owns and, on its last line,
     `May import: ...` the sibling folders it may import (tests/test_architecture.py reads and
     enforces that line); experiments/__init__.py and sweeper/__init__.py get the map. A module
     one folder deeper that finds a path from its own file (`Path(__file__).resolve().parents[N]`:
     the repository, conf/) goes up one more (N + 1); `.with_name(...)` (a sibling that moved
     with it) stays; any other use of __file__ stops the script.
  4. Checks: every .py compiles; every dotted path into either package and every file path names
     a module or folder that exists; `from <folder> import x` names modules of it; no relative
     import leaves its folder. Then `ruff check --select I --fix` and `ruff check` on src and
     tests when ruff is found.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

SRC = Path("src") / "smallinit"

# package -> folder -> modules (old names). "" is the package itself (the driver's modules).
MAP: dict[str, dict[str, list[str]]] = {
    "experiments": {
        "data": ["load", "tuning", "importance", "compare"],
        "stats": ["paired", "stats", "valnoise", "curves", "tokens"],
        "fits": ["scaling", "effective_size", "effective_width", "joint_fit", "crossover", "token_crossover"],
        "claims": ["claims", "mechanism", "width", "anchor_phase", "budgets"],
        "output": ["figures", "figures_protocol", "render", "md_table"],
        "report": ["report", "context", "sections", "sections_mechanism", "protocol", "token_crossover_section",
                   "findings", "screenshot"],
        "records": ["results_doc", "results_budgets", "dtype_check", "wsd_check"],
    },
    "sweeper": {
        "runtime": ["cluster", "ray_internals", "reaper", "resources", "lock", "stop"],
        "worker": ["trainable", "failures"],
        "config": ["schema", "config", "space", "precheck", "points", "fixed_overrides", "compose", "protocol"],
        "study": ["study", "study_rebuild", "searcher", "plan", "dashboard"],
        "results": ["results", "summary", "progress", "show", "estimate"],
        "": ["core", "tuner"],
    },
}
RENAMED = {("sweeper", "core"): "driver", ("experiments", "protocol"): "sections_protocol"}
PACKAGES = tuple(MAP)

# Each folder's __init__.py: what it owns; the last line is what test_architecture enforces.
INITS: dict[tuple[str, str], str] = {
    ("experiments", ""): '''"""The report and the paper's analyses, read from what the sweeper wrote (never through it).

Folders by concern, each importing only the folders below it (its __init__ says which;
tests/test_architecture.py enforces the `May import:` line):

    data      reading sweep folders into frames (load), each setting at its tuned optimiser
              settings (tuning), Optuna importances, compare two sweep folders
    output    figures (saved only with titled, labelled axes), blocks rendered to Markdown and
              HTML, Markdown tables
    stats     paired statistics: t-interval, sign-flip p, Holm; validation-sampling noise; curves
              of the gap over training; token-level comparisons
    fits      fitted laws: L(N), L(N, D), effective size and width, where the gap crosses 0
    claims    the paper's claims with a verdict each (claims.py) and the analyses that make them
              (mechanism, width trend, anchor phase, token budgets)
    report    `make report`: the page (report.py) built from sections over a shared Context,
              its lead (findings), the headless-browser check (screenshot)
    records   docs/results.md (results_doc) and the checks a record names (dtype_check, wsd_check)

    output, data  <  stats  <  fits  <  claims  <  report;  records sits on fits
"""
''',
    ("experiments", "data"): '''"""Reading sweep folders: the results table, metrics, probes and per-token losses as frames
(load), which trials each setting is compared on at its tuned optimiser settings (tuning),
Optuna parameter importances, and `compare` of two sweep folders.

May import: (none)
"""
''',
    ("experiments", "output"): '''"""What the report is written with: figures (Figures.save refuses an unlabelled axis), the
protocol's figures, blocks rendered to report.md and a self-contained index.html, and the
Markdown cells and tables of docs/results.md.

May import: (none)
"""
''',
    ("experiments", "stats"): '''"""Paired statistics, the one rule every verdict goes through: the paired differences' interval and
p-values (paired), comparisons between variants with Holm's correction (stats), validation-
sampling noise beside the seed spread (valnoise), the gap over training (curves), and where on
the eval tokens one variant beats another (tokens).

May import: data
"""
''',
    ("experiments", "fits"): '''"""Fitted models of loss against size and tokens: L(N) and the effective model size (scaling),
effective size over (width, budget) and where small init starts to pay (effective_size,
crossover), the joint L(N, D) law (joint_fit), effective size off measured widths
(effective_width), and the token crossover at one width (token_crossover).

May import: data, output, stats
"""
''',
    ("experiments", "claims"): '''"""The paper's claims, each with a verdict and the numbers behind it (claims), and the analyses
that make them: the mechanism read from probes, the width trend, the anchor-function phase
diagram, and the report over several token budgets.

May import: data, fits, output, stats
"""
''',
    ("experiments", "report"): '''"""`make report` (python -m smallinit.experiments.report.report): the page built from its sections
(sections, sections_mechanism, sections_protocol, token_crossover_section) over a shared Context,
its lead (findings), and the headless-browser check of a built page (screenshot).

May import: claims, data, fits, output, stats
"""
''',
    ("experiments", "records"): '''"""docs/results.md, the record of the CPU experiments (results_doc, with results_budgets' block),
and the checks a record names: bf16 against fp32 (dtype_check), a WSD branch against a cosine run
(wsd_check).

May import: data, fits, output, stats
"""
''',
    ("sweeper", ""): '''"""Hydra multirun -> Ray Tune trials. The driver (driver.py: the sweep, start to end) and the
Tune wiring (tuner.py) sit here, over folders by concern, each importing only the folders below
it (its __init__ says which; tests/test_architecture.py enforces the `May import:` line):

    runtime   the Ray cluster (up, down, its private names), what a trial asks of it, the
              reaper, the sweep folder's lock, how the driver stops
    worker    what runs in a Ray worker (trainable) and why a trial failed (failures)
    config    the schema, the sweeper's settings, the sweep space, prechecks, grid points,
              fixed overrides, compose, the select-then-confirm protocol
    study     the Optuna study, its rebuild from trial folders, the searcher, the plan,
              the dashboard
    results   the results table, the closing summary, live progress, --show and its estimate

    runtime  <  worker  <  config  <  study  <  results  <  driver.py, tuner.py
"""
''',
    ("sweeper", "runtime"): '''"""The sweep's processes: the Ray cluster it runs on (cluster) and every private Ray name it uses
(ray_internals), what each trial asks Ray for (resources), the reaper that stops a local Ray when
its driver ends, the one-driver-per-folder lock, and how the driver stops on a signal (stop).

May import: (none)
"""
''',
    ("sweeper", "worker"): '''"""What runs inside a Ray worker: one trial, its metrics forwarded to Ray Tune and W&B
(trainable), and why a trial failed and whether a rerun tries it again (failures).

May import: runtime
"""
''',
    ("sweeper", "config"): '''"""What a sweep is asked to run: conf/'s schema and the sweeper's settings (schema, config), the
sweep space from Hydra's override grammar (space), one-line prechecks, grid points without a
compose each (points), the fixed overrides a folder was made with, overrides -> validated
TrialSpec (compose), and select-then-confirm (protocol).

May import: runtime, worker
"""
''',
    ("sweeper", "study"): '''"""The Optuna study that remembers a sweep (study), rebuilt from the trial folders (study_rebuild),
the Tune searcher over it (searcher), what a sweep will run against it (plan), and
optuna-dashboard on it (dashboard).

May import: config, runtime, worker
"""
''',
    ("sweeper", "results"): '''"""What a sweep shows a person: the results table (results), the closing summary, the live
progress table, and `--show` with its time estimate (show, estimate).

May import: config, runtime, study, worker
"""
''',
}

TEXT_SUFFIXES = {".py", ".md", ".txt", ".yaml", ".yml", ".toml", ".cfg", ".ini", ".sh"}
TEXT_NAMES = {"Makefile"}
RECORDS = {"bench/results.md", "bench/results.json"}
SELF = "tools/split_packages.py"  # this script names the old paths on purpose
GENERATED_BLOCK = re.compile(r"<!-- bench\.doc: ([\w-]+) -->.*?<!-- end \1 -->", re.S)
# docs/results/<exp>/status.md: "Written <date> by <file> at commit <sha>" is history.
HISTORY_LINE = re.compile(r"^Written .* by .*$", re.M)

NOTES: list[str] = []
COUNTS: dict[str, int] = {}


class Fail(Exception):
    pass


def note(msg: str) -> None:
    NOTES.append(msg)


def count(what: str, n: int) -> None:
    COUNTS[what] = COUNTS.get(what, 0) + n


def git(root: Path, *args: str) -> str:
    proc = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
    if proc.returncode != 0:
        raise Fail(f"git {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout


def tracked(root: Path, *paths: str) -> list[str]:
    return [p for p in git(root, "ls-files", "-z", "--", *paths).split("\0") if p]


def outside(text: str, spans: list[tuple[int, int]], fn) -> str:
    """fn applied to the parts of text outside the (sorted, disjoint) spans."""
    out, pos = [], 0
    for a, b in spans:
        out.append(fn(text[pos:a]))
        out.append(text[a:b])
        pos = b
    out.append(fn(text[pos:]))
    return "".join(out)


# ---------------------------------------------------------------- the mapping

WHERE: dict[tuple[str, str], tuple[str, str]] = {
    (pkg, m): (folder, RENAMED.get((pkg, m), m)) for pkg, folders in MAP.items()
    for folder, mods in folders.items() for m in mods
}


def folder_of(pkg: str, old: str) -> str:
    return WHERE[(pkg, old)][0]


def new_name(pkg: str, old: str) -> str:
    return WHERE[(pkg, old)][1]


def folder_dotted(pkg: str, folder: str) -> str:
    return f"smallinit.{pkg}" + (f".{folder}" if folder else "")


def new_dotted(pkg: str, old: str) -> str:
    folder, name = WHERE[(pkg, old)]
    return f"{folder_dotted(pkg, folder)}.{name}"


def new_rel_path(pkg: str, old: str) -> str:
    """experiments/stats/paired.py (relative to src/smallinit)."""
    folder, name = WHERE[(pkg, old)]
    return "/".join([pkg, *([folder] if folder else []), f"{name}.py"])


# ---------------------------------------------------------------- 0. preconditions

def preconditions(root: Path) -> None:
    if not (root / ".git").exists():
        raise Fail(f"{root} is not a git checkout")
    for pkg, folders in MAP.items():
        d = root / SRC / pkg
        have = {p.stem for p in d.glob("*.py")} - {"__init__"}
        placed = {m for mods in folders.values() for m in mods}
        if not have:
            raise Fail(f"{d} holds no modules")
        if have - placed:
            raise Fail(f"{pkg}: modules not placed in MAP (add them first): {sorted(have - placed)}")
        if placed - have:
            raise Fail(f"{pkg}: MAP places modules that are not there (already split?): {sorted(placed - have)}")
        for folder in folders:
            if folder and (d / folder).exists():
                raise Fail(f"{d / folder} exists: already split (start from a clean checkout)")
        if (d / "__init__.py").read_text().strip():
            raise Fail(f"{d}/__init__.py is not empty: merge its text into INITS by hand first")
    dirty = git(root, "status", "--porcelain", "--untracked-files=no").strip()
    if dirty:
        raise Fail(f"the checkout has changes to tracked files (commit or stash them first):\n{dirty}")


# ---------------------------------------------------------------- 1. relative imports

REL_FROM_MODULE = re.compile(r"^([ \t]*)from[ \t]+\.(\w+)((?:\.\w+)*)[ \t]+import\b", re.M)
REL_FROM_PKG = re.compile(r"^([ \t]*)from[ \t]+\.[ \t]+import[ \t]+([^\n]*)$", re.M)
UP_LEVEL = re.compile(r"^[ \t]*from[ \t]+\.\.", re.M)


def parse_names(stmt: str, path: str) -> tuple[list[tuple[str, str | None]], str]:
    """`a, b as c  # noqa: F401` -> ([(a, None), (b, c)], '# noqa: F401')."""
    names, _, comment = stmt.partition("#")
    if "(" in names or "\\" in names:
        raise Fail(f"{path}: a multi-line `from ... import (` of modules: split it by hand first: {stmt}")
    out = []
    for part in names.split(","):
        part = part.strip()
        if not part:
            continue
        m = re.fullmatch(r"(\w+)(?:\s+as\s+(\w+))?", part)
        if not m:
            raise Fail(f"{path}: cannot read the import `{stmt}`")
        out.append((m.group(1), m.group(2)))
    return out, (f"  #{comment}" if comment else "")


def rename_bare_uses(path: str, text: str, old: str, new: str) -> str:
    """A renamed module bound by its bare name (`from . import protocol`): every use of the name
    (ast Name nodes: `protocol.x`, `setattr(protocol, ...)`) takes the new one; refused where
    the file binds the old name otherwise too."""
    tree = ast.parse(text)
    spots = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Name) and n.id == old:
            if not isinstance(n.ctx, ast.Load):
                raise Fail(f"{path}:{n.lineno}: `{old}` (renamed {new}) is also assigned here: by hand")
            spots.append((n.lineno, n.col_offset, n.end_col_offset))
        name = getattr(n, "arg", None) if isinstance(n, ast.arg) else getattr(n, "name", None) \
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) else None
        if name == old:
            raise Fail(f"{path}:{n.lineno}: `{old}` is also a local name: rename by hand")
    lines = text.splitlines(keepends=True)
    for lineno, a, b in sorted(spots, reverse=True):
        line = lines[lineno - 1].encode()
        if line[a:b].decode() != old:
            raise Fail(f"{path}:{lineno}: cannot place `{old}` (non-ASCII before it?): by hand")
        lines[lineno - 1] = (line[:a] + new.encode() + line[b:]).decode()
    count(f"uses of a renamed module under its new name ({old} -> {new})", len(spots))
    return "".join(lines)


def split_from_package(path: str, indent: str, pkg: str, own_folder: str | None,
                       names: list[tuple[str, str | None]], comment: str, relative: bool,
                       renames: list[tuple[str, str]]) -> str:
    """`from . import a, b as c` (relative, in own_folder) or `from smallinit.pkg import a, b`
    -> one statement per destination folder."""
    groups: dict[str, list[str]] = {}
    for name, alias in names:
        if (pkg, name) not in WHERE:
            if relative:
                raise Fail(f"{path}: `from . import {name}`: {name} is not a module of {pkg}")
            groups.setdefault(f"smallinit.{pkg}", []).append(name + (f" as {alias}" if alias else ""))
            continue
        folder, new = WHERE[(pkg, name)]
        if new != name and alias is None:
            renames.append((name, new))
        bound = f"{new} as {alias}" if alias else new
        key = "." if relative and folder == own_folder else folder_dotted(pkg, folder)
        groups.setdefault(key, []).append(bound)
    return "\n".join(f"{indent}from {k} import {', '.join(v)}{comment}" for k, v in groups.items())


def rewrite_relative(path: str, pkg: str, old: str, text: str) -> str:
    own = folder_of(pkg, old)
    if UP_LEVEL.search(text):
        raise Fail(f"{path}: `from .. import`: rewrite it by hand first")

    def module_form(m: re.Match) -> str:
        indent, mod, sub = m.group(1), m.group(2), m.group(3)
        if (pkg, mod) not in WHERE:
            raise Fail(f"{path}: `from .{mod} import`: {mod} is not a module of {pkg}")
        folder, new = WHERE[(pkg, mod)]
        count("relative imports", 1)
        if folder == own:
            return f"{indent}from .{new}{sub} import"
        return f"{indent}from {new_dotted(pkg, mod)}{sub} import"

    text = REL_FROM_MODULE.sub(module_form, text)
    renames: list[tuple[str, str]] = []

    def package_form(m: re.Match) -> str:
        names, comment = parse_names(m.group(2), path)
        count("relative imports", 1)
        return split_from_package(path, m.group(1), pkg, own, names, comment, True, renames)

    text = REL_FROM_PKG.sub(package_form, text)
    for a, b in renames:
        text = rename_bare_uses(path, text, a, b)
    return text


# ---------------------------------------------------------------- 2. moves

FILE_PARENTS = re.compile(r"(Path\(__file__\)\.resolve\(\))\.parents\[(\d+)\]")


def git_mv(root: Path, src: str, dst: str) -> None:
    (root / dst).parent.mkdir(parents=True, exist_ok=True)
    git(root, "mv", src, dst)


def move(root: Path) -> None:
    for pkg in PACKAGES:
        for d in sorted((root / SRC / pkg).rglob("__pycache__"), reverse=True):
            shutil.rmtree(d)
    # Relative imports first, while each file is where its old name says.
    texts: dict[str, str] = {}
    for (pkg, old) in WHERE:
        rel = f"{SRC.as_posix()}/{pkg}/{old}.py"
        texts[rel] = rewrite_relative(rel, pkg, old, (root / rel).read_text())
    n = 0
    for (pkg, old) in WHERE:
        src = f"{SRC.as_posix()}/{pkg}/{old}.py"
        dst = f"{SRC.as_posix()}/{new_rel_path(pkg, old)}"
        if src != dst:
            git_mv(root, src, dst)
            n += 1
        text = texts[src]
        if folder_of(pkg, old):  # one folder deeper: paths found from __file__ go up one more
            text, k = FILE_PARENTS.subn(lambda m: f"{m.group(1)}.parents[{int(m.group(2)) + 1}]", text)
            count("paths found from __file__ (parents[N] -> N+1)", k)
            for i, line in enumerate(text.splitlines(), 1):
                if "__file__" in line and not FILE_PARENTS.search(line) and ".with_name(" not in line:
                    raise Fail(f"{dst}:{i}: locates itself by __file__ in a way this script does not move: {line.strip()}")
        (root / dst).write_text(text)
    count("modules moved (git mv)", n)
    for (pkg, folder), doc in INITS.items():
        p = root / SRC / pkg / folder / "__init__.py"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(doc)
        git(root, "add", str(p.relative_to(root)))
    count("__init__.py written", len(INITS))


# ---------------------------------------------------------------- 3. rewrites

MODS = {pkg: "|".join(sorted({m for mods in MAP[pkg].values() for m in mods}, key=len, reverse=True))
        for pkg in PACKAGES}
# `from smallinit.sweeper import a, b as c` (one line, or parenthesized over several)
FROM_PKG = re.compile(r"^([ \t]*)from[ \t]+smallinit\.(experiments|sweeper)[ \t]+import[ \t]+"
                      r"(\([^)]*\)|[^\n]*)$", re.M)
DOTTED = {pkg: re.compile(rf"(?<![\w.])smallinit\.{pkg}\.({MODS[pkg]})(?!\w)") for pkg in PACKAGES}
# prose: `experiments.stats`, `sweeper.reaper` (hydra.sweeper.protocol has a dot before it)
BARE_DOTTED = {pkg: re.compile(rf"(?<![\w./-]){pkg}\.({MODS[pkg]})(?!\w)") for pkg in PACKAGES}
PATHS = {pkg: re.compile(rf"(?<![\w.-])((?:\.\./)*(?:src/smallinit/|smallinit/)?){pkg}/({MODS[pkg]})\.py(?!\w)")
         for pkg in PACKAGES}


def text_files(root: Path) -> list[str]:
    out = []
    for f in tracked(root):
        p = Path(f)
        if f in RECORDS or f == SELF or not (root / f).is_file():
            continue
        if p.suffix in TEXT_SUFFIXES or p.name in TEXT_NAMES or f.startswith(".ci/"):
            out.append(f)
    return out


def rewrite_from_package(path: str, text: str) -> str:
    renames: list[tuple[str, str]] = []

    def one(m: re.Match) -> str:
        indent, pkg, body = m.groups()
        comment = ""
        if body.startswith("("):
            inner = body[1:-1]
            if "#" in inner:
                raise Fail(f"{path}: a comment inside `from smallinit.{pkg} import (...)`: by hand")
            names, _ = parse_names(" ".join(inner.split()), path)
        else:
            names, comment = parse_names(body, path)
        count("from smallinit.<package> import <modules>", 1)
        return split_from_package(path, indent, pkg, None, names, comment, False, renames)

    text = FROM_PKG.sub(one, text)
    for a, b in renames:
        text = rename_bare_uses(path, text, a, b)
    return text


def rewrite_paths_and_names(text: str) -> str:
    for pkg in PACKAGES:
        text, n = DOTTED[pkg].subn(lambda m, pkg=pkg: new_dotted(pkg, m.group(1)), text)
        count("dotted module paths", n)
        text, n = BARE_DOTTED[pkg].subn(lambda m, pkg=pkg: new_dotted(pkg, m.group(1))[len("smallinit."):], text)
        count("unprefixed dotted names (prose)", n)
        text, n = PATHS[pkg].subn(lambda m, pkg=pkg: m.group(1) + new_rel_path(pkg, m.group(2)), text)
        count("file paths", n)
    return text


def headings(markdown: str) -> list[str]:
    """GitHub's anchors of a Markdown file's headings, in order (code blocks skipped)."""
    out, in_code = [], False
    for line in markdown.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        m = None if in_code else re.match(r"#{1,6} (.+)", line)
        if m:
            out.append(re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-"))
    return out


def rewrite_anchors(root: Path, renamed: dict[str, str]) -> None:
    if not renamed:
        return
    pattern = re.compile(r"#(" + "|".join(re.escape(a) for a in sorted(renamed, key=len, reverse=True)) + r")(?![\w-])")
    for f in text_files(root):
        path = root / f
        text = path.read_text(errors="replace")
        new, n = pattern.subn(lambda m: "#" + renamed[m.group(1)], text)
        if n:
            path.write_text(new)
            count("links to renamed headings", n)


def rewrite_all(root: Path) -> None:
    changed, renamed = [], {}
    for f in text_files(root):
        path = root / f
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        new = text
        spans = [m.span() for m in GENERATED_BLOCK.finditer(new)] if f.endswith(".md") else []
        if f.startswith("docs/results/") and f.endswith("status.md"):
            spans = sorted(spans + [m.span() for m in HISTORY_LINE.finditer(new)])
        new = outside(new, spans, rewrite_paths_and_names)
        if f.endswith(".py"):  # after: its output names folders (smallinit.sweeper.config), not old modules
            new = rewrite_from_package(f, new)
        if new != text:
            path.write_text(new)
            changed.append(f)
            if f.endswith(".md"):
                before, after = headings(text), headings(new)
                if len(before) != len(after):
                    raise Fail(f"{f}: the rewrite changed the number of headings")
                renamed.update({a: b for a, b in zip(before, after, strict=True) if a != b})
    count("text files rewritten", len(changed))
    rewrite_anchors(root, renamed)


# ---------------------------------------------------------------- 4. checks

ANY_DOTTED = re.compile(r"(?<![\w.])smallinit\.(?:experiments|sweeper)(?:\.\w+)+")
ANY_PATH = re.compile(r"(?<![\w.-])(?:src/smallinit/|smallinit/)?((?:experiments|sweeper)/[\w/]+\.py)(?!\w)")


def resolves(root: Path, dotted: str) -> bool:
    """smallinit.experiments.stats.paired[.attr...]: a module (then anything) or a folder (then
    a module or folder of it, or nothing)."""
    parts = dotted.split(".")[1:]
    here = root / SRC
    for i, part in enumerate(parts):
        if (here / part / "__init__.py").is_file():
            here = here / part
            continue
        if (here / f"{part}.py").is_file():
            return True
        return i == 0  # smallinit.<top>: checked by the caller's pattern
    return True


def defined(module: Path) -> set[str]:
    """The names a module binds at its top level (under if/try too, not in functions or classes)."""
    names: set[str] = set()

    def body(stmts) -> None:
        for n in stmts:
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(n.name)
            elif isinstance(n, ast.Import | ast.ImportFrom):
                names.update((a.asname or a.name).split(".")[0] for a in n.names)
            elif isinstance(n, ast.Assign | ast.AnnAssign | ast.AugAssign):
                for t in (n.targets if isinstance(n, ast.Assign) else [n.target]):
                    names.update(x.id for x in ast.walk(t) if isinstance(x, ast.Name))
            elif isinstance(n, ast.If | ast.Try | ast.With | ast.For):
                for field in ("body", "orelse", "finalbody"):
                    body(getattr(n, field, []))
                for h in getattr(n, "handlers", []):
                    body(h.body)
    body(ast.parse(module.read_text()).body)
    return names


def checks(root: Path) -> None:
    problems = []
    for f in text_files(root):
        text = (root / f).read_text(errors="replace")
        if f.endswith(".py"):
            try:
                tree = compile(text, f, "exec", ast.PyCF_ONLY_AST)
            except SyntaxError as e:
                raise Fail(f"{f} no longer compiles: {e}") from e
            in_pkg = f.startswith(f"{SRC.as_posix()}/experiments/") or f.startswith(f"{SRC.as_posix()}/sweeper/")
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                        re.fullmatch(r"smallinit\.(experiments|sweeper)(\.\w+)*", node.module):
                    base = root / SRC / Path(*node.module.split(".")[1:])
                    if base.is_dir():
                        for a in node.names:
                            if not ((base / f"{a.name}.py").is_file() or (base / a.name / "__init__.py").is_file()):
                                problems.append(f"{f}:{node.lineno}: from {node.module} import {a.name}: not a module")
                    elif not base.with_suffix(".py").is_file():
                        problems.append(f"{f}:{node.lineno}: from {node.module}: no such module")
                    else:
                        have = defined(base.with_suffix(".py"))
                        problems += [f"{f}:{node.lineno}: from {node.module} import {a.name}: {a.name} is not defined there"
                                     for a in node.names if a.name != "*" and a.name not in have]
                if in_pkg and isinstance(node, ast.ImportFrom) and node.level > 0:
                    here = (root / f).parent
                    target = here / Path(*(node.module or "").split(".")) if node.module else here
                    if node.level > 1 or not (target.with_suffix(".py").is_file() or target.is_dir()):
                        problems.append(f"{f}:{node.lineno}: relative import does not resolve in its folder")
        if f in RECORDS:
            continue
        body = text
        if f.startswith("docs/results/") and f.endswith("status.md"):
            body = HISTORY_LINE.sub("", body)
        for m in ANY_DOTTED.finditer(body):
            if not resolves(root, m.group(0)):
                problems.append(f"{f}: {m.group(0)} names no module")
        for m in ANY_PATH.finditer(body):
            if not (root / SRC / m.group(1)).exists():
                problems.append(f"{f}: {m.group(0)} is no file")
    if problems:
        raise Fail("references left that name nothing:\n  " + "\n  ".join(problems))


def find_ruff(root: Path) -> list[str] | None:
    for cand in (root / ".venv" / "bin" / "ruff", Path(sys.executable).parent / "ruff"):
        if cand.is_file() and os.access(cand, os.X_OK):
            return [str(cand)]
    return [shutil.which("ruff")] if shutil.which("ruff") else None


def isort(root: Path, use_ruff: bool) -> None:
    ruff = find_ruff(root) if use_ruff else None
    if ruff is None:
        note("ruff not found (or --no-ruff): run `ruff check --select I --fix src tests` and `ruff check src tests`")
        return
    proc = subprocess.run([*ruff, "check", "--select", "I", "--fix", "--quiet", "src", "tests"], cwd=root,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise Fail(f"ruff --select I --fix: {proc.stdout}{proc.stderr}")
    proc = subprocess.run([*ruff, "check", "--quiet", "src", "tests"], cwd=root, capture_output=True, text=True)
    if proc.returncode != 0:
        raise Fail(f"ruff check src tests after the split:\n{proc.stdout}{proc.stderr}")
    count("ruff check src tests (after the isort fix): clean", 1)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("root", type=Path, help="the repository root (a clean checkout, experiments/ and sweeper/ flat)")
    p.add_argument("--no-ruff", action="store_true", help="skip `ruff check --select I --fix` and `ruff check`")
    a = p.parse_args(argv)
    root = a.root.resolve()
    try:
        preconditions(root)
        rewrite_all(root)  # first: every smallinit.experiments.<x> in the tree is still an old path
        move(root)
        checks(root)
        isort(root, not a.no_ruff)
        git(root, "add", "-u")
    except Fail as e:
        print(f"split_packages: error: {e}", file=sys.stderr)
        return 1
    print(f"split_packages: {root}: split (nothing committed)")
    for k, v in COUNTS.items():
        print(f"  {k}: {v}")
    for pkg, folders in MAP.items():
        for folder, mods in folders.items():
            print(f"  {pkg}/{folder or '.'}: {len(mods)} modules")
    if NOTES:
        print("look at:")
        for n in NOTES:
            print(f"  - {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
