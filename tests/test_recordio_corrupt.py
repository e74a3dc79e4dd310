"""Corrupt streams: every kind of framing error, in both ``on_corrupt`` modes, and hostile length words.

The base stream is five records of 12 bytes, so each frame is 20 bytes and record ``i`` starts at ``20*i``.
"""

from __future__ import annotations

import io
import struct
import tracemalloc

import pytest

from parrecio import CorruptRecordError, IndexedRecordReader, RecordReader
from recordio_helpers import M, ShortReads, frame

P = [b"record-%d...." % i for i in range(5)]
assert all(len(p) == 12 for p in P)
F = [frame(p) for p in P]
CHUNKS = [8, 13, 64, 1 << 20]


def _read(data, chunk_size=1 << 20, **kw):
    return RecordReader(ShortReads(data, seed=chunk_size, most=64), chunk_size=chunk_size, **kw)


def _raise(data, chunk_size=1 << 20, **kw):
    """(payloads before the error, the error)."""
    got = []
    with pytest.raises(CorruptRecordError) as e:
        for rec in _read(data, chunk_size, **kw):
            got.append(rec.payload)
    return got, e.value


def _skip(data, chunk_size=1 << 20, **kw):
    r = _read(data, chunk_size, on_corrupt="skip", **kw)
    return [rec.payload for rec in r], r


def _bad_magic(f):
    return b"\x00\x23\xd7\xce" + f[4:]


CASES = {
    # name: (stream, error offset, reason fragment, survivors under skip, skipped regions)
    "bad_magic_at_start": (_bad_magic(F[0]) + b"".join(F[1:]), 0, "bad magic", P[1:], [(0, 20)]),
    "bad_magic_in_middle": (F[0] + F[1] + _bad_magic(F[2]) + F[3] + F[4], 40, "bad magic",
                            P[:2] + P[3:], [(40, 20)]),
    "garbage_between_records": (F[0] + b"GARBAGE!" + b"".join(F[1:]), 20, "bad magic", P, [(20, 8)]),
    "lone_middle_part": (F[0] + F[1] + frame(P[2], 2) + F[3] + F[4], 40, "without a first part",
                         P[:2] + P[3:], [(40, 20)]),
    "lone_last_part": (F[0] + frame(P[1], 3) + b"".join(F[2:]), 20, "without a first part",
                       P[:1] + P[2:], [(20, 20)]),
    "first_part_then_whole_record": (F[0] + F[1] + frame(P[2], 1) + F[3] + F[4], 60, "new record (cflag 0)",
                                     P[:2] + P[3:], [(40, 20)]),
    "first_part_then_first_part": (F[0] + frame(b"abcd", 1) + frame(P[2], 1) + frame(b"", 3) + F[3], 32,
                                   "new record (cflag 1)", [P[0], P[2] + M, P[3]], [(20, 12)]),
    "stream_ends_inside_multipart": (b"".join(F[:4]) + frame(b"abcd", 1) + frame(b"ef", 2), 104,
                                     "ends inside the multipart", P[:4], [(80, 24)]),
    "truncated_header_5_bytes": (b"".join(F) + M + b"\x05", 100, "truncated frame header", P, [(100, 5)]),
    "truncated_header_3_bytes": (b"".join(F) + M[:3], 100, "truncated frame header", P, [(100, 3)]),
    "truncated_payload": (b"".join(F) + frame(b"0123456789")[:13], 100, "truncated payload", P, [(100, 13)]),
    "truncated_padding": (b"".join(F) + frame(b"0123456789")[:19], 100, "truncated payload", P, [(100, 19)]),
    "truncated_middle_frame_payload": (F[0] + F[1] + frame(P[2], length=900) + F[3] + F[4], 40,
                                       "truncated payload", P[:2] + P[3:], [(40, 20)]),
    "length_above_max": (F[0] + F[1] + frame(P[2], length=5000) + F[3] + F[4], 40, "exceeds max_record_bytes",
                         P[:2] + P[3:], [(40, 20)]),
    "joined_multipart_above_max": (F[0] + frame(b"a" * 600, 1) + frame(b"b" * 600, 3) + F[1], 628,
                                   "exceeds max_record_bytes", P[:2], [(20, 1216)]),
    "bad_magic_in_second_part": (F[0] + frame(b"abcd", 1) + _bad_magic(frame(b"ef", 3)) + F[1], 32,
                                 "bad magic", P[:2], [(20, 24)]),
}


