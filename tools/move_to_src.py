#!/usr/bin/env python3
"""Move smallinit's code into one installable package, `smallinit`, in a src layout.

    python move_to_src.py REPO_ROOT [--no-ruff]

REPO_ROOT is a clean git checkout of the flat layout (core/ model/ trainer/ sweeper/ experiments/
bench/ conf/ hydra_plugins/ sweep.py at the root). The script changes the working tree and the
index (git mv, git add) and commits nothing. It stops with `move_to_src: error: ...` when the
tree is not what it expects (already moved, dirty, a pattern it must replace is missing); a
tree it stopped on is half-moved: `git reset -q --hard && git clean -fdq src` (or a fresh clone)
and run it again.

What it does, in order:
  1. git mv core model trainer sweeper experiments bench -> src/smallinit/<name> (bench's files
     other than .py are records and stay in bench/ at the root), conf -> src/smallinit/conf,
     hydra_plugins -> src/hydra_plugins; untracked __pycache__ of the old folders and the root's
     stale *.egg-info are removed.
  2. src/smallinit/__init__.py (the package's map, CONF_DIR) and src/smallinit/cli.py (sweep.py's
     body, main() the entry); the root sweep.py becomes a shim that puts src/ on sys.path.
  3. Rewrites: imports (`from core.x import` -> `from smallinit.core.x import`), `-m pkg.x` module
     paths, GitHub anchors of headings that name them, the repository-root constants
     (`Path(__file__).resolve().parents[N]` -> N + 2), `REPO / "conf"`, bench's record folder,
     PYTHONPATH / sys.path set by tests and benches, file paths in README, docs, Makefile, .ci and
     pyproject comments (only where the named file moved), the architecture test, pyproject's
     package discovery, package data and a console script, the Makefile's clean target, Hydra's
     job name (kept "sweep"), the README's Layout block.
  4. Checks: every .py compiles, no flat import or `-m` path is left; then `ruff check --select I
     --fix` on the tree (isort: `smallinit` now sorts before `tests`), when ruff is found.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

PACKAGES = ("core", "model", "trainer", "sweeper", "experiments", "bench")
PKG = "|".join(PACKAGES)
NEW = Path("src") / "smallinit"
# Text files whose module paths (`python -m bench.doc`) are rewritten; records (JSON, bench's
# results.md) are not: docs/benchmarks.md's generated blocks quote them and stay as they are.
TEXT_SUFFIXES = {".py", ".md", ".txt", ".yaml", ".yml", ".toml", ".cfg", ".ini", ".sh"}
TEXT_NAMES = {"Makefile"}
RECORDS = {"bench/results.md"}
# Files whose prose names files by path (core/provenance.py): rewritten where the file moved.
PATH_DOCS_SUFFIXES = {".md"}
PATH_DOC_NAMES = {"Makefile", "pyproject.toml"}
# docs/results.md is generated from records and conf's comments (python -m ...results_doc --check
# compares): paths are not rewritten there, and bench's generated blocks are left whole.
NO_PATH_REWRITE = {"docs/results.md", "bench/results.md"}
GENERATED_BLOCK = re.compile(r"<!-- bench\.doc: ([\w-]+) -->.*?<!-- end \1 -->", re.S)

NOTES: list[str] = []  # what a person should look at
COUNTS: dict[str, int] = {}


class Fail(Exception):
    pass


def note(msg: str) -> None:
    NOTES.append(msg)


def count(what: str, n: int) -> None:
    COUNTS[what] = COUNTS.get(what, 0) + n


def git(root: Path, *args: str, check: bool = True) -> str:
    proc = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise Fail(f"git {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout


def tracked(root: Path, *paths: str) -> list[str]:
    return [p for p in git(root, "ls-files", "-z", "--", *paths).split("\0") if p]


def replace_once(text: str, pattern: str, repl, what: str, flags: int = re.M, count_: int = 1) -> str:
    """re.subn that must match exactly count_ times (0: at least once): the targeted edits fail loudly."""
    new, n = re.subn(pattern, repl, text, flags=flags)
    if n == 0 or (count_ and n != count_):
        raise Fail(f"{what}: expected {count_ or '1+'} match(es) of /{pattern}/, found {n}")
    return new


def outside(text: str, spans: list[tuple[int, int]], fn) -> str:
    """fn applied to the parts of text outside the (sorted, disjoint) spans."""
    out, pos = [], 0
    for a, b in spans:
        out.append(fn(text[pos:a]))
        out.append(text[a:b])
        pos = b
    out.append(fn(text[pos:]))
    return "".join(out)


# ---------------------------------------------------------------- 0. preconditions

def preconditions(root: Path) -> None:
    if not (root / ".git").exists():
        raise Fail(f"{root} is not a git checkout")
    if (root / NEW).exists():
        raise Fail(f"{root / NEW} exists: already moved (start from a clean checkout of the flat layout)")
    for pkg in PACKAGES:
        if not (root / pkg / "__init__.py").is_file():
            raise Fail(f"{root / pkg}/__init__.py is missing: not the flat layout this script moves")
    for p in ("conf/config.yaml", "hydra_plugins", "sweep.py", "pyproject.toml", "Makefile", "tests/test_architecture.py"):
        if not (root / p).exists():
            raise Fail(f"{root / p} is missing")
    dirty = git(root, "status", "--porcelain", "--untracked-files=no").strip()
    if dirty:
        raise Fail(f"the checkout has changes to tracked files (commit or stash them first):\n{dirty}")


# ---------------------------------------------------------------- 1. moves

def remove_pycache(folder: Path) -> None:
    for d in sorted(folder.rglob("__pycache__"), reverse=True):
        if d.is_dir():
            shutil.rmtree(d)


def git_mv(root: Path, src: str, dst: str) -> None:
    (root / dst).parent.mkdir(parents=True, exist_ok=True)
    git(root, "mv", src, dst)


def move(root: Path) -> None:
    for pkg in (*PACKAGES, "conf", "hydra_plugins"):
        remove_pycache(root / pkg)
    moved = 0
    for pkg in PACKAGES:
        for f in tracked(root, pkg):
            rel = f[len(pkg) + 1:]
            if pkg == "bench" and not f.endswith(".py"):
                note(f"kept at the root (a record, not code): {f}")
                continue
            git_mv(root, f, str(NEW / pkg / rel))
            moved += 1
    for f in tracked(root, "conf"):
        git_mv(root, f, str(NEW / f))
        moved += 1
    for f in tracked(root, "hydra_plugins"):
        git_mv(root, f, str(Path("src") / f))
        moved += 1
    count("files moved (git mv)", moved)
    for pkg in (*PACKAGES, "conf", "hydra_plugins"):
        d = root / pkg
        if not d.exists():
            continue
        for sub in sorted(d.rglob("*"), reverse=True):  # empty folders git leaves behind
            if sub.is_dir() and not any(sub.iterdir()):
                sub.rmdir()
        if d.is_dir() and not any(d.iterdir()):
            d.rmdir()
        elif pkg != "bench":
            left = sorted(str(p.relative_to(root)) for p in d.rglob("*") if p.is_file())
            note(f"{pkg}/ still holds untracked files (not moved): {left}")
    for egg in root.glob("*.egg-info"):  # the old layout's metadata: the reinstall writes src/*.egg-info
        shutil.rmtree(egg)
        note(f"removed {egg.name} (stale metadata of the flat layout; `make install` writes src/smallinit.egg-info)")


# ---------------------------------------------------------------- 2. new files

INIT = '''"""smallinit: test, reproduce and extend "Small Initialization Matters for Large Language Models".

