"""One schema: the dataclasses' defaults are the command line's, so a trial built in Python
is the trial `python sweep.py` trains."""

from __future__ import annotations

from model.config import PRESETS, ModelConfig
from trainer.config import OptimConfig, TrainConfig, TrialConfig, trial_config_from_dict
from trainer.data_config import BilingualData


def test_the_default_trial_built_in_python_is_the_command_lines(compose):
    cli = trial_config_from_dict(compose(tiny=False))  # python sweep.py
    # As bench/gpu_bench.py and a notebook build one: the dataclasses' own defaults.
    direct = TrialConfig(model=ModelConfig(), optim=OptimConfig(), train=TrainConfig(), data=BilingualData(),
                         preset="micro")
    assert direct.identity() == cli.identity()
    assert ModelConfig() == PRESETS["micro"] == ModelConfig.preset("micro")
