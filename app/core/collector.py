"""Python's cyclic garbage collector, tuned for a server process once its app is built.

With the defaults (a young collection every 700 new objects, a full one every 100 young ones), a server ingesting a
1,024-GPU job (bench/big_job.py, 128 nodes x 8 GPUs) spent ~0.35 of a core collecting: each post makes thousands of
short-lived objects, and each full collection walked every module, schema and SQLAlchemy object made at the start,
which live as long as the process. Frozen (`gc.freeze`), those are never walked again; the young generation is
collected every YOUNG objects. Freed objects are freed as before, by their reference counts; only cycles wait longer.

Not in tests' processes: freezing there would keep every earlier test's cycles for good.
"""

from __future__ import annotations

import gc

YOUNG = 10_000


def settle() -> None:
    """Freezes every object alive now, and collects the young generation every YOUNG new objects."""
    gc.collect()
    gc.freeze()
    _young, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG, middle, old)
