"""Output slots grown for batches the user kept are given back once the user lets go of them.

``list(reader)`` (or any loop that keeps its batches) grows the pool of output slots, one shared-memory
segment per batch: that is what lets a user keep batches at all.  The grown pool stayed, in /dev/shm and
mapped in the consumer and in every decoder process (a descriptor each), until ``close()``: one
``list(reader)`` of 224x224 images pinned ~120 MiB for the rest of training.  Now a pass starts by giving
back the free slots past the initial number (``SlotPool.retire``), and each decoder process unmaps them
with its next task (``Task.retired``)."""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest

from parrecio import ParallelReader
from pipeline_helpers import Fixed, digest_array, payloads, write_rec


def _slot_files(prefix):
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(prefix) and n[len(prefix):].startswith("s"))


def _mapped(pid, names):
    """Which of the segments ``names`` process ``pid`` maps."""
    found = set()
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.rstrip("\n").split(None, 5)
            if len(parts) == 6:
                found.add(os.path.basename(parts[5].removesuffix(" (deleted)")))
    return found & set(names)


@pytest.mark.parametrize("workers", [1, 2])
def test_slots_grown_for_kept_batches_are_given_back(tmp_path, workers, no_leaks):
    path = tmp_path / "s.rec"
    recs = payloads(600, seed=3)
    write_rec(path, recs)
    want = np.stack([digest_array(r) for r in recs])
    with ParallelReader(str(path), fields=Fixed(), workers=workers, batch_size=8) as reader:
        kept = list(reader)  # 75 batches held: the pool grows to about that many slots
        pool, prefix = reader._res.slots, reader._res.prefix
        grown = len(pool.segments)
        grown_names = [seg.name for seg in pool.segments.values()]
        assert grown > pool.initial + 40 and len(_slot_files(prefix)) == grown
        assert np.array_equal(np.concatenate(kept), want)
        some = kept[10].copy()
        keep_one = kept[10]  # one batch the user goes on holding: its slot stays
        del kept
        gc.collect()
        again = list(reader)  # a pass starts: the free slots past the initial number go
        assert np.array_equal(np.concatenate(again), want)  # (this pass keeps its batches too: it grows
        del again                                             # again, by about as many)
        gc.collect()
        got = [b.copy() for b in reader]  # batches not kept: nothing grows
        assert np.array_equal(np.concatenate(got), want)
        live = len(pool.segments)
        assert live <= pool.initial + 1  # the initial slots, and the one still held
        assert len(_slot_files(prefix)) == live
        retired = set(grown_names) - {seg.name for seg in pool.segments.values()}
        assert len(retired) >= grown - pool.initial - 1
        for pid in reader.worker_pids:  # every worker got tasks since: it unmapped them too
            assert _mapped(pid, retired) == set(), pid
        assert _mapped(os.getpid(), retired) == set()
        assert np.array_equal(keep_one, some)  # the batch held all along is untouched
