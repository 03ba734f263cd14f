"""The floors: which package may import which (README "Layout"). A new import that goes up a
floor, or a private name taken from another package, fails here rather than in review."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"  # src/smallinit/<package>, and src/hydra_plugins

# package -> the packages it may import (besides itself). core is the ground floor; experiments
# reads what the sweeper wrote through core's schema, so it needs neither trainer nor sweeper.
ALLOWED = {
    "core": set(),
    "model": {"core"},
    "trainer": {"core", "model"},
    "sweeper": {"core", "model", "trainer"},
    "experiments": {"core", "model"},
    "bench": {"core", "model", "trainer", "sweeper"},
    "hydra_plugins": {"core", "sweeper"},
}


def _home(package: str) -> Path:
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


@pytest.mark.parametrize("package", list(ALLOWED))
def test_imports_go_down_the_floors(package):
    ours = set(ALLOWED)
    wrong = [f"{p.relative_to(REPO)}:{line} imports {top}"
             for p, line, top, _ in _imports(package)
             if top in ours and top != package and top not in ALLOWED[package]]
    assert not wrong, f"{package} may import only {sorted(ALLOWED[package])}:\n" + "\n".join(wrong)


@pytest.mark.parametrize("package", list(ALLOWED))
def test_no_private_name_crosses_packages(package):
    wrong = [f"{p.relative_to(REPO)}:{line} takes {n} from {top}"
             for p, line, top, names in _imports(package)
             if top in ALLOWED and top != package
             for n in names if n.startswith("_") and not n.startswith("__")]
    assert not wrong, "\n".join(wrong)


def test_the_walker_sees_lazy_and_private_imports(tmp_path):
    # The walker sees a lazy, upward import; without this the tests above could pass vacuously.
    pkg = tmp_path / "model"
    pkg.mkdir()
    (pkg / "x.py").write_text("def f():\n    from smallinit.sweeper.driver import _private\n")
    found = list(_imports("model", tmp_path))
    assert [(top, names) for _, _, top, names in found] == [("sweeper", ["_private"])]


def _module_deps(root: Path = REPO) -> dict[str, set[str]]:
    """module -> the modules of ours it imports when it runs (lazy imports included; imports
    under `if TYPE_CHECKING:` left out: they never run)."""
    deps: dict[str, set[str]] = {}
    for package in ALLOWED:
        for path in sorted((root / package).rglob("*.py")):
            name = ".".join(path.relative_to(root).with_suffix("").parts)
            tree = ast.parse(path.read_text(), str(path))
            typing_only = {id(n) for node in ast.walk(tree)
                           if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
                           for n in ast.walk(node)}
            found = set()
            for node in ast.walk(tree):
                if not isinstance(node, ast.ImportFrom) or id(node) in typing_only:
                    continue
                base = name.split(".")[:len(name.split(".")) - node.level] if node.level else []
                module = ".".join([*base, *(node.module.split(".") if node.module else [])])
                found |= {module} | {f"{module}.{a.name}" for a in node.names}
            deps[name] = found
    return {m: {d for d in ds if d in deps and d != m} for m, ds in deps.items()}


def test_no_two_modules_import_each_other():
    """A circle means neither module can be read, or moved, without the other."""
    deps = _module_deps()
    circles = sorted({tuple(sorted((a, b))) for a, ds in deps.items() for b in ds if a in deps[b]})
    assert not circles, circles
