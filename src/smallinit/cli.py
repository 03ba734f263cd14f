"""smallinit's command line: `python sweep.py` at the repository root, or `smallinit-sweep`
once installed, runs main().

    python sweep.py                      train one trial with the defaults (conf/config.yaml)
    python sweep.py model=mini init.gamma=0.5 norm.eps=1e-5
    python sweep.py -m init.gamma=0.5,0.75,1.0,1.25 norm.eps=1e-5,1e-12    a sweep
    python sweep.py --show [-m] OVERRIDES    what each trial would get (shape, budget, identity)
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from smallinit import CONF_DIR

os.environ.setdefault("HF_HUB_OFFLINE", "1")
log = logging.getLogger("smallinit")


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def run(cfg: DictConfig) -> float | None:
    from hydra.core.hydra_config import HydraConfig

    from smallinit.core.errors import ConfigError
    from smallinit.core.trial_dir import DamagedFile, TrialDir
    from smallinit.trainer.config import trial_config_from_dict
    from smallinit.trainer.data_check import check_trials
    from smallinit.trainer.entry import train_trial
    from smallinit.trainer.machine.host_memory import check_switch
    from smallinit.trainer.reporting import ConsoleReporter

    try:
        trial = trial_config_from_dict(OmegaConf.to_container(cfg, resolve=True))
        identity = trial.identity()  # once: the trainer reads it
        check_switch()  # SMALLINIT_CPU_ALLOCATOR
        # The corpus, held against the budget: main() checked it before Hydra made the folder.
        prepared = _CHECKED.pop(identity) if identity in _CHECKED else check_trials([trial]).get(trial.data)
    except ConfigError as e:
        sys.exit(f"error: {e}")
    out_dir = HydraConfig.get().runtime.output_dir
    m = trial.model
    print(f"trial {identity}: {trial.preset} ({m.num_params() / 1e6:.2f}M params), "
          f"gamma={m.init.gamma} eps={m.norm.eps:g} gate={m.attn.gate}, "
          f"{trial.train.total_steps} steps x {trial.train.tokens_per_step} tokens -> {out_dir}")
    # Said, because wandb.* is accepted here too: only a sweep's trials log to W&B.
    print(f"W&B: disabled for a single run (a sweep, sweep.py -m, logs one W&B run per trial); "
          f"metrics in {TrialDir(out_dir).metrics}")
    console = ConsoleReporter(trial.train.total_steps, description=trial.preset or "train")
    from smallinit.core.trial_lock import TrialBusy
    from smallinit.trainer.folder_checks import ForeignFolder

    try:  # the entry a sweep's worker takes too: the folder's lock, and a folder that is this trial's
        result = train_trial(trial, out_dir, identity, reporter=console, prepared=prepared)
    except (TrialBusy, ForeignFolder) as e:
        sys.exit(f"error: hydra.run.dir={out_dir}: {e}")
    except DamagedFile as e:
        sys.exit(f"error: {e}: move it aside to train the trial here again, or use another hydra.run.dir")
    if result["final_val_loss"] is not None:
        print(f"val loss {result['final_val_loss']:.4f} (best {result['best_val_loss']:.4f}; "
              f"unigram entropy of the val tokens {result['unigram_entropy']:.4f}) after {result['tokens']:,} tokens")
    extra = {k: v for k, v in (result.get("final_metrics") or {}).items() if k.startswith("anchor/")}
    if extra:
        print("  ".join(f"{k} {v:.3f}" for k, v in extra.items()))
    print(f"{result['tokens_per_s']:,.0f} tokens/s, {result['wall_s']:.1f} s; outputs in {out_dir}")
    return result["final_val_loss"]


# What a single run's folder holds before its trial.json (Hydra's job log, the trial's lock);
# hidden names (Hydra's .hydra/, .gitkeep) are never a user's files either.
BEFORE_THE_TRIAL = {"sweep.log", "trial.lock"}


# The single run's trial identity -> its corpus, prepared and checked by main() before Hydra
# made the run's folder, for run() to take rather than prepare it again.
_CHECKED: dict[str, object] = {}


def _check_single_run(argv: list[str], cfg: DictConfig) -> None:
    """A single run checked as run() checks it, before Hydra makes the run's folder, so a refusal
    leaves nothing behind: its config and allocator switch, its folder (cheap, and a finished
    trial is answered before any corpus work), then the corpus against its budget. ConfigError
    or SystemExit with one line otherwise."""
    from smallinit.trainer.config import trial_config_from_dict
    from smallinit.trainer.data_check import check_trials
    from smallinit.trainer.machine.host_memory import check_switch

    trial = trial_config_from_dict(OmegaConf.to_container(cfg, resolve=True))
    check_switch()
    _check_run_dir(argv, trial)
    _CHECKED[trial.identity()] = check_trials([trial]).get(trial.data)


def _check_run_dir(argv: list[str], trial) -> None:
    """A single run into a path that is not a folder, a folder that holds files no trial wrote,
    another trial's, or a finished trial is answered before Hydra writes its .hydra/ there:
    refused in one line, or (its own finished trial) told so, with nothing in the folder touched."""
    from smallinit.core.errors import ConfigError
    from smallinit.core.trial_dir import TrialDir, unusable
    from smallinit.trainer.folder_checks import folder_refusal, not_this_trial

    given = [a.split("=", 1)[1] for a in argv if a.startswith("hydra.run.dir=")]
    if given and Path(given[-1]).exists() and not Path(given[-1]).is_dir():
        raise ConfigError(f"hydra.run.dir={given[-1]} is invalid: it is a file, not a folder (nothing was written)")
    if not given or not Path(given[-1]).is_dir():
        return  # Hydra's own default is a new time-stamped folder
    folder = TrialDir(given[-1])
    names = sorted(n.name for n in folder.path.iterdir() if not n.name.startswith("."))
    if not (folder.finished or folder.has_checkpoint or folder.trial_json.exists()):
        mine = [n for n in names if n not in BEFORE_THE_TRIAL]
        if mine:
            shown = ", ".join(mine[:5]) + (f" and {len(mine) - 5} more" if len(mine) > 5 else "")
            sys.exit(f"error: hydra.run.dir={folder.path} holds files no trial wrote ({shown}): a run trains into a "
                     "new or empty folder, or its own trial's (nothing was written)")
        return
    identity = trial.identity()
    meta = folder.read_trial(damaged_ok=True)
    if not (folder.finished or folder.has_checkpoint) and isinstance(meta, dict) and meta.get("identity") != identity:
        # another trial began here and stopped before its first checkpoint: its folder still
        sys.exit(f"error: hydra.run.dir={folder.path}: "
                 f"{not_this_trial(folder.path, 'trial', meta.get('identity'), trial, 1, identity)}")
    damage = folder.damaged_result()
    if damage:
        sys.exit(f"error: {folder.result_json} is {unusable(damage)}: move it aside to train the trial here again, "
                 "or use another hydra.run.dir")
    why = folder_refusal(trial, folder.path, identity)
    if why:
        sys.exit(f"error: hydra.run.dir={folder.path}: {why}")
    if folder.finished:
        print(f"trial {identity} already finished in {folder.path}: nothing to train (its result.json)")
        sys.exit(0)


def main() -> None:
    from smallinit.core.errors import ConfigError
    from smallinit.sweeper.config.precheck import precheck

    conf = CONF_DIR
    try:
        cfg = precheck([a for a in sys.argv[1:] if a != "--show"], conf, show="--show" in sys.argv[1:])
        if cfg is not None and not {"-m", "--multirun", "--show"} & set(sys.argv[1:]):
            _check_single_run(sys.argv[1:], cfg)
        if "--show" in sys.argv[1:]:
            from smallinit.sweeper.results.show import show

            for line in show([a for a in sys.argv[1:] if a != "--show"], conf):
                print(line, flush=True)
            return
    except ConfigError as e:
        sys.exit(f"error: {e}")
    from smallinit.sweeper.runtime import stop

    stop.install()
    try:
        run()
        status = 0
    except SystemExit as e:  # a refusal, an aborted sweep or failed trials: `error: ...` and 1
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
        status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except KeyboardInterrupt:  # a stop signal outside Tune's loop: the driver unwound (Ray stopped)
        print(f"stopped by {stop.signal_name()}", file=sys.stderr)
        status = 1
    # Everything is written by now (results, study, checkpoints, W&B files). Run the exit hooks
    # (logging, Ray) and skip the interpreter's teardown, which after a Ray driver spends
    # ~0.6 s in destructors (measured by bench/sweep_bench.py's timeline); every ending goes
    # this way, so the status is set here rather than by an exception reaching the interpreter.
    import atexit

    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(stop.exit_status(status))


if __name__ == "__main__":
    main()
