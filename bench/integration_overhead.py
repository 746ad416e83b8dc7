"""What each integration costs its library's own training loop: the loop with no logger, with the library's own
TensorBoard logger, and with Rankboard's (to a live server), interleaved, in a fresh process each (one CPU rank).

    .venv/bin/python -m bench.integration_overhead [--steps 400] [--repeats 3] [--libraries lightning,hf,accelerate]

Every step logs its loss (Lightning log_every_n_steps=1, HF logging_steps=1, Accelerate's log each step): the most
a loop logs. Times are of the training alone (fit, train, the loop), measured inside the process: wall seconds, and
the process's CPU seconds (training and every thread of the logger), which a machine busy with other work disturbs
far less; the overhead is the logger's CPU time per step.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from tests.live import serving

VARIANTS = ("none", "tensorboard", "rankboard")


def _data() -> torch.utils.data.DataLoader:
    torch.manual_seed(0)
    dataset = torch.utils.data.TensorDataset(torch.randn(4096, 32), torch.randn(4096, 1))
    return torch.utils.data.DataLoader(dataset, batch_size=8)


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))


Seconds = tuple[float, float]  # wall, CPU


def _clock() -> Seconds:
    return time.perf_counter(), time.process_time()


def _since(start: Seconds) -> Seconds:
    return time.perf_counter() - start[0], time.process_time() - start[1]


def lightning_loop(variant: str, steps: int, logs: Path) -> Seconds:
    from lightning.pytorch import LightningModule, Trainer
    from lightning.pytorch.loggers import TensorBoardLogger
    from rankboard.integrations.lightning import RankboardLogger

    class Module(LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = _model()

        def training_step(self, batch: list[torch.Tensor], index: int) -> torch.Tensor:
            loss = torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])
            self.log("loss", loss)
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    logger = {"none": False, "tensorboard": TensorBoardLogger(str(logs)), "rankboard": RankboardLogger("bench")}
    trainer = Trainer(accelerator="cpu", devices=1, max_steps=steps, log_every_n_steps=1, logger=logger[variant],
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    start = _clock()
    trainer.fit(Module(), _data())
    return _since(start)


def hf_loop(variant: str, steps: int, logs: Path) -> Seconds:
    from rankboard.integrations.hf import RankboardCallback
    from transformers import Trainer, TrainingArguments

    class Pairs(torch.utils.data.Dataset):
        def __init__(self) -> None:
            self.x, self.y = torch.randn(4096, 32), torch.randn(4096, 1)

        def __len__(self) -> int:
            return len(self.x)

        def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
            return {"x": self.x[index], "labels": self.y[index]}

    class Module(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = _model()

        def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"loss": torch.nn.functional.mse_loss(self.net(x), labels)}

    args = TrainingArguments(output_dir=str(logs), max_steps=steps, per_device_train_batch_size=8, logging_steps=1,
                             save_strategy="no", use_cpu=True, disable_tqdm=True,
                             report_to="tensorboard" if variant == "tensorboard" else "none")  # fmt: skip
    callbacks = [RankboardCallback("bench")] if variant == "rankboard" else []
    trainer = Trainer(model=Module(), args=args, train_dataset=Pairs(), callbacks=callbacks)
    start = _clock()
    trainer.train()
    return _since(start)


def accelerate_loop(variant: str, steps: int, logs: Path) -> Seconds:
    from accelerate import Accelerator
    from rankboard.integrations.accelerate import RankboardTracker

    log_with = {"none": None, "tensorboard": "tensorboard", "rankboard": RankboardTracker("bench")}[variant]
    accelerator = Accelerator(cpu=True, log_with=log_with, project_dir=str(logs))
    if log_with is not None:
        accelerator.init_trackers("bench", config={"lr": 0.01})
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer, data = accelerator.prepare(model, optimizer, _data())
    start = _clock()
    for step, (x, y) in enumerate(data):
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        accelerator.log({"loss": loss.item()}, step=step)
        if step + 1 >= steps:
            break
    seconds = _since(start)
    accelerator.end_training()
    return seconds


LOOPS = {"lightning": lightning_loop, "hf": hf_loop, "accelerate": accelerate_loop}


def one(library: str, variant: str, steps: int, url: str) -> Seconds:
    """One loop in a fresh process: its wall and CPU seconds."""
    with tempfile.TemporaryDirectory() as logs:
        env = {**os.environ, "RANKBOARD_URL": url, "RANKBOARD_RUN_KEY": f"bench-{time.time_ns()}"}
        done = subprocess.run([sys.executable, "-m", "bench.integration_overhead", "--worker", library, variant,
                               str(steps), logs], env=env, capture_output=True, text=True, check=True)  # fmt: skip
        wall, cpu = done.stdout.strip().splitlines()[-1].split()
        return float(wall), float(cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--libraries", default="lightning,hf,accelerate")
    parser.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        library, variant, steps, logs = args.worker
        print(*LOOPS[library](variant, int(steps), Path(logs)))
        return
    with tempfile.TemporaryDirectory() as scratch, serving(Path(scratch)) as server:
        for library in args.libraries.split(","):
            seconds: dict[str, list[Seconds]] = {variant: [] for variant in VARIANTS}
            for _ in range(args.repeats):
                for variant in VARIANTS:
                    seconds[variant].append(one(library, variant, args.steps, server.url))
            print(f"{library}: {args.steps} steps, each logged; ms/step, median of {args.repeats} (min..max)")
            base = [statistics.median(s[i] for s in seconds["none"]) for i in (0, 1)]
            for variant, values in seconds.items():
                print(f"  {variant:<12}" + "".join(_column(name, [v[i] for v in values], base[i], args.steps)
                                                   for i, name in enumerate(("wall", "CPU"))))  # fmt: skip


def _column(name: str, values: list[float], base: float, steps: int) -> str:
    median = statistics.median(values)
    return (
        f"  {name} {median / steps * 1000:7.3f} ({min(values) / steps * 1000:.2f}..{max(values) / steps * 1000:.2f}"
        f", {(median - base) / steps * 1000:+.3f} over none)"
    )


if __name__ == "__main__":
    main()
