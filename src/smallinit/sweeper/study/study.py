"""The Optuna study that remembers a sweep: storage, trial identity, exactly-once recording.

Every trial of a sweep, grid or search, is an Optuna trial whose user attribute `identity`
is the hash of its resolved config. A rerun of the same command looks identities up here to
skip finished trials and to reuse (not duplicate) trials a killed driver left RUNNING.
"""

from __future__ import annotations

import copy
import importlib.util
import math
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna
import sqlalchemy.exc
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

from smallinit.core import results_schema as schema
from smallinit.core.errors import ConfigError, first_line, shown
from smallinit.core.files import disk_full

if TYPE_CHECKING:
    from smallinit.sweeper.config.space import SweepSpace
    from smallinit.sweeper.config.spec import TrialSpec

SAMPLERS = ("tpe", "random", "gp", "grid")
TRIAL_DIR = "trial_dir"  # the user attribute that names a trial's folder
# True where the sampler chose the trial's params, False for a fixed point (a grid point, a
# rerun): a grid's values are recorded as ranges (space.py), so the distributions cannot say.
SAMPLED = "sampled"
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
# A study attribute `superseded:<trial number>` (the reason) marks an ended trial whose folder no
# longer holds what it ended with (deleted, or a damaged result.json set aside): Optuna can
# neither reopen nor re-attribute a finished trial, so this one stops counting (by_identity
# skips it) and the trial trains again as a new one (study_rebuild.reconcile).
SUPERSEDED = "superseded:"


def default_storage_url(sweep_dir: Path) -> str:
    return f"sqlite:///{Path(sweep_dir).resolve() / 'optuna.db'}"


SCHEMA_RACE_RETRIES = 5
# The tables a study's trials live in. Optuna recreates a missing one empty when it opens the
# file: a study whose trials table was dropped would read as a study with no trials.
TRIAL_TABLES = ("studies", "trials", "trial_params", "trial_values", "trial_user_attributes")
POSTGRES_EXTRA = "pip install -e '.[postgres]' (or: make install EXTRAS=dev,dashboard,postgres)"


