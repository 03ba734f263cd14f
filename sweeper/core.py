"""The sweep, start to end, on the driver.

1. Parse the overrides into a grid or an Optuna search space (sweeper/space.py).
2. Compose and validate every trial's config with Hydra, here, before anything launches;
   a bad override stops the command with one line and leaves nothing behind.
3. Open the study (SQLite by default) and check the grid against what it recorded.
4. Skip trials whose identity already finished; reuse trials a killed driver left RUNNING.
5. If any are left: start or connect to Ray while the data is prepared once, run them as
   Ray Tune trials (StudySearcher decides which, ASHA may stop them), stop Ray.
6. Write results.parquet and print the best trial.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf, open_dict

from core.errors import ConfigError, first_line
from core.files import atomic_write_json
from trainer.config import trial_config_from_dict

from .config import SmallinitSweeperConf
from .space import SweepSpace, parse_sweep
from .trainable import TrialSpec

log = logging.getLogger("smallinit.sweep")


class Composer:
    """Overrides -> composed Hydra config -> validated TrialSpec, on the driver."""

    def __init__(self, loader, base: DictConfig, space: SweepSpace, sweep_dir: Path):
        self.loader, self.base, self.space, self.sweep_dir = loader, base, space, sweep_dir
        # Validation composes every grid point before launch; planning asks again to write
        # its folder. Hydra composition is ~0.2 s a trial, so each point is composed once.
        self._built: dict[str, tuple[TrialSpec, DictConfig]] = {}

    def compose(self, params: dict[str, Any]) -> tuple[list[str], DictConfig]:
        overrides = self.space.overrides_for(params)
        try:
            cfg = self.loader.load_sweep_config(self.base, overrides)
        except HydraException as e:
            raise ConfigError(first_line(e)) from None
        return overrides, cfg

    def spec(self, params: dict[str, Any], write: bool = False) -> TrialSpec:
        key = json.dumps(params, sort_keys=True, default=str)
        if key not in self._built:
            self._built[key] = self._build(params)
        spec, job_cfg = self._built[key]
        if write:  # Hydra's job-folder convention: the composed config and the overrides
            out = Path(spec.out_dir)
            (out / ".hydra").mkdir(parents=True, exist_ok=True)
            OmegaConf.save(job_cfg, out / ".hydra" / "config.yaml")
            OmegaConf.save(OmegaConf.create(spec.overrides), out / ".hydra" / "overrides.yaml")
            # The resolved config too: a trial whose worker dies before training starts has no
            # trial.json, and the results table still needs its row.
            atomic_write_json(out / "sweep.json", {"params": spec.params, "overrides": spec.overrides,
                                                   "identity": spec.identity, "config": spec.trial.to_dict()})
        return spec

    def _build(self, params: dict[str, Any]) -> tuple[TrialSpec, DictConfig]:
        overrides, cfg = self.compose(params)
        HydraConfig.instance().set_config(cfg)  # lets ${hydra:...} resolve on the driver
        with open_dict(cfg):
            job_cfg = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
        try:
            container = OmegaConf.to_container(job_cfg, resolve=True)
        except Exception as e:
            raise ConfigError(first_line(e)) from None
        if container.get("data", {}).get("paths"):  # workers may run elsewhere: pin user files
            container["data"]["paths"] = [str(Path(p).expanduser().absolute()) for p in container["data"]["paths"]]
        trial = trial_config_from_dict(container)
        _validate_data(trial.data)
        ray_cfg, wandb_cfg = container.get("ray", {}), container.get("wandb", {})
        spec = TrialSpec(
            identity=trial.identity(), trial=trial, out_dir=str(self.sweep_dir / "trials" / trial.identity()),
            params=dict(params), overrides=overrides, sweep_name=str(container.get("name", "sweep")),
            wandb=dict(wandb_cfg), threads=int(ray_cfg.get("cpus_per_trial") or 1),
        )
        return spec, job_cfg


def _validate_data(data: dict[str, Any]) -> None:
    fields = {k: v for k, v in data.items() if k != "task"}
    if data.get("task", "lm") == "anchor":
        from trainer.anchor import AnchorConfig

        AnchorConfig(**fields)
    else:
        from trainer.data import DataConfig

        DataConfig(**fields)


def _corner_params(space: SweepSpace) -> list[dict[str, Any]]:
    """Points that test every swept value's validity without enumerating a search space:
    the low and high ends of each interval, each discrete value."""
    base = {k: c.values[0] for k, c in space.discrete.items()}
    base.update({k: d.low for k, d in space.intervals.items()})
    points = [base]
    for key, dist in space.intervals.items():
        points.append({**base, key: dist.high})
    for key, choices in space.discrete.items():
        points += [{**base, key: v} for v in choices.values[1:]]
    return points


def _quiet_libraries() -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)


def connect_ray(ray_cfg: dict[str, Any]) -> bool:
    """Connect to ray.address, or start a local Ray; False if this process already had one."""
    import ray

    if ray.is_initialized():
        return False
    address = ray_cfg.get("address")
    # Trials keep the working directory they were launched from (Tune would chdir into its
    # own trial folder); set for every worker of the job, on a remote cluster too.
    os.environ["RAY_CHDIR_TO_TRIAL_DIR"] = "0"
    kwargs = {"include_dashboard": False, "logging_level": logging.WARNING, "log_to_driver": False,
              "runtime_env": {"env_vars": {"RAY_CHDIR_TO_TRIAL_DIR": "0"}}}
    try:
        if address:
            ray.init(address=address, **kwargs)
        else:
            ray.init(num_cpus=ray_cfg.get("num_cpus"), num_gpus=ray_cfg.get("num_gpus"), **kwargs)
    except Exception as e:
        raise ConfigError(
            f"ray.address={address!r} is invalid: could not connect ({first_line(e)}); "
            "start one with `ray start --head`, or leave ray.address=null for a local Ray"
        ) from None
    return True


def _stop_ray() -> None:
    """Shut down (or disconnect from) the Ray this sweep started, now rather than at exit:
    Ray's exit hook first sleeps 0.5 s for log lines this driver does not forward."""
    import ray

    # ray.shutdown() stops the autoscaler monitor after the GCS, and the monitor's SIGTERM
    # handler then waits on the dead GCS until Ray's 1 s grace period runs out (1.4 s of the
    # shutdown's 1.5 s here). A local cluster's monitor holds no state: stop it first.
    try:
        from ray._private import ray_constants
        from ray._private.worker import _global_node as node

        if node is not None and node.is_head():
            for info in node.all_processes.get(ray_constants.PROCESS_TYPE_MONITOR, []):
                info.process.kill()
                info.process.wait(timeout=5)
    except Exception:  # noqa: BLE001 - Ray's internals moved: shut down the slow way
        pass
    ray.shutdown()


