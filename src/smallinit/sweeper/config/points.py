"""A grid point's config without a Hydra compose per point.

Hydra composes in two phases: the defaults list (config groups, `+`/`++`/`~` edits, hydra.*)
builds the config, then each plain `key=value` override is set on it with `OmegaConf.update`.
A grid differs mostly in those values, and a full compose takes tenths of a second, so the
first phase runs once per distinct set of structure overrides and a point is that config, as a
plain dict, with its values set (well under a millisecond). Each (structure, key, value) is first set on the
composed DictConfig, which checks and converts it as Hydra would, and the converted value is
what the point gets. Whatever this path cannot reproduce exactly (a value Hydra refuses, a
mapping merged into a node, an interpolation other than `${key}`) takes Hydra's full compose,
so a refused value gets Hydra's own error.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf, open_dict

from smallinit.core.errors import ConfigError, first_line

from .precheck import hydra_error

_SIMPLE = re.compile(r"\$\{([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)\}")  # ${seed}, ${train.seed}: a plain lookup
_MISSING = object()
_VALUE, _GROUP, _EDIT = "value", "group", "edit"  # how Hydra applies an override (see _kind)


@dataclass
class _Structure:
    """A composed config: its job part as an unresolved plain dict, the pristine DictConfig and
    a working copy that checks values, and its `${key}` interpolations (path, key)."""

    plain: dict | None = None  # None: every point of this structure takes the full compose
    job: DictConfig | None = None
    work: DictConfig | None = None
    sites: list[tuple[str, str]] = field(default_factory=list)
    values: dict[str, tuple[list[str], Any] | None] = field(default_factory=dict)


class PointComposer:
    """overrides -> the job config (without `hydra`) as a plain dict, resolved or not.

    `full(overrides)` is Hydra's compose with the hydra node (the sweeper's loader, or
    hydra.compose); `group_exists(path)` is its config repository's."""

    def __init__(self, full: Callable[[list[str]], DictConfig], group_exists: Callable[[str], bool]):
        self._full, self._group_exists = full, group_exists
        self._parser = OverridesParser.create()
        self._kinds: dict[str, tuple[str, str, Override | None]] = {}  # line -> (kind, key, parsed)
        self._structures: dict[tuple[str, ...], _Structure] = {}

    def job(self, overrides: list[str], resolve: bool = True) -> dict:
        """A fresh dict, the caller's to change. Raises ConfigError with one line for what Hydra
        refuses or cannot resolve."""
        fast = self._fast(overrides, resolve)
        if fast is not None:
            return fast
        resolved, plain = _containers(self._compose(overrides))
        return resolved if resolve else plain

    def _compose(self, overrides: list[str]) -> DictConfig:
        """Hydra's full compose: the job part, as every point took before."""
        try:
            cfg = self._full(overrides)
        except HydraException as e:
            raise ConfigError(hydra_error(e, overrides)) from None
        HydraConfig.instance().set_config(cfg)  # lets ${hydra:...} resolve on the driver
        with open_dict(cfg):
            return OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])

    def _fast(self, overrides: list[str], resolve: bool) -> dict | None:
        split = self._split(overrides)
        if split is None:
            return None
        structure, values = split
        s = self._structures.get(structure)
        if s is None:
            s = self._structures[structure] = self._structure(list(structure))
        if s.plain is None:
            return None
        point = _copy(s.plain)
        for line, override in values:
            if line not in s.values:
                s.values[line] = self._check(s, override)
            checked = s.values[line]
            if checked is None or not _set(point, *checked):
                return None
        return point if not resolve or _resolve(point, s.sites) else None

    def _split(self, overrides: list[str]) -> tuple[tuple[str, ...], list[tuple[str, Override]]] | None:
        """(structure overrides, value overrides). Hydra applies the values and the edits (+key,
        ~key, ...) in command-line order after the groups; composing the edits first changes
        nothing unless a value is under an edited key, or under another value: then None."""
        structure, values, edited = [], [], []
        for line in overrides:
            if line not in self._kinds:
                self._kinds[line] = self._kind(line)
            kind, key, override = self._kinds[line]
            if kind == _VALUE:
                values.append((line, override))
            else:
                structure.append(line)
                edited += [key] if kind == _EDIT else []
        keys = [o.key_or_group for _, o in values]
        if any(_nested(k, e) for k in keys for e in edited) or \
                any(_nested(a, b) and a != b for i, a in enumerate(keys) for b in keys[i + 1:]):
            return None
        return tuple(structure), values

    def _kind(self, line: str) -> tuple[str, str, Override | None]:
        """_VALUE: a plain key=value Hydra sets with OmegaConf.update; _GROUP: a config group
        choice (composed from the defaults list); _EDIT: anything else, composed with the groups."""
        try:
            (o,) = self._parser.parse_overrides([line])
        except Exception:
            return _EDIT, line, None  # the full compose reports it
        key = o.key_or_group
        if o.package is None and not o.is_add() and not o.is_force_add() and self._group_exists(key) \
                and not isinstance(o.value(), dict):
            return _GROUP, key, None
        if (o.is_sweep_override() or o.package is not None or o.is_add() or o.is_force_add() or o.is_delete()
                or key == "hydra" or key.startswith("hydra.") or "${" in line or isinstance(o.value(), dict)
                or o.value() == "???"):
            return _EDIT, key, None  # a mapping merges into its node; an interpolation is resolved later
        return _VALUE, key, o

    def _structure(self, overrides: list[str]) -> _Structure:
        try:
            job = self._compose(overrides)
            resolved, plain = _containers(job)
        except ConfigError:
            return _Structure()  # the full compose of each point reports it
        sites = []
        for path, text in _strings(plain):
            if "${" in text:
                match = _SIMPLE.fullmatch(text)
                if match is None:
                    return _Structure()  # a resolver, a relative or nested interpolation: OmegaConf's
                sites.append((path, match.group(1)))
        mine = copy.deepcopy(plain)
        if not _resolve(mine, sites) or not _same(mine, resolved):  # a target converted its value
            return _Structure()
        OmegaConf.set_struct(job, True)  # as Hydra applies overrides: unknown keys are refused
        return _Structure(plain=plain, job=job, work=copy.deepcopy(job), sites=sites)

    def _check(self, s: _Structure, o: Override) -> tuple[list[str], Any] | None:
        """(path, the value as the config stores it) after Hydra's own update, or None where it
        raises or an interpolation of the key would not read the value back unchanged."""
        key, work = o.key_or_group, s.work
        parts = key.split(".")
        old = _get(s.plain, parts)
        if old is _MISSING:
            return None
        try:
            OmegaConf.update(work, key, o.value(), merge=True)
            stored = _plain(OmegaConf.select(work, key), resolve=False)
            ok = all(_same(_plain(OmegaConf.select(work, site)), _plain(OmegaConf.select(work, ref)))
                     for site, ref in s.sites if _is_interpolation(work, site))
            OmegaConf.update(work, key, old, merge=True)
        except Exception:
            s.work = copy.deepcopy(s.job)  # a failed update may have left the working copy half-set
            return None
        return (parts, stored) if ok else None


