"""The old home of the anchor task's config, kept only because sweeper/core.py imports
`AnchorConfig` from here; delete once it validates `trial.data` itself. The task now lives
in trainer/anchor_task.py."""

from .anchor_task import AnchorData as AnchorConfig

__all__ = ["AnchorConfig"]
