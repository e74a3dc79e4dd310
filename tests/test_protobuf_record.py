"""SageMaker RecordIO-protobuf: files the SageMaker Python SDK writes, read back exactly; parrecio's writer
equal to the SDK's byte for byte; the hand parser equal to the protobuf package's on drawn Records; the
ML-IO split-record layout; hostile payloads refused by name (parrecio/decoders/protobuf_record.py,
parrecio/recordio/protobuf_writer.py).

The SDK (``sagemaker``, v2: ``sagemaker.amazon.common``) is installed by .ci/run; without it the tests
that need it are skipped, and the rest still run.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from parrecio import DecodeError, ParallelReader, RecordReader, RecordWriter
from parrecio.decoders import ProtobufRecord, ProtobufSample, SparseCOO, SparseTensor
from parrecio.decoders import protobuf_record
from parrecio.decoders.protobuf_record import parse_record, parse_record_py
from parrecio.recordio.protobuf_writer import encode_record, write_dense, write_sparse

os.environ.setdefault("SAGEMAKER_SUPPRESS_V2_WARNING", "1")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sdk():
    """``sagemaker.amazon.common`` (the SDK's writer and record_pb2), or skip."""
    return pytest.importorskip("sagemaker.amazon.common", reason="the SageMaker Python SDK is not installed")


def record_pb2():
    return pytest.importorskip("sagemaker.amazon.record_pb2", reason="the SageMaker Python SDK is not installed")


def dense_cases():
    rng = np.random.default_rng(0)
    return {
        "float32": (rng.normal(size=(40, 7)).astype(np.float32), rng.integers(0, 3, 40).astype(np.float32)),
        "float64": (rng.normal(size=(40, 5)), rng.normal(size=40)),
        "int": (rng.integers(-2 ** 31, 2 ** 31 - 1, (40, 6)), rng.integers(-3, 3, 40)),   # -> Int32Tensor
        "no label": (rng.normal(size=(40, 3)).astype(np.float32), None),
        # a value whose bits are the RecordIO magic, somewhere in each row: the SDK writes one frame per
        # row; ours split such rows MXNet's way (4 bytes short for a reader that concatenates parts)
        "holds the magic": (_with_magic(rng.normal(size=(40, 8)).astype(np.float32)), rng.normal(size=40)),
    }


def _with_magic(x):
    magic = np.array([0xCED7230A], np.uint32).view(np.float32)[0]
    for i in range(len(x)):
        x[i, i % x.shape[1]] = magic
    return x


def sparse_case():
    import scipy.sparse
    rng = np.random.default_rng(1)
    m = scipy.sparse.random(60, 300, density=0.05, format="csr", random_state=2, dtype=np.float32).tolil()
    m[3, :] = 0  # an empty row
    return m.tocsr(), rng.integers(0, 2, 60).astype(np.float32)


def sdk_bytes(writer, x, y) -> bytes:
    buf = io.BytesIO()
    writer(buf, x, y)
    return buf.getvalue()


def read_all(path, workers=0, **kw):
    with ParallelReader(str(path), fields=ProtobufRecord(), workers=workers, **kw) as reader:
        return list(reader)


@pytest.mark.parametrize("name", list(dense_cases()))
def test_dense_sdk_files_write_and_read_exactly(tmp_path, name):
    common = sdk()
    x, y = dense_cases()[name]
    want = sdk_bytes(common.write_numpy_to_dense_tensor, x, y)
    ours = io.BytesIO()
    assert write_dense(ours, x, y) == len(x)
    assert ours.getvalue() == want  # byte for byte
    path = tmp_path / "dense.rec"
    path.write_bytes(want)
    dtype = np.int32 if x.dtype == np.int64 else x.dtype
    for workers in (0, 2):
        got = read_all(path, workers)
        assert len(got) == len(x)
        for i, s in enumerate(got):
            assert type(s) is ProtobufSample
            assert s["values"].dtype == dtype and np.array_equal(s["values"], x[i])
            if y is None:
                assert list(s) == ["values"]
            else:
                assert list(s) == ["values", "label_values"] and s["label_values"].shape == (1,)
                assert s["label_values"][0] == y[i]


def test_sparse_sdk_file_writes_and_reads_exactly(tmp_path):
    common = sdk()
    m, y = sparse_case()
    want = sdk_bytes(common.write_spmatrix_to_sparse_tensor, m, y)
    ours = io.BytesIO()
    write_sparse(ours, m, y)
    assert ours.getvalue() == want
    # scipy's sparse arrays (what it recommends; save_npz/load_npz keep the type) have no getrow(): an
    # AttributeError, and `pack protobuf X.npz` a traceback (audit)
    import scipy.sparse
    for array in (scipy.sparse.csr_array(m), scipy.sparse.coo_array(m)):
        again = io.BytesIO()
        write_sparse(again, array, y)
        assert again.getvalue() == want
    path = tmp_path / "sparse.rec"
    path.write_bytes(want)
    for workers in (0, 2):
        got = read_all(path, workers)
        dense = np.zeros(m.shape, np.float32)
        for i, s in enumerate(got):
            t = s["values"]
            assert isinstance(t, SparseTensor) and t.shape == (300,) and t.values.dtype == np.float32
            dense[i, t.keys.astype(np.int64)] = t.values
            assert s["label_values"][0] == y[i]
        assert np.array_equal(dense, m.toarray())
        assert len(got[3]["values"].keys) == 0


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("kind", ["dense", "sparse"])
def test_sdk_files_shuffled_and_sharded_read_exactly(tmp_path, workers, kind, no_leaks):
    """SDK-written files, shuffled (a shuffle buffer: no .idx) and read as 2 shards: every row once over
    the shards, each with its values, dtype, shape and label."""
    common = sdk()
    if kind == "dense":
        x, y = dense_cases()["float64"]
        data, rows = sdk_bytes(common.write_numpy_to_dense_tensor, x, y), x
    else:
        m, y = sparse_case()
        data, rows = sdk_bytes(common.write_spmatrix_to_sparse_tensor, m, y), m.toarray()
    path = tmp_path / f"{kind}.rec"
    path.write_bytes(data)
    where = {rows[i].tobytes() + np.asarray(y[i]).tobytes(): i for i in range(len(rows))}
    seen = []
    for shard in range(2):
        with ParallelReader(str(path), fields=ProtobufRecord(), workers=workers, shuffle=True, seed=9,
                            shuffle_buffer=16, num_shards=2, shard_index=shard) as reader:
            assert reader.config.shuffle_mode == "buffer"
            for s in reader:
                v = s["values"]
                if kind == "sparse":
                    assert v.shape == (300,) and v.values.dtype == np.float32
                    row = np.zeros(300, np.float32)
                    row[v.keys.astype(np.int64)] = v.values
                else:
                    assert v.dtype == np.float64 and v.shape == (5,)
                    row = v
                label = s["label_values"]
                assert label.shape == (1,) and label.dtype == y.dtype
                seen.append(where[row.tobytes() + label[0].tobytes()])
    assert sorted(seen) == list(range(len(rows)))
    assert seen != sorted(seen)  # shuffled


@pytest.mark.parametrize("workers", [0, 2])
def test_batches_shuffled_and_sharded(tmp_path, workers, no_leaks):
    """Dense features stack, sparse ones batch as COO and CSR; the shards of a shuffled read are the whole
    file once, each sample intact."""
    import scipy.sparse
    x, y = dense_cases()["float32"]
    write_dense(tmp_path / "d.rec", x, y, index=True)
    m, ym = sparse_case()
    write_sparse(tmp_path / "s.rec", m, ym, index=True)
    seen = []
    for shard in range(2):
        with ParallelReader(str(tmp_path / "d.rec"), fields=ProtobufRecord(), workers=workers, batch_size=8,
                            shuffle=True, seed=5, num_shards=2, shard_index=shard) as reader:
            for b in reader:
                assert b["values"].shape[1:] == (7,) and b["values"].dtype == np.float32
                assert b["label_values"].shape[1:] == (1,)
                for row, label in zip(b["values"], b["label_values"][:, 0]):
                    i = int(np.flatnonzero((x == row).all(axis=1))[0])
                    assert y[i] == label
                    seen.append(i)
    assert sorted(seen) == list(range(len(x)))
    with ParallelReader(str(tmp_path / "s.rec"), fields=ProtobufRecord(), workers=workers, batch_size=16) as r:
        coo = [b["values"] for b in r]
    assert all(isinstance(c, SparseCOO) for c in coo) and coo[0].shape == (16, 300)
    dense = np.concatenate([_densify(c) for c in coo])
    assert np.array_equal(dense, m.toarray())
    with ParallelReader(str(tmp_path / "s.rec"), fields=ProtobufRecord(sparse="csr"), workers=workers,
                        batch_size=16) as r:
        csr = [b["values"] for b in r]
    assert all(scipy.sparse.issparse(c) for c in csr)
    assert np.array_equal(scipy.sparse.vstack(csr).toarray(), m.toarray())


def _densify(c: SparseCOO) -> np.ndarray:
    out = np.zeros(c.shape, c.values.dtype)
    out[tuple(c.indices.T)] = c.values
    return out


@pytest.mark.parametrize("workers", [0, 2])
def test_a_record_that_does_not_match_its_batch_names_the_sample(tmp_path, workers, no_leaks):
    path = tmp_path / "mixed.rec"
    with RecordWriter(str(path)) as w:
        for i in range(12):
            n = 5 if i != 9 else 6
            w.write(encode_record(2, np.arange(n, dtype=np.float32)))
    with RecordReader(str(path)) as rr:
        offsets = [off for off, _ in rr.iter_views()]
    with ParallelReader(str(path), fields=ProtobufRecord(), workers=workers, batch_size=4) as reader:
        it = iter(reader)
        assert next(it)["values"].shape == (4, 5)
        assert next(it)["values"].shape == (4, 5)
        # the sample before it in its batch comes first, as before a sample that does not decode (it was
        # lost with the batch; and the error named no offset or file: an audit)
        assert next(it)["values"].shape == (1, 5)
        with pytest.raises(DecodeError) as info:
            next(it)
    assert (info.value.index, info.value.offset, info.value.source) == (9, offsets[9], str(path))
    assert str(info.value).startswith("'values' is a dense float32 tensor of shape (6,) where the batch's others "
                                      "are a dense float32 tensor of shape (5,)")


@pytest.mark.parametrize("workers", [0, 2])
def test_a_sample_unlike_its_batch_after_skipped_ones_is_located(tmp_path, workers, no_leaks):
    """Under "skip", samples skipped inside the batch (5 that do not decode) pushed the odd sample's place
    out of what workers=0 kept of the recent samples: no offset or file (a review audit)."""
    path = tmp_path / "skips.rec"
    with RecordWriter(str(path)) as w:
        for i in range(16):
            w.write(b"\xff\xff\xff garbage" if 8 <= i <= 12 else
                    encode_record(2, np.arange(5 if i == 13 else 4, dtype=np.float32)))
    with RecordReader(str(path)) as rr:
        offsets = [off for off, _ in rr.iter_views()]
    got = []
    with ParallelReader(str(path), fields=ProtobufRecord(), workers=workers, batch_size=7,
                        on_error="skip") as reader:
        with pytest.raises(DecodeError) as info:
            for batch in reader:
                got.append(len(batch["values"]))
    assert got == [7, 1]  # 0-6, then 7 (8-12 skipped) before 13
    assert (info.value.index, info.value.offset, info.value.source) == (13, offsets[13], str(path))


@pytest.mark.parametrize("odd", [4, 5, 7])
def test_the_sample_unlike_its_batch_is_named_wherever_it_is_in_it(tmp_path, odd, no_leaks):
    """The odd record first in its batch was taken as the batch's measure: the error named the good sample
    after it."""
    path = tmp_path / "odd.rec"
    with RecordWriter(str(path)) as w:
        for i in range(8):
            w.write(encode_record(2, np.arange(4 if i == odd else 3, dtype=np.float32)))
    got = []
    with ParallelReader(str(path), fields=ProtobufRecord(), workers=0, batch_size=4) as reader:
        with pytest.raises(DecodeError) as info:
            for batch in reader:
                got.append(len(batch["values"]))
    assert info.value.index == odd and got == [4] + ([odd - 4] if odd > 4 else [])
    assert "is a dense float32 tensor of shape (4,) where the batch's others are a dense float32 tensor of " \
           "shape (3,)" in str(info.value)


def _pb_record(rng, names, sparse):
    """A random Record built with the protobuf package (the SDK's record_pb2)."""
    rec = record_pb2().Record()
    for name in names:
        kind = rng.choice(["float32_tensor", "float64_tensor", "int32_tensor", "bytes"])
        value = rec.features[name]
        if kind == "bytes":
            value.bytes.value.extend([bytes(rng.integers(0, 256, rng.integers(0, 9)).astype(np.uint8))
                                      for _ in range(rng.integers(0, 3))])
            continue
        tensor = getattr(value, kind)
        n = int(rng.integers(0, 12))
        if kind == "int32_tensor":
            vals = rng.integers(-2 ** 31, 2 ** 31, n).tolist()
        else:
            vals = rng.normal(size=n).astype(np.float32 if kind == "float32_tensor" else np.float64).tolist()
        tensor.values.extend(vals)
        if sparse and n:
            size = int(rng.integers(n, 4 * n + 1))
            tensor.keys.extend(sorted(rng.choice(size, n, replace=False).tolist()))
            tensor.shape.extend([size])
        elif rng.random() < 0.5 and n:
            tensor.shape.extend([1, n])
    rec.label["values"].float32_tensor.values.extend([float(rng.integers(0, 9))])
    if rng.random() < 0.5:
        rec.uid = f"id-{rng.integers(1000)}"
    if rng.random() < 0.5:
        rec.metadata = '{"source": "é"}'
    return rec


def _expected(value):
    kind = value.WhichOneof("value")
    if kind == "bytes":
        return list(value.bytes.value)
    t = getattr(value, kind)
    dtype = {"float32_tensor": np.float32, "float64_tensor": np.float64, "int32_tensor": np.int32}[kind]
    vals = np.array(list(t.values), dtype)
    if len(t.keys):
        return SparseTensor(np.array(list(t.keys), np.uint64), vals, tuple(t.shape))
    return vals.reshape(tuple(t.shape)) if len(t.shape) else vals


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), nfeatures=st.integers(1, 4), sparse=st.booleans())
def test_the_hand_parser_equals_the_protobuf_package(seed, nfeatures, sparse):
    rng = np.random.default_rng(seed)
    rec = _pb_record(rng, [f"f{i}" for i in range(nfeatures)], sparse)
    data = rec.SerializeToString()
    sample = ProtobufRecord(uid=True, metadata=True)(memoryview(data).toreadonly())
    for name, value in rec.features.items():
        got, want = sample[name], _expected(value)
        if isinstance(want, SparseTensor):
            assert isinstance(got, SparseTensor) and got.shape == want.shape
            assert np.array_equal(got.keys, want.keys) and np.array_equal(got.values, want.values)
            assert got.values.dtype == want.values.dtype
        elif isinstance(want, list):
            assert got == want
        else:
            assert got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want)
    assert sample["label_values"].tolist() == list(rec.label["values"].float32_tensor.values)
    assert sample["uid"] == rec.uid and sample["metadata"] == rec.metadata
    assert _same(parse_record_py(data), parse_record(data))  # the C and the Python parser