def _check_reachable(address: str) -> None:
    """Fail in seconds, not minutes: ray.init retries an unreachable GCS for a long time."""
    import socket

    if address == "auto":
        if os.environ.get("RAY_ADDRESS") or Path("/tmp/ray/ray_current_cluster").exists():
            return
        raise ConfigError("ray.address='auto' is invalid: no running Ray cluster found on this machine "
                          "(start one with `ray start --head`, or leave ray.address=null for a local Ray)")
    hostport = address.removeprefix("ray://").rsplit("/", 1)[0]
    host, _, port = hostport.rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=5):
            return
    except (OSError, ValueError) as e:
        raise ConfigError(
            f"ray.address={address!r} is invalid: cannot reach {hostport} ({e}); start a cluster with "
            "`ray start --head`, or leave ray.address=null for a local Ray"
        ) from None


def run_sweep(conf: SmallinitSweeperConf, loader, base: DictConfig, arguments: list[str]) -> list[dict[str, Any]]:
    try:
        return _run(conf, loader, base, arguments)
    except ConfigError as e:
        sys.exit(f"error: {e}")


def _run(conf: SmallinitSweeperConf, loader, base: DictConfig, arguments: list[str]) -> list[dict[str, Any]]:
    from .study import Study, default_storage_url, make_sampler, open_storage

    _check_sweeper_conf(conf)
    _quiet_libraries()
    space = parse_sweep(arguments, dict(conf.params) if conf.params else None)
    sweep_dir = Path(base.hydra.sweep.dir).resolve()
    composer = Composer(loader, base, space, sweep_dir)
    if space.mode == "grid":
        specs = [composer.spec(p) for p in space.grid()]
        checked = specs
    else:
        checked = [composer.spec(p) for p in _corner_params(space)]
        specs = []
    ray_cfg = OmegaConf.to_container(base.get("ray", {}), resolve=True) or {}
    if ray_cfg.get("address"):
        _check_reachable(ray_cfg["address"])
    storage = open_storage(conf.storage or default_storage_url(sweep_dir))
    sampler = make_sampler(conf.sampler, conf.seed, space.distributions())
    study = Study(storage, conf.study_name or str(base.get("name", "sweep")), sampler)
    # A grid rerun with more values (seeds, gammas) must fit what the study recorded: checked
    # before Ray starts, so this error, like every other, comes in the first seconds.
    grid_dists = study.grid_distributions(space) if space.mode == "grid" else None
    # Everything is valid: from here on we write.
    pending, n_new, skipped, total = _plan(conf, space, study, specs, composer)
    print(f"sweep {study.study.study_name}: {space.mode}, {total} trials ({skipped} already done), "
          f"folder {sweep_dir}, study {conf.storage or default_storage_url(sweep_dir)}", flush=True)
    aborted = None
    if pending or n_new:  # a rerun of a finished sweep needs no cluster and no data
        # Ray's start (~4 s, mostly waiting for its processes) overlaps the rest of the driver's
        # work: the corpus check (minutes when the cache is cold) and Tune's imports (~1 s).
        ready = _Background(lambda: (_prepare_data_once(checked), _import_tune()))
        started = connect_ray(ray_cfg)
        try:
            ready.result()
            aborted = _tune(conf, ray_cfg, space, study, pending, n_new, composer, sweep_dir, total, skipped, grid_dists)
        finally:
            if started:
                _stop_ray()
    return _finish(sweep_dir, study, aborted)


