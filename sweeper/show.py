"""`python sweep.py --show [-m] OVERRIDES`: what each trial would get, before anything runs.

Hydra's `--cfg job` prints the config as composed, where the model's shape fields are null
(the preset fills them when the trial is built) and the launcher reads BasicLauncher although
sweeps run on Ray. This prints the trial as it will train: the preset's shape filled in, the
data and budget resolved, its identity, and how it would run.
"""

from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from trainer.config import TrialConfig, trial_config_from_dict
from trainer.data_check import check_trial, describe, passes
from trainer.data_config import CorpusData

from . import protocol
from .config import ProtocolConf
from .space import parse_sweep


def show(argv: list[str], conf_dir: Path) -> str:
    multirun = "-m" in argv or "--multirun" in argv
    lines = [a for a in argv if not a.startswith("-")]
    # The experiment and the sweeper's own settings shape the sweep; the rest are its overrides.
    sweep_settings = [a for a in lines if "experiment" in a.split("=", 1)[0] or a.startswith("hydra.sweeper.")]
    with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
        base = compose("config", overrides=sweep_settings, return_hydra_config=True)
        params = _container(base.hydra.sweeper.params) if multirun else {}
        space = space_given = parse_sweep([a for a in lines if not a.startswith("hydra.sweeper.")], params)
        pconf = ProtocolConf(**_container(base.hydra.sweeper.get("protocol")))
        if multirun and pconf.enabled:
            protocol.check(pconf, space, asha=bool(base.hydra.sweeper.asha.enabled))
            # What stage 1 runs first: each setting at every tuned value on the tuning seeds.
            points = [{**s, pconf.seed_key: seed} for s in space.grid() for seed in pconf.tune_seeds]
            space = protocol.round_space(space, points)
        points = space.grid() if space.mode == "grid" else [{}]
        trials = []
        for point in points:
            cfg = compose("config", overrides=space.overrides_for(point))
            trials.append((point, trial_config_from_dict(OmegaConf.to_container(cfg, resolve=True))))
    point, first = trials[0]
    m = first.model
    out = [OmegaConf.to_yaml(OmegaConf.create(first.to_dict())).rstrip(),
           f"# identity {first.identity()}: {first.preset}, {m.num_params() / 1e6:.2f}M parameters "
           f"({m.num_params(active=True) / 1e6:.2f}M active), {first.train.total_steps} steps x "
           f"{first.train.tokens_per_step} tokens = {first.train.total_steps * first.train.tokens_per_step:,} tokens",
           *_passes(first)]
    if not multirun:
        out.append("# runs here, in this process (python sweep.py ...)")
        return "\n".join(out)
    mode = "grid" if space.mode == "grid" else f"Optuna search ({space.swept_keys} sampled)"
    out.append(f"# with -m: {len(trials) if space.mode == 'grid' else 'hydra.sweeper.n_trials'} trial(s), {mode}, "
               "each a Ray Tune trial launched by the smallinit sweeper (hydra/sweeper=smallinit; Hydra's launcher "
               "setting is not used). Above: the first; all of them:")
    for p, t in trials:
        out.append(f"#   {t.identity()}  " + " ".join(f"{k}={v}" for k, v in p.items()))
    if pconf.enabled:
        out += protocol.describe_plan(pconf, space_given)
    return "\n".join(out)


def _container(node) -> dict:
    """A config node as a plain dict ({} for a missing or null node)."""
    return (OmegaConf.to_container(node) or {}) if OmegaConf.is_config(node) else {}


def _passes(trial: TrialConfig) -> list[str]:
    """The budget against the corpus (prepared on first use, then a cache hit) and the verdict
    the launch would give: refused above train.max_epochs, with the line it would print."""
    if not isinstance(trial.data, CorpusData):
        return []
    from core.errors import ConfigError
    from trainer.data import prepare

    prepared = prepare(trial.data, log=lambda *_: None)
    line = (f"# {passes(trial, prepared):,.2f} passes over the {prepared.n_train_tokens:,} training tokens of "
            f"{describe(trial.data)} (train.max_epochs={trial.train.max_epochs})")
    try:
        check_trial(trial, prepared)
    except ConfigError as e:
        return [line, f"# a launch would be refused: error: {e}"]
    return [line]
