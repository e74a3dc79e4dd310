"""Releases of groups read in place, held back (parrecio.pipeline.feed.Feed.release): each Release wakes the
reader process, so the bytes of a mapped file's delivered chunks are sent in batches of a quarter of the
mapped budget; ring space and one-off segments go back at once, views turn the holding off, and whatever
is owed is sent before the consumer waits with no chunk in hand -- so the reader never waits on what the
consumer holds, whatever the size of the batch.
"""

from __future__ import annotations

from array import array

import numpy as np
import pytest

from parrecio import ParallelReader, Tuning
from parrecio.pipeline import reader_handle, run as run_module
from parrecio.pipeline.feed import Feed
from parrecio.pipeline.messages import FILE, ONEOFF, Chunk, Place, ReaderEnd
from pipeline_helpers import Fixed, deadline, digest_array, payloads, write_rec

SMALL = Tuning(ring_bytes=1 << 20)  # mapped budget 4 MiB: the reader waits for releases


class _Handle:
    """What Feed sends to its reader, recorded."""

    def __init__(self) -> None:
        self.sent = []
        self.releases_sent = 0

    def release(self, pos: int, oneoff: int = 0, mapped: int = 0) -> None:
        self.sent.append((pos, oneoff, mapped))
        self.releases_sent += 1


def _chunk(lens, ring_end: int, place: Place) -> Chunk:
    n = len(lens)
    return Chunk(0, n, 0, array("q", [0] * n), array("q", lens), array("q", [0] * n), ring_end, place)


def test_mapped_bytes_go_back_in_batches_and_everything_else_at_once():
    h = _Handle()
    feed = Feed(h, None, 0, (100, 100), hold=1000)
    in_file = Place(FILE, "f")
    for _ in range(2):
        feed.release(_chunk([150, 250], 100, in_file))  # 400 bytes read in place, no ring space
    assert h.sent == []                                  # 800 owed, under the 1000 held back
    feed.release(_chunk([400], 100, in_file))
    assert h.sent == [(100, 0, 1200)]                    # all of it, in one Release
    feed.release(_chunk([300], 100, in_file))
    feed.release(_chunk([10, 20], 640, Place(0)))        # ring space: at once, with what is owed
    assert h.sent[1:] == [(640, 0, 300)]
    feed.release(_chunk([50], 640, in_file))
    feed.release(_chunk([700], 640, Place(ONEOFF, "parrecio-test-no-such-segment")))  # a one-off: at once
    assert h.sent[2:] == [(640, 700, 50)]
    feed.release(_chunk([60], 640, in_file))
    feed.flush()
    feed.flush()                                         # nothing more owed: nothing sent
    assert h.sent[3:] == [(640, 0, 60)]
    feed.release(_chunk([70], 640, in_file))
    feed.end = ReaderEnd(0, {})                          # the reader ended: nothing more to send
    feed.flush()
    feed.release(_chunk([5000], 700, in_file))
    assert len(h.sent) == 4 and h.releases_sent == 4


def test_without_holding_every_release_is_sent():
    h = _Handle()
    feed = Feed(h, None, 0, (0, 0), hold=0)              # (views: parrecio.pipeline.views)
    feed.release(_chunk([10], 0, Place(FILE, "f")))
    feed.release(_chunk([20], 0, Place(FILE, "f")))
    feed.release_ring(128)
    assert h.sent == [(0, 0, 10), (0, 0, 20), (128, 0, 0)]


@pytest.fixture
def many_chunks(tmp_path):
    """~9 MB of small records read in place: ~190 chunks of 32 groups, twice the mapped budget of SMALL."""
    recs = payloads(6000, seed=5, max_len=3000)
    path = tmp_path / "m.rec"
    write_rec(path, recs)
    return path, recs


def _count_releases(monkeypatch):
    sent = [0]
    orig = reader_handle.ReaderHandle.release

    def counted(self, *a, **k):
        sent[0] += 1
        return orig(self, *a, **k)
    monkeypatch.setattr(reader_handle.ReaderHandle, "release", counted)
    return sent


@pytest.mark.parametrize("workers", [1, 3])
def test_a_file_twice_the_budget_reads_exactly_with_a_release_per_megabyte(many_chunks, monkeypatch, no_leaks,
                                                                           workers):
    path, recs = many_chunks
    sent = _count_releases(monkeypatch)
    want = np.stack([digest_array(r) for r in recs])
    with deadline(120), ParallelReader(path, fields=Fixed(), batch_size=16, workers=workers,
                                       tuning=SMALL) as reader:
        for epoch in range(2):
            sent[0] = 0
            got = np.concatenate(list(reader))
            assert np.array_equal(got, want), epoch
            # ~9 MB in batches of 1 MiB (a quarter of the budget), and a flush where the consumer ran dry:
            # far fewer than one per chunk, and at least one per budget's worth (else the reader would
            # have waited for good)
            assert 2 <= sent[0] <= 30, (epoch, sent[0])


@pytest.mark.parametrize("workers", [1, 3])
def test_with_everything_held_the_flush_before_a_wait_alone_keeps_the_reader_going(many_chunks, monkeypatch,
                                                                                   no_leaks, workers):
    """Held back without limit, mapped bytes go back only when the consumer, with no chunk in hand,
    is about to wait for the reader: the rule that makes any batch size safe.  No hang, every byte."""
    path, recs = many_chunks

    class HoldAll(Feed):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.hold = 1 << 60
    monkeypatch.setattr(run_module, "Feed", HoldAll)
    sent = _count_releases(monkeypatch)
    want = np.stack([digest_array(r) for r in recs])
    with deadline(120), ParallelReader(path, fields=Fixed(), batch_size=16, workers=workers,
                                       tuning=SMALL) as reader:
        got = np.concatenate(list(reader))
        assert np.array_equal(got, want)
        assert sent[0] >= 2  # the reader waited for the budget (4 MiB of ~9 MB) and was let go by flushes
