"""SageMaker RecordIO-protobuf payloads (``application/x-recordio-protobuf``) -> named numpy arrays.

The payload of each RecordIO record is one ``aialgs.data.Record`` (proto2; the SageMaker Python SDK's
``write_numpy_to_dense_tensor`` / ``write_spmatrix_to_sparse_tensor`` and the built-in algorithms write
them; ML-IO's ``RecordIOProtobufReader`` reads them)::

    Record   { map<string, Value> features = 1; map<string, Value> label = 2;
               optional string uid = 3; optional string metadata = 4; optional string configuration = 5; }
    Value    { oneof { Float32Tensor float32_tensor = 2; Float64Tensor float64_tensor = 3;
                       Int32Tensor int32_tensor = 7; Bytes bytes = 9; } }
    *Tensor  { repeated T values = 1 [packed]; repeated uint64 keys = 2 [packed];
               repeated uint64 shape = 3 [packed]; }
    Bytes    { repeated bytes value = 1; optional string content_type = 2; }

:class:`ProtobufRecord` parses that schema by hand (:func:`parse_record`): the wire format in C
(``_protobuf.c``: one pass, packed values copied once into buffers that numpy views), or, where the
extension was not built, in Python (:func:`parse_record_py`: ``numpy.frombuffer`` for packed floats,
numpy for packed varints), with the same results and errors (tests/test_protobuf_record.py compares
them on damaged records).  ``bench/bench_protobuf.py`` measures both against the ``protobuf`` package's
``ParseFromString`` and a numpy conversion (the C parser: about 3x; the Python one: 0.6-1x), which is
why the package is not used.  Nothing is
allocated by a declared size: a tensor's ``shape`` is checked against the values that are there, a
sparse tensor stays sparse (keys and values), and every length is checked against the payload.

One sample is a :class:`ProtobufSample`, a ``dict``: each feature under its name, each label under
``"label_" + name`` (the SDK writes ``features["values"]`` and ``label["values"]``: keys ``"values"`` and
``"label_values"``, as ML-IO names them), plus ``"uid"``, ``"metadata"``, ``"configuration"`` when asked.
A dense tensor is an array of its ``shape`` (or 1-D without one); a sparse tensor (non-empty ``keys``) is
a :class:`SparseTensor`; ``Bytes`` is a list of ``bytes``.  In a batch each dense feature is one stacked
array, each sparse one a :class:`SparseCOO` (``sparse="coo"``) or a ``scipy.sparse.csr_matrix``
(``sparse="csr"``, ``pip install 'parrecio[sparse]'``), and a record whose feature has another dtype,
shape, or kind than the batch's first raises :class:`DecodeError` naming the sample.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from ..errors import DecodeError
from .checks import check_bool
from .value import Value, derive

try:  # the wire format in C (setup.py builds it where a compiler is; else the Python parser below)
    from . import _protobuf
except ImportError:  # pragma: no cover - depends on the build
    _protobuf = None

__all__ = ["ProtobufRecord", "ProtobufSample", "SparseTensor", "SparseCOO", "parse_record", "parse_record_py",
           "as_coo", "is_csr",
           "TENSOR_DTYPES"]

#: Value's tensor field numbers -> the numpy dtype of their values.
TENSOR_DTYPES = {2: np.dtype("<f4"), 3: np.dtype("<f8"), 7: np.dtype("<i4")}
_BYTES_FIELD = 9
_NAMES = {2: "float32_tensor", 3: "float64_tensor", 7: "int32_tensor", 9: "bytes"}
_MAX_RANK = 32          # a shape with more dimensions than this is refused
_SPARSE = ("coo", "csr")


class SparseTensor(NamedTuple):
    """One record's sparse tensor: ``values[i]`` is at flat (row-major) index ``keys[i]`` of ``shape``."""
    keys: np.ndarray    # uint64, one per value
    values: np.ndarray  # float32, float64 or int32
    shape: Tuple[int, ...]


