"""Writing SageMaker RecordIO-protobuf: numpy arrays and scipy sparse matrices as ``aialgs.data.Record``
payloads (see :mod:`parrecio.decoders.protobuf_record` for the schema).

:func:`write_dense` and :func:`write_sparse` write what the SageMaker Python SDK's
``write_numpy_to_dense_tensor`` and ``write_spmatrix_to_sparse_tensor`` write for the same arrays, byte for
byte (tests/test_protobuf_record.py compares them with the SDK's own output): one Record per row,
``features["values"]`` holding the row (sparse: its values, its column ids as ``keys`` and the column
count as ``shape``), ``label["values"]`` the row's label; the tensor type from the dtype as the SDK picks
it (numpy's default int -> Int32Tensor, float64 -> Float64Tensor, float32 -> Float32Tensor; int32 is also
taken, as Int32Tensor); each payload framed as a RecordIO record (a plain length word, zero padding to 4
bytes), with an optional ``.idx`` index next to it.  The encoder is written here, not taken from the
``protobuf`` package, so that parrecio does not need it.
"""

from __future__ import annotations

import os
from typing import Any, BinaryIO, Optional, Tuple, Union

import numpy as np

from .writer import RecordWriter

__all__ = ["write_dense", "write_sparse", "encode_record"]

_FLOAT32, _FLOAT64, _INT32 = 2, 3, 7    # Value's field numbers


def _tensor_kind(dtype: np.dtype) -> int:
    """The Value field the SDK's ``_resolve_type`` picks for ``dtype`` (int32 added)."""
    if dtype == np.dtype(int) or dtype == np.dtype(np.int32):
        return _INT32
    if dtype == np.dtype(float):
        return _FLOAT64
    if dtype == np.dtype(np.float32):
        return _FLOAT32
    raise ValueError(f"unsupported dtype {dtype} (float32, float64, int32 or numpy's default int)")


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _packed_varints(values: np.ndarray) -> bytes:
    return b"".join(_varint(int(v)) for v in values.tolist())


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _int32s(values: np.ndarray) -> np.ndarray:
    """``values`` as int64, each in the int32 range (ValueError if not)."""
    ints = values.astype(np.int64)
    if ((ints < -2 ** 31) | (ints >= 2 ** 31)).any():
        raise ValueError("a value out of the int32 range for an Int32Tensor")
    return ints


def _tensor(kind: int, values: np.ndarray, keys: Optional[np.ndarray] = None,
            shape: Optional[Any] = None) -> bytes:
    body = b""
    if len(values):
        if kind == _INT32:
            raw = _packed_varints(_int32s(values).astype(np.uint64))  # negatives: 10 bytes, two's complement
        else:
            raw = np.ascontiguousarray(values, "<f4" if kind == _FLOAT32 else "<f8").tobytes()
        body += _field(1, raw)
    if keys is not None and len(keys):
        body += _field(2, _packed_varints(keys.astype(np.uint64)))
    if shape is not None:
        body += _field(3, _packed_varints(np.asarray(shape, np.uint64)))
    return body


def _entry(name: str, value: bytes) -> bytes:
    return _field(1, name.encode()) + _field(2, value)


def encode_record(kind: int, values: np.ndarray, label_kind: Optional[int] = None, label: Any = None,
                  keys: Optional[np.ndarray] = None, shape: Optional[Any] = None) -> bytes:
    """One Record: ``features["values"]`` a tensor of Value field ``kind`` (2 float32, 3 float64, 7 int32),
    with ``keys``/``shape`` when sparse; ``label["values"]`` the scalar ``label`` when ``label_kind``."""
    out = _field(1, _entry("values", _field(kind, _tensor(kind, values, keys, shape))))
    if label_kind is not None:
        out += _field(2, _entry("values", _field(label_kind, _tensor(label_kind, np.asarray([label])))))
    return out


class LabelError(ValueError):
    """What is wrong is the labels, not the features (``pack protobuf`` names the labels' file)."""


def _labels(labels: Any, rows: int) -> Tuple[Optional[np.ndarray], Optional[int]]:
    """``labels`` as a vector of ``rows`` values, and its tensor kind (None, None without labels)."""
    if labels is None:
        return None, None
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise LabelError("labels must be a vector")
    if labels.shape[0] != rows:
        raise LabelError(f"{labels.shape[0]} labels for {rows} rows")
    try:
        kind = _tensor_kind(labels.dtype)
        if kind == _INT32:  # (checked before a row is written, and named as the labels')
            _int32s(labels)
    except ValueError as exc:
        raise LabelError(f"labels: {exc}") from None
    return labels, kind


def _writer(out: Union[str, "os.PathLike[str]", BinaryIO], index: Any) -> RecordWriter:
    # One frame per Record, whatever its bytes: the SDK's writer never splits (a float whose bits are
    # the magic split the row MXNet's way, 4 bytes short for a reader that concatenates parts)
    return RecordWriter(out, index=index, split_magic=False)


def write_dense(out: Union[str, "os.PathLike[str]", BinaryIO], array: Any, labels: Any = None, *,
                index: Any = None) -> int:
    """Write each row of the 2-D ``array`` as one Record (``labels[i]`` its label); ``out`` is a path or
    a binary file, ``index`` as :class:`~parrecio.recordio.RecordWriter` takes it (``True``: the ``.idx``
    next to a path).  Returns the rows written."""
    array = np.asarray(array)
    if array.ndim != 2:
        raise ValueError("array must be a matrix (2-D)")
    kind = _tensor_kind(array.dtype)
    labels, label_kind = _labels(labels, array.shape[0])
    with _writer(out, index) as w:
        for i, row in enumerate(array):
            w.write(encode_record(kind, row, label_kind, None if labels is None else labels[i]))
    return array.shape[0]


def write_sparse(out: Union[str, "os.PathLike[str]", BinaryIO], matrix: Any, labels: Any = None, *,
                 index: Any = None) -> int:
    """Write each row of the scipy sparse ``matrix`` as one sparse Record: its values, its column ids as
    ``keys`` and the column count as ``shape``.  Returns the rows written."""
    import scipy.sparse

    if not scipy.sparse.issparse(matrix):
        raise TypeError("matrix must be a scipy sparse matrix")
    if len(matrix.shape) != 2:
        raise ValueError("matrix must be 2-D")
    csr = matrix.tocsr()  # (a row is its slice of indptr, as getrow() gave it: a sparse array has no getrow)
    rows, cols = csr.shape
    kind = _tensor_kind(csr.dtype)
    labels, label_kind = _labels(labels, rows)
    indptr, indices, data = csr.indptr, csr.indices, csr.data
    with _writer(out, index) as w:
        for i in range(rows):
            a, b = indptr[i], indptr[i + 1]
            w.write(encode_record(kind, data[a:b], label_kind, None if labels is None else labels[i],
                                  keys=indices[a:b], shape=[cols]))
    return rows
