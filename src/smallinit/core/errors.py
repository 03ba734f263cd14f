"""Errors a user reads: one line that names the key, the value and what is allowed."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A configuration value is out of range; the message names key, value and what is allowed."""


def require(ok: bool, key: str, value: Any, allowed: str) -> None:
    """Raise ConfigError("key=value is invalid: allowed") unless ok."""
    if not ok:
        raise ConfigError(f"{key}={value!r} is invalid: {allowed}")


def first_line(e: BaseException | str) -> str:
    """The first line of an exception's message (its type name when the message is empty)."""
    text = str(e).strip()
    if text:
        return text.splitlines()[0]
    return type(e).__name__ if isinstance(e, BaseException) else ""


def shown(path: Path) -> str:
    """path relative to the working directory when it is below it, as a user typed it."""
    rel = os.path.relpath(path)
    return Path(path).as_posix() if rel.startswith("..") else rel
