"""A user's DDP script, reporting through the client alone, whose rank 1 stops before the all-reduce of step 10 (as
one stuck reading its data would): the dashboard must name rank 1 without any other help from the script."""

import threading

import torch
import torch.distributed as dist
from rankboard import report


def wait_for_data() -> None:
    threading.Event().wait()  # never set: this rank never reaches the all-reduce


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    total = torch.zeros(1)
    for step in range(1, 1_000_000):
        if rank == 1 and step == 10:
            wait_for_data()
        total += 1.0
        dist.all_reduce(total)
        if rank == 0:
            report.log({"loss": 1.0 / step}, step=step)
        threading.Event().wait(0.05)


if __name__ == "__main__":
    main()
