"""Equal shards stay equal when samples are skipped (``even_shards`` + ``on_error="skip"``,
:mod:`parrecio.pipeline.padding`): a rank that loses samples pads its pass with copies of its first
sample, so that every rank yields as many samples and batches (a DDP all-reduce would otherwise hang).

The reference is written here: a rank's samples are its share of the epoch's order (read with a decoder
that never fails), without the failed ones, followed by copies of the first that came out, until the
share's length; then batched (``drop_last``: whole batches only)."""

from __future__ import annotations

import struct
from typing import List, Optional

import numpy as np
import pytest

from parrecio import ParallelReader, PipelineError, RecordWriter
from parrecio.decoders import ArraySpec

N = 23  # samples; 3 ranks: shares of 8 (pad) or 7 (drop)


class Number:
    """``int(payload)`` as a fixed-shape int64 (in the output slots); ``bad`` ids raise."""
    output_spec = ArraySpec((), np.int64)

    def __init__(self, bad=()):
        self.bad = frozenset(bad)

    def __call__(self, payload):
        value = int(bytes(payload))
        if value in self.bad:
            raise ValueError(f"sample {value} is bad")
        return np.int64(value)


def ragged(payload):
    """A ragged value (travels pickled): the id as text."""
    return bytes(payload).decode()


def _write(tmp_path, index: bool) -> str:
    path = str(tmp_path / "s.rec")
    with RecordWriter(path, index=index or None) as w:
        for i in range(N):
            w.write(b"%d" % i)
            w.write(b"%d" % i)  # two fields: [number][text]
    return path


def _values(out, batch_size) -> List[List[int]]:
    """The ids of each item: one list per batch, [id] per sample; checks the two fields agree."""
    items = []
    for item in out:
        nums, texts = item
        nums = np.atleast_1d(np.asarray(nums)).tolist()
        texts = [texts] if batch_size is None else list(texts)
        assert [str(n) for n in nums] == texts
        items.append(nums)
    return items


def _reference(order: List[int], bad, share: int, batch_size: Optional[int], drop_last: bool):
    kept = [i for i in order if i not in bad]
    samples = kept + [kept[0]] * (share - len(kept))
    if batch_size is None:
        return [[s] for s in samples]
    whole = len(samples) // batch_size * batch_size if drop_last else len(samples)
    return [samples[i:i + batch_size] for i in range(0, whole, batch_size)]


