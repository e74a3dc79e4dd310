"""The settings of a pipeline, checked once and frozen: what every process of it needs to know.

::

    ParallelReader(channel, **settings)
       | validate every value, resolve(channel) -> Source
       v
    PipelineConfig (frozen) --whole--> reader process (each pass)     parrecio.pipeline.reader_proc
                            --whole--> decoder processes (at start)   parrecio.pipeline.worker
                            --whole--> Run / InlineRun (each pass)    parrecio.pipeline.run / inline

Nothing is copied field by field into per-process config objects: a process reads what it needs from
the one object, and what is not a setting (the source, the epoch, shared-memory names) travels beside it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, FrozenSet, Optional, Tuple

from .shipping import ship
from .slots import SlotLayout

__all__ = ["PipelineConfig"]


@dataclass(frozen=True)
class PipelineConfig:
    """Every setting of one ParallelReader (see its docstring for their meaning and units)."""

    # what a group is, and what the user gets
    decoders: Tuple[Any, ...]          # one per record position of a group
    names: Tuple[str, ...]             # field names (for dicts and messages)
    kind: str                          # "single" | "tuple" | "dict": the shape of a sample
    passthrough: Tuple[bool, ...]      # fields whose payload is handed out as bytes, never decoded
    kinds: Tuple[Optional[FrozenSet[str]], ...]  # payload kinds each field reads (None: any): resync.py
    layout: SlotLayout                 # where fixed-shape outputs live in an output slot
    travels: Tuple[bool, ...]          # fields whose values (or part of them) travel back from workers
    batch_size: Optional[int]
    drop_last: bool
    # the stream
    join: str                          # "mxnet" | "concat"
    on_error: str                      # "raise" | "skip"
    max_record_bytes: int
    num_shards: int
    shard_index: int
    even_shards: Optional[str]         # None | "pad" | "drop": equal shard lengths (parrecio.pipeline.plan)
    shuffle_mode: Optional[str]        # None | "buffer" (a stream's shuffle buffer) | "index" (a global permutation)
    shuffle_buffer: int                # groups
    shuffle_buffer_bytes: int          # payload bytes those groups may hold
    seed: int
    index_paths: Tuple[Tuple[str, str], ...]  # ((rec, idx), ...) when every file has an index
    # processes and memory
    workers: int                       # 0: decode in the consumer's process
    start_method: str
    ring_bytes: int                    # input ring size
    chunk_groups: Optional[int]        # groups per chunk; None: adaptive
    chunk_bytes: int                   # a chunk's payloads reach at most about this many bytes
    oneoff_budget: int                 # bytes of one-off segments in flight
    mapped_budget: int                 # bytes of in-place (mmapped) groups in flight
    prefetch: int                      # tasks queued per worker
    # liveness (seconds)
    poll_interval: float
    drain_timeout: float
    task_timeout: Optional[float]

    def __reduce__(self):
        # A child gets the decoders shipped as they are now, when it starts (by value where pickle by
        # reference cannot reach them), as bytes that a decoder process loads itself (shipping.unship),
        # where a failure can be reported; the reader process never loads them.
        state = {f.name: getattr(self, f.name) for f in fields(self)}
        state["decoders"] = ship(self.decoders, self.names, self.start_method)
        return (_config_from, (state,))

    @property
    def nfields(self) -> int:
        return len(self.names)  # not the decoders: in a child they are one Shipped until unshipped

    @property
    def shuffle(self) -> bool:
        """Whether the groups are shuffled, as the reader was asked (``shuffle_mode`` says how)."""
        return self.shuffle_mode is not None

    @property
    def by_index(self) -> bool:
        """Groups are read by their ``.idx`` offsets (a global shuffle, or equal shards of indexed
        files), not by streaming the files."""
        return bool(self.index_paths) and (self.shuffle_mode == "index" or self.even_shards is not None)

    @property
    def slot_size(self) -> int:
        return self.layout.slot_size

    @property
    def mapped_chunk_bytes(self) -> int:
        """The payload bytes a chunk of groups read in place from a mapped file may reach: its share of
        the mapped budget when every worker holds ``prefetch`` chunks and two more wait (never less than
        ``chunk_bytes``).  A chunk in the ring is held to ``chunk_bytes`` (1/8 of the ring) so that the
        ring holds several; one read in place takes no ring space, and cutting it there too made tasks
        of ~100 KB photos 73 groups instead of two batches' 128, at ~0.5 ms of the consumer's time each."""
        return max(self.chunk_bytes, self.mapped_budget // (self.workers * self.prefetch + 2))

    def reader_chunk_groups(self) -> Optional[int]:
        """Groups per chunk for the reader process (None: adaptive).  With fixed-shape outputs a chunk
        fills two output slots (two batches), so that batches come out as spans of one slot, zero-copy,
        and the consumer's per-task cost (~0.3-0.7 ms on a busy 2-core host) is spread over
        ``2 * batch_size`` samples.  Without decoders the consumer copies payloads itself: chunks of
        1024 groups at least."""
        groups = self.chunk_groups
        if all(self.passthrough):
            return None if groups is None else max(groups, 1024)
        if groups is None and self.layout.has_fixed:
            return 2 * self.slot_size
        return groups


def _config_from(state: dict) -> PipelineConfig:
    return PipelineConfig(**state)