def storage_url(url: str) -> str:
    """The SQLAlchemy URL to open. A plain postgresql:// URL means SQLAlchemy's default driver,
    psycopg2; the postgres extra installs psycopg 3, so the URL is pointed at the driver that is
    there. Without either, one line names the extra to install."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.split("+")[0] not in ("postgresql", "postgres"):
        return url
    if "+" in scheme:  # the user chose a driver: theirs to install
        return url
    if importlib.util.find_spec("psycopg2") is not None:
        return f"postgresql://{rest}"
    if importlib.util.find_spec("psycopg") is not None:
        return f"postgresql+psycopg://{rest}"
    raise ConfigError(f"hydra.sweeper.storage={redacted(url)!r} is invalid: no PostgreSQL driver is installed; "
                      f"{POSTGRES_EXTRA}")


def redacted(url: str) -> str:
    """The URL with its password (if any) replaced by ***, for printing and logs."""
    scheme, sep, rest = url.partition("://")
    userinfo, at, host = rest.rpartition("@")
    if not sep or not at or ":" not in userinfo:
        return url
    return f"{scheme}://{userinfo.split(':', 1)[0]}:***@{host}"


def open_storage(url: str) -> optuna.storages.BaseStorage:
    """An RDB storage for any SQLAlchemy URL; a bad URL fails here, before any trial."""
    given, url = url, storage_url(url)  # errors name the URL the user gave
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        _require_trial_tables(Path(url.removeprefix("sqlite:///")))
    # A generous SQLite timeout lets concurrent sweeps share one file safely.
    kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
    try:
        for attempt in range(SCHEMA_RACE_RETRIES):
            try:
                return optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
            except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.OperationalError) as e:
                # Two sweeps creating the same new database at once: both write the schema
                # (version) and one loses. The winner's schema is there now; open it again.
                lost_race = isinstance(e, sqlalchemy.exc.IntegrityError) or "already exists" in str(e)
                if not lost_race or attempt == SCHEMA_RACE_RETRIES - 1:
                    raise
                time.sleep(0.2 * (attempt + 1))
    except Exception as e:  # SQLAlchemy raises many types: all mean the same to the user
        reason = first_line(e)
        path = Path(url.removeprefix("sqlite:///")) if url.startswith("sqlite:///") else None
        if path is not None and ("database or disk is full" in str(e) or disk_full(e)):  # not the file's fault
            raise ConfigError(f"no space left on device: {path} (the study could not be written; free space "
                              "and rerun the same command)") from None
        if path is not None and path.is_file():  # the file is at fault, not the setting
            raise ConfigError(f"{shown(path)} is not a readable SQLite study: {reason}; move it aside and rerun "
                              "to rebuild it from the trial folders") from None
        raise ConfigError(
            f"hydra.sweeper.storage={redacted(given)!r} is invalid: {reason} (use sqlite:///path.db or a SQLAlchemy URL such as postgresql://user@host/db)"
        ) from None


def _require_trial_tables(path: Path) -> None:
    """An existing Optuna SQLite file keeps every table its trials live in (read-only look)."""
    if not path.is_file() or path.stat().st_size == 0:
        return
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.Error:
        return  # not SQLite at all: RDBStorage names the fault in the one line below
    missing = [t for t in TRIAL_TABLES if t not in tables]
    if "alembic_version" in tables and missing:
        raise ConfigError(f"{shown(path)} is not a readable SQLite study: it has no {', '.join(missing)} table; "
                          "move it aside and rerun to rebuild it from the trial folders")


def make_sampler(name: str, seed: int, space: dict[str, BaseDistribution]) -> optuna.samplers.BaseSampler:
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed)
    if name == "grid":
        grid = {}
        for key, dist in space.items():
            if not isinstance(dist, optuna.distributions.CategoricalDistribution):
                raise ConfigError(f"hydra.sweeper.sampler='grid' is invalid with the interval {key}: use discrete values")
            grid[key] = list(dist.choices)
        return optuna.samplers.GridSampler(grid, seed=seed)
    raise ConfigError(f"hydra.sweeper.sampler={name!r} is invalid: one of {list(SAMPLERS)}")


def trial_names(spec: TrialSpec) -> dict[str, Any]:
    """The attributes that tie a study trial to its point and folder (and its protocol role)."""
    role = {"role": spec.role} if spec.role else {}
    return {"identity": spec.identity, TRIAL_DIR: spec.out_dir, **role}


@dataclass
class Pending:
    """A trial to run with known params; `existing` is the study trial a killed driver left
    RUNNING, reused so the study holds each trial once."""

    spec: TrialSpec
    existing: FrozenTrial | None = None


class Study:
    """Thin wrapper over an optuna.Study with identity-aware, exactly-once bookkeeping."""

    def __init__(self, storage: optuna.storages.BaseStorage, name: str, sampler: optuna.samplers.BaseSampler):
        self.study = optuna.create_study(storage=storage, study_name=name, sampler=sampler, direction="minimize", load_if_exists=True)
        self.storage = storage
        # Trial folders are recorded relative to the folder holding the SQLite file (the sweep
        # folder, by default), like results.parquet's paths, so a moved or copied sweep folder
        # still finds them; outside it, or with a database server, they stay absolute.
        url = getattr(storage, "url", "")
        self.home = Path(url.removeprefix("sqlite:///")).parent if url.startswith("sqlite:///") else None

    def stored_path(self, path: str | Path) -> str:
        return schema.to_stored_path(path, self.home) if self.home is not None else str(path)

    def local_path(self, stored: str | None, identity: str | None = None) -> str | None:
        """Where a recorded trial folder is now; absolute records (older studies) are read as they are."""
        return schema.to_local_path(stored, self.home, identity) if self.home is not None else stored

    def _localised(self, t: FrozenTrial) -> FrozenTrial:
        """t, its trial_dir attribute resolved (a copy: the storage caches the frozen trials)."""
        stored = t.user_attrs.get(TRIAL_DIR)
        local = self.local_path(stored, t.user_attrs.get("identity"))
        if local == stored:
            return t
        t = copy.copy(t)
        t.user_attrs = {**t.user_attrs, TRIAL_DIR: local}
        return t

    def by_identity(self) -> dict[str, FrozenTrial]:
        """Latest trial per identity, a finished one preferred over a RUNNING one, superseded
        ones left out; its trial_dir attribute is where the folder is now."""
        out: dict[str, FrozenTrial] = {}
        gone = self.superseded()
        for t in self.study.get_trials(deepcopy=False):
            ident = t.user_attrs.get("identity")
            if ident is None or t.number in gone:
                continue
            prev = out.get(ident)
            if prev is None or (t.state in FINISHED) >= (prev.state in FINISHED):
                out[ident] = t
        return {ident: self._localised(t) for ident, t in out.items()}

    def superseded(self) -> dict[int, str]:
        """trial number -> why it no longer counts (its folder lost it)."""
        return {int(k.removeprefix(SUPERSEDED)): v for k, v in self.study.user_attrs.items() if k.startswith(SUPERSEDED)}

    def supersede(self, trial: FrozenTrial, why: str) -> None:
        """One attribute per trial: two drivers sharing the study never overwrite each other's."""
        self.study.set_user_attr(f"{SUPERSEDED}{trial.number}", why)

    def grid_distributions(self, space: SweepSpace) -> dict[str, BaseDistribution]:
        """The distributions to record a grid's points with, given what the study already
        holds for each key (Optuna checks every new record against the first one). Raises
        ConfigError, before any trial, where the two cannot be reconciled."""
        recorded: dict[str, BaseDistribution] = {}
        for t in self.study.get_trials(deepcopy=False):
            for key, dist in t.distributions.items():
                recorded.setdefault(key, dist)
        out = {}
        for key, dist in space.grid_distributions().items():
            old = recorded.get(key)
            if old is None:
                out[key] = dist
            elif isinstance(old, optuna.distributions.CategoricalDistribution):
                # Recorded as choices (a non-numeric key, or a study from before grids were
                # recorded as ranges): the grid's values must be among them.
                if not set(space.discrete[key].values) <= set(old.choices):
                    raise ConfigError(
                        f"{key} is invalid for study {self.study.study_name!r}: it recorded {key} as the "
                        f"choices {list(old.choices)}, and an Optuna study cannot widen a categorical; "
                        f"keep to those values or use a new name=... (or hydra.sweeper.study_name=...)")
                out[key] = old
            elif type(old) is type(dist) and getattr(old, "log", False) == getattr(dist, "log", False):
                out[key] = dist
            elif isinstance(old, optuna.distributions.FloatDistribution) and isinstance(dist, type(old)) and not old.log:
                # Recorded on a linear axis (studies from before log axes): Optuna holds a key
                # to its first record's scale, so the rerun records on that scale too.
                out[key] = optuna.distributions.FloatDistribution(dist.low, dist.high)
            else:
                raise ConfigError(
                    f"{key} is invalid for study {self.study.study_name!r}: it recorded {key} as "
                    f"{type(old).__name__}, this grid needs {type(dist).__name__}; use a new name=...")
        return out

    def create_running(self, params: dict[str, Any], distributions: dict[str, BaseDistribution],
                       **attrs: Any) -> FrozenTrial:
        """A RUNNING trial with fixed params (grid points, reruns) and its attributes (identity,
        trial_dir) in one write: a driver killed between two writes would leave a trial that no
        rerun can match to its point, and the study would hold that point twice. Created directly
        in the storage, not enqueued, so a concurrent sweep on the same study cannot take it."""
        if TRIAL_DIR in attrs:
            attrs[TRIAL_DIR] = self.stored_path(attrs[TRIAL_DIR])
        template = optuna.trial.create_trial(
            state=TrialState.RUNNING, params=params, distributions={k: distributions[k] for k in params},
            user_attrs={**attrs, SAMPLED: False},
        )
        trial_id = self.storage.create_new_trial(self.study._study_id, template_trial=template)
        return self.storage.get_trial(trial_id)

    def ask(self, distributions: dict[str, BaseDistribution]) -> FrozenTrial:
        trial = self.study.ask(distributions)
        self.storage.set_trial_user_attr(trial._trial_id, SAMPLED, True)
        return self.storage.get_trial(trial._trial_id)

    def set_attrs(self, trial: FrozenTrial, **attrs: Any) -> None:
        if TRIAL_DIR in attrs:
            attrs[TRIAL_DIR] = self.stored_path(attrs[TRIAL_DIR])
        for key, value in attrs.items():
            self.storage.set_trial_user_attr(trial._trial_id, key, value)

    def report(self, trial: FrozenTrial, step: int, value: float) -> None:
        if value is not None and math.isfinite(value):
            self.storage.set_trial_intermediate_value(trial._trial_id, step, value)

    def finish(self, trial: FrozenTrial, state: TrialState, value: float | None = None, reason: str | None = None,
               **attrs: Any) -> None:
        # An ended trial keeps its state, value and reason: a second ending (another driver on the
        # same study, a late report) changes nothing and raises nothing.
        if self.storage.get_trial(trial._trial_id).state.is_finished():
            return
        if attrs:
            self.set_attrs(trial, **attrs)
        if reason:
            self.set_attrs(trial, fail_reason=reason[:2000])
        if state == TrialState.COMPLETE and (value is None or not math.isfinite(value)):
            state, reason = TrialState.FAIL, reason or "no finite validation loss"
            self.set_attrs(trial, fail_reason=reason)
        values = value if state == TrialState.COMPLETE else None
        self.study.tell(trial.number, values, state=state, skip_if_finished=True)
