"""The floors: which package may import which (README "Layout"), and inside a package split into
folders (experiments/, sweeper/) which folder may import which. A new import that goes up a floor,
or a private name taken from another package, fails here rather than in review.

The floors are declared in one place each: the packages' in ALLOWED below, the folders' on the
`May import:` line of each folder's __init__.py docstring (read here, so the docstring a reader
sees is the rule the test enforces)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"  # src/smallinit/<package>, and src/hydra_plugins

# package -> the packages it may import (besides itself). core is the ground floor; experiments
# reads what the sweeper wrote through core's schema, so it needs neither trainer nor sweeper.
ALLOWED = {
    "core": set(),
    "model": {"core"},
    "data": {"core", "model"},
    "trainer": {"core", "model", "data"},
    "sweeper": {"core", "model", "data", "trainer"},
    "experiments": {"core", "model"},
    "bench": {"core", "model", "data", "trainer", "sweeper"},
    "hydra_plugins": {"core", "sweeper"},
}


def _home(package: str) -> Path:
    """The folder holding a package: src/smallinit/, or src/ for Hydra's hydra_plugins namespace."""
    return SRC if package == "hydra_plugins" else SRC / "smallinit"


def _top(module: str) -> str:
    """The package a module is in: smallinit.trainer.loop -> trainer (hydra_plugins.x -> hydra_plugins)."""
    parts = module.split(".")
    return parts[1] if parts[0] == "smallinit" and len(parts) > 1 else parts[0]


def _module_name(path: Path, home: Path) -> str:
    """src/smallinit/experiments/stats/paired.py -> smallinit.experiments.stats.paired (an
    __init__.py names its package)."""
    parts = path.relative_to(home).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(node: ast.ImportFrom | ast.Import, module: str, is_init: bool) -> list[tuple[str, list[str]]]:
    """(module imported, names taken from it) of one import statement; a relative import resolved
    against the importing module."""
    if isinstance(node, ast.Import):
        return [(a.name, []) for a in node.names]
    if node.level:
        base = module.split(".")
        base = base[:len(base) - node.level + (1 if is_init else 0)]
        return [(".".join([*base, *([node.module] if node.module else [])]), [a.name for a in node.names])]
    return [(node.module, [a.name for a in node.names])] if node.module else []


def _imports(package: str, root: Path | None = None):
    """(file, line, imported top-level package, imported names, imported module) for every import
    in package, those inside functions included (a lazy import is still a dependency)."""
    home = _home(package) if root is None else root
    for path in sorted((home / package).rglob("*.py")):
        module = _module_name(path, SRC if root is None else root)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for target, names in _imported(node, module, path.name == "__init__.py"):
                if target == "smallinit":
                    for n in names:  # from smallinit import trainer: the package by name
                        yield path, node.lineno, n, [], f"smallinit.{n}"
                else:
                    yield path, node.lineno, _top(target), names, target


@pytest.mark.parametrize("package", list(ALLOWED))
def test_imports_go_down_the_floors(package):
    ours = set(ALLOWED)
    wrong = [f"{p.relative_to(REPO)}:{line} imports {top}"
             for p, line, top, _, _ in _imports(package)
             if top in ours and top != package and top not in ALLOWED[package]]
    assert not wrong, f"{package} may import only {sorted(ALLOWED[package])}:\n" + "\n".join(wrong)


@pytest.mark.parametrize("package", list(ALLOWED))
def test_no_private_name_crosses_packages(package):
    wrong = [f"{p.relative_to(REPO)}:{line} takes {n} from {top}"
             for p, line, top, names, _ in _imports(package)
             if top in ALLOWED and top != package
             for n in names if n.startswith("_") and not n.startswith("__")]
    assert not wrong, "\n".join(wrong)


def test_the_walker_sees_lazy_and_private_imports(tmp_path):
    # The walker sees a lazy, upward import; without this the tests above could pass vacuously.
    pkg = tmp_path / "model"
    pkg.mkdir()
    (pkg / "x.py").write_text("def f():\n    from smallinit.sweeper.driver import _private\n")
    found = list(_imports("model", tmp_path))
    assert [(top, names) for _, _, top, names, _ in found] == [("sweeper", ["_private"])]


# ---------------------------------------------------------------- folders inside a package

MAX_MODULES = 12  # a folder past this is split by concern, as experiments/ and sweeper/ were
MAY_IMPORT = re.compile(r"^May import: (.+)$", re.M)


