"""A run's logs: its files, their last lines, and the failures explained."""

from __future__ import annotations

from pydantic import BaseModel, Field


class LogFileOut(BaseModel):
    """One log file: `rank` is the global rank, null for the launcher's output (torchrun's agent on this host, or
    Slurm's output file of the job; stdout and stderr together)."""

    rank: int | None
    stream: str
    size: int
    attempt: int | None = Field(description="torchrun's restart attempt; each agent's latest one is listed.")
    rank_guessed: bool = Field(description="True when the rank is taken from the agent's order, because the script "
                               "does not import rankboard.report (which says each log's global rank); on several "
                               "nodes c10d may have numbered the ranks otherwise.")  # fmt: skip
    url: str = Field(description="Where its last lines are; add /download for the whole file.")


class TailOut(BaseModel):
    rank: int | None
    stream: str
    size: int
    lines: list[str]
    scanned: int = Field(description="Bytes read from the end of the file to find these lines.")
    budget_hit: bool = Field(description="True when the scan budget ran out before `lines` matches were found: "
                             "older lines were not searched.")  # fmt: skip


class DiagnosisOut(BaseModel):
    """One recognised failure: what it is, its likely cause, what to do, and the line that gave it away."""

    kind: str = Field(description="slurm_oom, slurm_node_failure, slurm_time_limit, slurm_preempted, "
                      "slurm_cancelled (Slurm's lines in its output file), cuda_oom, desync, peer_lost (a rank "
                      "failed because another stopped first), nccl_timeout, no_space, not_torchrun, address_in_use "
                      "or exception. Slurm's come first, then the others by the rank that failed first.")  # fmt: skip
    title: str
    cause: str
    advice: str
    rank: int | None = Field(description="The rank it was seen on first; null when only the launcher's output.")
    ranks: list[int] = Field(description="Every rank it was seen on, the first to fail first.")
    line: str
    traceback: str | None
    log_rank: int | None = Field(description="The log it was seen in: the rank of the file, null for the launcher's "
                                 "output. It differs from `rank` where torch's `[rank<n>]:` prefix names another, "
                                 "as in a --tee copy.")  # fmt: skip
    stream: str = Field(description="That log's stream: stdout or stderr (the launcher's output is one file, stdout).")


class RankOutput(BaseModel):
    """The last lines one rank wrote to stdout or stderr."""

    rank: int
    stream: str
    lines: list[str]