@pytest.mark.parametrize("chunk_size", CHUNKS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_raise_names_the_offset(name, chunk_size):
    data, offset, reason, _, _ = CASES[name]
    got, err = _raise(data, chunk_size, max_record_bytes=1000, source_name="s.rec")
    assert err.offset == offset
    assert reason in err.reason
    assert f"byte offset {offset} of s.rec" in str(err)
    assert got == P[:CASES[name][4][0][0] // 20]  # every record before the broken one, and no more


@pytest.mark.parametrize("chunk_size", CHUNKS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_skip_drops_only_the_broken_record(name, chunk_size):
    data, _, _, survivors, regions = CASES[name]
    got, r = _skip(data, chunk_size, max_record_bytes=1000)
    assert got == survivors
    assert r.corrupt_regions == regions
    assert r.skipped_records == len(regions)
    assert r.skipped_bytes == sum(n for _, n in regions)


def test_raise_again_on_the_next_iteration():
    r = RecordReader(io.BytesIO(F[0] + _bad_magic(F[1])))
    with pytest.raises(CorruptRecordError) as first:
        list(r)
    with pytest.raises(CorruptRecordError) as second:
        list(r)
    assert second.value is first.value


def test_resync_ignores_unaligned_magic_and_continuation_heads():
    fake_unaligned = b"zz" + M + struct.pack("<I", 4) + b"ab"  # an unaligned head: 12 bytes
    fake_middle = frame(b"abcd", 2)  # an aligned head, but cflag 2: not a record start
    data = F[0] + _bad_magic(F[1]) + fake_unaligned + fake_middle + F[2]
    got, r = _skip(data, 8)
    assert got == [P[0], P[2]]
    assert r.corrupt_regions == [(20, 20 + 12 + 12)]


def test_resync_across_a_long_garbage_region_with_tiny_chunks():
    garbage = bytes(range(256)) * 40 + M[:3]  # no aligned head inside
    data = F[0] + garbage + b"\0" + F[1]
    for chunk_size in (8, 100, 4096):
        got, r = _skip(data, chunk_size)
        assert got == [P[0], P[1]]
        assert r.corrupt_regions == [(20, len(garbage) + 1)]


def test_corrupt_regions_list_is_capped():
    data = (_bad_magic(F[0]) + F[1]) * 1100
    got, r = _skip(data)
    assert got == [P[1]] * 1100
    assert r.skipped_records == 1100 and len(r.corrupt_regions) == 1000


def test_hostile_length_word_is_never_allocated():
    hostile = M + struct.pack("<I", (1 << 29) - 1) + b"x" * 16  # 512 MiB - 1 under the default limit
    tracemalloc.start()
    try:
        got, err = _raise(F[0] + hostile)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got == [P[0]] and err.offset == 20 and "exceeds max_record_bytes" in err.reason
    assert peak < 4 << 20  # the 1 MiB chunk buffer and change, nowhere near 512 MiB


def test_hostile_length_under_skip_resyncs():
    hostile = M + struct.pack("<I", (1 << 29) - 1)
    got, r = _skip(F[0] + hostile + F[1], 8)
    assert got == [P[0], P[1]] and r.corrupt_regions == [(20, 8)]


def test_large_length_within_limit_but_beyond_the_stream():
    """A plausible length that runs past the end: truncated, and skip finds the records it swallowed."""
    data = F[0] + frame(b"", length=100_000) + F[1] + F[2]
    got, err = _raise(data, 64)
    assert got == [P[0]] and err.offset == 20 and "truncated payload" in err.reason
    got, r = _skip(data, 64)
    assert got == P[:3] and r.corrupt_regions == [(20, 8)]


def test_indexed_reader_raises_on_corruption(tmp_path):
    rec = tmp_path / "c.rec"
    rec.write_bytes(F[0] + _bad_magic(F[1]) + frame(b"ab", 1) + frame(b"cd", 0) + frame(b"x", length=5000))
    (tmp_path / "c.idx").write_text("0\t0\n1\t20\n2\t40\n3\t64\n4\t1000\n")
    with IndexedRecordReader(rec, max_record_bytes=1000) as r:
        assert r[0] == P[0]
        for key, offset, reason in [(1, 20, "bad magic"), (2, 52, "new record"), (4, 1000, "past the end")]:
            with pytest.raises(CorruptRecordError) as e:
                r[key]
            assert e.value.offset == offset and reason in e.value.reason
        with pytest.raises(CorruptRecordError, match="exceeds max_record_bytes"):
            r[3]
        with pytest.raises(CorruptRecordError, match="bad magic"):
            r.read_at(62)  # not a record start


def test_malformed_index_line(tmp_path):
    (tmp_path / "d.rec").write_bytes(F[0])
    (tmp_path / "d.idx").write_text("0\t0\nnot a line\n")
    with pytest.raises(CorruptRecordError) as e:
        IndexedRecordReader(tmp_path / "d.rec")
    assert e.value.offset == 4


@pytest.mark.parametrize("join,total", [("mxnet", 1204), ("concat", 1200)])
def test_a_part_past_max_record_bytes_names_its_record(join, total):
    """A part after the first that takes its record past the limit: the error names the record's start and
    the size it would reach (it said "record length 600 bytes exceeds max_record_bytes (bytes left for this
    record: 396)", as if the part were a record); its offset stays the part's, where reading stopped."""
    data = F[0] + frame(b"a" * 600, 1) + frame(b"b" * 600, 3) + F[1]
    with RecordReader(io.BytesIO(data), join=join, max_record_bytes=1000) as r:
        with pytest.raises(CorruptRecordError) as e:
            list(r)
    assert e.value.offset == 628
    assert e.value.reason == (f"a part of 600 bytes takes the multipart record that starts at byte 20 to {total} "
                              f"bytes: it exceeds max_record_bytes (1000)")
