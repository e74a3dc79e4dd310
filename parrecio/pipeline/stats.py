"""Counters and stage timings of a ParallelReader, to see which stage limits throughput."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict

__all__ = ["Stats"]


@dataclass
class Stats:
    """Totals over the reader's life (all epochs).  Times are seconds.

    - ``read_time``: the reader process reading the source (source-bound when it dominates);
    - ``wait_consumer_time``: the reader process waiting for ring space, i.e. for the consumer;
    - ``wait_workers_time``: the consumer waiting inside ``next()`` for decoded samples (decode-bound);
    - ``user_time``: the consumer's time outside ``next()`` (your training step);
    - ``decode_cpu``: CPU seconds per worker pid spent decoding.
    """
    epochs: int = 0
    samples: int = 0
    records: int = 0
    bytes: int = 0
    skipped: int = 0            # samples dropped under on_error="skip" (decode errors, broken groups)
    skipped_records: int = 0    # corrupt framing regions skipped by the RecordIO reader
    skipped_bytes: int = 0
    sharded_out: int = 0        # groups left to the other shards
    chunks: int = 0
    reruns: int = 0             # tasks re-run after a worker died
    workers_replaced: int = 0
    read_time: float = 0.0
    wait_consumer_time: float = 0.0
    wait_workers_time: float = 0.0
    user_time: float = 0.0
    decode_cpu: Dict[int, float] = field(default_factory=dict)
    decoded: Dict[int, int] = field(default_factory=dict)

    def add_reader(self, rs: dict) -> None:
        self.records += rs.get("records", 0)
        self.bytes += rs.get("bytes", 0)
        self.skipped += rs.get("skipped_groups", 0)
        self.skipped_records += rs.get("skipped_records", 0)
        self.skipped_bytes += rs.get("skipped_bytes", 0)
        self.sharded_out += rs.get("sharded_out", 0)
        self.read_time += rs.get("read_time", 0.0)
        self.wait_consumer_time += rs.get("wait_consumer_time", 0.0)

    def add_worker(self, pid: int, cpu: float, n: int) -> None:
        self.decode_cpu[pid] = self.decode_cpu.get(pid, 0.0) + cpu
        self.decoded[pid] = self.decoded.get(pid, 0) + n

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        d["decode_cpu"] = dict(self.decode_cpu)
        d["decoded"] = dict(self.decoded)
        return d