def _outcome(parse, data):
    try:
        return parse(data)
    except DecodeError as exc:
        return ("DecodeError", str(exc))


def _same(a, b) -> bool:
    """Two parse results (or errors) are equal: the same names, kinds, dtypes, shapes and values."""
    if isinstance(a, tuple) and not isinstance(a, SparseTensor) and a and isinstance(a[0], str) \
            and a[0] == "DecodeError":
        return a == b
    if type(a) is not type(b):
        return False
    if isinstance(a, (tuple, list)) and not isinstance(a, SparseTensor):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, SparseTensor):
        return a.shape == b.shape and _same(a.keys, b.keys) and _same(a.values, b.values)
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b, equal_nan=True)
    return a == b


needs_c = pytest.mark.skipif(protobuf_record._protobuf is None, reason="the _protobuf C extension is not built")


@needs_c
@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)),
                                                         max_size=4), cut=st.integers(0, 10_000))
def test_the_c_and_the_python_parser_agree_on_damaged_records(seed, edits, cut):
    """Bytes changed or cut anywhere in a valid record: the same result, or the same DecodeError."""
    rng = np.random.default_rng(seed)
    data = bytearray(encode_record(int(rng.choice([2, 3, 7])), rng.integers(-9, 9, int(rng.integers(0, 20))),
                                   2, 1.0, keys=None))
    if rng.random() < 0.5:
        k = np.sort(rng.choice(50, 5, replace=False))
        data = bytearray(encode_record(2, np.ones(5), 7, 3, keys=k, shape=[50]))
    for pos, byte in edits:
        if data:
            data[pos % len(data)] = byte
    data = bytes(data[:cut % (len(data) + 1)])
    assert _same(_outcome(parse_record_py, data), _outcome(parse_record, data))


