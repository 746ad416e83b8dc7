"""A Lightning fit on 2 CPU ranks (Lightning's own launcher starts rank 1 as a copy of this script), reported with
RankboardLogger: `python lightning_fit.py NAME STEPS PAUSE_S CHECKPOINT_DIR`."""

from __future__ import annotations

import sys
import time

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from rankboard.integrations.lightning import RankboardLogger
from torch.utils.data import DataLoader, TensorDataset


class Tiny(LightningModule):
    def __init__(self, lr: float = 0.01, hidden: int = 8, pause: float = 0.0) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1))

    def training_step(self, batch: list[torch.Tensor], index: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss)
        time.sleep(self.hparams["pause"])  # a step that takes a while, for the dashboard's stop to arrive during fit
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams["lr"])


def main(name: str, steps: int, pause: float, checkpoint_dir: str) -> None:
    torch.manual_seed(0)
    data = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=4)
    checkpoints = ModelCheckpoint(dirpath=checkpoint_dir, every_n_train_steps=5, save_top_k=-1)
    trainer = Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=steps, log_every_n_steps=1,
                      logger=RankboardLogger(name=name), callbacks=[checkpoints],
                      enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    trainer.fit(Tiny(pause=pause), data)
    print(f"rank {trainer.global_rank} fit ended at step {trainer.global_step}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4])
