"""An Accelerate training loop on 2 CPU ranks under torchrun (gloo), reported with RankboardTracker:
`torchrun --nproc-per-node=2 accelerate_loop.py NAME STEPS PAUSE_S`."""

from __future__ import annotations

import sys
import time

import torch
from accelerate import Accelerator
from rankboard.integrations.accelerate import RankboardTracker
from torch.utils.data import DataLoader, TensorDataset


def main(name: str, steps: int, pause: float) -> None:
    tracker = RankboardTracker(name)
    accelerator = Accelerator(cpu=True, log_with=tracker)
    accelerator.init_trackers("rankboard-tests", config={"lr": 0.01, "batch_size": 4})
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=4)
    model, optimizer, data = accelerator.prepare(model, optimizer, data)
    step = 0
    while step < steps:
        for x, y in data:
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            accelerator.log({"loss": loss.item()}, step=step)
            time.sleep(pause)
            step += 1
            if step >= steps or tracker.stop_requested():  # every rank asks, at the same step
                steps = step
                break
    print(f"rank {accelerator.process_index} stopped at step {step}", flush=True)
    accelerator.end_training()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]))
