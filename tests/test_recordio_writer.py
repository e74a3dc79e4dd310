"""RecordWriter: arguments, index keys, payload types, limits."""

from __future__ import annotations

import io
import mmap

import numpy as np
import pytest

from parrecio import IndexedRecordReader, RecordReader, RecordWriter
from recordio_helpers import M


def test_default_keys_are_the_running_record_number(tmp_path):
    with RecordWriter(tmp_path / "a.rec", index=tmp_path / "a.idx") as w:
        assert w.write(b"abc") == 0
        assert w.write(b"defgh", key=77) == 12
        assert w.write(M) == 28
        assert w.tell() == 28 + 8 + 8
    assert (tmp_path / "a.idx").read_text() == "0\t0\n77\t12\n2\t28\n"


def test_str_keys_round_trip(tmp_path):
    with RecordWriter(tmp_path / "a.rec", index=tmp_path / "a.idx") as w:
        w.write(b"one", key="img/1.jpg")
        w.write(b"two", key="7")
    with IndexedRecordReader(tmp_path / "a.rec") as r:
        assert r.keys == ["img/1.jpg", "7"] and r["7"] == b"two"


def test_bad_key_refused(tmp_path):
    with RecordWriter(tmp_path / "a.rec", index=tmp_path / "a.idx") as w:
        with pytest.raises(ValueError):
            w.write(b"x", key="a\tb")


def test_payload_types():
    buf = io.BytesIO()
    with RecordWriter(buf) as w:
        w.write(bytearray(b"ab"))
        w.write(memoryview(b"cdef"))
        w.write(np.arange(6, dtype=np.uint8).reshape(2, 3))
        w.write(np.array([1], dtype="<u4"))
    got = [r.payload for r in RecordReader(io.BytesIO(buf.getvalue()))]
    assert got == [b"ab", b"cdef", bytes(range(6)), b"\x01\0\0\0"]


def test_appends_after_the_file_objects_position():
    buf = io.BytesIO()
    buf.write(b"HEAD")
    w = RecordWriter(buf)
    assert w.write(b"x") == 4 and w.tell() == 16


def test_payload_of_2_pow_29_bytes_refused_without_copy():
    big = mmap.mmap(-1, 1 << 29)  # anonymous and untouched: no memory is used unless it is copied
    try:
        with RecordWriter(io.BytesIO()) as w:
            with pytest.raises(ValueError, match="2\\*\\*29"):
                w.write(big)
    finally:
        big.close()


def test_closed_writer_refuses_writes(tmp_path):
    w = RecordWriter(tmp_path / "a.rec")
    w.close()
    w.close()
    assert w.closed
    with pytest.raises(ValueError):
        w.write(b"x")


def test_split_magic_false_writes_a_payload_holding_the_magic_as_one_frame(tmp_path):
    """SageMaker's RecordIO-protobuf writer and ML-IO never split a payload; MXNet's does, where the
    magic lies at a 4-byte-aligned offset (the default here)."""
    import struct
    from parrecio.recordio import RecordReader, RecordWriter
    payload = b"abcd" + b"\x0a\x23\xd7\xce" + b"efgh"
    for split in (True, False):
        path = tmp_path / f"m{split}.rec"
        with RecordWriter(str(path), index=True, split_magic=split) as w:
            w.write(payload)
            w.write(b"next")
        data = path.read_bytes()
        magic, lrec = struct.unpack_from("<II", data)
        assert (magic, lrec >> 29, lrec & ((1 << 29) - 1)) == ((0xCED7230A, 1, 4) if split else (0xCED7230A, 0, 12))
        with RecordReader(str(path), join="mxnet" if split else "auto") as r:
            assert [bytes(rec) for _, rec in r] == [payload, b"next"]
        assert path.with_suffix(".idx").read_text() == f"0\t0\n1\t{len(data) - 12}\n"