One installable package (src layout). `python sweep.py ...` at the repository root, or the
`smallinit-sweep` console script once installed, runs `smallinit.cli.main`. Its sub-packages,
by concern:

    core         the ground floor: ConfigError and require, atomic writes, the trial folder
                 (TrialDir), the results table's columns, provenance of records
    model        the decoder, the init rule, gated attention; probes attach from outside
    trainer      typed data settings, corpora, the anchor task, the training loop, precision,
                 checkpoints, export to transformers
    sweeper      Hydra multirun -> Ray Tune trials: schema, compose, plan, cluster, tuner, the
                 Optuna study, results, dashboard
    experiments  the report and the paper's analyses, read from what the sweeper wrote
    bench        what the instrument costs (its records stay in the repository's bench/)
    conf         Hydra's presets and experiments (CONF_DIR); not a Python package
    cli          sweep.py's body: the Hydra main, --show, the stop signals

Hydra's plugin (the smallinit sweeper) is hydra_plugins.smallinit_sweeper, beside this package
in src/: Hydra finds plugins in the hydra_plugins namespace.

The import floors (tests/test_architecture.py enforces them, lazy imports included; no private
name crosses between packages): core -> model -> trainer and experiments -> sweeper and bench.

    core         the standard library only
    model        core
    trainer      core, model
    experiments  core, model (it reads sweeps through core's schema, not through the sweeper)
    sweeper      core, model, trainer
    bench        core, model, trainer, sweeper
    hydra_plugins  core, sweeper

Importing this package imports nothing else (the sweep driver must not pay for torch).
"""

from pathlib import Path

CONF_DIR = Path(__file__).parent / "conf"
'''


def make_cli(root: Path) -> None:
    old = (root / "sweep.py").read_text()
    doc = re.match(r'"""(.*?)"""\n', old, re.S)
    if not doc:
        raise Fail("sweep.py: no module docstring to keep")
    usage = doc.group(1).split("\n", 1)[1] if "\n" in doc.group(1) else ""
    cli = old
    cli = replace_once(cli, r'\A"""[^\n]*\n', '"""smallinit\'s command line: `python sweep.py` at the repository root, or `smallinit-sweep`\n'
                       "once installed, runs main().\n", "cli.py docstring")
    cli = replace_once(cli, r'config_path="conf"', "config_path=str(CONF_DIR)", "cli.py @hydra.main config_path")
    cli = replace_once(cli, r"^def main\(cfg", "def run(cfg", "cli.py: the Hydra main (renamed run)")
    cli = replace_once(cli, r"^def cli\(\) -> None:", "def main() -> None:", "cli.py: cli() (renamed main)")
    cli = replace_once(cli, r"^([ \t]+)main\(\)$", r"\1run()", "cli.py: main() called in cli()")
    cli = replace_once(cli, r'^(\s+conf = )Path\(__file__\)\.resolve\(\)\.parent / "conf"$', r"\1CONF_DIR",
                       "cli.py: the conf folder of --show and precheck")
    cli = replace_once(cli, r'^if __name__ == "__main__":\n    cli\(\)$', 'if __name__ == "__main__":\n    main()',
                       "cli.py: __main__")
    cli = replace_once(cli, r"^(from omegaconf import [^\n]*\n)", r"\1\nfrom smallinit import CONF_DIR\n", "cli.py: imports")
    # cli() imported Path locally for the conf folder; now unused there.
    body = re.search(r"^def main\(\) -> None:\n(.*?)(?=^\S)", cli, re.M | re.S)
    if body and "    from pathlib import Path\n\n" in body.group(1) and "Path(" not in body.group(1):
        start = body.start(1)
        cli = cli[:start] + body.group(1).replace("    from pathlib import Path\n\n", "", 1) + cli[body.end(1):]
    (root / NEW / "cli.py").write_text(cli)
    usage = rewrite_doc_paths(root, usage)  # (conf/config.yaml) -> (src/smallinit/conf/config.yaml)
    shim = ('"""smallinit\'s entry point: src/smallinit/cli.py (installed, also the `smallinit-sweep` command).\n'
            f"{usage}"
            '"""\n\n'
            "import sys\n"
            "from pathlib import Path\n\n"
            "# This checkout's src/ first: the package runs from here even before (or without) `pip install -e .`.\n"
            'sys.path.insert(0, str(Path(__file__).resolve().parent / "src"))\n\n'
            "from smallinit.cli import main  # noqa: E402\n\n"
            'if __name__ == "__main__":\n'
            "    main()\n")
    (root / "sweep.py").write_text(shim)
    (root / NEW / "__init__.py").write_text(INIT)
    git(root, "add", str(NEW / "cli.py"), str(NEW / "__init__.py"), "sweep.py")


# ---------------------------------------------------------------- 3. rewrites

FROM_IMPORT = re.compile(rf"(?<![\w.])from(\s+)({PKG})((?:\.\w+)*)(\s+import\b)")
LINE_IMPORT = re.compile(rf"^([ \t]*)import[ \t]+({PKG})((?:\.\w+)*)([ \t]+as[ \t]+\w+)?[ \t]*(,[^\n]*)?(#[^\n]*)?$", re.M)
# `python -m bench.doc`, `$(PY) -m experiments.report`, `sys.executable, "-m", "trainer.export"`
RUN_M = re.compile(rf"((?:\bpython3?|\$\(PY\))\s+-m\s+)({PKG})(?=[.\s`'\")\]]|$)", re.M)
ARG_M = re.compile(rf"""(["']-m["']\s*,\s*["'])({PKG})(?=[."'])""")


def rewrite_imports(path: str, text: str) -> str:
    text, n = FROM_IMPORT.subn(r"from\1smallinit.\2\3\4", text)
    count("from-imports", n)

    def line(m: re.Match) -> str:
        indent, pkg, sub, alias, more, comment = m.groups()
        if more:
            raise Fail(f"{path}: `{m.group(0).strip()}` imports several modules on one line: split it first")
        tail = f"  {comment}" if comment else ""
        if alias:
            return f"{indent}import smallinit.{pkg}{sub}{alias}{tail}"
        if not sub:  # `import sweeper` binds the name sweeper: keep that binding
            return f"{indent}from smallinit import {pkg}{tail}"
        raise Fail(f"{path}: `{m.group(0).strip()}` (a dotted import without `as`) binds `{pkg}`: rewrite it by hand")

    text, n = LINE_IMPORT.subn(line, text)
    count("import statements", n)
    return text


def rewrite_module_paths(text: str) -> str:
    text, n1 = RUN_M.subn(r"\1smallinit.\2", text)
    text, n2 = ARG_M.subn(r"\1smallinit.\2", text)
    count("-m module paths", n1 + n2)
    return text


DOC_PATH = re.compile(rf"(?<![\w./-])(\.\./)?({PKG}|conf|hydra_plugins)/([\w.*<>/-]*)")


def rewrite_doc_paths(root: Path, text: str) -> str:
    """`core/provenance.py` -> `src/smallinit/core/provenance.py` where the named file or folder
    moved there; what is still at the root (bench/results.json, bench/) is left."""
    def one(m: re.Match) -> str:
        up, pkg, rest = m.groups()
        base = Path("src") if pkg == "hydra_plugins" else NEW
        head = re.split(r"[*<]", rest, maxsplit=1)[0]
        if (root / pkg / head).exists():
            return m.group(0)
        for c in (head, head.rstrip(".-"), head.rsplit("/", 1)[0] if "/" in head else ""):
            if (root / base / pkg / c).exists():
                count("file paths in docs", 1)
                return f"{up or ''}{base.as_posix()}/{pkg}/{rest}"
        return m.group(0)

    return DOC_PATH.sub(one, text)


def text_files(root: Path) -> list[str]:
    out = []
    for f in tracked(root):
        p = Path(f)
        if f in RECORDS or not (root / f).is_file():
            continue
        if p.suffix in TEXT_SUFFIXES or p.name in TEXT_NAMES or f.startswith(".ci/"):
            out.append(f)
    return out


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
    """Links to a heading whose text was rewritten (## Probes (`model/probes.py`)) follow it."""
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
        if f.endswith(".py"):
            new = rewrite_imports(f, new)
        spans = [m.span() for m in GENERATED_BLOCK.finditer(new)] if f.endswith(".md") else []
        new = outside(new, spans, rewrite_module_paths)
        if (Path(f).suffix in PATH_DOCS_SUFFIXES or Path(f).name in PATH_DOC_NAMES or f.startswith(".ci/")) \
                and f not in NO_PATH_REWRITE:
            if f == "README.md":
                layout = re.search(r"^## Layout\n.*?^```\n.*?^```\n", new, re.M | re.S)
                spans = sorted([*spans, layout.span()]) if layout else spans
            new = outside(new, spans, lambda t: rewrite_doc_paths(root, t))
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


def rewrite_constants(root: Path) -> None:
    """Repository-root constants of the moved code go up two more folders; anything else that
    locates itself by __file__ is listed for a look."""
    root_const = re.compile(r"^(\s*(?:REPO|ROOT|REPO_ROOT)\s*=\s*Path\(__file__\)\.resolve\(\))"
                            r"(?:\.parents\[(\d+)\]|(\.parent\.parent))(?![\w.\[])", re.M)
    # bench's record folder stays at the root.
    main = root / NEW / "bench" / "__main__.py"
    text = replace_once(main.read_text(), r"^RECORD = Path\(__file__\)\.resolve\(\)\.parent$",
                        'RECORD = Path(__file__).resolve().parents[3] / "bench"  # the record stays in the repository\'s bench/',
                        "bench/__main__.py RECORD")
    main.write_text(text)
    n_total = 0
    for f in tracked(root, str(NEW)):
        if not f.endswith(".py"):
            continue
        path = root / f
        text = path.read_text()

        def up(m: re.Match) -> str:
            n = int(m.group(2)) if m.group(2) is not None else 1
            return f"{m.group(1)}.parents[{n + 2}]"

        new, n = root_const.subn(up, text)
        n_total += n
        for i, line in enumerate(new.splitlines(), 1):
            if "__file__" in line and not root_const.match(line) and not line.startswith("RECORD = "):
                note(f"locates itself by __file__ (checked by hand, left as is): {f}:{i}: {line.strip()}")
        if new != text:
            path.write_text(new)
    if n_total == 0:
        raise Fail("no `REPO = Path(__file__).resolve().parents[N]` in the moved code (core/provenance.py had one)")
    count("repository-root constants (parents[N] -> N+2)", n_total)

    # The conf folder, wherever code or tests build it from the repository root.
    n_total = 0
    for f in tracked(root):
        if f.endswith(".py"):
            path = root / f
            text = path.read_text()
            new, n = re.subn(r'\bREPO / "conf"', 'REPO / "src" / "smallinit" / "conf"', text)
            if n:
                path.write_text(new)
                n_total += n
    count('REPO / "conf" -> REPO / "src" / "smallinit" / "conf"', n_total)


def rewrite_pythonpath(root: Path) -> None:
    """Subprocesses given PYTHONPATH=REPO (or sys.path.insert(0, REPO)) get REPO/src too."""
    n_total = 0
    for f in tracked(root):
        if not f.endswith(".py"):
            continue
        path = root / f
        text = path.read_text()
        new, n1 = re.subn(r'"PYTHONPATH": (?:str\((REPO|repo)\)|(REPO))(?=[,}\s])',
                          lambda m: (f'"PYTHONPATH": os.pathsep.join([os.path.join({m.group(1) or m.group(2)}, "src"), '
                                     f'str({m.group(1) or m.group(2)})])'), text)
        # In a child's code: str(REPO) is a Path's; a bare REPO may be a str (os.path).
        new, n2 = re.subn(r"sys\.path\.insert\(0, \{str\(REPO\)!r\}\)", "sys.path.insert(0, {str(REPO / 'src')!r})", new)
        new, n3 = re.subn(r"sys\.path\.insert\(0, \{REPO!r\}\)", "sys.path.insert(0, {os.path.join(REPO, 'src')!r})", new)
        if n1 + n2 + n3:
            if (n1 or n3) and not re.search(r"^[ \t]*import[ \t]+(?:[\w, ]*,[ \t]*)?os\b", new, re.M):
                raise Fail(f"{f}: PYTHONPATH rewritten with os.path, but the file does not import os")
            path.write_text(new)
            n_total += n1 + n2 + n3
    count("PYTHONPATH / sys.path of subprocesses (+ REPO/src)", n_total)


ARCH_IMPORTS = '''def _home(package: str) -> Path:
    """The folder holding a package: src/smallinit/, or src/ for Hydra's hydra_plugins namespace."""
    return SRC if package == "hydra_plugins" else SRC / "smallinit"


def _top(module: str) -> str:
    """The package a module is in: smallinit.trainer.loop -> trainer (hydra_plugins.x -> hydra_plugins)."""
    parts = module.split(".")
    return parts[1] if parts[0] == "smallinit" and len(parts) > 1 else parts[0]


def _imports(package: str, root: Path | None = None):
    """(file, line, imported top-level package, imported names) for every import in package,
    those inside functions included (a lazy import is still a dependency)."""
    for path in sorted(((_home(package) if root is None else root) / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                for a in node.names:
                    yield path, node.lineno, _top(a.name), []
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "smallinit":
                for a in node.names:  # from smallinit import trainer: the package by name
                    yield path, node.lineno, a.name, []
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                yield path, node.lineno, _top(node.module), [a.name for a in node.names]
'''


def rewrite_architecture_test(root: Path) -> None:
    path = root / "tests" / "test_architecture.py"
    text = path.read_text()
    text = replace_once(text, r"^(REPO = Path\(__file__\)\.resolve\(\)\.parents\[1\]\n)",
                        r'\1SRC = REPO / "src"  # src/smallinit/<package>, and src/hydra_plugins\n', "test_architecture: REPO")
    text = replace_once(text, r"^def _imports\(package: str, root: Path = REPO\):\n.*?(?=^\S)", ARCH_IMPORTS + "\n\n",
                        "test_architecture: _imports", flags=re.M | re.S)
    path.write_text(text)


def rewrite_pyproject(root: Path) -> None:
    path = root / "pyproject.toml"
    text = path.read_text()
    text = replace_once(text, r"^\[tool\.setuptools\.packages\.find\]\n(?:[^\[\n][^\n]*\n|\n)*?(?=\n\[|\Z)",
                        "[tool.setuptools.packages.find]\n"
                        'where = ["src"]\n'
                        'include = ["smallinit*", "hydra_plugins*"]\n'
                        "namespaces = true\n\n"
                        "# Hydra's configs ship with the package (smallinit.CONF_DIR).\n"
                        "[tool.setuptools.package-data]\n"
                        'smallinit = ["conf/*.yaml", "conf/**/*.yaml"]\n',
                        "pyproject.toml [tool.setuptools.packages.find]")
    if "[project.scripts]" in text:
        raise Fail("pyproject.toml already has [project.scripts]: add smallinit-sweep by hand")
    text = replace_once(text, r"^(\[project\.optional-dependencies\])",
                        "[project.scripts]\n"
                        "# sweep.py at the repository root runs the same main().\n"
                        'smallinit-sweep = "smallinit.cli:main"\n\n'
                        r"\1", "pyproject.toml [project.optional-dependencies]")
    path.write_text(text)


def rewrite_makefile(root: Path) -> None:
    path = root / "Makefile"
    text = path.read_text()
    text = replace_once(text, r"^(clean:.*\n\trm -rf [^\n]*\*\.egg-info)", r"\1 src/*.egg-info", "Makefile clean")
    path.write_text(text)


def rewrite_hydra_job_name(root: Path) -> None:
    """Hydra names the job after the file of its main: cli.py would make it "cli" (the log file,
    --help). The config keeps it "sweep", as when sweep.py held the main."""
    path = root / NEW / "conf" / "config.yaml"
    text = path.read_text()
    if re.search(r"^hydra:\n(?:[ \t][^\n]*\n|\n)*?  job:\n(?:    [^\n]*\n)*?    name:", text, re.M):
        raise Fail(f"{path}: hydra.job.name is already set: check it by hand")
    text = replace_once(text, r"^(hydra:\n(?:[ \t][^\n]*\n|\n)*?  job:\n)",
                        r"\1    # The job (its log file, --help) keeps the entry point's name: src/smallinit/cli.py runs as sweep.py.\n"
                        r"    name: sweep\n", "conf/config.yaml hydra.job")
    path.write_text(text)


def rewrite_readme_layout(root: Path) -> None:
    """The Layout block: the packages (and conf/) indented under src/smallinit/, then
    src/hydra_plugins/ and the root's bench/ (records only)."""
    path = root / "README.md"
    text = path.read_text()
    m = re.search(r"^(## Layout\n.*?^```\n)(.*?)(^```\n)", text, re.M | re.S)
    if not m:
        note("README.md: no `## Layout` code block: describe src/smallinit/ there by hand")
        return
    entry = re.compile(rf"^({PKG}|conf)/\s")
    out: list[str] = []
    state = "before"  # before, in (a package entry or its continuation lines), after
    for line in m.group(2).splitlines(keepends=True):
        starts_entry = line[:1] not in (" ", "\t", "\n", "")
        if entry.match(line) and state != "after":
            if state == "before":
                out.append("src/smallinit/  the package (pip install -e .); cli.py is sweep.py's body:\n")
            state = "in"
            out.append(f"  {line}")
        elif state == "in" and not starts_entry:
            out.append(f"  {line}")
        else:
            if state == "in":
                out.append("src/hydra_plugins/  Hydra's entry to the sweeper (smallinit_sweeper)\n")
                if (root / "bench").is_dir():
                    out.append("bench/        the benchmarks' records: results.json, results.md (make bench)\n")
                state = "after"
            if line.startswith("sweep.py"):
                line = re.sub(r"^(sweep\.py\s+the entry point)$", r"\1 (src/smallinit/cli.py; installed: smallinit-sweep)",
                              line.rstrip("\n")) + "\n"
            out.append(line)
    if state == "before":
        note("README.md: the Layout block names no package: describe src/smallinit/ there by hand")
        return
    text = text[:m.start(2)] + "".join(out) + text[m.end(2):]
    path.write_text(text)
    count("README Layout block", 1)


# ---------------------------------------------------------------- 4. checks

def checks(root: Path) -> None:
    old_import = re.compile(rf"^[ \t]*(?:from[ \t]+({PKG})(?:\.\w+)*[ \t]+import\b|import[ \t]+({PKG})(?:\.\w+)*[ \t]*(?:$|as\b|,))", re.M)
    old_m = re.compile(rf"""(?:\bpython3?|\$\(PY\))\s+-m\s+({PKG})(?=[.\s`'")]|$)|["']-m["']\s*,\s*["']({PKG})[."']""", re.M)
    left = []
    for f in text_files(root):
        text = (root / f).read_text(errors="replace")
        if f.endswith(".py"):
            try:
                compile(text, f, "exec")
            except SyntaxError as e:
                raise Fail(f"{f} no longer compiles: {e}") from e
            left += [f"{f}: {m.group(0).strip()}" for m in old_import.finditer(text)]
            left += [f"{f}: {m.group(0)} (in a string?)" for m in re.finditer(rf"(?<![\w.])(?:import|from)\s+({PKG})\.\w", text)]
            if re.search(r'"PYTHONPATH": str\((REPO|repo)\)(?=[,}\s])', text):
                left.append(f"{f}: PYTHONPATH=REPO without src")
        spans = [m.span() for m in GENERATED_BLOCK.finditer(text)] if f.endswith(".md") else []
        rest = outside(text, spans, lambda t: t)
        for a, b in reversed(spans):
            rest = rest[:a] + rest[b:]
        left += [f"{f}: {m.group(0).strip()}" for m in old_m.finditer(rest)]
    if left:
        raise Fail("flat-layout references left:\n  " + "\n  ".join(left))
    for p in (NEW / "conf" / "config.yaml", NEW / "cli.py", NEW / "__init__.py", Path("src/hydra_plugins")):
        if not (root / p).exists():
            raise Fail(f"{p} is missing after the move")


def find_ruff(root: Path) -> list[str] | None:
    for cand in (root / ".venv" / "bin" / "ruff", Path(sys.executable).parent / "ruff"):
        if cand.is_file() and os.access(cand, os.X_OK):
            return [str(cand)]
    if shutil.which("ruff"):
        return [shutil.which("ruff")]
    return None


def isort(root: Path, use_ruff: bool) -> None:
    ruff = find_ruff(root) if use_ruff else None
    if ruff is None:
        note("ruff not found (or --no-ruff): run `ruff check --select I --fix .` (import order: smallinit now sorts "
             "before tests) and `ruff check .`")
        return
    proc = subprocess.run([*ruff, "check", "--select", "I", "--fix", "--quiet", "."], cwd=root, capture_output=True, text=True)
    if proc.returncode != 0:
        raise Fail(f"ruff --select I --fix: {proc.stdout}{proc.stderr}")
    proc = subprocess.run([*ruff, "check", "--quiet", "."], cwd=root, capture_output=True, text=True)
    if proc.returncode != 0:
        raise Fail(f"ruff check . after the move:\n{proc.stdout}{proc.stderr}")
    count("ruff check . (after isort fix): clean", 1)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("root", type=Path, help="the repository root (a clean checkout of the flat layout)")
    p.add_argument("--no-ruff", action="store_true", help="skip `ruff check --select I --fix` and `ruff check`")
    a = p.parse_args(argv)
    root = a.root.resolve()
    try:
        preconditions(root)
        move(root)
        make_cli(root)
        rewrite_all(root)
        rewrite_constants(root)
        rewrite_pythonpath(root)
        rewrite_architecture_test(root)
        rewrite_pyproject(root)
        rewrite_makefile(root)
        rewrite_hydra_job_name(root)
        rewrite_readme_layout(root)
        checks(root)
        isort(root, not a.no_ruff)
        git(root, "add", "-u")
    except Fail as e:
        print(f"move_to_src: error: {e}", file=sys.stderr)
        return 1
    print(f"move_to_src: {root}: moved (nothing committed)")
    for k, v in COUNTS.items():
        print(f"  {k}: {v}")
    if NOTES:
        print("look at:")
        for n in NOTES:
            print(f"  - {n}")
    print("next: make install (editable reinstall), then ruff check . and the tests")
    return 0


if __name__ == "__main__":
    sys.exit(main())
