"""Byte-exact agreement with files and bytes MXNet itself wrote (``tests/golden/``, see make_golden.py)."""

from __future__ import annotations

import io
import os
import random
import shutil

import numpy as np
import pytest

from parrecio import IndexedRecordReader, IRHeader, RecordReader, RecordWriter, pack, unpack
from parrecio.recordio import read_index
from parrecio.recordio.framing import encode_record
from recordio_helpers import GOLDEN, golden_bytes, load_manifest, mxnet_frames

MANIFEST = load_manifest()
RECORDS = [(r["name"], r["key"], bytes.fromhex(r["payload"])) for r in MANIFEST["records"]]
PAYLOADS = [p for _, _, p in RECORDS]
KEYS = [k for _, k, _ in RECORDS]
REC = os.path.join(GOLDEN, "mxnet.rec")
IDX = os.path.join(GOLDEN, "mxnet.idx")


def test_golden_covers_the_split_cases():
    names = {n for n, _, _ in RECORDS}
    for needed in ("magic_at_start", "magic_in_middle", "magic_at_end", "magic_consecutive",
                   "magic_unaligned_1", "ends_with_unaligned_magic", "packed_id_low_word_is_magic",
                   "packed_multi_label", "len_0", "len_9"):
        assert needed in names
    rec = golden_bytes("mxnet.rec")
    assert rec.count(bytes.fromhex("0a23d7ce")) > len(RECORDS)  # some records really are multipart


def test_writer_matches_mxnet_rec_and_idx(tmp_path):
    rec, idx = tmp_path / "out.rec", tmp_path / "out.idx"
    with RecordWriter(rec, index=idx) as w:
        for key, payload in zip(KEYS, PAYLOADS):
            w.write(payload, key=key)
    assert rec.read_bytes() == golden_bytes("mxnet.rec")
    assert idx.read_bytes() == golden_bytes("mxnet.idx")


def test_writer_to_file_object_and_tell():
    buf = io.BytesIO()
    w = RecordWriter(buf)
    offsets = [w.write(p) for p in PAYLOADS]
    assert w.tell() == len(golden_bytes("mxnet.rec"))
    w.close()
    assert not buf.closed  # not ours to close
    assert buf.getvalue() == golden_bytes("mxnet.rec")
    assert offsets == [o for _, o in read_index(IDX)]


def test_framing_matches_independent_split():
    for payload in PAYLOADS:
        assert b"".join(encode_record(payload)) == mxnet_frames(payload)


@pytest.mark.parametrize("chunk_size", [8, 13, 64, 1 << 20])
def test_reader_payloads_and_offsets(chunk_size):
    with RecordReader(REC, chunk_size=chunk_size) as r:
        got = list(r)
    assert [g.payload for g in got] == PAYLOADS
    assert [g.offset for g in got] == [o for _, o in read_index(IDX)]
    assert all(type(g.payload) is bytes for g in got)


def test_indexed_reader_random_access():
    with IndexedRecordReader(REC) as r:  # .idx found from the .rec name
        assert len(r) == len(RECORDS)
        assert r.keys == KEYS and all(type(k) is int for k in r.keys)
        assert list(r) == KEYS
        order = list(range(len(RECORDS)))
        random.Random(5).shuffle(order)
        for i in order:
            assert r[KEYS[i]] == PAYLOADS[i]
            assert r.read_at(r.offsets[i]) == PAYLOADS[i]
        assert KEYS[3] in r and 3 not in r
        with pytest.raises(KeyError):
            r[3]
    assert r.closed


def test_indexed_reader_explicit_idx_and_str_keys(tmp_path):
    rec = tmp_path / "data.bin"
    shutil.copy(REC, rec)
    idx = tmp_path / "named.idx"
    lines = [f"k{k}\t{o}\n" for k, o in read_index(IDX)]
    idx.write_text("".join(lines) + "\n")  # a trailing blank line is ignored
    with IndexedRecordReader(rec, idx) as r:
        assert r.keys == [f"k{k}" for k in KEYS]
        assert r[f"k{KEYS[-1]}"] == PAYLOADS[-1]


def test_pack_matches_mxnet():
    for case in MANIFEST["packs"]:
        flag, label, id_, id2 = case["header"]
        if not case["label_is_sequence"]:
            label = float(label)
        assert pack(IRHeader(flag, label, id_, id2), bytes.fromhex(case["data"])).hex() == case["packed"], \
            case["name"]
        if case["label_is_sequence"]:  # a numpy array label packs the same as the list
            arr = np.asarray(label, dtype=np.float64)
            assert pack((flag, arr, id_, id2), bytes.fromhex(case["data"])).hex() == case["packed"]


@pytest.mark.parametrize("kind", ["bytes", "memoryview", "numpy", "bytearray"])
def test_unpack_matches_mxnet(kind):
    for case in MANIFEST["packs"]:
        raw = bytes.fromhex(case["packed"])
        payload = {"bytes": raw, "memoryview": memoryview(raw), "bytearray": bytearray(raw),
                   "numpy": np.frombuffer(raw, np.uint8)}[kind]
        header, data = unpack(payload)
        want = case["unpacked"]
        assert (header.flag, header.id, header.id2) == (want["flag"], want["id"], want["id2"])
        if want["flag"] > 0:
            assert isinstance(header.label, np.ndarray) and header.label.dtype == np.float32
            np.testing.assert_array_equal(header.label, np.asarray(want["label"], np.float32))
        else:
            assert header.label == pytest.approx(want["label"])
        assert bytes(data) == bytes.fromhex(want["data"])


def test_golden_records_unpack_through_reader_views():
    packed = {f"packed_{c['name']}": c for c in MANIFEST["packs"]}
    names = [n for n, _, _ in RECORDS]
    with RecordReader(REC) as r:
        for name, (offset, view) in zip(names, r.iter_views()):
            if name in packed:
                header, data = unpack(view)
                assert bytes(data) == bytes.fromhex(packed[name]["unpacked"]["data"])
                assert header.id == packed[name]["unpacked"]["id"]
