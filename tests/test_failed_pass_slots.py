"""A pass that ends with an error must not keep output slots leased through the error's traceback.

The traceback keeps the pipeline's generator frames, and those frames are part of a reference cycle
(the exception in a local of a frame it keeps), so they live until the garbage collector runs: spans or
the last batch left in their locals kept their slots leased that long, and each later pass, finding no
free slot, grew the pool by one (4 -> 5 -> 7 -> 9 slots over four failed passes with the collector off;
found by the long differential exploration as "5 output slots, more than the bound 4")."""

from __future__ import annotations

import gc

import pytest

from parrecio import CorruptRecordError, ParallelReader, RecordWriter, Tuning
from parrecio.decoders import Raw
from pipeline_helpers import Fixed


@pytest.fixture
def truncated(tmp_path):
    path = tmp_path / "t.rec"
    with RecordWriter(str(path)) as w:
        for i in range(400):
            w.write(b"x%d" % i * 10)
            w.write(b"y%d" % i)
    data = path.read_bytes()
    path.write_bytes(data[:-7])  # the last record cut short: every pass ends with CorruptRecordError
    return path


@pytest.mark.parametrize("batch_size", [64, None])
def test_failed_passes_do_not_grow_the_slot_pool(truncated, no_leaks, batch_size):
    gc.collect()
    gc.disable()  # the cycles stay: only what the pipeline lets go of by itself is freed
    try:
        with ParallelReader(truncated, fields=[Raw(), Fixed()], workers=2, batch_size=batch_size,
                            drop_last=batch_size is not None, tuning=Tuning(chunk_groups=3, prefetch=3)) as r:
            counts, errors = [], []
            for _ in range(5):
                it = iter(r)
                try:
                    for item in it:
                        del item
                except CorruptRecordError as exc:
                    errors.append((exc.offset, exc.index))
                finally:
                    it.close()
                counts.append(r.telemetry()["queues"]["slots"])
            assert len(errors) == 5 and len(set(errors)) == 1
            assert counts == [counts[0]] * 5, counts
    finally:
        gc.enable()


def test_a_slot_whose_last_view_dies_as_its_pass_lets_go_is_freed_once():
    """The tracker's own lease held the last view (rows handed out and dropped, the pass ended before the
    rest came): the weakref callback queued the slot, finish()'s poll() freed it, and finish() freed it
    again -- one shared-memory slot in the free list twice, for two batches at once."""
    import numpy as np
    from parrecio.decoders import ArraySpec
    from parrecio.pipeline.shm import new_prefix
    from parrecio.pipeline.slots import SlotLayout, SlotPool, SlotTracker

    pool = SlotPool(SlotLayout([ArraySpec((4,), np.dtype("uint8"))], 8), new_prefix(), 2)
    try:
        tracker = SlotTracker(pool)
        tracker.reserve(5, False)           # 5 groups: physical slot 0, rows 0..4
        lease, _ = tracker.deliver(0, 3)    # rows 0..2 handed out, then dropped
        del lease
        tracker.close()                     # the pass ends before rows 3..4 come
        pool.poll()
        assert sorted(pool.free) == [0, 1]
        assert {pool.acquire(False), pool.acquire(False)} == {0, 1} and pool.acquire(False) is None
    finally:
        pool.close()