def _folders(package_dir: Path) -> dict[str, set[str]]:
    """folder -> the sibling folders its __init__.py docstring says it may import."""
    out = {}
    for init in sorted(package_dir.glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        m = MAY_IMPORT.search(doc)
        assert m, f"{init.relative_to(package_dir.parent)}: its docstring ends with no `May import: ...` line"
        said = m.group(1).strip()
        out[init.parent.name] = set() if said == "(none)" else {x.strip() for x in said.split(",")}
    return out


def _split_packages(root: Path | None = None) -> list[str]:
    """The packages split into folders: those with a sub-package (not hydra_plugins: each folder
    of Hydra's namespace is one plugin, not a floor)."""
    return [p for p in ALLOWED if p != "hydra_plugins"
            and any(((_home(p) if root is None else root) / p).glob("*/__init__.py"))]


def _folder_violations(package: str, root: Path | None = None) -> list[str]:
    """Imports from one folder of package into a sibling its `May import:` line does not name,
    or into the package's own modules (the driver's: they may import every folder, none imports
    them)."""
    home = _home(package) if root is None else root
    folders = _folders(home / package)
    prefix = f"smallinit.{package}." if root is None and package != "hydra_plugins" else f"{package}."
    wrong = []
    for path, line, _, names, target in _imports(package, root):
        rel = path.relative_to(home / package).parts
        if len(rel) == 1:
            continue  # a module of the package itself (driver.py, tuner.py): every folder is below it
        own = rel[0]
        if not (target + ".").startswith(prefix):
            continue
        parts = target[len(prefix):].split(".")
        # `from smallinit.sweeper import driver`: the package's own module by name
        hit = parts[0] if parts[0] else (names[0] if names else "")
        into = hit if hit in folders else ""
        if into == own or (into and into in folders[own]):
            continue
        what = f"folder {into}" if into else f"{package}'s own module {hit}"
        wrong.append(f"{path.relative_to(home)}:{line} ({own}) imports {target} ({what}); "
                     f"{own} may import {sorted(folders[own]) or 'none'}")
    return wrong


def test_packages_split_into_folders():
    # Without this the folder tests below could pass vacuously.
    assert {"experiments", "sweeper", "trainer", "bench"} <= set(_split_packages())


@pytest.mark.parametrize("package", _split_packages())
def test_folders_declare_siblings_that_exist_and_form_floors(package):
    folders = _folders(_home(package) / package)
    unknown = {f: sorted(d - set(folders)) for f, d in folders.items() if d - set(folders)}
    assert not unknown, f"{package}: `May import:` names folders that do not exist: {unknown}"
    # The declared graph has no cycle: take folders whose siblings are all placed, floor by floor.
    placed: set[str] = set()
    while len(placed) < len(folders):
        floor = {f for f, d in folders.items() if f not in placed and d <= placed}
        assert floor, f"{package}: the `May import:` lines form a cycle among {sorted(set(folders) - placed)}"
        placed |= floor


@pytest.mark.parametrize("package", _split_packages())
def test_folders_import_only_the_folders_they_declare(package):
    wrong = _folder_violations(package)
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("package", [p for p in ALLOWED if p != "hydra_plugins"])
def test_no_folder_holds_more_than_max_modules(package):
    big = {str(d.relative_to(SRC)): n for d in [_home(package) / package, *(_home(package) / package).glob("*/")]
           if d.is_dir() and (n := len([p for p in d.glob("*.py") if p.name != "__init__.py"])) > MAX_MODULES}
    assert not big, f"split these by concern (at most {MAX_MODULES} modules a folder): {big}"


def test_the_folder_walker_sees_relative_absolute_and_package_imports(tmp_path):
    pkg = tmp_path / "experiments"
    for folder, may in (("low", "(none)"), ("high", "low")):
        (pkg / folder).mkdir(parents=True)
        (pkg / folder / "__init__.py").write_text(f'"""{folder}.\n\nMay import: {may}\n"""\n')
    (pkg / "__init__.py").write_text("")
    (pkg / "top.py").write_text("from .high import h\n")  # the package's own module: anything
    (pkg / "high" / "h.py").write_text("from .h2 import x\nfrom experiments.low import l\n")
    (pkg / "low" / "l.py").write_text("def f():\n    from experiments.high.h import y\n"
                                      "    from experiments import top\n    from .. import high\n")
    wrong = _folder_violations("experiments", tmp_path)
    assert [w.split(" imports ")[1].split(";")[0] for w in wrong] == [
        "experiments.high.h (folder high)", "experiments (experiments's own module top)", "experiments (folder high)"]


# ---------------------------------------------------------------- records/, outside the package

RECORDS = REPO / "records"  # the repository's record builders: run from the root, never installed


def _records_may_import() -> set[str]:
    """The packages of ours records/ may import: the `May import:` line of its __init__.py."""
    doc = ast.get_docstring(ast.parse((RECORDS / "__init__.py").read_text())) or ""
    m = MAY_IMPORT.search(doc)
    assert m, "records/__init__.py: its docstring ends with no `May import: ...` line"
    return {x.strip() for x in m.group(1).split(",")}


def _records_imports(root: Path, home: Path):
    """(file, line, module imported, names taken) for every import under root naming `records`,
    lazy ones included (a relative import resolved against its module, as above)."""
    for path in sorted(root.rglob("*.py")):
        module = _module_name(path, home)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import | ast.ImportFrom):
                for target, names in _imported(node, module, path.name == "__init__.py"):
                    if target.split(".")[0] == "records":
                        yield path, node.lineno, target, names


