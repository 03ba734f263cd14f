"""Carry a long record's sweep from one machine to the next through git: its finished trials and
its study, never what a running trial was in the middle of.

A record like crossover_registry trains for more hours than one session lends, and a session's
machine may not keep anything outside the repository. `pack` writes the sweep's finished and
failed trials (every file their result lists, their plan and logs; no checkpoint, lock or W&B
folder) and its top-level records (optuna.db, protocol.json, fixed_overrides.json, the results
table) into one .tgz that is committed beside the record; `unpack` makes a sweep folder of it on
the next machine, and the sweep's own command then resumes there, training only the trials the
pack did not hold (a trial that was running starts again from step 0).

    python -m records.keep pack ~/records/crossover_registry docs/results/crossover_registry/carry/crossover_registry.tgz
    python -m records.keep unpack docs/results/crossover_registry/carry/crossover_registry.tgz ~/records/crossover_registry

Only trials trained with train.keep_weights=false are carried: a result that lists model.pt would
read as damaged where the weights were not carried. Such a trial, or a damaged one, is left out,
named in a warning and in the manifest's "not_carried", and trains again on the next machine.
What each side checks, so that nothing is lost or written over:
- pack reads every finished trial through TrialDir.damaged_result (the one check every reader
  makes) and carries only whole ones; it writes over an existing .tgz only when that is a pack
  of the same sweep whose finished trials the new one all holds (a pack of a sweep folder that
  has lost trials is refused, not written over the pack that still has them);
- unpack writes only into a folder of the sweep's own name that does not exist or is empty, and
  then reads every trial the manifest lists as finished through the same check.
"""

from __future__ import annotations

import argparse
import io
import json
import sqlite3
import sys
import tarfile
import tempfile
import time
from contextlib import closing
from pathlib import Path

from smallinit.core import provenance
from smallinit.core.errors import ConfigError
from smallinit.core.files import atomic_write
from smallinit.core.trial_dir import TRIALS_FOLDER, TrialDir
from smallinit.core.trial_files import WEIGHTS, kept

MANIFEST = "keep.json"  # inside the .tgz only; never written into the sweep folder
TRIAL_RECORDS = ("result.json", "failure.json", "placement.json", "trial.log")
# Top-level files a sweep driver holds only while it runs, or SQLite's own (the study is carried
# as one consistent copy).
NOT_CARRIED = {"driver.lock"}
NOT_CARRIED_SUFFIXES = ("-journal", "-wal", "-shm")


def _finished(folder: TrialDir) -> tuple[str, str | None]:
    """('finished' | 'failed' | 'running', why it cannot be carried or None)."""
    if folder.result_json.exists():
        why = folder.damaged_result()
        if why is None and WEIGHTS in (folder.read_result() or {}).get("files", {}):
            why = f"its result lists {WEIGHTS}: trained with train.keep_weights=true, it cannot be carried without its weights"
        return "finished", why
    if folder.failure_json.exists():
        return "failed", None
    return "running", None


def _trial_files(folder: TrialDir) -> list[str]:
    names = [n for n in (*kept(folder.path), *TRIAL_RECORDS) if (folder.path / n).is_file()]
    return sorted(set(names))


def plan(sweep: Path) -> dict:
    """What a pack of `sweep` holds: {"top": [...], "trials": {id: [files]}, "finished", "failed",
    "left": [running ids], "not_carried": {id: why}}. A finished trial that cannot be carried
    (damaged, or its weights listed) is left out and named, never the reason to carry nothing.
    Raises ConfigError for a folder that is not a sweep."""
    trials_root = sweep / TRIALS_FOLDER
    if not sweep.is_dir() or not (trials_root.is_dir() or (sweep / "optuna.db").is_file()):
        raise ConfigError(f"SWEEP={sweep} is invalid: not a sweep folder (no {TRIALS_FOLDER}/ or optuna.db)")
    top = sorted(p.name for p in sweep.iterdir()
                 if p.is_file() and p.name not in NOT_CARRIED and not p.name.endswith(NOT_CARRIED_SUFFIXES)
                 and not p.name.startswith("."))
    out: dict = {"top": top, "trials": {}, "finished": [], "failed": [], "left": [], "not_carried": {}}
    for path in sorted(trials_root.iterdir()) if trials_root.is_dir() else []:
        if not path.is_dir():
            continue
        folder = TrialDir(path)
        state, why = _finished(folder)
        if why is not None:
            out["not_carried"][path.name] = why
            continue
        if state == "running":
            out["left"].append(path.name)
            continue
        out[state].append(path.name)
        out["trials"][path.name] = _trial_files(folder)
    return out


def _read_manifest(pack: Path) -> dict:
    try:
        with tarfile.open(pack, "r:gz") as tar:
            member = tar.extractfile(MANIFEST)
            manifest = json.loads(member.read()) if member else None
    except (OSError, tarfile.TarError, KeyError, ValueError) as e:
        raise ConfigError(f"PACK={pack} is invalid: not a pack written by records.keep ({e})") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("sweep"), str) \
            or not all(isinstance(manifest.get(k), list) for k in ("finished", "failed", "left")):
        raise ConfigError(f"PACK={pack} is invalid: not a pack written by records.keep (its {MANIFEST} lacks the sweep "
                          "or its trial lists)")
    return manifest