def test_ml_io_split_record_layout_reads_by_default():
    """ML-IO's split_records.pr: parts of 8, 10, 1 and 29 bytes whose plain concatenation is the record
    (no magic re-inserted).  join='auto' sees parts that are not multiples of 4: concat."""
    payload = encode_record(2, np.arange(3, dtype=np.float32), 2, 1.0)
    assert len(payload) == 48
    parts, pos, buf = (8, 10, 1, 29), 0, io.BytesIO()
    for k, n in enumerate(parts):
        cflag = 1 if k == 0 else 3 if k == len(parts) - 1 else 2
        chunk = payload[pos:pos + n]
        pos += n
        buf.write(np.array([0xCED7230A, cflag << 29 | n], "<u4").tobytes() + chunk + b"\0" * (-n % 4))
    whole = np.array([0xCED7230A, len(payload)], "<u4").tobytes() + payload  # complete_records.pr's kind
    data = whole + buf.getvalue() + whole
    recs = [r.payload for r in RecordReader(io.BytesIO(data))]
    assert recs == [payload] * 3
    with ParallelReader(io.BytesIO(data), fields=ProtobufRecord(), workers=0) as reader:
        got = list(reader)
    assert all(np.array_equal(s["values"], np.arange(3, dtype=np.float32)) for s in got) and len(got) == 3


