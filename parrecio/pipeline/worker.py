"""A decoder process: payloads from the input ring -> decoded values -> output slots / result messages.

::

    consumer --Task--> [ worker ] --TaskDone--> consumer
                          |  reads payloads: input ring (memoryview slices, no copy)
                          |  writes fixed-shape results: output slots (numpy views of shared memory)

Each worker has its own task and result pipes, so a worker killed in the middle of a message breaks
nothing shared (a shared queue's lock would be left held).  It leaves when told to stop, when its
pipes close, or when the consumer dies (the lifeline pipe reports EOF): then it removes the run's
shared memory, since the consumer cannot.
"""

from __future__ import annotations

import os
import random
import signal
import time
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any, Dict, List, Optional

import numpy as np

from ..decoders.base import OutputSpec, write_into
from .messages import RemoteError, Stop, Task, TaskDone
from .shm import Segment, sweep
from .slots import SlotLayout

__all__ = ["WorkerConfig", "worker_main"]


@dataclass
class WorkerConfig:
    """What every worker needs, sent once at start (decoders are pickled here, never per task)."""
    decoders: List[Any]          # one per field
    specs: List[OutputSpec]      # output_spec per field
    passthrough: List[bool]      # fields the consumer copies out itself
    layout: SlotLayout
    ring_name: str
    prefix: str                  # shm name prefix of this reader, swept if the consumer dies
    seed: int
    poll_interval: float = 1.0   # seconds between liveness checks while idle


def worker_main(cfg: WorkerConfig, index: int, task_conn, result_conn, lifeline) -> None:
    """Entry point of a decoder process (``index`` is its number, for seeding)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the consumer's to handle; it stops us
    random.seed(cfg.seed + index)
    np.random.seed((cfg.seed + index) % 2**32)
    ring = Segment.attach(cfg.ring_name)
    slots: Dict[str, tuple] = {}
    try:
        while True:
            ready = wait([task_conn, lifeline], cfg.poll_interval)
            if lifeline in ready:  # the consumer is gone: clean up after it
                sweep(cfg.prefix)
                return
            if task_conn not in ready:
                continue
            msg = task_conn.recv()
            if isinstance(msg, Stop):
                return
            result_conn.send(_run_task(cfg, msg, ring, slots))
    except (EOFError, OSError):
        # Our pipes broke: the consumer closed them, or died (then its lifeline says so soon after).
        if lifeline.poll(cfg.poll_interval):
            sweep(cfg.prefix)
    finally:
        for seg, _ in slots.values():
            seg.close()
        ring.close()


_NO_OUTS: List[Any] = []


def _run_task(cfg: WorkerConfig, task: Task, ring: Segment, slots: Dict[str, tuple]) -> TaskDone:
    cpu0 = time.process_time()
    seg = ring if task.segment == cfg.ring_name else Segment.attach(task.segment)
    mem = memoryview(seg.buf).toreadonly()
    dests = _expand_dest(task, cfg.layout, slots)
    nf = len(cfg.decoders)
    values: list = []
    try:
        for j in range(task.n):
            outs = dests[j] or _NO_OUTS
            vals: List[Any] = [None] * nf
            base = j * nf
            f = -1
            try:
                for f in range(nf):
                    if cfg.passthrough[f]:
                        continue
                    off = task.ring_offs[base + f]
                    payload = mem[off:off + task.lens[base + f]]
                    try:
                        spec = cfg.specs[f]
                        if spec is None:
                            vals[f] = cfg.decoders[f](payload)
                        else:
                            vals[f] = write_into(cfg.decoders[f], payload, spec, outs[f])
                    finally:
                        payload.release()
                values.append(tuple(vals))
            except Exception as exc:  # a decode error is data: it is raised at its sequence number
                values.append(RemoteError(exc, f))
    finally:
        mem.release()
        if seg is not ring:
            seg.close()
    return TaskDone(task.task_id, values, time.process_time() - cpu0, os.getpid())


def _expand_dest(task: Task, layout: SlotLayout, slots: Dict[str, tuple]) -> List[Optional[list]]:
    """Per group of the task, the ``out`` arguments of its fields (None where nothing is fixed)."""
    dests: List[Optional[list]] = [None] * task.n
    for name, g0, i0, count in task.dest:
        entry = slots.get(name)
        if entry is None:  # a slot this worker has not seen yet (the pool grew): map it once
            seg = Segment.attach(name)
            entry = slots[name] = (seg, layout.arrays(seg.buf))
        arrays = entry[1]
        for k in range(count):
            dests[g0 + k] = layout.outs(arrays, i0 + k)
    return dests