class SparseCOO(NamedTuple):
    """A batch of sparse tensors as coordinates: ``values[i]`` is at ``indices[i]`` = (sample, *index in
    shape) of ``shape`` = (batch, *tensor shape); ``torch.sparse_coo_tensor(indices.T, values, shape)``
    and ``tf.sparse.SparseTensor(indices, values, shape)`` take it as it is."""
    indices: np.ndarray  # int64 (nnz, 1 + rank)
    values: np.ndarray
    shape: Tuple[int, ...]


# -- the wire format ---------------------------------------------------------------------------------------

class _Truncated(Exception):
    pass


def _varint(data: bytes, pos: int, end: int) -> Tuple[int, int]:
    """The unsigned varint at ``pos`` and the position after it (at most 10 bytes, before ``end``)."""
    result = shift = 0
    while True:
        if pos >= end:
            raise _Truncated("a varint runs past the end of its message")
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            if result >> 64:
                raise DecodeError("a varint longer than 64 bits")
            return result, pos
        shift += 7
        if shift >= 70:
            raise DecodeError("a varint longer than 10 bytes")


def _packed_varints(data: bytes, start: int, end: int) -> np.ndarray:
    """The packed varints in ``data[start:end]`` as uint64, decoded with numpy (keys, shape, int32s)."""
    n = end - start
    if n == 0:
        return np.zeros(0, np.uint64)
    a = np.frombuffer(data, np.uint8, n, start)
    last = a < 0x80
    if not last[-1]:
        raise _Truncated("a packed varint runs past the end of its field")
    ends = np.flatnonzero(last)
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    lengths = ends - starts + 1
    if int(lengths.max()) > 10:
        raise DecodeError("a varint longer than 10 bytes")
    pos = np.arange(n, dtype=np.int64) - np.repeat(starts, lengths)
    parts = (a & 0x7F).astype(np.uint64) << (7 * pos).astype(np.uint64)
    out = np.bitwise_or.reduceat(parts, starts)
    tenth = lengths == 10
    if tenth.any() and (a[ends[tenth]] > 1).any():  # bits past the 64th
        raise DecodeError("a varint longer than 64 bits")
    return out


def _skip(data: bytes, pos: int, end: int, wire: int) -> int:
    """The position after a field of wire type ``wire`` (not 2: :func:`_fields` reads those) whose value
    starts at ``pos``."""
    if wire == 0:
        return _varint(data, pos, end)[1]
    if wire == 1:
        pos += 8
    elif wire == 5:
        pos += 4
    else:  # 3/4: proto2 groups, which this schema never uses
        raise DecodeError(f"a field of wire type {wire} (a group), which aialgs.data.Record has not")
    if pos > end:
        raise _Truncated("a field runs past the end of its message")
    return pos


def _fields(data: bytes, pos: int, end: int):
    """``(field number, wire type, start, stop)`` of each field of the message in ``data[pos:end]``;
    for wire type 2, ``start:stop`` is the content, else the value's own bytes."""
    while pos < end:
        key, pos = _varint(data, pos, end)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise DecodeError("a field numbered 0")
        if wire == 2:
            n, start = _varint(data, pos, end)
            stop = start + n
            if stop > end:
                raise _Truncated(f"field {number} declares {n} bytes, past the end of its message")
            pos = stop
        else:
            start, pos = pos, _skip(data, pos, end, wire)
            stop = pos
        yield number, wire, start, stop


