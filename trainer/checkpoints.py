"""Checkpoints on shared storage: writing one with its sidecar, deleting those the run no longer keeps, and starting
a new run from one.

Rank 0 alone calls `save` and `Retention.add`; every rank calls `init_from`. File names and the sidecar's format are
in `wire`, which the server shares: it lists checkpoints from the sidecars and never loads a checkpoint.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import math
import os
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import torch
from rankboard import wire
from torch import nn

# What torch.save writes since torch 1.6 is a zip archive; anything else was not written by this trainer.
_ZIP_MAGIC = b"PK\x03\x04"


class CheckpointError(Exception):
    """A checkpoint could not be written or read and the run cannot go on; the message says why, in one line."""


def write_atomically(path: Path, write: Callable[[IO[bytes]], object]) -> None:
    """Write a file so that a reader sees the previous version or the complete new one, never a part of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # In the same folder, so that os.replace is a rename on one filesystem. Not tempfile.mkstemp: its mode 0600
    # would hide checkpoints from a server running as another user on the shared storage.
    temp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(temp, "xb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())  # the data is on disk before the name points at it
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise


class _KeepsWriteError:
    """A file for torch.save that remembers why a write failed: torch.save reports a failed write as a RuntimeError
    ("unexpected pos 704 vs 598") that has lost the errno, and ENOSPC or EFBIG is what the person needs to read."""

    def __init__(self, file: IO[bytes]) -> None:
        self._file = file
        self.error: OSError | None = None

    def write(self, data: bytes) -> int:
        try:
            return self._file.write(data)
        except OSError as error:
            self.error = error
            raise

    def flush(self) -> None:
        self._file.flush()


def _torch_save(snapshot: Mapping[str, Any], file: IO[bytes]) -> None:
    writer = _KeepsWriteError(file)
    try:
        torch.save(snapshot, writer)  # type: ignore[arg-type]  # torch needs only write() and flush()
    except RuntimeError:
        if writer.error is None:
            raise
        raise writer.error from None


def save(
    directory: Path, snapshot: Mapping[str, Any], *, epoch: int, step: int, metrics: Mapping[str, float], reason: str
) -> wire.CheckpointSidecar:
    """Write `step-*.pt`, then its sidecar; on OSError neither is left behind, and earlier checkpoints are untouched."""
    if reason not in wire.CHECKPOINT_REASONS:  # the pages and the API explain only these
        raise ValueError(f"unknown checkpoint reason {reason!r}; one of {wire.CHECKPOINT_REASONS}")
    path = directory / wire.checkpoint_name(step)
    write_atomically(path, lambda file: _torch_save(snapshot, file))
    try:
        sidecar = wire.CheckpointSidecar(
            file=path.name,
            step=step,
            epoch=epoch,
            metrics=dict(metrics),
            size=path.stat().st_size,
            written_at=time.time(),
            reason=reason,
        )
        body = json.dumps(sidecar.to_json(), allow_nan=False).encode()
        write_atomically(directory / wire.sidecar_name(path.name), lambda file: file.write(body))
    except OSError:
        # Without its sidecar the server would never list it, and a failed save must not leave a latest .pt that
        # only a look at the folder would find.
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        raise
    return sidecar


def describe(error: OSError) -> str:
    """An OSError as a person reads it: `No space left on device (ENOSPC)`."""
    if error.errno is None:
        return str(error)
    return f"{os.strerror(error.errno)} ({errno.errorcode.get(error.errno, error.errno)})"


@dataclasses.dataclass(frozen=True)
class Policy:
    """Which checkpoints a run keeps; see the config fields of the same names."""

    keep_last: int = 0
    keep_best: int = 0
    best_metric: str = "loss"

    def kept(self, written: Sequence[wire.CheckpointSidecar]) -> set[int]:
        """The steps of the checkpoints to keep, given those written so far, oldest first; the last, just written,
        is always kept."""
        if not written or (self.keep_last == 0 and self.keep_best == 0):
            return {sidecar.step for sidecar in written}
        newest = [sidecar.step for sidecar in written[-self.keep_last :]] if self.keep_last else []
        best = [sidecar.step for sidecar in sorted(written, key=self._badness)[: self.keep_best]]
        return {*newest, *best, written[-1].step}

    def _badness(self, sidecar: wire.CheckpointSidecar) -> tuple[bool, float, int]:
        # Lower is better; NaN (or no value) is worse than any number, infinity included. Ties go to the earlier one.
        value = sidecar.metrics.get(self.best_metric, math.nan)
        return math.isnan(value), 0.0 if math.isnan(value) else value, sidecar.step


class Retention:
    """Deletes the checkpoints this run wrote that its policy no longer keeps; rank 0 calls `add` after each save.

    Only checkpoints this process wrote are candidates: another run's files in the same folder (the one a run was
    started from, say) are never deleted.
    """

    def __init__(self, directory: Path, policy: Policy, say: Callable[[str], None]) -> None:
        self.directory, self.policy, self._say = directory, policy, say
        self.written: list[wire.CheckpointSidecar] = []  # this run's checkpoints still kept, oldest first

    @property
    def latest(self) -> str | None:
        """The name of the newest checkpoint this run wrote, if any."""
        return self.written[-1].file if self.written else None

    def add(self, sidecar: wire.CheckpointSidecar) -> None:
        """Count a checkpoint just written, then delete the ones the policy no longer keeps."""
        self.written.append(sidecar)
        kept = self.policy.kept(self.written)
        for old in self.written:
            if old.step not in kept:
                self._remove(old)
        self.written = [sidecar for sidecar in self.written if sidecar.step in kept]

    def _remove(self, sidecar: wire.CheckpointSidecar) -> None:
        try:
            # The sidecar first: a .pt left alone by a crash here is still complete, and listed without metrics.
            freed = sum(_unlink(self.directory / name) for name in (wire.sidecar_name(sidecar.file), sidecar.file))
        except OSError as error:
            self._say(f"could not delete {sidecar.file}, which retention no longer keeps: {describe(error)}")
            return
        policy = dataclasses.asdict(self.policy)
        record = {"removed": sidecar.file, "step": sidecar.step, "freed": freed, "at": time.time(), "policy": policy}
        self._say(
            f"removed {sidecar.file}, freed {freed} bytes: not among the newest {self.policy.keep_last} nor the best "
            f"{self.policy.keep_best} by {self.policy.best_metric}"
        )
        try:
            with open(self.directory / wire.RETENTION_LOG, "ab") as log:
                log.write(json.dumps(record).encode() + b"\n")
        except OSError as error:
            self._say(f"could not record the removal of {sidecar.file} in {wire.RETENTION_LOG}: {describe(error)}")


def _unlink(path: Path) -> int:
    """Delete a file and return its size; 0 if someone already deleted it."""
    try:
        size = path.stat().st_size
        path.unlink()
    except FileNotFoundError:
        return 0
    return size


def init_from(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer | None, device: torch.device) -> int:
    """Load a checkpoint's weights into the bare model, and its optimizer state when given the optimizer; returns
    the step it was written at. Raises CheckpointError saying what is wrong with the file."""
    snapshot = _read_snapshot(path, device)
    try:
        model.load_state_dict(snapshot["model"])  # strict: every key, every shape
    except (RuntimeError, TypeError, AttributeError) as error:
        raise CheckpointError(f"init_from {path}: its model does not fit this workload's: {one_line(error)}") from None
    if optimizer is not None:
        _load_optimizer(path, snapshot, optimizer)
    step = snapshot.get("step")
    return step if isinstance(step, int) else 0


def newest(directory: Path) -> Path | None:
    """The checkpoint of the highest step in a folder, if it has any."""
    found = [(step, path) for path in directory.glob(wire.CHECKPOINT_GLOB) if (step := wire.checkpoint_step(path.name))]
    return max(found)[1] if found else None


def written_by_run(directory: Path) -> list[wire.CheckpointSidecar]:
    """The sidecars in a run's folder, oldest first: what a resumed run's retention goes on from."""
    sidecars = []
    for path in directory.glob(wire.CHECKPOINT_SIDECAR_GLOB):
        try:
            sidecars.append(wire.CheckpointSidecar.from_json(json.loads(path.read_bytes())))
        except (OSError, ValueError):
            continue  # a damaged sidecar: its checkpoint stays, listed without metrics, and is never deleted
    return sorted(sidecars, key=lambda sidecar: sidecar.step)


def load_snapshot(path: Path, device: torch.device, *, what: str) -> dict[str, Any]:
    """A checkpoint's contents, loaded safely onto this rank's device; `what` starts the error messages."""
    return _read_snapshot(path, device, what)


def _read_snapshot(path: Path, device: torch.device, what: str = "init_from") -> dict[str, Any]:
    try:
        with open(path, "rb") as file:
            magic = file.read(len(_ZIP_MAGIC))
    except FileNotFoundError:
        raise CheckpointError(f"{what} {path}: no such file") from None
    except OSError as error:
        raise CheckpointError(f"{what} {path}: cannot be read: {describe(error)}") from None
    if magic != _ZIP_MAGIC:
        raise CheckpointError(f"{what} {path}: not a Rankboard checkpoint (not a file torch.save writes)")
    try:
        # weights_only: a checkpoint is data; unpickling arbitrary objects from shared storage would run code.
        snapshot = torch.load(path, map_location=device, weights_only=True)
    except Exception as error:  # a damaged or foreign archive fails in many ways, KeyError and EOFError included
        raise CheckpointError(f"{what} {path}: not a Rankboard checkpoint ({one_line(error)})") from None
    if not isinstance(snapshot, dict) or "model" not in snapshot:
        found = "no 'model' key" if isinstance(snapshot, dict) else f"a {type(snapshot).__name__}, not a dict"
        raise CheckpointError(f"{what} {path}: not a Rankboard checkpoint ({found})")
    return snapshot


def _load_optimizer(path: Path, snapshot: Mapping[str, Any], optimizer: torch.optim.Optimizer) -> None:
    if "optimizer" not in snapshot:
        raise CheckpointError(f"init_from {path}: has no optimizer state ('optimizer' key), which init_optimizer needs")
    # The moments come from the checkpoint; the learning rate and the other settings stay this run's.
    settings = [{key: value for key, value in group.items() if key != "params"} for group in optimizer.param_groups]
    try:
        optimizer.load_state_dict(snapshot["optimizer"])
    except (ValueError, KeyError, TypeError, RuntimeError) as error:
        raise CheckpointError(f"init_from {path}: its optimizer state does not fit: {one_line(error)}") from None
    for group, own in zip(optimizer.param_groups, settings, strict=True):
        group.update(own)


def one_line(error: BaseException, limit: int = 300) -> str:
    text = " ".join(f"{type(error).__name__}: {error}".split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
