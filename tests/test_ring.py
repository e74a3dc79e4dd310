"""The input ring's allocator (parrecio/pipeline/ring.py) against a model of the ring's contents, and
the reader process's held groups past the 16 MiB early-wrap point (the shuffle buffer used to crash
there: ``place`` returned -1 after its early wrap moved the group's start, and the caller wrote at it).

The model: every placed record occupies ``[pos, pos + n)`` until the consumer releases past it; live
records never overlap in the segment, never straddle its end, and a wait for space never asks for more
than the groups placed before could give back (else the reader would wait for itself)."""

from __future__ import annotations

import hashlib
import random

import pytest
from hypothesis import given, settings, strategies as st

from parrecio import ParallelReader, Tuning
from parrecio.decoders import Json, Raw
from parrecio.pipeline.ring import ALIGN, GroupTooLarge, RingWriter
from parrecio.recordio import RecordWriter


class Model:
    """A ring of ``size`` bytes driven like the reader process drives it: groups placed whole, the
    consumer releasing groups in order once ``lag`` later groups were placed."""

    def __init__(self, size: int, soft: int, lag: int) -> None:
        self.ring = RingWriter(size, self.wait)
        self.ring.soft = soft  # the early wrap, cheaply: the real threshold is 16 MiB into the segment
        self.lag = lag
        self.sent = []  # (end position of the group = what delivering it releases, [(pos, n), ...])
        self.live = []  # records not released yet: (pos, n)
        self.released = 0
        self.waits = 0

    def wait(self, needed: int) -> int:
        """Release groups in order until ``needed``; it must be reachable from groups already sent."""
        self.waits += 1
        while self.released < needed:
            assert self.sent, f"waits for {needed} with nothing left to release (at {self.released})"
            self.release_one()
        return self.released

    def release_one(self) -> None:
        end, recs = self.sent.pop(0)
        self.released = max(self.released, end)
        self.ring.release(end)
        for r in recs:
            self.live.remove(r)

    def place(self, sizes) -> bool:
        ring = self.ring
        head, tail = ring.head, ring.tail
        try:
            offs = ring.place(sizes)
        except GroupTooLarge:
            assert (ring.head, ring.tail) == (head, tail), "a refused group reserved something"
            return False
        size = ring.size
        assert ring.placed % size == offs[0]
        # the span counts from the head before the group, unless the early wrap put the whole group
        # in space that was free already (then it needed no wait)
        # (an early wrap needs no wait: the whole group went into space that was free already)
        early = (head % size >= ring.soft and ring.placed == head - head % size + size
                 and ring.tail == tail and ring.head - ALIGN - size <= tail)
        base = ring.placed if early else head
        assert ring.head - base <= ring.max_span + ALIGN
        for off, n in zip(offs, sizes):
            assert 0 <= off and off + n <= size, f"record of {n} at {off} leaves a {size}-byte ring"
            assert off % ALIGN == 0 or size % ALIGN
            for lo, k in self.live:
                assert off + n <= lo or lo + k <= off or not n or not k, (
                    f"record [{off}, {off + n}) overwrites a live one [{lo}, {lo + k})")
        recs = list(zip(offs, sizes))
        self.live.extend(recs)
        self.sent.append((ring.head, recs))
        while len(self.sent) > self.lag:
            self.release_one()
        return True


sizes_st = st.lists(st.one_of(st.integers(0, 300), st.integers(300, 5000), st.integers(5000, 40000)),
                    min_size=1, max_size=4)


@settings(max_examples=200, deadline=None)
@given(size=st.sampled_from([1 << 16, 100_000, 1 << 17]), soft_frac=st.floats(0.05, 1.0),
       lag=st.integers(0, 6), groups=st.lists(sizes_st, min_size=1, max_size=120))
def test_placement_never_overlaps_and_never_waits_for_itself(size, soft_frac, lag, groups):
    m = Model(size, max(ALIGN, int(size * soft_frac)), lag)
    for sizes in groups:
        fits = sum(-(-n // ALIGN) * ALIGN for n in sizes) + max(sizes) <= m.ring.max_span
        placed = m.place(sizes)
        if fits:
            assert placed, f"a group of {sizes} that fits in half of a {size}-byte ring was refused"


def test_early_wrap_moves_the_whole_group():
    """Past the soft point with the ring's start free, every record of the group goes to the next lap:
    the old code moved only the first one and refused (-1) the second."""
    m = Model(1 << 20, 1 << 18, lag=0)
    assert m.place([300_000])           # offset 0 .. 300000: past the soft point
    assert m.ring.head % m.ring.size >= m.ring.soft
    head = m.ring.head
    offs = m.ring.place([100, 200, 300])
    assert m.ring.placed == head - head % m.ring.size + m.ring.size  # the next lap's start
    assert offs == [0, 128, 384]


def test_a_refused_group_reserves_nothing():
    ring = RingWriter(1 << 16, lambda needed: pytest.fail("waited"))
    ring.place([1000])
    head = ring.head
    with pytest.raises(GroupTooLarge, match="would span"):
        ring.place([20000, 20000])
    assert ring.head == head


def _groups(n: int, seed: int):
    rng = random.Random(seed)
    for i in range(n):
        head = i.to_bytes(4, "little")
        yield head + rng.randbytes(rng.randint(40_000, 160_000)), b'{"i": %d}' % i


@pytest.mark.parametrize("indexed", [False, True], ids=["buffer", "index"])
def test_held_groups_past_the_soft_wrap(tmp_path, no_leaks, indexed):
    """The reported crash, cheaply: [~100 KB][JSON] groups through the shuffle buffer (no .idx) or the
    index shuffle, a 40 MiB ring whose soft point (16 MiB) lies before its middle; 2 workers and 0 give
    the same permutation, every group once, each payload with its own label."""
    path = tmp_path / "held.rec"
    digests = {}
    with RecordWriter(path, index=indexed) as w:
        for a, b in _groups(420, 1):  # ~42 MB: past the soft point in the first lap, into the second
            digests[int.from_bytes(a[:4], "little")] = hashlib.sha1(a).digest()
            w.write(a)
            w.write(b)
    orders = {}
    for workers in (0, 2):
        with ParallelReader(path, fields=[Raw(), Json()], workers=workers, shuffle=True, seed=5,
                            tuning=Tuning(ring_bytes=40 << 20)) as r:
            for epoch in (0, 1):
                r.set_epoch(epoch)
                got = []
                for a, b in r:
                    assert int.from_bytes(a[:4], "little") == b["i"], "an image paired with another's label"
                    assert hashlib.sha1(a).digest() == digests[b["i"]]
                    got.append(b["i"])
                assert sorted(got) == list(range(420))
                orders[workers, epoch] = got
            assert r.stats.reruns == 0 and r.stats.workers_replaced == 0
    assert orders[0, 0] == orders[2, 0] and orders[0, 1] == orders[2, 1]
    assert orders[0, 0] != orders[0, 1] and orders[0, 0] != list(range(420))
