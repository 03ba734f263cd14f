"""No command writes over a file it did not write: the rule every output of ours follows.

A folder a command writes its outputs into (a report, a record under docs/results/, the bench
record) keeps `.written.json`: for each file a smallinit command wrote there, the command and
the file's sha256. Before a command writes any of its files, every one is checked:
- not there: written;
- there, listed, and unchanged since it was written: written over (the command's own output,
  or another of ours that made the same file: a record is rebuilt by whichever tool owns it);
- there but not listed (a user's file, or one from before this rule), or listed but changed
  since (an edit): refused, in one line naming the file, before any file is written.
`adopt=True` (a command's --overwrite) takes such files over and lists them from then on.

Each file is written atomically (core/files.py). The list is written twice: before the files,
naming each one's coming sha256 as `pending`, and after them: a kill between leaves each file
either as it was or as this command wrote it, and the list knows both as ours.
Exports (trainer/export.py) and carried sweeps (records/keep.py) keep their own marker, which
also names the trial or sweep they hold. One page is written by hand and by a command together:
docs/benchmarks.md, whose `<!-- bench.doc: NAME -->` blocks `python -m smallinit.bench.doc`
regenerates from bench/results.json and nothing else (its --check holds the page to them).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from .errors import ConfigError
from .files import atomic_write, atomic_write_json

LIST = ".written.json"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _listed(folder: Path) -> dict[str, dict]:
    path = folder / LIST
    if not path.exists():
        return {}
    try:
        listed = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path} is unreadable ({e}): move it aside; the files it listed are then refused "
                          "until a command is given --overwrite") from None
    return listed if isinstance(listed, dict) else {}


def blocked(folder: Path, names: list[str]) -> dict[str, str]:
    """{name: why it may not be written over} for each of `names` in `folder`."""
    listed = _listed(folder)
    out = {}
    for name in names:
        path = folder / name
        if not path.exists():
            continue
        entry = listed.get(name)
        if not isinstance(entry, dict):
            out[name] = "not written by a smallinit command"
        elif _sha256(path.read_bytes()) not in (entry.get("sha256"), entry.get("pending")):
            out[name] = f"changed since {entry.get('by', 'a smallinit command')} wrote it"
    return out


def check(folder: Path, names: list[str], adopt: bool = False) -> None:
    """Refuse (ConfigError) when any of `names` may not be written over in folder, unless `adopt`:
    a command that writes several files checks them all before it writes the first."""
    refused = {} if adopt else blocked(Path(folder), names)
    if refused:
        shown = "; ".join(f"{n}: {why}" for n, why in sorted(refused.items())[:4])
        more = f" and {len(refused) - 4} more" if len(refused) > 4 else ""
        raise ConfigError(f"{folder} holds files this command may not write over ({shown}{more}); move them, give "
                          "another folder, or --overwrite to replace them (nothing was written)")


def write_outputs(folder: Path, files: dict[str, str | bytes], by: str, adopt: bool = False) -> list[Path]:
    """Write `files` ({name relative to folder: text or bytes}) into folder as command `by`;
    refuses (ConfigError, nothing written) a file it may not write over unless `adopt`."""
    folder = Path(folder)
    data = {name: body.encode() if isinstance(body, str) else body for name, body in files.items()}
    check(folder, list(data), adopt)
    listed = _listed(folder)
    digests = {name: _sha256(body) for name, body in data.items()}
    # The list names each file's coming sha256 first, as pending: a kill (or a full disk) between
    # the files and the final list leaves a file the list still knows as ours, not one "changed".
    pending = {name: {k: v for k, v in (listed.get(name) or {}).items() if k == "sha256"} | {"by": by, "pending": d}
               for name, d in digests.items()}
    atomic_write_json(folder / LIST, dict(sorted({**listed, **pending}.items())))
    paths = []
    for name, body in data.items():
        path = folder / name
        atomic_write(path, lambda f, body=body: f.write(body))
        listed[name] = {"by": by, "sha256": digests[name]}
        paths.append(path)
    atomic_write_json(folder / LIST, dict(sorted(listed.items())))
    return paths


def require_own(folder: Path, adopt: bool = False) -> None:
    """Refuse (ConfigError, before any write) a folder holding any file not written by us or
    changed since: for a command that owns its whole output folder (a report) and may write a
    different set of files on each run."""
    folder = Path(folder)
    if folder.is_dir():
        check(folder, [str(p.relative_to(folder)) for p in sorted(folder.rglob("*")) if p.is_file() and p.name != LIST],
              adopt)
