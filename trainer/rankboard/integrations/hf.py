"""Hugging Face Transformers: `Trainer(callbacks=[RankboardCallback()])`; needs `pip install rankboard[hf]`.

Every rank joins the run as training begins; the training arguments (and the model's config, under `model.`) are
the run's config; what the Trainer logs (loss, learning rate, grad norm, evaluation metrics) goes from the main
process at the Trainer's global step; a stop from the dashboard ends training at the next logging step on every rank
(`control.should_training_stop`, agreed over the process group), after which the Trainer saves as it does at its end.

`report_to="rankboard"` is not offered: Transformers maps `report_to` names to its own callbacks in a table of its
own (`INTEGRATION_TO_CALLBACK`), with no way to register another. Its checkpoints are folders (`checkpoint-<step>/`),
which the dashboard's checkpoint list (one `step-<step>.pt` file each) does not show: none are listed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from .. import report
from . import job


class RankboardCallback(TrainerCallback):
    """Reports a Transformers Trainer's run to Rankboard (see the module's docstring); arguments as `report.init`
    takes them (`name` defaults to the training arguments' `run_name`)."""

    def __init__(
        self,
        name: str | None = None,
        config: Mapping[str, Any] | None = None,
        *,
        server: str | None = None,
        token: str | None = None,
        key: str | None = None,
    ) -> None:
        self._name, self._config = name, dict(config or {})
        self._server, self._token, self._key = server, token, key
        self._joined = False

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       model: Any = None, **kwargs: Any) -> None:  # fmt: skip
        """Every rank joins (at the same point: the key may be agreed over the process group)."""
        if self._joined:
            return
        self._joined = True
        config = {f"model.{key}": value for key, value in _model_config(model).items()}
        config |= {**args.to_sanitized_dict(), **self._config}
        job.join(name=self._name or args.run_name, config=config, key=self._key, server=self._server,
                 token=self._token)  # fmt: skip
        if state.max_steps > 0:
            report.progress(total_steps=state.max_steps)

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> None:  # fmt: skip
        report.heartbeat(state.global_step)

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs: Mapping[str, Any] | None = None, **kwargs: Any) -> None:  # fmt: skip
        """The main process's logs at the global step; on every rank (the Trainer logs on all of them at once), the
        stop they agree on."""
        if not self._joined:
            return
        if state.is_world_process_zero and logs:
            report.log({key: value for key, value in logs.items() if isinstance(value, (int, float))},
                       step=state.global_step)  # fmt: skip
        if job.agreed_stop(args.device):
            control.should_training_stop = True

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> None:  # fmt: skip
        if self._joined:
            report.finished()


def _model_config(model: Any) -> dict[str, Any]:
    """A Transformers model's config (PretrainedConfig), as a dict; none for a plain module."""
    to_dict = getattr(getattr(model, "config", None), "to_dict", None)
    return dict(to_dict()) if callable(to_dict) else {}