def _containers(job: DictConfig) -> tuple[dict, dict]:
    """(resolved, unresolved) plain dicts of a composed job config."""
    try:
        resolved = OmegaConf.to_container(job, resolve=True)
    except Exception as e:
        raise ConfigError(first_line(e)) from None
    return resolved, OmegaConf.to_container(job)


def _copy(node: Any) -> Any:
    """A copy of a plain config (dicts, lists, immutable leaves), made twice per grid point:
    under half of copy.deepcopy's time, which keeps a memo and dispatches on every leaf."""
    if isinstance(node, dict):
        return {k: _copy(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_copy(v) for v in node]
    return node


def _nested(a: str, b: str) -> bool:
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


def _get(d: Any, parts: list[str]) -> Any:
    for p in parts:
        if isinstance(d, dict) and p in d:
            d = d[p]
        elif isinstance(d, list) and p.isdigit() and int(p) < len(d):
            d = d[int(p)]
        else:
            return _MISSING
    return d


def _set(d: dict, parts: list[str], value: Any) -> bool:
    parent = _get(d, parts[:-1])
    if isinstance(parent, dict) and parts[-1] in parent:
        parent[parts[-1]] = _copy(value)
        return True
    if isinstance(parent, list) and parts[-1].isdigit() and int(parts[-1]) < len(parent):
        parent[int(parts[-1])] = _copy(value)
        return True
    return False


def _strings(node: Any, path: str = ""):
    """(dotted path, text) of every string in a plain config."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for k, v in items:
        sub = f"{path}.{k}" if path else str(k)
        if isinstance(v, str):
            yield sub, v
        else:
            yield from _strings(v, sub)


def _resolve(d: dict, sites: list[tuple[str, str]]) -> bool:
    """Resolve the `${key}` sites in place, as OmegaConf would; False where one cannot be. A
    site a value override replaced is no longer an interpolation and stays as set."""
    for path, _ in sites:
        parts = path.split(".")
        value = _get(d, parts)
        if isinstance(value, str) and "${" in value:
            value = _interpolated(d, value)
            if value is _MISSING or not _set(d, parts, value):
                return False
    return True


def _interpolated(d: dict, text: str, depth: int = 0) -> Any:
    """The value `${key}` refers to, resolved; _MISSING where OmegaConf would fail or give a node."""
    match = _SIMPLE.fullmatch(text)
    if match is None or depth > 16:
        return _MISSING
    target = _get(d, match.group(1).split("."))
    if isinstance(target, str) and "${" in target:
        return _interpolated(d, target, depth + 1)
    return _MISSING if isinstance(target, dict | list) or target in (_MISSING, "???") else target


def _is_interpolation(cfg: DictConfig, path: str) -> bool:
    parent, _, leaf = path.rpartition(".")
    node = OmegaConf.select(cfg, parent) if parent else cfg
    return OmegaConf.is_interpolation(node, int(leaf) if leaf.isdigit() else leaf)


def _plain(value: Any, resolve: bool = True) -> Any:
    return OmegaConf.to_container(value, resolve=resolve) if OmegaConf.is_config(value) else value


def _same(a: Any, b: Any) -> bool:
    """Equal and of the same types throughout (1 and 1.0 give different identities)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b
