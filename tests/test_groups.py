"""The one group stream (``parrecio/pipeline/groups.py``) on its own, against a plain reference written
here: groups of ``len(fields)`` records, this shard's, equal shards, the shuffle buffer's draws, the
resume skip -- and its position kept as data (``group_index``, ``skip``, ``count``), not in generator
locals."""

from __future__ import annotations

import numpy as np
import pytest

from parrecio import ParallelReader, RecordWriter, SourceError
from parrecio.decoders import Raw
from parrecio.pipeline.groups import GroupStream, InProcess
from parrecio.recordio import RecordReader


def _file(tmp_path, n: int, size=lambda i: i % 7 * 5):
    path = tmp_path / "g.rec"
    recs = [bytes([i % 251]) * size(i) + b"%d" % i for i in range(n)]
    with RecordWriter(str(path)) as w:
        for r in recs:
            w.write(r)
    return str(path), recs


def _cfg(path, nf: int, **kw):
    with ParallelReader(path, fields=[Raw()] * nf, workers=0, on_error="skip", **kw) as r:
        return r.config


def _streams(path, cfg, hold: bool):
    reader = RecordReader(path)
    try:
        yield 0, path, reader, InProcess(cfg.nfields, hold)
    finally:
        reader.close()


def _groups(path, cfg, epoch=0, skip=0):
    gs = GroupStream(cfg, epoch, skip)
    return gs, [tuple(bytes(p) for p in g.parts) for g in gs.groups(_streams(path, cfg, gs.holds))]


