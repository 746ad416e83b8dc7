"""A Hugging Face Trainer on 2 CPU ranks under torchrun (gloo), reported with RankboardCallback:
`torchrun --nproc-per-node=2 hf_train.py NAME STEPS PAUSE_S OUTPUT_DIR`. The model is a tiny module of its own: nothing
is downloaded."""

from __future__ import annotations

import sys
import time

import torch
from rankboard.integrations.hf import RankboardCallback
from torch.utils.data import Dataset
from transformers import Trainer, TrainingArguments


class Pairs(Dataset):
    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(64, 4, generator=generator), torch.randn(64, 1, generator=generator)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[index], "labels": self.y[index]}


class Tiny(torch.nn.Module):
    def __init__(self, pause: float) -> None:
        super().__init__()
        self.net, self.pause = torch.nn.Linear(4, 1), pause

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        time.sleep(self.pause)  # a step that takes a while, for the dashboard's stop to arrive during training
        return {"loss": torch.nn.functional.mse_loss(self.net(x), labels)}


def main(name: str, steps: int, pause: float, output_dir: str) -> None:
    args = TrainingArguments(output_dir=output_dir, max_steps=steps, per_device_train_batch_size=4, logging_steps=1,
                             learning_rate=0.01, save_strategy="no", report_to="none", use_cpu=True,
                             ddp_backend="gloo", run_name=name, disable_tqdm=True)  # fmt: skip
    trainer = Trainer(model=Tiny(pause), args=args, train_dataset=Pairs(), callbacks=[RankboardCallback()])
    trainer.train()
    print(f"rank {args.process_index} trained to step {trainer.state.global_step}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4])
