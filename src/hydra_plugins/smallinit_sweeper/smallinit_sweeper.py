"""Hydra's entry to the smallinit sweeper. Kept thin: Hydra imports every module under
hydra_plugins when it starts, so the heavy code (Ray, Optuna) is imported only in sweep()."""

from __future__ import annotations

from typing import Any

from hydra.plugins.sweeper import Sweeper

from smallinit.sweeper.config.config import register

register()


class SmallinitSweeper(Sweeper):
    def __init__(self, **kwargs: Any):
        self.kwargs = kwargs
        self.hydra_context = None
        self.config = None

    def setup(self, *, hydra_context, task_function, config) -> None:
        self.hydra_context, self.config = hydra_context, config

    def sweep(self, arguments: list[str]) -> Any:
        from smallinit.sweeper.config.config import sweeper_conf_from
        from smallinit.sweeper.driver import run_sweep

        return run_sweep(sweeper_conf_from(self.kwargs), self.hydra_context.config_loader, self.config, arguments)
