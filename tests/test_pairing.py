"""Results waited for in pairs (parrecio.pipeline.pairing): the board and bell protocol alone, with two
processes racing to finish, and in real pipelines -- fewer wake-ups, the same samples, no stall when
a worker dies or a result frame is larger than its pipe."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import random
import time

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from parrecio import ParallelReader, Tuning
from parrecio.pipeline import run as run_mod
from parrecio.pipeline.pairing import BOARD_ENTRIES, Bell, Pairs, Ringer
from parrecio.pipeline.poller import Poller
from parrecio.pipeline.pool import ALL, BELL
from parrecio.pipeline.shm import new_prefix
from pipeline_helpers import Fixed, KillOnceOn, Sleepy, digest_array, payloads, write_rec


def _rings(bell: Bell) -> int:
    try:
        return len(os.read(bell.fd, 1 << 16))
    except BlockingIOError:
        return 0


@settings(max_examples=40, deadline=None)
@given(data=st.data(), pairs=st.integers(1, 3 * BOARD_ENTRIES // 2), window=st.integers(1, 8))
def test_the_second_of_each_pair_rings_in_any_order_and_old_flags_never_count(data, pairs, window):
    """Pair members finish in any order (within a window of pairs in flight, far past the board's size):
    the one that finishes second rings, the first does not, whichever of two workers ran each."""
    b = Bell(multiprocessing.get_context(), new_prefix() + "pairs")
    ringers = []
    rnd = random.Random(data.draw(st.integers(0, 2**32 - 1)))
    try:
        ringers += [Ringer(b.name, b.w), Ringer(b.name, b.w)]
        numbers = list(range(2 * pairs))
        order = []
        for lo in range(0, len(numbers), 2 * window):  # shuffled within each window of pairs
            part = numbers[lo:lo + 2 * window]
            rnd.shuffle(part)
            order += part
        done = set()
        for p in order:
            rnd.choice(ringers).done(p)
            done.add(p)
            assert _rings(b) == (1 if p ^ 1 in done else 0), (p, sorted(done)[-4:])
    finally:
        for r in ringers:
            r.close()
        b.close()


def test_pairs_number_from_an_even_start():
    p = Pairs()
    assert [p.next() for _ in range(3)] == [0, 1, 2]
    p.align()
    assert p.next() == 4
    p.align()
    assert p.next() == 6  # (already even: unchanged)


def _racer(name, w, side, rounds, barrier):
    ringer = Ringer(name, w)
    for k in range(rounds):
        barrier.wait()
        ringer.done(2 * k + side)
        barrier.wait()
    ringer.close()


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_two_workers_finishing_a_pair_at_once_never_lose_the_ring(method, no_leaks):
    """Two processes finish the two halves of each pair at the same moment (released by a barrier),
    thousands of times: every pair rings at least once (the FIONREAD through the bell pipe's mutex
    orders their marks), and no more than twice."""
    ctx = multiprocessing.get_context(method)
    b = Bell(ctx, new_prefix() + "pairs")
    rounds = 1500
    barrier = ctx.Barrier(3)
    procs = [ctx.Process(target=_racer, args=(b.name, b.w, side, rounds, barrier)) for side in (0, 1)]
    try:
        for p in procs:
            p.start()
        counts = []
        for _ in range(rounds):
            barrier.wait(30)
            barrier.wait(30)
            counts.append(_rings(b))
        assert min(counts) >= 1 and max(counts) <= 2
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
        b.close()


class _Waits:
    """Counts the consumer's blocking waits by what they watched, and the waits that ran into their
    timeout (nothing ready) while some result pipe was not watched (on the bell, or on one worker):
    the stall these tests look for, a frame left in a pipe the consumer did not watch.  A wait on
    every result pipe that runs into its timeout cannot be one (any byte of any worker would end it):
    the decoders did not finish within POLL_INTERVAL -- workers still starting at the pass's first
    wait, or a loaded machine.  Those are counted apart (``idle``) and asserted on by no test."""

    def __init__(self, monkeypatch):
        self.by_mode = {}
        self.timeouts = 0
        self.idle = 0
        step, wait = run_mod.Run._step, Poller.wait
        waits = self
        current = [None]

        def counted_step(run, timeout):
            current[0] = run
            step(run, timeout)
            if timeout:
                waits.by_mode[run._watch] = waits.by_mode.get(run._watch, 0) + 1

        def counted_wait(poller, timeout):
            ready = wait(poller, timeout)
            if timeout and not ready:
                run = current[0]  # (Run._step sets run._watch before it waits)
                if run is not None and run._watch == ALL:
                    waits.idle += 1
                else:
                    waits.timeouts += 1
            return ready

        monkeypatch.setattr(run_mod.Run, "_step", counted_step)
        monkeypatch.setattr(Poller, "wait", counted_wait)

    @property
    def total(self) -> int:
        return sum(self.by_mode.values())


class SleepyRagged(Sleepy):
    """Sleepy's digest, and a ragged value that travels back in the result frame: its first 8 bytes
    (small frames), or with ``size``, that many bytes (frames larger than a pipe holds)."""

    def __init__(self, max_ms=2.0, size=0):
        super().__init__(max_ms)
        self.output_spec = (self.output_spec, None)
        self.size = size

    def tail(self, payload):
        return bytes(payload[:8]) * (self.size // 8 if self.size else 1)

    def __call__(self, payload):
        return digest_array(payload), self.tail(payload)

    def decode_into(self, payload, out):
        Sleepy.decode_into(self, payload, out[0])
        return (None, self.tail(payload))


@pytest.mark.parametrize("workers", [1, 2, 3])
@pytest.mark.parametrize("ragged", [False, True])
def test_a_pipeline_wakes_about_once_per_pair_of_chunks_with_the_same_samples(tmp_path, workers, ragged, monkeypatch,
                                                                              no_leaks):
    """Decoders slower than the consumer: it waits for nearly every chunk.  On the bell it waits about once
    per two chunks (at most 0.75 per chunk over 80 chunks, against about one per chunk before), whether
    every value lands in a slot or small ones travel back, and the samples are those of workers=0."""
    recs = payloads(640, seed=5)
    path = tmp_path / "p.rec"
    write_rec(path, recs)
    fields = SleepyRagged() if ragged else Sleepy(max_ms=2.0)

    def flat(batches):  # (copies: views would keep every slot)
        if not ragged:
            return [(x.copy(), None) for batch in batches for x in batch]
        return [(x.copy(), t) for arr, tails in batches for x, t in zip(arr, tails)]

    with ParallelReader(path, fields=fields, workers=0, batch_size=4) as r:
        want = flat(r)
    waits = _Waits(monkeypatch)
    with ParallelReader(path, fields=fields, workers=workers, batch_size=4, tuning=Tuning(chunk_groups=8)) as r:
        got = flat(r)
        chunks = r.stats.chunks
    assert chunks == 80
    assert len(got) == len(want) == 640
    assert all(np.array_equal(a, digest_array(rec)) and np.array_equal(a, b) and t == u
               for (a, t), (b, u), rec in zip(got, want, recs))
    assert waits.by_mode.get(BELL, 0) >= 25, waits.by_mode
    assert waits.total <= 0.75 * chunks, waits.by_mode
    assert waits.timeouts == 0


class SleepyKillOnceOn(KillOnceOn):
    """:class:`KillOnceOn` whose decodes take 0..2 ms, like :class:`Sleepy`: decoders slower than the
    consumer, so that it waits on them (on the bell) whatever the load of the machine."""

    def decode_into(self, payload, out):
        time.sleep(hashlib.md5(bytes(payload)).digest()[0] / 255 * 0.002)
        super().decode_into(payload, out)


def test_a_worker_killed_mid_pair_loses_nothing_and_the_rest_waits_per_result(tmp_path, monkeypatch, no_leaks):
    """A worker SIGKILLed in the middle of a pair (perhaps between its result and its mark on the board):
    its tasks are re-run, every sample comes out once in order, and the pass goes on without a stall.
    The decoders are slower than the consumer (with instant ones, a loaded machine's consumer may never
    wait on the bell before the death, and the bell's check below would say nothing)."""
    recs = payloads(600, seed=8)
    recs[333] = b"KILL" + recs[333]
    path = tmp_path / "k.rec"
    write_rec(path, recs)
    waits = _Waits(monkeypatch)
    with ParallelReader(path, fields=SleepyKillOnceOn(b"KILL", str(tmp_path / "flag")), workers=2,
                        tuning=Tuning(chunk_groups=8)) as r:
        got = list(r)
        assert r.stats.workers_replaced == 1
    assert len(got) == 600 and all(np.array_equal(a, digest_array(b)) for a, b in zip(got, recs))
    assert waits.by_mode.get(BELL, 0) > 0


class BigError(Fixed):
    """Fixed-shape output; about half the samples fail with a 10 KB message (three times that with its
    pickled exception and traceback), so that a task's result frame is larger than a pipe holds."""

    def decode_into(self, payload, out):
        if not payload or payload[0] % 2 == 0:
            raise ValueError("x" * 10_000)
        super().decode_into(payload, out)


def test_result_frames_larger_than_the_pipe_are_read_without_a_stall(tmp_path, monkeypatch, no_leaks):
    """Frames of over 100 KB (failed samples with long messages) from workers whose pipes the consumer
    does not watch while it waits on the bell: a worker whose pipe is full rings (after the bytes that
    filled it), the consumer reads the frame as it comes; no wait runs into its timeout (a stall of a
    second each; 7 of 20 runs had one when the worker rang before writing, not when the pipe was full)."""
    recs = payloads(160, seed=3)
    path = tmp_path / "e.rec"
    write_rec(path, recs)
    fails = [not r or r[0] % 2 == 0 for r in recs]
    waits = _Waits(monkeypatch)
    with ParallelReader(path, fields=[BigError()], workers=2, on_error="skip", tuning=Tuning(chunk_groups=8)) as r:
        got = [x.copy() for (x,) in r]
        assert r.stats.skipped == sum(fails)
    assert len(got) == 160 - sum(fails)
    assert all(np.array_equal(a, digest_array(b)) for a, b in zip(got, [r for r, f in zip(recs, fails) if not f]))
    assert waits.by_mode.get(BELL, 0) > 0
    assert waits.timeouts == 0, waits.by_mode


@pytest.mark.parametrize("error", ["OSError", "PipelineError"])
def test_without_a_bell_results_are_waited_for_one_by_one(tmp_path, monkeypatch, error, no_leaks):
    """When the bell cannot be made (no room for its 8 KiB board, no pipe), the pipeline runs without it:
    every result pipe is watched, the samples are the same.  A full /dev/shm is a PipelineError (what
    shm._reserve makes of ENOSPC), which the fallback missed: the pass failed.  The progress board of
    the pool (see tests/test_reliability.py) is left out the same way."""
    from parrecio import PipelineError
    from parrecio.pipeline import pool as pool_mod
    from parrecio.pipeline.shm import Segment

    def no_room(*args, **kwargs):
        if error == "OSError":
            raise OSError(28, "No space left on device")
        raise PipelineError("cannot allocate 0.0 MiB of shared memory in /dev/shm (full)")

    monkeypatch.setattr(pool_mod, "Bell", no_room)
    create = Segment.create.__func__
    monkeypatch.setattr(Segment, "create", classmethod(
        lambda cls, name, size, *more: no_room() if name.endswith("progress") else create(cls, name, size, *more)))
    recs = payloads(200, seed=4)
    path = tmp_path / "n.rec"
    write_rec(path, recs)
    waits = _Waits(monkeypatch)
    with ParallelReader(path, fields=Sleepy(max_ms=1.0), workers=2, tuning=Tuning(chunk_groups=8)) as r:
        got = [x.copy() for x in r]
    assert len(got) == 200 and all(np.array_equal(a, digest_array(b)) for a, b in zip(got, recs))
    assert set(waits.by_mode) == {ALL}


def test_values_larger_than_the_pipe_travel_back_without_a_stall(tmp_path, monkeypatch, no_leaks):
    """Ragged values of 24 KB: every task's frame (~200 KB) is larger than its pipe holds, so each worker
    rings whenever its pipe is full and the consumer reads the frame as it comes; the values are
    byte-exact and no wait runs into its timeout."""
    recs = payloads(160, seed=6)
    path = tmp_path / "big.rec"
    write_rec(path, recs)
    fields = SleepyRagged(max_ms=1.0, size=24_000)
    waits = _Waits(monkeypatch)
    with ParallelReader(path, fields=fields, workers=2, tuning=Tuning(chunk_groups=8)) as r:
        got = [(a.copy(), t) for a, t in r]
    assert len(got) == 160
    assert all(np.array_equal(a, digest_array(rec)) and t == fields.tail(rec) for (a, t), rec in zip(got, recs))
    assert sum(len(t) for _, t in got) > 100 * 24_000
    assert waits.by_mode.get(BELL, 0) > 0
    assert waits.timeouts == 0, waits.by_mode
