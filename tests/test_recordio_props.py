"""Property tests: RecordReader(RecordWriter(x)) == x, for both joins, any chunk size, short reads."""

from __future__ import annotations

import io

from hypothesis import given, settings
from hypothesis import strategies as st

from parrecio import IndexedRecordReader, RecordReader, RecordWriter
from recordio_helpers import M, ShortReads, concat_frames, mxnet_frames

# Payloads made of pieces, some of them the magic, so that it lands at aligned and unaligned offsets,
# at the start, the end, back to back.
piece = st.one_of(st.binary(max_size=9), st.just(M), st.just(M + M), st.just(M[:2]), st.just(M[2:]))
payload = st.lists(piece, max_size=8).map(b"".join)
payloads = st.lists(payload, max_size=12)
chunk = st.sampled_from([8, 9, 15, 64, 1 << 20])


@settings(max_examples=200, deadline=None)
@given(payloads, chunk, st.integers(0, 2**16))
def test_mxnet_round_trip(xs, chunk_size, seed):
    buf = io.BytesIO()
    with RecordWriter(buf) as w:
        offsets = [w.write(x) for x in xs]
    data = buf.getvalue()
    assert data == b"".join(mxnet_frames(x) for x in xs)  # the writer's split rule, reimplemented
    got = list(RecordReader(ShortReads(data, seed=seed), chunk_size=chunk_size))
    assert [r.payload for r in got] == xs
    assert [r.offset for r in got] == offsets


@settings(max_examples=200, deadline=None)
@given(st.data(), payloads, chunk)
def test_concat_round_trip(data, xs, chunk_size):
    stream = b""
    for x in xs:
        sizes = data.draw(st.lists(st.integers(0, 11), max_size=4))
        stream += concat_frames(x, sizes)
    got = [r.payload for r in RecordReader(ShortReads(stream, seed=len(stream)), join="concat",
                                           chunk_size=chunk_size)]
    assert got == xs


@settings(max_examples=50, deadline=None)
@given(payloads)
def test_indexed_round_trip(tmp_path_factory, xs):
    d = tmp_path_factory.mktemp("idx")
    with RecordWriter(d / "a.rec", index=d / "a.idx") as w:
        for x in xs:
            w.write(x)
    with IndexedRecordReader(d / "a.rec") as r:
        assert r.keys == list(range(len(xs)))
        assert [r[k] for k in reversed(r.keys)] == xs[::-1]


@settings(max_examples=100, deadline=None)
@given(payloads, st.binary(min_size=1, max_size=40), chunk)
def test_skip_never_loses_records_after_trailing_garbage(xs, garbage, chunk_size):
    """Garbage at the end never costs a good record, and the garbage bytes are all counted."""
    buf = io.BytesIO()
    with RecordWriter(buf) as w:
        for x in xs:
            w.write(x)
    r = RecordReader(io.BytesIO(buf.getvalue() + garbage), on_corrupt="skip", chunk_size=chunk_size)
    got = [rec.payload for rec in r]
    assert got[:len(xs)] == xs
    if len(got) == len(xs):
        assert r.skipped_bytes == len(garbage)