def _check_sweeper_conf(conf: SmallinitSweeperConf) -> None:
    if not (isinstance(conf.n_trials, int) and conf.n_trials > 0):
        raise ConfigError(f"hydra.sweeper.n_trials={conf.n_trials!r} is invalid: must be a positive integer")
    if not 0 <= conf.max_failure_rate <= 1:
        raise ConfigError(f"hydra.sweeper.max_failure_rate={conf.max_failure_rate!r} is invalid: must be in [0, 1]")
    if conf.max_concurrent is not None and conf.max_concurrent < 1:
        raise ConfigError(f"hydra.sweeper.max_concurrent={conf.max_concurrent!r} is invalid: must be >= 1 or null")


def _prepare_data_once(specs: list[TrialSpec]) -> None:
    """Tokenise each distinct corpus on the driver so trials only read the cache."""
    from trainer.data import DataConfig, prepare

    seen = set()
    for spec in specs:
        data = spec.trial.data
        key = json.dumps(data, sort_keys=True, default=str)
        if data.get("task", "lm") == "lm" and key not in seen:
            seen.add(key)
            prepare(DataConfig(**{k: v for k, v in data.items() if k != "task"}))


class _Background(threading.Thread):
    """Run a function beside the main thread; result() re-raises its error there. (Ray itself
    must start on the main thread: its processes die with the thread that spawned them.)"""

    def __init__(self, fn):
        super().__init__(daemon=True)
        self.fn, self.error = fn, None
        self.start()

    def run(self) -> None:
        try:
            self.fn()
        except BaseException as e:  # noqa: BLE001 - handed to the main thread
            self.error = e

    def result(self) -> None:
        self.join()
        if self.error is not None:
            raise self.error


def _import_tune() -> None:
    # Tune's usage telemetry imports its W&B integration, and with it wandb (~0.8 s), when
    # the run starts: imported here, beside Ray's start, it is off the critical path.
    import ray.air.integrations.wandb  # noqa: F401
    import ray.tune.logger  # noqa: F401
    import ray.tune.schedulers  # noqa: F401

    from . import progress, searcher  # noqa: F401


def _plan(conf, space, study, specs, composer):
    from optuna.trial import TrialState

    from .study import FINISHED, Pending

    known = study.by_identity()
    if space.mode == "grid":
        pending, skipped = [], 0
        for spec in specs:
            t = known.get(spec.identity)
            done_file = Path(spec.out_dir, "result.json").exists()
            if done_file or (t is not None and t.state in FINISHED and not (t.state == TrialState.FAIL and conf.retry_failed)):
                skipped += 1
                continue
            composer.spec(spec.params, write=True)
            pending.append(Pending(spec, t if t is not None and t.state == TrialState.RUNNING else None))
        return pending, 0, skipped, len(specs)
    # Count every finished trial (a sampler may propose the same point twice); a RUNNING one
    # was left by a killed driver (one driver per study at a time) and is resumed.
    finished = [t for t in study.study.get_trials(deepcopy=False) if t.state in FINISHED]
    interrupted = [t for t in known.values() if t.state == TrialState.RUNNING]
    pending = [Pending(composer.spec(t.params, write=True), t) for t in interrupted]
    n_new = max(0, conf.n_trials - len(finished) - len(pending))
    return pending, n_new, len(finished), conf.n_trials