def pack(sweep: Path, out: Path) -> dict:
    """Write `sweep`'s carryable records to `out` (.tgz); returns the manifest, with "unchanged"
    True where `out` already held the same finished and failed trials (then nothing is written:
    a running sweep's study changes every step, and a pack per unchanged state would only churn git)."""
    sweep = sweep.resolve()
    what = plan(sweep)
    before = None
    if out.exists():
        before = _read_manifest(out)
        if before["sweep"] != sweep.name:
            raise ConfigError(f"OUT={out} is invalid: it is the pack of sweep {before['sweep']!r}, not {sweep.name!r}; "
                              "give another file (nothing was written)")
        lost = sorted(set(before.get("finished", [])) - set(what["finished"]))
        if lost:
            raise ConfigError(f"OUT={out} is invalid: it holds {len(lost)} finished trial(s) that {sweep} lacks "
                              f"({', '.join(lost[:4])}{', ...' if len(lost) > 4 else ''}); unpack it into a new folder "
                              "first (nothing was written)")
        if (sorted(before.get("finished", [])), sorted(before.get("failed", []))) == (sorted(what["finished"]),
                                                                                    sorted(what["failed"])):
            return {**before, "unchanged": True}
    made_by = provenance.record()
    manifest = {"sweep": sweep.name, "packed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "commit": made_by["commit"], "dirty": made_by["dirty"], "machine": made_by["machine"],
                "finished": what["finished"], "failed": what["failed"], "left": what["left"],
                "not_carried": what["not_carried"]}

    def add(tar: tarfile.TarFile, path: Path, name: str) -> None:
        if path.suffix == ".db":  # the driver may be writing the study: carry a consistent copy
            with tempfile.TemporaryDirectory() as tmp:
                copy = Path(tmp) / path.name
                with closing(sqlite3.connect(path)) as src, closing(sqlite3.connect(copy)) as dst:
                    src.backup(dst)
                info = tar.gettarinfo(str(copy), arcname=name)
                info.mtime = int(path.stat().st_mtime)
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                with open(copy, "rb") as f:
                    tar.addfile(info, f)
            return
        info = tar.gettarinfo(str(path), arcname=name)
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        with open(path, "rb") as f:
            tar.addfile(info, f)

    def write(f) -> None:
        with tarfile.open(fileobj=f, mode="w:gz") as tar:
            blob = (json.dumps(manifest, indent=1) + "\n").encode()
            info = tarfile.TarInfo(MANIFEST)
            info.size, info.mtime = len(blob), int(time.time())
            tar.addfile(info, io.BytesIO(blob))
            for name in what["top"]:
                add(tar, sweep / name, name)
            for identity, files in what["trials"].items():
                for name in files:
                    add(tar, sweep / TRIALS_FOLDER / identity / name, f"{TRIALS_FOLDER}/{identity}/{name}")

    atomic_write(out, write)
    return manifest


def _safe(name: str) -> bool:
    parts = Path(name).parts
    return bool(parts) and not Path(name).is_absolute() and ".." not in parts


def unpack(pack_path: Path, sweep: Path) -> dict:
    """Make the sweep folder `sweep` from `pack_path`; returns the manifest."""
    manifest = _read_manifest(pack_path)
    if Path(sweep).name != manifest["sweep"]:  # the sweep's own name: its study and trials are named by it
        raise ConfigError(f"SWEEP={sweep} is invalid: the pack holds sweep {manifest['sweep']!r}; unpack it into a folder "
                          f"of that name (nothing was written)")
    if sweep.exists() and (not sweep.is_dir() or any(sweep.iterdir())):
        raise ConfigError(f"SWEEP={sweep} is invalid: it exists and is not empty; resume the sweep there as it is, "
                          "or give a new folder (nothing was written)")
    with tarfile.open(pack_path, "r:gz") as tar:
        members = [m for m in tar.getmembers() if m.name != MANIFEST]
        unsafe = [m.name for m in members if not (m.isfile() and _safe(m.name))]
        if unsafe:
            raise ConfigError(f"PACK={pack_path} is invalid: it holds {unsafe[0]!r}, not a plain file inside the sweep "
                              "(nothing was written)")
        sweep.mkdir(parents=True, exist_ok=True)
        # Every member was checked above to be a plain file inside the sweep; the "data" filter
        # (Python 3.11.4+) checks it again where the interpreter has it.
        extra = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(sweep, members=members, **extra)
    damaged = {}
    for i in manifest["finished"]:
        folder = TrialDir(sweep / TRIALS_FOLDER / i)
        why = folder.damaged_result() if folder.result_json.is_file() else "its result.json is not in the pack"
        if why:
            damaged[i] = why
    if damaged:
        raise ConfigError(f"PACK={pack_path} unpacked into {sweep}, but {len(damaged)} finished trial(s) read as damaged "
                          f"({next(iter(damaged.items()))}); the sweep would train them again")
    return manifest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack", help="write a sweep folder's finished trials and study into a .tgz")
    p.add_argument("sweep", type=Path)
    p.add_argument("out", type=Path)
    u = sub.add_parser("unpack", help="make a new sweep folder from a pack")
    u.add_argument("pack", type=Path)
    u.add_argument("sweep", type=Path)
    args = ap.parse_args(argv)
    try:
        if args.command == "pack":
            m = pack(args.sweep, args.out)
            if m.get("unchanged"):
                print(f"{args.out}: {m['sweep']}: unchanged ({len(m['finished'])} finished, {len(m['failed'])} failed, "
                      f"packed {m['packed_at']}); not written again")
            else:
                print(f"{args.out}: {m['sweep']}: {len(m['finished'])} finished, {len(m['failed'])} failed; "
                      f"{len(m['left'])} running or waiting left out ({args.out.stat().st_size:,} bytes)")
            for identity, why in m.get("not_carried", {}).items():
                print(f"warning: {identity} finished but is not carried: {why}", file=sys.stderr)
        else:
            m = unpack(args.pack, args.sweep)
            print(f"{args.sweep}: {len(m['finished'])} finished and {len(m['failed'])} failed trial(s) of {m['sweep']} "
                  f"(packed {m['packed_at']} at {m['commit'] and m['commit'][:7]}); its sweep command resumes there")
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
