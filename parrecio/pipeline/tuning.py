"""``Tuning``: the settings of a ParallelReader that rarely need touching, apart from the ones that say
what you get (fields, batches, shuffling, sharding, errors).

::

    ParallelReader("train.rec", fields=..., batch_size=64, tuning=Tuning(ring_bytes=16 << 20))

The defaults fit a training job; the figures in the README and ``bench/`` say when another value pays.
Every value is checked when the Tuning is made, with an error naming it.
"""

from __future__ import annotations

import multiprocessing
import numbers
from dataclasses import dataclass, fields
from typing import Any, Optional

from ..recordio import DEFAULT_MAX_RECORD_BYTES

__all__ = ["Tuning", "TUNING_KEYWORDS", "count", "seconds", "MIN_RING_BYTES"]

MIN_RING_BYTES = 64 << 10  # below this, groups of ordinary records would all need one-off segments


def count(name: str, value: Any, minimum: int = 1, maximum: Optional[int] = None) -> int:
    """``value`` as an int in ``minimum..maximum`` (no upper bound when ``maximum`` is None), or a ValueError
    (TypeError for a non-integer: a float, even ``2.0``, a bool, a string) naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int >= {minimum}, not {type(value).__name__} ({value!r})")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, not {value!r}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, not {value!r}")
    return int(value)


def seconds(name: str, value: Any) -> float:
    """``value`` as a positive number of seconds, or a ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number of seconds, not {type(value).__name__} ({value!r})")
    if not 0 < value < float("inf"):
        raise ValueError(f"{name} must be a positive number of seconds, not {value!r}")
    return float(value)


@dataclass(frozen=True)
class Tuning:
    """How a ParallelReader does its work (what it delivers does not depend on any of these).

    Args:
        ring_bytes: size of the input ring in bytes (shared memory): bounds the payload bytes of
            streams in flight.  Shrunk, with a warning, when /dev/shm has less free.
        chunk_groups: groups per task sent to a decoder process (amortizes the per-task cost of ~0.1-0.5
            ms in the consumer); ``None``: adaptive -- with fixed-shape outputs two output slots (two
            batches), else at least 64 groups and more for small records (up to 64 KiB of payload, 2048
            groups); at least 1024 groups with ``fields=None``.  A task also ends at a payload byte cap:
            ``max(1 MiB, ring_bytes / 8)`` for records that pass through the ring (streams), a share of the mapped
            budget (``4 * ring_bytes / (workers * prefetch + 2)``) for files read in place.
        prefetch: tasks in flight per decoder process (one being decoded, the others queued).  With 2 or
            more the consumer waits for results two at a time (``parrecio.pipeline.pairing``).
        slot_samples: samples per output slot when ``batch_size`` is None; ``None`` (default): as many
            fixed-shape outputs as fill about 4 MiB, 8 to 256 samples (27 images of 224x224x3).
        max_record_bytes: larger records are refused as corrupt (a hostile length word), in bytes.
        start_method: ``"forkserver"`` (default where available), ``"spawn"`` or ``"fork"``.
        task_timeout: seconds a decoder process may hold work without returning a result before it is
            killed and its groups re-run (a sample that hangs twice is a poison record); ``None``: never.
    """

    ring_bytes: int = 64 << 20
    chunk_groups: Optional[int] = None
    prefetch: int = 2
    slot_samples: Optional[int] = None
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
    start_method: Optional[str] = None
    task_timeout: Optional[float] = 600.0

    def __post_init__(self) -> None:
        put = object.__setattr__  # frozen: the checked values replace the given ones once, here
        put(self, "ring_bytes", count("ring_bytes", self.ring_bytes, minimum=MIN_RING_BYTES))
        if self.chunk_groups is not None:
            put(self, "chunk_groups", count("chunk_groups", self.chunk_groups))
        put(self, "prefetch", count("prefetch", self.prefetch))
        if self.slot_samples is not None:
            put(self, "slot_samples", count("slot_samples", self.slot_samples))
        put(self, "max_record_bytes", count("max_record_bytes", self.max_record_bytes))
        if self.task_timeout is not None:
            put(self, "task_timeout", seconds("task_timeout", self.task_timeout))
        methods = multiprocessing.get_all_start_methods()
        if self.start_method is not None and self.start_method not in methods:
            raise ValueError(f"start_method must be one of {methods} or None, not {self.start_method!r}")


TUNING_KEYWORDS = frozenset(f.name for f in fields(Tuning))

SLOT_BYTES = 4 << 20  # what an unbatched output slot aims to hold


def slot_samples(tuning: Tuning, sample_bytes: int) -> int:
    """Samples per output slot without ``batch_size``: the tuning's, or what fills ~4 MiB (8..256)."""
    if tuning.slot_samples is not None:
        return tuning.slot_samples
    return max(8, min(256, SLOT_BYTES // max(1, sample_bytes)))