def _tune(conf, ray_cfg, space, study, pending, n_new, composer, sweep_dir, total, skipped, grid_dists=None) -> str | None:
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # our ProgressTable is the display
    # A failed trial's last report has no val_loss; it is still a result we want recorded.
    os.environ.setdefault("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")
    # Tune's default loggers include TensorBoard's, whose import pulls torch into the driver
    # (~2-3 s of every sweep's start): add the loggers ourselves, TensorBoard only when asked.
    os.environ["TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"] = "1"
    from ray import tune
    from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    from .progress import ProgressTable
    from .searcher import StudySearcher
    from .trainable import METRIC, run_spec

    searcher = StudySearcher(study, space, pending, n_new, lambda p: composer.spec(p, write=True), conf.max_failure_rate,
                             grid_dists)
    steps = [p.spec.trial.train.total_steps for p in pending] or [composer.spec(_corner_params(space)[0]).trial.train.total_steps]
    if conf.asha.enabled:
        max_t = max(steps)
        # max_t + 1: ASHA stops a trial that reaches max_t, which would cut it off before
        # it writes its results; finishing trials must end on their own.
        scheduler = ASHAScheduler(time_attr="step", max_t=max_t + 1, grace_period=conf.asha.grace_period or max(1, max_t // 4),
                                  reduction_factor=conf.asha.reduction_factor)
    else:
        scheduler = FIFOScheduler()

    class AbortStopper(tune.Stopper):
        def __call__(self, trial_id, result):
            return False

        def stop_all(self):
            return searcher.aborted is not None

    progress = ProgressTable(space.swept_keys, total, skipped)
    callbacks = [progress, CSVLoggerCallback(), JsonLoggerCallback()]
    if conf.tensorboard:
        from ray.tune.logger import TBXLoggerCallback

        callbacks.append(TBXLoggerCallback())
    resources = {"cpu": float(ray_cfg.get("cpus_per_trial") or 1), "gpu": float(ray_cfg.get("gpus_per_trial") or 0)}
    tuner = tune.Tuner(
        tune.with_resources(run_spec, resources),
        tune_config=tune.TuneConfig(metric=METRIC, mode="min", search_alg=searcher, scheduler=scheduler,
                                    num_samples=len(pending) + n_new, max_concurrent_trials=conf.max_concurrent,
                                    reuse_actors=conf.reuse_workers,
                                    trial_name_creator=_trial_name, trial_dirname_creator=_trial_name),
        run_config=tune.RunConfig(name="tune", storage_path=str(sweep_dir / "ray"), callbacks=callbacks, verbose=0,
                                  stop=AbortStopper(), failure_config=tune.FailureConfig(max_failures=conf.max_retries)),
    )
    try:
        tuner.fit()
    finally:
        progress.close()
    return searcher.aborted


def _trial_name(trial) -> str:
    return f"trial_{trial.config['number']}_{trial.config['spec'].identity}"


def _finish(sweep_dir: Path, study, aborted: str | None) -> list[dict[str, Any]]:
    from .results import build_table, write_table

    states = {
        ident: {"number": t.number, "state": t.state.name, "fail_reason": t.user_attrs.get("fail_reason"),
                "trial_dir": t.user_attrs.get("trial_dir")}
        for ident, t in study.by_identity().items()
    }
    df = build_table(sweep_dir, states)
    path = write_table(sweep_dir, df)
    counts = df["state"].value_counts().to_dict() if not df.empty else {}
    print(f"results: {path} ({', '.join(f'{v} {k.lower()}' for k, v in counts.items()) or 'no trials'})")
    done = df[df["state"] == "COMPLETE"].dropna(subset=["final_val_loss"]) if not df.empty else df
    if not done.empty:
        best = done.loc[done["final_val_loss"].idxmin()]
        params = {c.removeprefix("param."): best[c].item() if hasattr(best[c], "item") else best[c]
                  for c in df.columns if c.startswith("param.")}
        print(f"best: trial {int(best['trial_number'])} {params} val loss {best['final_val_loss']:.4f} -> {best['trial_dir']}")
    if aborted:
        sys.exit(f"error: {aborted}")
    return df.to_dict("records")