def test_nothing_under_src_imports_records():
    """The installed package must run without the repository's records/, which it does not carry."""
    wrong = [f"{p.relative_to(REPO)}:{line} imports {target}" for p, line, target, _ in _records_imports(SRC, SRC)]
    assert not wrong, "records/ imports the library, never the reverse:\n" + "\n".join(wrong)


def test_the_records_walker_sees_lazy_and_plain_imports(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("import records.quoted\ndef f():\n    from records import results_doc\n")
    found = [(target, names) for _, _, target, names in _records_imports(tmp_path, tmp_path)]
    assert found == [("records.quoted", []), ("records", ["results_doc"])]


def test_records_import_only_the_library_and_no_private_name():
    may = _records_may_import()
    assert may <= set(ALLOWED), f"records/__init__.py names packages that do not exist: {sorted(may - set(ALLOWED))}"
    wrong = []
    for path in sorted(RECORDS.rglob("*.py")):
        module = _module_name(path, REPO)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for target, names in _imported(node, module, path.name == "__init__.py"):
                if target.split(".")[0] != "smallinit":
                    continue
                tops = names if target == "smallinit" else [_top(target)]
                where = f"{path.relative_to(REPO)}:{node.lineno}"
                wrong += [f"{where} imports {top}; records may import {sorted(may)}" for top in tops if top not in may]
                wrong += [f"{where} takes {n} from {target}" for n in names if n.startswith("_") and not n.startswith("__")]
    assert not wrong, "\n".join(wrong)


def test_the_package_build_finds_packages_under_src_only():
    """So a wheel carries smallinit and hydra_plugins, and never the top-level records/."""
    import tomllib

    find = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    assert find["where"] == ["src"] and not (SRC / "records").exists()
    assert not any(pattern.startswith("records") for pattern in find.get("include", []))


# ---------------------------------------------------------------- modules

def _module_deps(type_only: bool = False) -> dict[str, set[str]]:
    """module -> the modules of ours it imports when it runs (lazy imports included), and with
    `type_only` also those under `if TYPE_CHECKING:` (they never run, but a reader follows them)."""
    deps: dict[str, set[str]] = {}
    paths = [p for package in ALLOWED for p in sorted((_home(package) / package).rglob("*.py"))]
    for path in paths + sorted((SRC / "smallinit").glob("*.py")):  # and smallinit/cli.py, smallinit/__init__.py
        name = _module_name(path, SRC)
        tree = ast.parse(path.read_text(), str(path))
        typing_only = {id(n) for node in ast.walk(tree)
                       if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
                       for n in ast.walk(node)}
        found = set()
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom) or (id(node) in typing_only and not type_only):
                continue
            for module, names in _imported(node, name, path.name == "__init__.py"):
                found |= {module} | {f"{module}.{n}" for n in names}
        deps[name] = found
    return {m: {d for d in ds if d in deps and d != m} for m, ds in deps.items()}


def test_the_module_walker_sees_the_package():
    # _module_deps read REPO/<package> before the src layout, and found nothing.
    deps = _module_deps()
    assert "smallinit.experiments.stats.stats" in deps["smallinit.experiments.report.context"]
    assert "smallinit.experiments.stats.valnoise" in deps["smallinit.experiments.stats.stats"]


def _circles(deps: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of any length: strongly connected components of more than one module
    (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(m: str) -> None:
        index[m] = low[m] = len(index)
        stack.append(m)
        for d in sorted(deps.get(m, ())):
            if d not in index:
                visit(d)
                low[m] = min(low[m], low[d])
            elif d in stack:
                low[m] = min(low[m], index[d])
        if low[m] == index[m]:
            component = []
            while True:
                d = stack.pop()
                component.append(d)
                if d == m:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for m in sorted(deps):
        if m not in index:
            visit(m)
    return sorted(found)


def test_the_circle_finder_finds_circles_of_any_length():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


def test_no_modules_import_each_other_in_a_circle():
    """A circle means none of its modules can be read, or moved, without the others; one closed
    only by an `if TYPE_CHECKING:` import is a circle to its reader too."""
    deps = _module_deps(type_only=True)
    assert "smallinit.cli" in deps  # the top-level modules are walked too, and plain `import a.b` is an edge
    assert "smallinit.trainer.observer" in deps["smallinit.bench.trainer_bench"]
    assert not _circles(deps), _circles(deps)
