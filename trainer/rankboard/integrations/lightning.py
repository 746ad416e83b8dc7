"""Lightning: `Trainer(logger=RankboardLogger())`; needs `pip install rankboard[lightning]`.

Every rank joins the run as `fit` starts, when the trainer hands its loggers the model and hyperparameters, after
the process group is up (`Trainer(enable_autolog_hparams=False)` skips that, and the logger then sends nothing).
The module's and datamodule's hyperparameters are the run's config; metrics go from rank 0, at the trainer's
steps; a stop from the dashboard ends `fit` at the next logging step on every rank (`trainer.should_stop`, agreed
over the process group). A `ModelCheckpoint` left to its default file names saves `step-<step>.pt` instead, with a
sidecar: the dashboard lists, inspects and prunes those when their folder is in the shared folder (give it
`dirpath`, or the logger `save_dir` or `checkpoint_dir` there); one given its own `filename` keeps it, and is not
listed.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import Logger
from torch import nn

from .. import report, wire
from . import job


class RankboardLogger(Logger):
    """Reports a Lightning run to Rankboard (see the module's docstring); arguments as `report.init` takes them."""

    def __init__(
        self,
        name: str | None = None,
        config: Mapping[str, Any] | None = None,
        *,
        server: str | None = None,
        token: str | None = None,
        key: str | None = None,
        save_dir: str | os.PathLike[str] | None = None,
        checkpoint_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        super().__init__()
        self._name = name
        self._config: dict[str, Any] = dict(config or {})
        self._server, self._token, self._key = server, token, key
        self._save_dir = os.fspath(save_dir) if save_dir is not None else None
        self._checkpoint_dir = checkpoint_dir
        self._version = time.strftime("%Y%m%d-%H%M%S")  # rank 0's is the one Lightning gives every rank
        self._trainer: Trainer | None = None

    @property
    def name(self) -> str:
        return self._name or "rankboard"

    @property
    def version(self) -> str:
        return self._version

    @property
    def save_dir(self) -> str | None:
        return self._save_dir

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        """The run's config, until it is joined (a config is sent once, with the join)."""
        self._config.update(params if isinstance(params, Mapping) else vars(params))

    def log_graph(self, model: nn.Module, input_array: Any = None) -> None:
        """Called on every rank once the process group is up: the moment every rank joins."""
        if isinstance(model, LightningModule) and self._trainer is None:
            self._join(model.trainer)

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        """Rank 0's metrics at the trainer's step; every rank's heartbeat; and the stop every rank agrees on."""
        trainer = self._trainer
        if trainer is None:
            return
        step = trainer.global_step if step is None else step
        if trainer.is_global_zero:
            report.log(metrics, step=step)
        report.heartbeat(step)
        if trainer.strategy.reduce_boolean_decision(report.stop_requested(), all=False):
            trainer.should_stop = True  # fit ends after this step, on every rank

    def after_save_checkpoint(self, checkpoint_callback: ModelCheckpoint) -> None:
        """Sidecars for the checkpoints saved under wire's names (rank 0 wrote them), and none for those pruned."""
        trainer = self._trainer
        if trainer is None or not trainer.is_global_zero or checkpoint_callback.dirpath is None:
            return
        folder = Path(checkpoint_callback.dirpath)
        metrics = {key: float(value) for key, value in trainer.callback_metrics.items() if value.numel() == 1}
        for checkpoint in folder.glob(wire.CHECKPOINT_GLOB):
            step = wire.checkpoint_step(checkpoint.name)
            if step is not None and not checkpoint.with_name(wire.sidecar_name(checkpoint.name)).exists():
                job.write_sidecar(checkpoint, step=step, epoch=trainer.current_epoch, metrics=metrics)
        for sidecar in folder.glob(wire.CHECKPOINT_SIDECAR_GLOB):
            if not sidecar.with_suffix(".pt").exists():
                sidecar.unlink(missing_ok=True)

    def finalize(self, status: str) -> None:
        if status == "success" and self._trainer is not None:
            report.finished()

    def _join(self, trainer: Trainer) -> None:
        self._trainer = trainer
        folder = self._checkpoint_dir
        for callback in trainer.checkpoint_callbacks:
            if isinstance(callback, ModelCheckpoint):
                _name_as_wire(callback)
                folder = folder or callback.dirpath
        job.join(name=self._name, config=self._config, key=self._key, server=self._server, token=self._token,
                 checkpoint_dir=folder, local_world_size=trainer.num_devices)  # fmt: skip
        total = trainer.estimated_stepping_batches
        if isinstance(total, int) or (isinstance(total, float) and total != float("inf")):
            report.progress(total_steps=int(total))


def _name_as_wire(callback: ModelCheckpoint) -> None:
    """A checkpoint callback left to Lightning's names (`epoch=0-step=100.ckpt`) saves `step-00000100.pt` instead,
    which the dashboard lists; one the user named keeps its names."""
    if callback.filename is None:
        callback.filename = "step-{step:08d}"
        callback.auto_insert_metric_name = False
        callback.FILE_EXTENSION = ".pt"