def _frame(payload: bytes) -> bytes:
    return np.array([0xCED7230A, len(payload)], "<u4").tobytes() + payload + b"\0" * (-len(payload) % 4)


def _tensor_body(values: bytes = b"", keys: bytes = b"", shape: bytes = b"") -> bytes:
    body = b""
    for number, raw in ((1, values), (2, keys), (3, shape)):
        if raw:
            body += bytes([number << 3 | 2]) + _len(raw) + raw
    return body


def _len(raw: bytes) -> bytes:
    out, n = bytearray(), len(raw)
    while True:
        if n < 0x80:
            out.append(n)
            return bytes(out)
        out.append(n & 0x7F | 0x80)
        n >>= 7


def _record_with(tensor_body: bytes, kind: int = 2) -> bytes:
    value = bytes([kind << 3 | 2]) + _len(tensor_body) + tensor_body
    entry = b"\x0a\x06values" + b"\x12" + _len(value) + value
    return b"\x0a" + _len(entry) + entry


HOSTILE = {
    "truncated varint": (b"\x0a\xff", "runs past the end"),
    "length past the end": (b"\x0a\x7f\x0a\x06values", "declares 127 bytes, past the end"),
    "a declared length of 2**62": (b"\x0a" + b"\x80" * 8 + b"\x40" + b"\0" * 16,
                                   "declares 4611686018427387904 bytes, past the end"),
    "ten-byte varint overflow": (b"\x08" + b"\xff" * 9 + b"\x7f", "longer than 64 bits"),
    "eleven-byte varint": (b"\x08" + b"\xff" * 10 + b"\x01", "longer than 10 bytes"),
    "a group": (b"\x0b\x0c", "wire type 3 (a group)"),
    "huge declared shape": (_record_with(_tensor_body(values=b"\0" * 12, shape=b"\x80\x80\x80\x80\x80\x80\x80\x80\x40")),
                            "holds 4611686018427387904 values, the tensor has 3"),
    # (each record alone fitted; a batch's int64 indices wrapped: a csr_matrix 0 columns wide)
    "a sparse shape of 2**64 elements": (_record_with(_tensor_body(values=b"\0" * 4, keys=b"\x07",
                                                                   shape=b"\x80\x80\x80\x80\x10" * 2)),
                                         "shape [4294967296, 4294967296] has 18446744073709551616 elements, "
                                         "more than an array can index"),
    "a dimension of 2**64 - 1": (_record_with(_tensor_body(values=b"\0" * 4, keys=b"\x07",
                                                           shape=b"\xff" * 9 + b"\x01")),
                                 "more than an array can index"),
    # (no elements, so under the size limit; numpy's own ValueError came out of reshape)
    "a shape of 0 x 2**62": (_record_with(_tensor_body(shape=b"\x00" + b"\x80" * 8 + b"\x40")),
                             "shape [0, 4611686018427387904] cannot be an array"),
    "keys outside the shape": (_record_with(_tensor_body(values=b"\0" * 8, keys=b"\x01\x09", shape=b"\x05")),
                               "key 9 outside the shape [5]"),
    "keys without a shape": (_record_with(_tensor_body(values=b"\0" * 4, keys=b"\x01")), "without a shape"),
    "keys and values of other counts": (_record_with(_tensor_body(values=b"\0" * 8, keys=b"\x01", shape=b"\x05")),
                                        "1 keys for 2 values"),
    "floats not a multiple of 4": (_record_with(_tensor_body(values=b"\0" * 7)), "not a multiple of 4"),
    "int32 out of range": (_record_with(_tensor_body(values=b"\x80\x80\x80\x80\x10"), kind=7),
                           "out of the int32 range"),
    "an empty Value": (b"\x0a\x0a\x0a\x06values\x12\x00", "a Value with none of"),
    "a map entry without a value": (b"\x0a\x08\x0a\x06values", "has no value"),
    "a name that is not UTF-8": (b"\x0a\x05\x0a\x03\xff\xfe\xfd", "not valid UTF-8"),
    "deep unknown nesting": (b"\x32" + _len(b"\x32\x02" * 5000) + b"\x32\x02" * 5000, None),  # skipped, no recursion
}