def _reference(recs, nf, num_shards=1, shard=0, even=None, skip=0):
    groups = [tuple(recs[i:i + nf]) for i in range(0, len(recs) // nf * nf, nf)]
    total = len(groups)
    mine = [g for i, g in enumerate(groups) if i % num_shards == shard]
    if even == "drop":
        mine = mine[:total // num_shards]
    elif even == "pad" and total % num_shards and shard >= total % num_shards:
        mine.append(groups[(shard - total % num_shards) % total])
    return mine[skip:]


@pytest.mark.parametrize("nf,num_shards,shard,even,skip", [
    (1, 1, 0, None, 0), (2, 1, 0, None, 3), (3, 2, 1, None, 0), (2, 3, 2, "pad", 1), (2, 3, 0, "drop", 2),
    (1, 4, 3, "pad", 0), (4, 2, 0, None, 5)])
def test_groups_shards_and_skip_equal_a_plain_reference(tmp_path, nf, num_shards, shard, even, skip):
    path, recs = _file(tmp_path, 101)
    cfg = _cfg(path, nf, num_shards=num_shards, shard_index=shard, even_shards=even)
    gs, got = _groups(path, cfg, skip=skip)
    assert got == _reference(recs, nf, num_shards, shard, even, skip)
    # the position is data: every group of the stream seen, the skip used up, the counts added up
    assert gs.group_index == len(recs) // nf and gs.skip == 0
    assert gs.count.records == len(recs) and gs.count.bytes == sum(map(len, recs))
    assert gs.count.skipped_groups == (1 if len(recs) % nf else 0)
    others = len(recs) // nf - len(_reference(recs, nf, num_shards, shard))
    assert gs.count.sharded_out == others


def test_shuffle_buffer_draws_from_seed_and_epoch(tmp_path):
    path, recs = _file(tmp_path, 300)
    cfg = _cfg(path, 1, shuffle=True, shuffle_buffer=16, seed=5)
    _, a = _groups(path, cfg, epoch=1)
    _, b = _groups(path, cfg, epoch=1)
    _, c = _groups(path, cfg, epoch=2)
    assert a == b != c and sorted(a) == sorted((r,) for r in recs)
    # a plain shuffle buffer with the same draws from default_rng([seed, epoch])
    rng, buf, want = np.random.default_rng([5, 1]), [], []
    for r in recs:
        if len(buf) < 16:
            buf.append((r,))
            continue
        i = int(rng.integers(len(buf)))
        buf[i], out = (r,), buf[i]
        want.append(out)
    want += [buf[i] for i in rng.permutation(len(buf))]
    assert a == want
    # the resume skip comes after the buffer: the same order, its first groups left out
    _, resumed = _groups(path, cfg, epoch=1, skip=40)
    assert resumed == want[40:]



def _bounded_buffer(recs, seed, epoch, capacity, limit):
    """A plain shuffle buffer of ``capacity`` groups and at most ``limit`` payload bytes (one group
    whatever its size), the README's rule: a group that would pass the bound swaps as if the buffer were
    full; while the bound is passed, random groups go out.  Also the most bytes it held."""
    rng, buf, want, most = np.random.default_rng([seed, epoch]), [], [], 0
    for r in recs:
        if len(buf) < capacity and (sum(map(len, buf)) + len(r) <= limit or not buf):
            buf.append(r)
        else:
            i = int(rng.integers(len(buf)))
            buf[i], out = r, buf[i]
            want.append(out)
            while sum(map(len, buf)) > limit and len(buf) > 1:
                i = int(rng.integers(len(buf)))
                buf[i], buf[-1] = buf[-1], buf[i]
                want.append(buf.pop())
        most = max(most, sum(map(len, buf)))
    return want + [buf[i] for i in rng.permutation(len(buf))], most


def test_shuffle_buffer_holds_at_most_its_bytes(tmp_path):
    """Records of 1 B to 6 KB: 64 groups would hold ~190 KB; bounded at 20 KB the buffer holds ~7, and
    one record larger than the bound passes through on its own."""
    rng = np.random.default_rng(0)
    sizes = [int(x) for x in rng.integers(1, 6000, 400)]
    sizes[150] = 25_000  # larger than the whole bound
    path, recs = _file(tmp_path, 400, size=lambda i: sizes[i])
    cfg = _cfg(path, 1, shuffle=True, shuffle_buffer=64, shuffle_buffer_bytes=20_000, seed=5)
    _, got = _groups(path, cfg, epoch=3)
    want, _ = _bounded_buffer(recs, 5, 3, 64, 20_000)
    assert [g[0] for g in got] == want and sorted(want) == sorted(recs)
    # the bound holds: what stays in the buffer after each step (the one large record alone)
    assert _bounded_buffer(recs[:150] + recs[151:], 5, 3, 64, 20_000)[1] <= 20_000
    # far below the bound: the draws of the count alone (the orders of states saved before the bound)
    loose = _cfg(path, 1, shuffle=True, shuffle_buffer=64, seed=5)
    assert _groups(path, loose, epoch=3)[1] == [(r,) for r in _bounded_buffer(recs, 5, 3, 64, 1 << 62)[0]]
    # resumed after the buffer: the same order, its first groups left out
    assert _groups(path, cfg, epoch=3, skip=123)[1] == [(r,) for r in want[123:]]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_bounded_shuffle_buffer_in_the_pipeline(tmp_path, workers, no_leaks):
    """The same order through the reader process and the decoders, on a ring that wraps (1 MiB, ~3 MB
    of records up to 60 KB), every record once, byte-exact."""
    sizes = [int(x) for x in np.random.default_rng(1).integers(0, 60_000, 100)]
    path, recs = _file(tmp_path, 100, size=lambda i: sizes[i])
    from parrecio import Tuning
    with ParallelReader(path, fields=None, workers=workers, shuffle=True, shuffle_buffer=50,
                        shuffle_buffer_bytes=200_000, seed=2, tuning=Tuning(ring_bytes=1 << 20)) as r:
        r.set_epoch(4)
        got = [bytes(x) for x in r]
        state = r.state_dict()
    assert got == _bounded_buffer(recs, 2, 4, 50, 200_000)[0]
    assert state["shuffle_buffer_bytes"] == 200_000
    with ParallelReader(path, fields=None, workers=0, shuffle=True, shuffle_buffer=50, seed=2) as r:
        with pytest.raises(ValueError, match="state_dict was saved with shuffle_buffer_bytes=200000, this reader "
                                             "has shuffle_buffer_bytes=1073741824"):
            r.load_state_dict(state)


def test_resume_past_the_end_names_the_position(tmp_path):
    path, recs = _file(tmp_path, 10)
    cfg = _cfg(path, 2)
    with pytest.raises(SourceError, match="the resumed position 7 is past the end of epoch 0: this shard's "
                                          "order has 5 samples now"):
        _groups(path, cfg, skip=7)


def test_position_is_readable_mid_stream(tmp_path):
    path, recs = _file(tmp_path, 40)
    cfg = _cfg(path, 2, num_shards=2, shard_index=0)
    gs = GroupStream(cfg, 0, 3)
    it = gs.groups(_streams(path, cfg, gs.holds))
    first = next(it)
    assert bytes(first.parts[0]) == recs[12]  # shard 0: groups 0, 2, 4, ...; 3 left out: group 6
    assert (gs.group_index, gs.skip, gs.count.sharded_out) == (7, 0, 3)
    assert first.offset > 0 and not first.held
    it.close()
