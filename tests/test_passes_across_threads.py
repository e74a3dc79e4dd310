"""A new pass while an older one is left unfinished: in this thread, or in another thread that holds its
iterator suspended (a framework's prefetch or pool thread that outlives it: tf.data, Keras stopped
early, a background-generator thread).  The new pass ends the older one, which raises if resumed; only a
thread that is inside the older pass's ``next()`` right now makes a new one from elsewhere refused.  And
where the stream stands (``state_dict()``) is the newest pass's: an older iterator dropped late does not
put it back."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from parrecio import ParallelReader
from parrecio.errors import PipelineError
from pipeline_helpers import Fixed, digest_array, payloads, write_rec


@pytest.fixture
def rec(tmp_path):
    recs = payloads(300, seed=3)
    path = tmp_path / "t.rec"
    write_rec(path, recs)
    return path, recs


def _same(batches, recs, batch):
    got = np.concatenate(batches)
    assert got.shape[0] == len(recs)
    assert all(np.array_equal(a, digest_array(p)) for a, p in zip(got, recs))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_pass_left_suspended_in_a_live_thread_is_ended_by_a_new_one(rec, workers, no_leaks):
    """It was refused ("being iterated by another thread") for as long as that thread lived: after Keras
    stopped early, every later fit/evaluate on the reader failed."""
    path, recs = rec
    with ParallelReader(path, fields=Fixed(), workers=workers, batch_size=32) as reader:
        started, resume, outcome = threading.Event(), threading.Event(), []

        def old_pass():
            it = iter(reader)
            outcome.append(next(it).copy())
            started.set()
            resume.wait(60)  # alive, its iterator suspended
            try:
                next(it)
                outcome.append("resumed")
            except PipelineError as e:
                outcome.append(str(e))

        t = threading.Thread(target=old_pass, name="prefetch-like")
        t.start()
        assert started.wait(60)
        _same([b.copy() for b in reader], recs, 32)            # a whole pass, from this thread
        resume.set()
        t.join(60)
        assert np.array_equal(outcome[0], np.stack([digest_array(p) for p in recs[:32]]))
        assert outcome[1] == "this pass was ended by close() or by a new iteration of the same ParallelReader"
        _same([b.copy() for b in reader], recs, 32)             # and the next one


@pytest.mark.parametrize("workers", [0, 2])
def test_an_older_iterator_dropped_late_does_not_move_the_state_back(rec, workers, no_leaks):
    """An epoch-0 iterator kept after 2 batches, epoch 1 read whole (ending epoch 0's pass), then the old
    iterator dropped: state_dict() went from (epoch 2, position 0) back to (epoch 0, position 64)."""
    path, _ = rec
    with ParallelReader(path, fields=Fixed(), workers=workers, batch_size=32) as reader:
        old = iter(reader)
        next(old)
        next(old)
        assert sum(len(b) for b in reader) == 300                 # epoch 1, whole
        before = reader.state_dict()
        assert (before["epoch"], before["position"]) == (2, 0)
        del old
        after = reader.state_dict()
        assert (after["epoch"], after["position"]) == (2, 0)
