"""One-line errors for what Hydra itself rejects: unknown options, and the keys and types the
schema (sweeper/config/schema.py) does not allow, from an override or a conf file.

Hydra reports these as multi-line messages from inside its own main. sweep.py calls
`precheck(argv)` first: it composes the config once with every override (a sweep's first
value standing in for the sweep) and turns Hydra's exception into one line naming the key,
the value and what is allowed (`hydra_error`, which the sweeper uses for every grid point).
Value checks (gamma > 0, ...) stay with the typed configs. A sweep given without `-m`, which
Hydra answers with its multi-line "Ambiguous value", is one line showing the `-m` form.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import IntervalSweep
from hydra.errors import HydraException, MissingConfigException, OverrideParseException
from omegaconf import DictConfig
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

from smallinit.core.errors import ConfigError, first_line, require

from . import schema

# Flags that take a value or change what is composed: leave those command lines to Hydra.
_HYDRA_FLAGS = ("-cn", "--config-name", "-cp", "--config-path", "-cd", "--config-dir", "--info", "-i",
                "--cfg", "-c", "--help", "-h", "--hydra-help", "--shell-completion", "-sc", "--experimental-rerun")


# `name` names the sweep folder (sweeps/<name>), the study and the W&B group: one folder name,
# so it can neither leave sweeps/ (../x) nor mean another thing to SQLite's URL or W&B (:#?).
NAME_MAX = 100
_NAME = re.compile(rf"[A-Za-z0-9_=,+-][A-Za-z0-9._=,+-]{{0,{NAME_MAX - 1}}}")


def check_name(name: object) -> None:
    text = str(name) if isinstance(name, int | float) and not isinstance(name, bool) else name  # name=2024
    require(isinstance(text, str) and _NAME.fullmatch(text) is not None, "name", name,
            f"must be one folder name: 1-{NAME_MAX} letters, digits and - _ . = , + (not starting with .)")


GRAMMAR = "expected key=value, key=a,b,c, range(start,stop[,step]), interval(low,high) or tag(log,interval(low,high))"


def _stand_in(line: str, parser: OverridesParser) -> str:
    """The override with a sweep replaced by one of its values."""
    try:
        (override,) = parser.parse_overrides([line])
    except OverrideParseException as e:
        raise ConfigError(f"{line} is invalid: {first_line(e)} ({GRAMMAR})") from None
    if not override.is_sweep_override():
        return line
    key = override.get_key_element()
    value = override.value()
    if isinstance(value, IntervalSweep):
        return f"{key}={value.start}"
    first = next(iter(override.sweep_string_iterator()), None)
    if first is None:
        raise ConfigError(f"{line} is invalid: the sweep of {override.get_key_element()} has no values")
    return f"{key}={first}"


def hydra_error(e: BaseException, overrides: list[str]) -> str:
    """One line for what Hydra refused while composing with these overrides: the key, the value
    and what is allowed (the options of a group, the keys of a section, the type of a value)."""
    if isinstance(e, MissingConfigException) and e.options is not None:
        group = (e.missing_cfg_file or "").rsplit("/", 1)[0]
        given = _given(group, overrides) or group
        options = sorted(o for o in e.options if not o.startswith("_"))  # _base etc. are internal
        return f"{given} is invalid: one of {options}"
    cause = e.__cause__ or e.__context__  # an override's error, or a conf file's (raised in an except)
    if isinstance(cause, ConfigKeyError | ConfigAttributeError) and cause.full_key:
        key = cause.full_key
        parent = key.rsplit(".", 1)[0] if "." in key else "the root config"
        known = schema.known_keys(cause.object_type)
        return (f"{_given(key, overrides) or key} is invalid: {parent} has no key {key.rsplit('.', 1)[-1]!r} "
                + (f"(one of {known})" if known else "(check the spelling)"))
    if isinstance(cause, ValidationError):  # a value of the wrong type
        # An element of a list given on the command line is reported without its list's key.
        merging = re.match(r"Error merging override (\S+)", str(e))
        key = merging.group(1).split("=", 1)[0].lstrip("+~") if merging else re.sub(r"\[\d+\]$", "", cause.full_key or "")
        if key:
            what = schema.allowed(key, cause.object_type if key == cause.full_key else None)
            return f"{_given(key, overrides) or f'{key}={cause.value!r}'} is invalid: " + (
                f"must be {what}" if what else first_line(cause))
    return first_line(e)


def _given(key: str, overrides: list[str]) -> str | None:
    """The last override of key, as the user wrote it."""
    return next((o for o in reversed(overrides) if o.split("=", 1)[0].lstrip("+~") == key), None)


def _refuse_new_keys(lines: list[str], conf_dir: Path) -> None:
    """`+key=value` adds a key Hydra's config does not have. For a config group (+experiment=...)
    that is how it is chosen; anywhere else nothing reads the key, and a sweep over it would run
    the same trial twice under one identity."""
    groups = sorted(p.name for p in conf_dir.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))
    for line in lines:
        if not line.startswith("+"):
            continue
        key = line.split("=", 1)[0].lstrip("+")
        if key.split("/", 1)[0] not in groups:
            raise ConfigError(f"{line} is invalid: {key} is not a smallinit setting, so nothing would read it "
                              "(+ adds a config group, as in +experiment=gate; set existing keys without +)")


def _sweep_needs_m(argv: list[str], lines: list[str], parser: OverridesParser, show: bool) -> None:
    """`init.gamma=0.5,1.0` without -m: one line with the command as it should read."""
    if "-m" in argv or "--multirun" in argv:
        return
    for line in lines:
        (override,) = parser.parse_overrides([line])
        if override.is_sweep_override():
            command = shlex.join(["python", "sweep.py", *(["--show"] if show else []), "-m", *argv])
            raise ConfigError(f"{line} is a sweep: run it with -m, e.g. {command}")


def precheck(argv: list[str], conf_dir: Path, config_name: str = "config", show: bool = False) -> DictConfig | None:
    """Raise ConfigError with one line if Hydra would reject these command-line overrides
    (argv without --show; show: it was given, for the command a sweep without -m is told).
    Returns the config composed (a sweep's first values standing in), None where Hydra's own
    flags leave the command to Hydra."""
    if any(a.split("=", 1)[0] in _HYDRA_FLAGS for a in argv):
        return None
    lines = [a for a in argv if not a.startswith("-")]
    _refuse_new_keys(lines, conf_dir)
    parser = OverridesParser.create()
    stand_ins = [_stand_in(line, parser) for line in lines]
    try:
        with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
            cfg = compose(config_name, overrides=stand_ins)
    except (HydraException, ConfigKeyError) as e:
        raise ConfigError(hydra_error(e, lines)) from None
    check_name(cfg.get("name"))
    _sweep_needs_m(argv, lines, parser, show)
    return cfg