def _string(data: bytes, start: int, stop: int, what: str) -> str:
    try:
        return data[start:stop].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DecodeError(f"{what} is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None


def _tensor(data: bytes, start: int, stop: int, kind: int, name: str) -> Any:
    """A Float32/Float64/Int32Tensor message -> an array of its shape, or a SparseTensor."""
    dtype = TENSOR_DTYPES[kind]
    values: List[np.ndarray] = []
    keys: List[np.ndarray] = []
    shape: List[np.ndarray] = []
    for number, wire, a, b in _fields(data, start, stop):
        if number == 1:
            if kind == 7:  # int32: varints (negative ones sign-extended to 10 bytes), packed or one
                if wire not in (0, 2):
                    raise DecodeError(f"feature {name!r}: values of wire type {wire} in an int32_tensor")
                as_int = _packed_varints(data, a, b).view(np.int64)
                if ((as_int < -2 ** 31) | (as_int >= 2 ** 31)).any():
                    raise DecodeError(f"feature {name!r}: an int32 value out of the int32 range")
                values.append(as_int.astype(np.int32))
            elif wire == 2:
                if (b - a) % dtype.itemsize:
                    raise DecodeError(f"feature {name!r}: {b - a} bytes of packed {dtype.name} values, not a "
                                      f"multiple of {dtype.itemsize}")
                values.append(np.frombuffer(data, dtype, (b - a) // dtype.itemsize, a))
            elif wire == (5 if kind == 2 else 1):  # one unpacked value
                values.append(np.frombuffer(data, dtype, 1, a))
            else:
                raise DecodeError(f"feature {name!r}: values of wire type {wire} in a {_NAMES[kind]}")
        elif number in (2, 3):
            if wire not in (0, 2):
                raise DecodeError(f"feature {name!r}: {('keys', 'shape')[number - 2]} of wire type {wire}")
            (keys if number == 2 else shape).append(_packed_varints(data, a, b))
    if not values:
        vals = np.zeros(0, dtype)
    else:  # a copy: the arrays must not hold the payload (a view of shared memory in the pipeline)
        vals = np.concatenate(values) if len(values) > 1 else values[0].copy()
    dims = tuple(int(d) for d in (np.concatenate(shape) if shape else ()))
    if len(dims) > _MAX_RANK:
        raise DecodeError(f"feature {name!r}: a shape of {len(dims)} dimensions (at most {_MAX_RANK})")
    k = None if not keys else np.concatenate(keys) if len(keys) > 1 else keys[0]
    return _Pending(name, vals, k, dims)  # the checks of meaning come after the whole record was walked


class _Pending(NamedTuple):
    """A tensor walked but not yet checked (:func:`_finish`, once the whole record is known to be whole:
    the C parser's order, so that both report the same first error)."""
    name: str
    vals: np.ndarray
    keys: Optional[np.ndarray]
    dims: Tuple[int, ...]


_INDEX_LIMIT = 1 << 63  # elements of a shape, and each dimension, stay below it (int64 indices, keys)


def _finish(name: str, vals: np.ndarray, k: Optional[np.ndarray], dims: Tuple[int, ...]) -> Any:
    """A tensor's values, keys (None: dense) and shape -> an array of its shape, or a SparseTensor; the
    checks of the schema's meaning (the same for the C and the Python parser)."""
    vals = vals.astype(vals.dtype.newbyteorder("="), copy=False)
    size = 1
    for d in dims:
        size *= d
    if size >= _INDEX_LIMIT or any(d >= _INDEX_LIMIT for d in dims):  # (a batch indexes it with int64)
        raise DecodeError(f"feature {name!r}: shape {list(dims)} has {size} elements, more than an array "
                          f"can index (2**63)")
    if k is not None and len(k):
        if len(k) != len(vals):
            raise DecodeError(f"feature {name!r}: {len(k)} keys for {len(vals)} values")
        if not dims:
            raise DecodeError(f"feature {name!r}: a sparse tensor (keys) without a shape")
        if int(k.max()) >= size:
            raise DecodeError(f"feature {name!r}: key {int(k.max())} outside the shape {list(dims)} "
                              f"({size} elements)")
        return SparseTensor(k, vals, dims)
    if dims and size and not len(vals):  # a sparse row without entries (the SDK writes its shape only)
        return SparseTensor(np.zeros(0, np.uint64), vals, dims)
    if dims:
        if size != len(vals):
            raise DecodeError(f"feature {name!r}: shape {list(dims)} holds {size} values, the tensor has "
                              f"{len(vals)}")
        try:
            return vals.reshape(dims)
        except ValueError as e:  # (no elements, but a dimension numpy cannot hold: [0, 2**62])
            raise DecodeError(f"feature {name!r}: shape {list(dims)} cannot be an array: {e}") from None
    return vals


def _value(data: bytes, start: int, stop: int, name: str) -> Any:
    """A Value message -> its tensor, or the list of bytes of a Bytes value."""
    found = None
    for number, wire, a, b in _fields(data, start, stop):
        if number in TENSOR_DTYPES and wire == 2:
            found = _tensor(data, a, b, number, name)
        elif number == _BYTES_FIELD and wire == 2:
            items = [bytes(data[x:y]) for n, w, x, y in _fields(data, a, b) if n == 1 and w == 2]
            found = items
    if found is None:
        raise DecodeError(f"feature {name!r}: a Value with none of float32_tensor, float64_tensor, "
                          f"int32_tensor, bytes")
    return found


def _entry(data: bytes, start: int, stop: int, where: str) -> Tuple[str, Tuple[int, int]]:
    """A map entry (key = 1, value = 2) -> (key, the value's span)."""
    key, span = "", None
    for number, wire, a, b in _fields(data, start, stop):
        if number == 1 and wire == 2:
            key = _string(data, a, b, f"a {where} name")
        elif number == 2 and wire == 2:
            span = (a, b)
    if span is None:
        raise DecodeError(f"{where} {key!r} has no value")
    return key, span


def parse_record(payload: Any) -> Tuple[Dict[str, Any], Dict[str, Any], Dict[str, str]]:
    """One ``aialgs.data.Record`` -> ``(features, label, strings)``: name -> array / SparseTensor / list
    of bytes, and ``uid``/``metadata``/``configuration`` where present.  Raises :class:`DecodeError`.
    The wire format is walked by the C extension (``_protobuf``) where it was built, else in Python
    (:func:`parse_record_py`): the same results and the same errors."""
    if _protobuf is None:
        return parse_record_py(payload)
    try:
        features, label, strings = _protobuf.parse(payload)
    except ValueError as exc:
        text = str(exc)
        if text.startswith("truncated: "):
            raise DecodeError(f"not a whole aialgs.data.Record ({memoryview(payload).nbytes} bytes): "
                              f"{text[len('truncated: '):]}") from None
        raise DecodeError(text) from None
    # (a name given twice: the last entry is the map's, as protobuf and the Python parser keep it; only
    # that one is checked)
    last_features = {n: rest for n, *rest in features}
    last_label = {n: rest for n, *rest in label}
    return ({n: _assembled(n, *rest) for n, rest in last_features.items()},
            {n: _assembled(f"label_{n}", *rest) for n, rest in last_label.items()},
            strings)


def _assembled(name: str, kind: int, values: Any, keys: Any, shape: Any) -> Any:
    """A tensor of the C parser (bytearrays, which the arrays keep: no copy) as the Python one gives it."""
    if kind == _BYTES_FIELD:
        return values
    vals = np.frombuffer(values, TENSOR_DTYPES[kind])
    return _finish(name, vals, None if keys is None else np.frombuffer(keys, "<u8"), shape or ())


def parse_record_py(payload: Any) -> Tuple[Dict[str, Any], Dict[str, Any], Dict[str, str]]:
    """:func:`parse_record` in Python alone (where the C extension was not built)."""
    data = payload if isinstance(payload, bytes) else bytes(payload)
    features: Dict[str, Any] = {}
    label: Dict[str, Any] = {}
    strings: Dict[str, str] = {}
    try:
        for number, wire, a, b in _fields(data, 0, len(data)):
            if number in (1, 2) and wire == 2:
                where = "feature" if number == 1 else "label"
                key, (x, y) = _entry(data, a, b, where)
                (features if number == 1 else label)[key] = _value(data, x, y, key if number == 1 else
                                                                   f"label_{key}")
            elif number in (3, 4, 5) and wire == 2:
                what = ("uid", "metadata", "configuration")[number - 3]
                strings[what] = _string(data, a, b, what)
    except _Truncated as exc:
        raise DecodeError(f"not a whole aialgs.data.Record ({len(data)} bytes): {exc}") from None
    done = lambda v: _finish(*v) if isinstance(v, _Pending) else v  # noqa: E731
    return ({k: done(v) for k, v in features.items()}, {k: done(v) for k, v in label.items()}, strings)


# -- samples and batches -----------------------------------------------------------------------------------

class ProtobufSample(dict):
    """One record's features (by name), labels (``"label_<name>"``) and asked-for strings.  In a batch
    (:func:`parrecio.pipeline.batching.collate` calls :meth:`collate_batch`): dense arrays stacked, sparse
    tensors as :class:`SparseCOO`, bytes and strings as lists."""

    sparse_batch = "coo"

    @classmethod
    def collate_batch(cls, samples: List["ProtobufSample"]) -> Dict[str, Any]:
        """A batch of samples -> ``{name: stacked array | SparseCOO | csr_matrix | list}``; a sample that
        does not match the first raises DecodeError whose ``index`` is its position in ``samples``."""
        # The odd sample is the one unlike most of the batch (not merely unlike its first sample: the
        # first may be the odd one).
        keys = [tuple(sorted(s)) for s in samples]  # (a map's entries have no order)
        common = _most_common(keys)
        for i, k in enumerate(keys):
            if k != common:
                raise DecodeError(f"its record has {list(k)} where the batch's others have {list(common)}",
                                  index=i)
        names = list(samples[keys.index(common)])
        if not names:  # (a batch {} would say nothing of its rows: equal shards' padding counts them)
            raise DecodeError("its record holds nothing this decoder delivers (no feature or label asked for: a "
                              "record of a uid alone, say), and a batch of such samples would hold no rows: "
                              "read them without batch_size, or ask for what they hold (uid=True)", index=0)
        out: Dict[str, Any] = {}
        for name in names:
            col = [s[name] for s in samples]
            kinds = [_kind(v) for v in col]
            usual = _most_common(kinds)
            head = col[kinds.index(usual)]
            for i, kind in enumerate(kinds):
                if kind != usual:
                    raise DecodeError(f"{name!r} is {_describe(col[i])} where the batch's others are "
                                      f"{_describe(head)}", index=i)
            if isinstance(head, np.ndarray):
                out[name] = np.stack(col)
            elif isinstance(head, SparseTensor):
                out[name] = _sparse_batch(col, cls.sparse_batch)
            else:
                out[name] = col
        return out


def is_csr(value: Any) -> bool:
    """Whether ``value`` is a ``scipy.sparse.csr_matrix`` (a ``sparse="csr"`` batch), without importing
    scipy."""
    return hasattr(value, "indptr") and getattr(value, "format", None) == "csr"


def as_coo(value: Any) -> Optional[SparseCOO]:
    """A sparse batch (a :class:`SparseCOO`, or a scipy CSR matrix) as a SparseCOO; None for anything
    else (what the tf.data adapter feeds to ``tf.SparseTensor``)."""
    if isinstance(value, SparseCOO):
        return value
    if is_csr(value):
        rows = np.repeat(np.arange(value.shape[0], dtype=np.int64), np.diff(value.indptr))
        return SparseCOO(np.stack([rows, value.indices.astype(np.int64)], axis=1), value.data, tuple(value.shape))
    return None


class _CSRSample(ProtobufSample):
    sparse_batch = "csr"


def _kind(v: Any) -> Any:
    """What must be alike in a batch's column: dense or sparse, the dtype, the shape."""
    if isinstance(v, np.ndarray):
        return ("dense", v.dtype.str, v.shape)
    if isinstance(v, SparseTensor):
        return ("sparse", v.values.dtype.str, tuple(v.shape))
    return ("other",)


def _most_common(items: List[Any]) -> Any:
    """The item most of ``items`` are (the first of them on a tie)."""
    counts: Dict[Any, int] = {}
    for x in items:
        counts[x] = counts.get(x, 0) + 1
    return max(counts, key=counts.__getitem__)


def _describe(v: Any) -> str:
    if isinstance(v, np.ndarray):
        return f"a dense {v.dtype} tensor of shape {v.shape}"
    if isinstance(v, SparseTensor):
        return f"a sparse {v.values.dtype} tensor of shape {v.shape}"
    return f"a {type(v).__name__}"


def _sparse_batch(col: List[SparseTensor], fmt: str) -> Any:
    shape = col[0].shape
    counts = np.fromiter((len(t.keys) for t in col), np.int64, len(col))
    keys = np.concatenate([t.keys for t in col]) if col else np.zeros(0, np.uint64)
    values = np.concatenate([t.values for t in col])
    if fmt == "csr":
        import scipy.sparse
        width = int(np.prod(shape, dtype=np.int64))
        indptr = np.zeros(len(col) + 1, np.int64)
        np.cumsum(counts, out=indptr[1:])
        return scipy.sparse.csr_matrix((values, keys.astype(np.int64), indptr), shape=(len(col), width))
    rows = np.repeat(np.arange(len(col), dtype=np.int64), counts)
    coords = np.unravel_index(keys.astype(np.int64), shape) if len(shape) > 1 else (keys.astype(np.int64),)
    indices = np.stack([rows, *coords], axis=1) if len(keys) else np.zeros((0, 1 + len(shape)), np.int64)
    return SparseCOO(indices.astype(np.int64, copy=False), values, (len(col), *shape))


@dataclass(frozen=True, repr=False)
class ProtobufRecord(Value):
    """A SageMaker RecordIO-protobuf record (``aialgs.data.Record``) -> a :class:`ProtobufSample` dict.

    Parameters
    ----------
    features:
        Names of the features to keep (``("values",)``), or ``None`` for every feature of the record; a
        name the record lacks raises :class:`DecodeError`.
    label:
        Keep the labels (each as ``"label_<name>"``).  Default ``True``.
    uid, metadata, configuration:
        Add the record's string of that name (``""`` where it has none).  Default ``False``.
    sparse:
        How a batch gives a sparse feature: ``"coo"`` (:class:`SparseCOO`: int64 ``(nnz, 1 + rank)``
        indices, values, shape; default) or ``"csr"`` (a ``scipy.sparse.csr_matrix`` of
        ``batch x prod(shape)``; needs scipy: ``pip install 'parrecio[sparse]'``).
    """

    features: Optional[Sequence[str]] = None
    label: bool = True
    uid: bool = False
    metadata: bool = False
    configuration: bool = False
    sparse: str = "coo"
    # no payload_kinds: a Record's bytes can sniff as anything (even empty: a Record with no fields), and
    # a kind left out would drop records after damage (decoders.base)

    def __post_init__(self) -> None:
        features = self.features
        if features is not None:
            if isinstance(features, str) or not all(isinstance(f, str) for f in features):
                raise TypeError(f"features must be None or a sequence of names, got {features!r}")
            features = tuple(features)
        if not isinstance(self.sparse, str) or self.sparse not in _SPARSE:
            raise ValueError(f"sparse must be one of {_SPARSE}, got {self.sparse!r}")
        if self.sparse == "csr":
            try:  # said here, not in the first batch
                import importlib
                importlib.import_module("scipy.sparse")
            except ImportError:
                raise ImportError("ProtobufRecord(sparse='csr') needs scipy: pip install 'parrecio[sparse]'",
                                  name="scipy") from None
        derive(self, features=features, label=check_bool("label", self.label), uid=check_bool("uid", self.uid),
               metadata=check_bool("metadata", self.metadata),
               configuration=check_bool("configuration", self.configuration),
               _cls=_CSRSample if self.sparse == "csr" else ProtobufSample)

    def __call__(self, payload: Any) -> ProtobufSample:
        features, label, strings = parse_record(payload)
        out = self._cls()
        if self.features is None:
            out.update(features)
        else:
            for name in self.features:
                if name not in features:
                    raise DecodeError(f"the record has no feature {name!r} (it has {sorted(features)})")
                out[name] = features[name]
        if self.label:
            for name, value in label.items():
                out[f"label_{name}"] = value
        for what in ("uid", "metadata", "configuration"):
            if getattr(self, what):
                out[what] = strings.get(what, "")
        return out