def _read(path, rank, bad, workers, batch_size, drop_last, even, shuffle=False):
    with ParallelReader(path, fields=[Number(bad), ragged], workers=workers, batch_size=batch_size,
                        drop_last=drop_last, on_error="skip", num_shards=3, shard_index=rank,
                        even_shards=even, shuffle=shuffle, seed=5) as r:
        out = _values(list(r), batch_size)
        return out, r.stats.padded, r.stats.skipped, r.state_dict()


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("index,shuffle", [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("even", ["pad", "drop"])
@pytest.mark.parametrize("batch_size,drop_last", [(None, False), (3, False), (3, True), (8, False)])
def test_ranks_yield_equal_counts_when_samples_are_skipped(tmp_path, workers, index, shuffle, even,
                                                           batch_size, drop_last):
    path = _write(tmp_path, index)
    bad = {4, 5, 7, 13}  # rank 1 of an unshuffled read loses 3 of its 8 (4, 7, 13), rank 2 one (5)
    share = -(-N // 3) if even == "pad" else N // 3
    lengths = []
    for rank in range(3):
        with ParallelReader(path, fields=[Number(), ragged], workers=0, num_shards=3, shard_index=rank,
                            even_shards=even, shuffle=shuffle, seed=5) as r:
            order = [int(n) for n, _ in r]
        assert len(order) == share
        got, padded, skipped, state = _read(path, rank, bad, workers, batch_size, drop_last, even, shuffle)
        lost = sum(1 for i in order if i in bad)
        assert got == _reference(order, bad, share, batch_size, drop_last), (rank, order)
        assert skipped == lost
        assert padded == (lost if not drop_last or batch_size is None else
                          max(0, share // batch_size * batch_size - (share - lost)))
        assert state["position"] == 0 and state["epoch"] == 1  # the pass is complete
        lengths.append([len(b) for b in got])
    assert lengths[0] == lengths[1] == lengths[2]


def test_nothing_is_padded_without_skips_or_with_one_rank(tmp_path):
    path = _write(tmp_path, True)
    for rank in range(3):
        got, padded, skipped, _ = _read(path, rank, set(), 2, 3, False, "pad")
        assert padded == skipped == 0 and sum(len(b) for b in got) == 8
    with ParallelReader(path, fields=[Number({4}), ragged], workers=0, on_error="skip",
                        even_shards="pad") as r:  # one rank: nothing to keep equal
        assert len(list(r)) == N - 1 and r.stats.padded == 0


@pytest.mark.parametrize("workers", [0, 2])
def test_a_group_its_index_cannot_read_is_padded_too(tmp_path, workers):
    """A damaged group read by its .idx offset is lost on its own rank only: padded like a decode
    error (framing damage in a stream is met by every rank alike and takes no position)."""
    path = _write(tmp_path, True)
    with open(path, "r+b") as f:  # destroy the magic of sample 7's first record (rank 1's third)
        data = f.read()
        at = 0
        for i in range(2 * 7):
            (length,) = struct.unpack_from("<I", data, at + 4)
            at += 8 + (length + 3) // 4 * 4
        f.seek(at)
        f.write(b"\0\0\0\0")
    counts = []
    for rank in range(3):
        got, padded, skipped, _ = _read(path, rank, set(), workers, None, False, "pad")
        counts.append(len(got))
        if rank == 1:
            assert [s[0] for s in got] == [1, 4, 10, 13, 16, 19, 22, 1] and padded == 1 and skipped == 1
        else:
            assert padded == 0
    assert counts == [8, 8, 8]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_rank_whose_every_sample_fails_says_so(tmp_path, workers):
    path = _write(tmp_path, False)
    with ParallelReader(path, fields=[Number(set(range(1, N, 3))), ragged], workers=workers,
                        on_error="skip", num_shards=3, shard_index=1, even_shards="pad") as r:
        with pytest.raises(PipelineError, match=r"every sample of shard 1 in epoch 0 was skipped: nothing to "
                                                r"pad its 8 positions with"):
            list(r)


@pytest.mark.parametrize("workers", [0, 2])
def test_an_early_break_ends_the_pass_without_copies(tmp_path, workers):
    path = _write(tmp_path, True)
    with ParallelReader(path, fields=[Number({4}), ragged], workers=workers, batch_size=2, on_error="skip",
                        num_shards=3, shard_index=1, even_shards="pad") as r:
        it = iter(r)
        first = next(it)
        assert np.asarray(first[0]).tolist() == [1, 7]  # 4 skipped
        state = r.state_dict()
        it.close()
        assert r.stats.padded == 0
        assert state["position"] == 3  # positions 0..2 of the share gone through (1, 4 skipped, 7)
        rest = [np.asarray(b[0]).tolist() for b in r]
        assert sum(len(b) for b in rest) == 8 and rest[-1][-1] == 1  # the next epoch, padded at its end


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("index", [False, True])
@pytest.mark.parametrize("even", ["pad", "drop"])
@pytest.mark.parametrize("batch_size", [None, 2])
def test_a_pass_left_while_copies_are_owed_resumes_with_them(tmp_path, workers, index, even, batch_size):
    """A loop left (``break``) after the stream's last sample but before the last copy: the state taken
    after the loop said the epoch was over (next epoch, position 0), and a reader resumed from it never
    handed out the copies still owed -- the rank's epoch came out short, the hang padding is there to
    prevent; the same with nothing owed but the last batch, held back (torch audit: 3 ranks disagreed on
    the epoch after the same number of steps).  And the short pass was taken as the epoch's length: ``len()`` without an ``.idx`` said 7
    where the next pass yields 8.  Now the state after the loop is the one taken inside it, at every
    stop point among the copies."""
    path = _write(tmp_path, index)
    bad = {4, 7, 13}  # rank 1 of 3 loses three of its 8 (pad) or 7 (drop): 1, 10, 16, 19, 22, then copies
    kw = dict(fields=[Number(bad), ragged], workers=workers, batch_size=batch_size, on_error="skip",
              num_shards=3, shard_index=1, even_shards=even)
    with ParallelReader(path, **kw) as r:
        whole = _values(list(r), batch_size)
    share = 8 if even == "pad" else 7
    assert whole == _reference([1, 4, 7, 10, 13, 16, 19, 22][:share], bad, share, batch_size, False)
    # every stop point: among the copies, and before them -- right after the batch before the last one
    # of the stream, which padding holds back until the count is known (the stream was read to its end
    # already: that state said the epoch was over too, and the held batch was never handed out)
    for stop in range(1, len(whole)):
        with ParallelReader(path, **kw) as r:
            head = []
            for item in r:
                head += _values([item], batch_size)
                if len(head) == stop:
                    inside = r.state_dict()
                    break
            after = r.state_dict()
            assert after == inside, stop
            if not index:  # the length of a pass is known from a complete one only
                with pytest.raises(TypeError, match="not known"):
                    len(r)
        with ParallelReader(path, **kw) as r:
            r.load_state_dict(after)
            tail = _values(list(r), batch_size)
            assert head + tail == whole, stop
            if index:
                assert len(r) == len(whole)


@pytest.mark.parametrize("workers", [0, 1])
def test_a_held_batch_whose_ragged_column_was_stacked_is_padded_as_a_list(tmp_path, workers):
    """Ragged arrays make a list column, unless a batch's rows happen to share a shape: then one stacked
    array.  The short last batch held for padding was such a batch (rows of 30 bytes) and the copies of
    the first sample (10 bytes) did not fit it: numpy's ValueError ended the pass.  The padded batch's
    column is a list of the rows, as the column rule says for arrays of several shapes."""
    def ragged(p):
        if bytes(p[:1]) == b"X":
            raise ValueError("bad sample")
        return np.frombuffer(p, np.uint8).copy()

    payloads = [b"a" * 10, b"-", b"b" * 20, b"-", b"c" * 30, b"-", b"X" * 40, b"-"]
    path = tmp_path / "r.rec"
    with RecordWriter(str(path)) as w:
        for p in payloads:
            w.write(p)
    with ParallelReader(path, ragged, workers=workers, batch_size=2, num_shards=2, shard_index=0,
                        even_shards="pad", on_error="skip") as reader:
        batches = list(reader)
    assert [[bytes(v) for v in b] for b in batches] == [[b"a" * 10, b"b" * 20], [b"c" * 30, b"a" * 10]]
    assert isinstance(batches[1], list)
