"""Counters and stage timings of a ParallelReader, to see which stage limits throughput."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict

__all__ = ["Stats"]


_RARE = ("skipped", "skipped_records", "skipped_bytes", "sharded_out", "reruns", "workers_replaced",
         "reader_copied_bytes")
_TIMES = ("wall_time", "startup_time", "read_time", "wait_source_time", "wait_consumer_time",
          "wait_workers_time", "user_time", "reader_cpu")


@dataclass(repr=False)
class Stats:
    """Totals over the reader's life (all epochs).  Times are seconds.

    - ``read_time``: the reader process reading the source;
    - ``wait_source_time``: the reader process waiting for data from a slow stream (a FIFO, stdin);
    - ``wait_consumer_time``: the reader process waiting for ring space, i.e. for the consumer;
    - ``wait_workers_time``: the consumer waiting inside ``next()`` for decoded samples (decode-bound);
    - ``user_time``: the consumer's time outside ``next()`` (your training step);
    - ``reader_cpu``: CPU seconds of the reader process (all passes);
    - ``reader_copied_bytes``: payload bytes the reader process copied into shared memory (0 when every
      payload was handed to the decoders where it was read: regular files mapped, streams read straight
      into the input ring; multipart records, shuffle buffers and oversized groups are copied);
    - ``decode_cpu``: CPU seconds per worker pid spent decoding;
    - ``wall_time``: time from the first ``next()`` of each pass to its end, summed over passes;
    - ``startup_time``: of that, the time until each pass's first sample (processes starting, the first
      records arriving), left out of the bottleneck verdict, which is about the steady state.

    :attr:`bottleneck` names the stage that limits throughput.
    """
    epochs: int = 0             # passes begun (one left early too)
    samples: int = 0            # samples (not batches) handed out (mid-pass: as of the last block)
    records: int = 0            # records read (a group is as many records as fields)
    bytes: int = 0              # payload bytes of those records
    skipped: int = 0            # samples dropped under on_error="skip" (decode errors, broken groups)
    skipped_records: int = 0    # corrupt framing regions skipped by the RecordIO reader
    padded: int = 0             # copies that kept an even shard's count after skips (pipeline.padding)
    skipped_bytes: int = 0      # bytes of those corrupt regions
    sharded_out: int = 0        # groups left to the other shards
    chunks: int = 0             # chunks of groups the reader process sent (tasks for the decoders)
    reruns: int = 0             # tasks re-run after a worker died
    workers_replaced: int = 0
    read_time: float = 0.0
    wait_source_time: float = 0.0
    wait_consumer_time: float = 0.0
    wait_workers_time: float = 0.0
    user_time: float = 0.0
    reader_cpu: float = 0.0
    reader_copied_bytes: int = 0
    wall_time: float = 0.0
    startup_time: float = 0.0
    workers: int = 0
    decode_cpu: Dict[int, float] = field(default_factory=dict)
    decoded: Dict[int, int] = field(default_factory=dict)  # groups decoded per worker pid

    def add_reader(self, rs: dict) -> None:
        """Add a pass's reading counters: what the reader process sent at its end, or the group stream's
        (:meth:`~parrecio.pipeline.groups.GroupStream.counters`) of a pass in this process."""
        self.records += rs.get("records", 0)
        self.bytes += rs.get("bytes", 0)
        self.skipped += rs.get("skipped_groups", 0)
        self.skipped_records += rs.get("skipped_records", 0)
        self.skipped_bytes += rs.get("skipped_bytes", 0)
        self.sharded_out += rs.get("sharded_out", 0)
        self.read_time += rs.get("read_time", 0.0)
        self.wait_source_time += rs.get("wait_source_time", 0.0)
        self.wait_consumer_time += rs.get("wait_consumer_time", 0.0)
        self.reader_cpu += rs.get("cpu_time", 0.0)
        self.reader_copied_bytes += rs.get("copied_bytes", 0)

    def add_worker(self, pid: int, cpu: float, n: int) -> None:
        """Count ``n`` groups decoded by worker ``pid`` in ``cpu`` seconds."""
        self.decode_cpu[pid] = self.decode_cpu.get(pid, 0.0) + cpu
        self.decoded[pid] = self.decoded.get(pid, 0) + n

    @property
    def bottleneck(self) -> str:
        """``"consumer"`` (samples are ready before you ask: your loop is the limit), ``"decode"`` (the
        decoder processes are busy), ``"source"`` (the reader process waits on the stream), or
        ``"unknown"`` (too little data, or no stage stands out)."""
        wall = self.wall_time - self.startup_time
        if wall <= 0 or self.samples == 0:
            return "unknown"
        if self.wait_workers_time - self.startup_time < 0.15 * wall:
            return "consumer"
        if self.workers and sum(self.decode_cpu.values()) >= 0.6 * wall * self.workers:
            return "decode"
        if self.read_time + self.wait_source_time >= 0.5 * wall:
            return "source"
        return "decode" if self.workers and self.decode_cpu else "unknown"

    def __repr__(self) -> str:
        """The counts, the times to four digits (seconds), the rare counters only when not 0, and the verdict."""
        parts = [f"{name}={getattr(self, name)}" for name in ("epochs", "samples", "records", "bytes")]
        parts += [f"{name}={getattr(self, name)}" for name in _RARE if getattr(self, name)]
        parts += [f"{name}={getattr(self, name):.4g}" for name in _TIMES]
        parts.append(f"decode_cpu={sum(self.decode_cpu.values()):.4g}")
        parts += [f"workers={self.workers}", f"bottleneck={self.bottleneck!r}"]
        return f"Stats({', '.join(parts)})"

    def as_dict(self) -> dict:
        """Every counter and the bottleneck verdict, as plain data (for JSON)."""
        d = dict(self.__dict__)
        d["decode_cpu"] = dict(self.decode_cpu)
        d["decoded"] = dict(self.decoded)
        d["bottleneck"] = self.bottleneck
        return d