@pytest.mark.parametrize("parser", ["c", "python"])
@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_payloads_are_refused_by_name(name, parser, monkeypatch):
    if parser == "python":
        monkeypatch.setattr(protobuf_record, "_protobuf", None)
    elif protobuf_record._protobuf is None:
        pytest.skip("the _protobuf C extension is not built")
    payload, message = HOSTILE[name]
    if message is None:
        assert ProtobufRecord()(payload) == {}  # unknown fields are skipped whole, never descended into
        return
    with pytest.raises(DecodeError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        ProtobufRecord()(payload)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_hostile_record_in_a_file_names_its_sample(tmp_path, workers, no_leaks):
    path = tmp_path / "h.rec"
    good = encode_record(2, np.ones(4, np.float32))
    path.write_bytes(b"".join(_frame(p) for p in [good] * 5 + [HOSTILE["huge declared shape"][0]] + [good] * 3))
    with ParallelReader(str(path), fields=ProtobufRecord(), workers=workers) as reader:
        with pytest.raises(DecodeError) as info:
            list(reader)
    assert info.value.index == 5 and info.value.offset == 5 * len(_frame(good))
    assert "field '0' (ProtobufRecord()): feature 'values': shape [4611686018427387904] holds" in str(info.value)
    with ParallelReader(str(path), fields=ProtobufRecord(), workers=workers, on_error="skip") as reader:
        assert len(list(reader)) == 8 and reader.stats.skipped == 1


def test_features_in_another_order_batch_together():
    """A map's entries have no order: records that list the same features in another order are alike."""
    a = np.arange(3, dtype="<f4").tobytes()
    def entry(name):
        value = b"\x12" + _len(_tensor_body(values=a)) + _tensor_body(values=a)
        body = b"\x0a" + _len(name) + name + b"\x12" + _len(value) + value
        return b"\x0a" + _len(body) + body
    one, two = entry(b"a") + entry(b"b"), entry(b"b") + entry(b"a")
    samples = [ProtobufRecord()(p) for p in (one, two, two, one)]
    batch = type(samples[0]).collate_batch(samples)
    assert sorted(batch) == ["a", "b"] and batch["a"].shape == (4, 3) and batch["b"].tolist() == [[0, 1, 2]] * 4


@pytest.mark.parametrize("parser", ["c", "python"])
def test_a_feature_given_twice_is_its_last_entry_in_both_parsers(parser, monkeypatch):
    """protobuf keeps a map's last entry for a key; the C path checked every entry, and refused a record
    whose overwritten first entry was invalid (the Python parser read it)."""
    if parser == "python":
        monkeypatch.setattr(protobuf_record, "_protobuf", None)
    elif protobuf_record._protobuf is None:
        pytest.skip("the _protobuf C extension is not built")
    bad = _record_with(_tensor_body(values=np.arange(3, dtype="<f4").tobytes(), shape=b"\x02"))
    good = _record_with(_tensor_body(values=np.array([4, 5], "<f4").tobytes(), shape=b"\x02"))
    got = ProtobufRecord()(bad + good)
    assert list(got) == ["values"] and got["values"].tolist() == [4.0, 5.0]
    with pytest.raises(DecodeError, match="shape \\[2\\] holds 2 values, the tensor has 3"):
        ProtobufRecord()(good + bad)


def test_features_and_options():
    payload = encode_record(2, np.arange(3, dtype=np.float32), 7, 2)
    assert list(ProtobufRecord()(payload)) == ["values", "label_values"]
    assert list(ProtobufRecord(label=False)(payload)) == ["values"]
    assert ProtobufRecord(uid=True)(payload)["uid"] == ""
    assert ProtobufRecord(label=False, features=["values"])(payload)["values"].tolist() == [0, 1, 2]
    with pytest.raises(DecodeError, match=r"the record has no feature 'x' \(it has \['values'\]\)"):
        ProtobufRecord(features=["x"])(payload)
    with pytest.raises(ValueError, match="sparse must be one of"):
        ProtobufRecord(sparse="dense")
    with pytest.raises(TypeError, match="features must be None or a sequence of names"):
        ProtobufRecord(features="values")
    assert repr(ProtobufRecord(sparse="csr")) == "ProtobufRecord(sparse='csr')"
    assert parse_record(payload)[1]["values"].dtype == np.int32


def test_cli_pack_protobuf_writes_the_sdks_bytes(tmp_path):
    common = sdk()
    x, y = dense_cases()["float64"]
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    m, ym = sparse_case()
    import scipy.sparse
    scipy.sparse.save_npz(tmp_path / "m.npz", m)
    np.save(tmp_path / "ym.npy", ym)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for feats, labels, out, want in (("x.npy", "y.npy", "d.rec", sdk_bytes(common.write_numpy_to_dense_tensor, x, y)),
                                     ("m.npz", "ym.npy", "s.rec",
                                      sdk_bytes(common.write_spmatrix_to_sparse_tensor, m, ym))):
        proc = subprocess.run([sys.executable, "-m", "parrecio.cli", "pack", "protobuf", feats, out, "--labels",
                               labels], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert (tmp_path / out).read_bytes() == want
        assert (tmp_path / out).with_suffix(".idx").exists()
        assert proc.stderr.startswith(f"pack: {len(ym) if out == 's.rec' else len(y)} records, ")


@pytest.mark.parametrize("fmt", ["coo", "csr"])
@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_torch_gets_sparse_tensors_where_asked(tmp_path, fmt, layout, no_leaks):
    torch = pytest.importorskip("torch")
    from parrecio.integrations.torch import ParallelIterableDataset, to_torch
    m, y = sparse_case()
    write_sparse(tmp_path / "s.rec", m, y)
    with ParallelReader(str(tmp_path / "s.rec"), fields=ProtobufRecord(sparse=fmt), workers=2, batch_size=16) as r:
        batches = [to_torch(b, sparse_layout=layout) for b in r]
    want = torch.sparse_coo if layout == "coo" else torch.sparse_csr
    assert all(b["values"].layout == want and b["values"].dtype == torch.float32 for b in batches)
    assert np.array_equal(np.concatenate([b["values"].to_dense().numpy() for b in batches]), m.toarray())
    assert np.array_equal(np.concatenate([b["label_values"].numpy()[:, 0] for b in batches]), y)
    with ParallelIterableDataset(str(tmp_path / "s.rec"), fields=ProtobufRecord(sparse=fmt), workers=0,
                                 batch_size=16, sparse_layout=layout) as ds:
        assert [b["values"].layout for b in ds] == [want] * 4
    with pytest.raises(ValueError, match="sparse_layout must be one of"):
        to_torch({}, sparse_layout="dense")


@pytest.mark.parametrize("fmt", ["coo", "csr"])
def test_tf_data_gets_sparse_tensors(tmp_path, fmt, no_leaks):
    tf = pytest.importorskip("tensorflow")
    from parrecio.integrations.tf import dataset
    m, y = sparse_case()
    write_sparse(tmp_path / "s.rec", m, y)
    with ParallelReader(str(tmp_path / "s.rec"), fields=ProtobufRecord(sparse=fmt), workers=2, batch_size=16) as r:
        ds = dataset(r)
        assert ds.element_spec["values"] == tf.SparseTensorSpec([None, 300], tf.float32)
        got = list(ds)
    dense = np.concatenate([tf.sparse.to_dense(b["values"]).numpy() for b in got])
    assert np.array_equal(dense, m.toarray())
    assert np.array_equal(np.concatenate([b["label_values"].numpy()[:, 0] for b in got]), y)


def test_the_writer_refuses_what_the_sdk_refuses(tmp_path):
    from parrecio.errors import SourceError
    from parrecio.tools.pack import pack_protobuf
    with pytest.raises(ValueError, match="array must be a matrix"):
        write_dense(io.BytesIO(), np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="unsupported dtype uint8"):
        write_dense(io.BytesIO(), np.zeros((2, 3), np.uint8))
    with pytest.raises(ValueError, match="3 labels for 2 rows"):
        write_dense(io.BytesIO(), np.zeros((2, 3)), np.zeros(3))
    with pytest.raises(TypeError, match="matrix must be a scipy sparse matrix"):
        write_sparse(io.BytesIO(), np.zeros((2, 3)))
    np.save(tmp_path / "v.npy", np.zeros(4, np.float32))
    with pytest.raises(SourceError, match=r"v\.npy: array must be a matrix"):
        pack_protobuf(str(tmp_path / "v.npy"), str(tmp_path / "out.rec"))
    np.savez(tmp_path / "plain.npz", a=np.zeros(3))
    with pytest.raises(SourceError, match=r"plain\.npz: not a scipy sparse matrix saved by scipy\.sparse\.save_npz"):
        pack_protobuf(str(tmp_path / "plain.npz"), str(tmp_path / "out.rec"))
    np.save(tmp_path / "m.npy", np.arange(6, dtype=np.float32).reshape(2, 3))
    res = pack_protobuf(str(tmp_path / "m.npy"), str(tmp_path / "ok.rec"))
    assert (res.records, res.rec_path, res.idx_path) == (2, str(tmp_path / "ok.rec"), str(tmp_path / "ok.idx"))
    with ParallelReader(res.rec_path, fields=ProtobufRecord(), workers=0) as reader:
        assert len(reader) == 2 and [s["values"].tolist() for s in reader] == [[0, 1, 2], [3, 4, 5]]


@pytest.mark.parametrize("source", ["file", "stream"])
def test_many_ring_laps_and_records_over_half_the_ring(tmp_path, source, no_leaks):
    """Dense and sparse Records of every size, from empty to 600 KB (more than half of a 1 MiB ring), some
    5 MiB in all: a file read in place and a stream that laps the ring five times; workers 1 and 3 give
    what workers=0 gives, and that is what the Python parser makes of each payload on its own."""
    from parrecio import Tuning
    rng = np.random.default_rng(3)
    payloads = []
    for i in range(400):
        n = [0, 1, 7, 256, 4000][i % 5] if i % 97 else 150_000  # 150k float32: 600 KB
        if i % 3 == 0:
            keys = np.sort(rng.choice(10 * n + 10, n, replace=False)) if n else np.zeros(0, np.int64)
            payloads.append(encode_record(2, rng.normal(size=n).astype(np.float32), 7, i,
                                          keys=keys, shape=[10 * n + 10]))
        else:
            payloads.append(encode_record(3 if i % 2 else 7, rng.integers(-99, 99, n), 2, float(i)))
    path = tmp_path / "laps.rec"
    with RecordWriter(str(path)) as w:
        for p in payloads:
            w.write(p)
    assert path.stat().st_size > 5 * (1 << 20)
    want = [parse_record_py(p) for p in payloads]
    got = {}
    for workers in (0, 1, 3):
        src = str(path) if source == "file" else io.BytesIO(path.read_bytes())
        with ParallelReader(src, fields=ProtobufRecord(), workers=workers, tuning=Tuning(ring_bytes=1 << 20)) as r:
            got[workers] = [dict(s) for s in r]
            assert r.stats.samples == len(payloads)
    for workers, samples in got.items():
        assert len(samples) == len(want)
        for s, (features, label, _) in zip(samples, want):
            expected = dict(features, **{f"label_{k}": v for k, v in label.items()})
            assert _same(s, expected), workers


@pytest.mark.parametrize("sparse", ["coo", "csr"])
@pytest.mark.parametrize("workers", [0, 1])
def test_even_shards_pad_sparse_batches(tmp_path, workers, sparse, no_leaks):
    """even_shards="pad" with on_error="skip" pads a rank's last batch with copies of its first sample: a
    SparseCOO column (a named tuple) was taken for a tuple of columns ("'int' object is not
    subscriptable"), a csr one for a list.  Both are padded as batches of rows now: the rank yields its
    share, the copies equal its first sample, and the other rows are the file's."""
    pytest.importorskip("scipy")
    import scipy.sparse
    m = scipy.sparse.random(9, 20, density=0.3, format="csr", random_state=0, dtype=np.float32)
    path = tmp_path / "s.rec"
    with open(path, "wb") as f:
        write_sparse(f, m, np.arange(9, dtype=np.float32))
    offsets = [r.offset for r in RecordReader(str(path))]
    data = bytearray(path.read_bytes())
    data[offsets[4] + 8:offsets[4] + 12] = b"\xff\xff\xff\xff"  # record 4 (shard 0's third) does not parse
    path.write_bytes(bytes(data))
    with ParallelReader(path, ProtobufRecord(sparse=sparse), workers=workers, batch_size=2, num_shards=2,
                        shard_index=0, even_shards="pad", on_error="skip") as reader:
        batches = list(reader)
        assert reader.stats.skipped == 1 and reader.stats.padded == 1

    def dense(column):
        if sparse == "csr":
            return column.toarray()
        out = np.zeros(column.shape, np.float32)
        out[tuple(column.indices.T)] = column.values
        return out

    rows = np.concatenate([dense(b["values"]) for b in batches])
    want = m.toarray()[[0, 2, 6, 8, 0]]  # rows of shard 0 but the broken one, then a copy of the first
    assert [len(b["label_values"]) for b in batches] == [2, 2, 1] and np.array_equal(rows, want)


@pytest.mark.parametrize("even", [None, "pad"])
def test_records_with_nothing_to_deliver_are_refused_in_batches(tmp_path, even, no_leaks):
    """Records of a uid alone read with the default ProtobufRecord(): a batch was {} (no rows), and equal
    shards' padding, counting its rows, failed with 'generator raised StopIteration' (audit)."""
    path = tmp_path / "uid.rec"
    with RecordWriter(str(path)) as w:
        for i in range(10):
            uid = b"id%d" % i
            w.write(b"\x1a" + bytes([len(uid)]) + uid)  # Record{uid: "id<i>"}
    with ParallelReader(str(path), fields=ProtobufRecord(), workers=0, batch_size=4, num_shards=2 if even else 1,
                        shard_index=0, even_shards=even, on_error="skip") as reader:
        with pytest.raises(DecodeError, match=r"its record holds nothing this decoder delivers .* read them "
                                              r"without batch_size, or ask for what they hold \(uid=True\) "
                                              r"\(sample 0, byte offset 0 of "):
            list(reader)
    with ParallelReader(str(path), fields=ProtobufRecord(uid=True), workers=0, batch_size=4) as reader:
        assert [b["uid"] for b in reader] == [["id0", "id1", "id2", "id3"], ["id4", "id5", "id6", "id7"],
                                              ["id8", "id9"]]
