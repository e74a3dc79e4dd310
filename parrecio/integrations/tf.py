"""TensorFlow adapter: a ``tf.data.Dataset`` over a :class:`~parrecio.ParallelReader`.

::

    import tensorflow as tf
    from parrecio import ParallelReader
    from parrecio.decoders import Image, ClassLabel
    from parrecio.integrations.tf import dataset

    reader = ParallelReader("train.rec", fields=[Image(size=(224, 224)), ClassLabel()], workers=8,
                            batch_size=64)
    ds = dataset(reader).prefetch(tf.data.AUTOTUNE)   # signature inferred from the first batch
    model.fit(ds, epochs=3)                           # each pass over ds is one pass of the reader
    reader.close()

How it works: ``tf.data.Dataset.from_generator(gen, output_signature=...)``; every iteration of the
dataset calls ``gen``, which runs one pass of the reader. Without ``output_signature`` the first batch is
read to infer it, so **the reader's first pass (its processes too) starts when** :func:`dataset` **is
called**; that batch is handed out first when the dataset is first iterated, followed by the rest of
that pass. Iterate the dataset by one iterator at a time (a new pass ends an unfinished one).

Inferred signature (:func:`infer_signature`, a pure function over the numpy/Python values, then
:func:`to_tensor_specs`):

- a numeric numpy array ``(B, *shape)`` -> ``tf.TensorSpec((None, *shape), dtype)`` (unbatched readers:
  ``TensorSpec(shape, dtype)``); numpy scalars and Python numbers -> ``()`` (Python float -> float32);
- a list of ``bytes``/``str`` -> ``tf.TensorSpec((None,), tf.string)``;
- a list of numeric arrays of one rank and dtype whose first dimension varies (ragged boxes ``(k, 5)``)
  -> ``tf.RaggedTensorSpec((None, None, 5), dtype, ragged_rank=1)``;
- tuples and dicts of those -> tuples and dicts of specs (so ``(images, labels)`` is ``(x, y)`` for Keras).

Anything else (JSON dicts, lists of mixed values) cannot be inferred: pass ``output_signature`` or use a
decoder with array output. Inference sees one batch only: a column of varying shape (``BoundingBoxes()``
without ``max_boxes``) whose first batch happens to be uniform is stacked and described as dense, and a
later ragged batch then raises; prefer fixed outputs (``max_boxes=``) or pass ``output_signature``. The
same holds for unbatched readers (``batch_size=None``), where a sample's shape is taken as fixed.

Memory: the dataset's tensors are **copies**. ``from_generator`` would otherwise wrap an aligned numpy
array without copying it, and every batch that ``tf.data`` keeps (``prefetch``, ``shuffle``, ``cache``, a
list of tensors) would keep its shared-memory output slot leased, so that the reader allocates new ones
without bound. One copy per batch keeps the reader's memory bounded; the slot is free again as soon as
the batch is converted.

Threads: ``tf.data`` runs the generator in threads of its own, not in the one that iterates the dataset.
Starting a new iteration while an older iterator of the same dataset is unfinished ends the older pass
here (the reader itself would refuse a new pass from another thread while one is open); used again, that
older iterator gives what it had already buffered and then fails with the
:class:`~parrecio.errors.PipelineError` message (raised by TensorFlow as a ``tf.errors.OpError``) instead of
silently stopping short.

Keras: ``model.fit(dataset(reader), epochs=n)`` runs one pass per epoch when the items are ``(x, y)``
tuples (``fields=[Image(...), ClassLabel()]``); for dict fields, map them:
``dataset(reader).map(lambda d: (d["image"], d["label"]))``. When the number of batches is not known in
advance, Keras warns "Your input ran out of data" at the end of the first epoch and goes on with the
next; if ``len(reader)`` is known (``.idx`` files), ``ds.apply(tf.data.experimental.assert_cardinality(
len(reader)))`` tells Keras the length up front (not with ``on_error="skip"``, which may deliver fewer).

Tested with TensorFlow 2.21 (tensorflow-cpu) and Keras 3 in ``tests/test_integrations_tf.py``; the parts
that need no TensorFlow in ``tests/test_integrations_misc.py``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Tuple

import numpy as np

from ..decoders.protobuf_record import as_coo
from ..errors import PipelineError
from .dlpack import NUMERIC_KINDS

if TYPE_CHECKING:  # only for the annotations: importing this module imports no TensorFlow
    import tensorflow as tf

__all__ = ["FieldSpec", "infer_signature", "to_tensor_specs", "from_tensor_specs", "prepare", "flatten_ragged",
           "batches", "dataset"]


@dataclass(frozen=True)
class FieldSpec:
    """A framework-neutral description of one column (leaf) of a sample or batch.

    ``kind``: ``"tensor"`` (a dense array), ``"string"`` (bytes/str values), ``"ragged"`` (a list of
    arrays whose first dimension varies, ``ragged_rank=1``) or ``"sparse"`` (a RecordIO-protobuf sparse
    batch: :class:`~parrecio.decoders.SparseCOO` or a ``scipy.sparse.csr_matrix``; ``tf.SparseTensor``).
    ``shape``: with ``None`` for unknown dimensions. ``dtype``: a numpy dtype name (``"uint8"``,
    ``"float32"``...) or ``"string"``.
    """

    kind: str
    shape: Tuple[Optional[int], ...]
    dtype: str


def _path(path: str) -> str:
    return path or "the value"


def infer_signature(value: Any, batched: bool = True, _path_: str = "") -> Any:
    """Describe one sample (``batched=False``) or batch (``batched=True``) as nested :class:`FieldSpec`.

    Tuples give tuples (namedtuples: plain tuples), dicts give dicts; leaves as in the module docstring.
    In a batch the leading (batch) dimension is ``None``, since the last batch may be shorter.
    Raises ``TypeError`` naming the column that cannot be described.
    """
    p = _path_
    coo = as_coo(value)
    if coo is not None:
        if not batched:
            raise TypeError(f"{_path(p)}: a sparse batch outside a batch; read with batch_size")
        return FieldSpec("sparse", (None,) + tuple(coo.shape[1:]), coo.values.dtype.name)
    if isinstance(value, dict):
        return {k: infer_signature(v, batched, f"{p}[{k!r}]") for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(infer_signature(v, batched, f"{p}[{i}]") for i, v in enumerate(value))
    if isinstance(value, (np.ndarray, np.generic)):
        if value.dtype.kind not in NUMERIC_KINDS:
            if value.dtype.kind in "SUO" and _all_strings(value.ravel().tolist()):
                shape = tuple(value.shape)
                return FieldSpec("string", ((None,) + shape[1:]) if batched and shape else shape, "string")
            raise TypeError(f"{_path(p)}: numpy dtype {value.dtype} has no tensor equivalent")
        shape = tuple(int(d) for d in np.shape(value))
        if batched:
            if not shape:
                raise TypeError(f"{_path(p)}: a batch column must have a batch dimension, got a scalar")
            shape = (None,) + shape[1:]
        return FieldSpec("tensor", shape, value.dtype.name)
    if isinstance(value, (bytes, bytearray, memoryview, str)):
        if batched:
            raise TypeError(f"{_path(p)}: a batch column must be a list or array, got {type(value).__name__}")
        return FieldSpec("string", (), "string")
    if isinstance(value, (bool, int, float)):
        if batched:
            raise TypeError(f"{_path(p)}: a batch column must be a list or array, got {type(value).__name__}")
        return FieldSpec("tensor", (), _python_dtype(value))
    if isinstance(value, list):
        if not batched:
            raise TypeError(f"{_path(p)}: cannot describe a list inside a sample; pass output_signature")
        return _infer_list(value, p)
    raise TypeError(f"{_path(p)}: cannot describe a {type(value).__name__}; pass output_signature")


def _python_dtype(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int64"
    return "float32"


def _all_strings(values: list) -> bool:
    return all(isinstance(v, (bytes, bytearray, memoryview, str)) for v in values)


def _infer_list(values: list, p: str) -> FieldSpec:
    if not values:
        raise TypeError(f"{_path(p)}: cannot describe an empty column; pass output_signature")
    if _all_strings(values):
        return FieldSpec("string", (None,), "string")
    if all(isinstance(v, (np.ndarray, np.generic)) for v in values):
        first = values[0]
        if first.dtype.kind in NUMERIC_KINDS and np.ndim(first) >= 1 and all(
                v.dtype == first.dtype and np.ndim(v) == np.ndim(first) for v in values):
            inner = np.shape(first)[1:]
            if all(np.shape(v)[1:] == inner for v in values):
                return FieldSpec("ragged", (None, None) + tuple(int(d) for d in inner), first.dtype.name)
            raise TypeError(f"{_path(p)}: arrays that vary in more than their first dimension "
                            f"(e.g. {np.shape(first)} and others); pass output_signature")
        raise TypeError(f"{_path(p)}: a list of arrays of different dtypes or ranks; pass output_signature")
    if all(isinstance(v, (bool, int, float)) for v in values):  # a decoder's Python numbers, batched
        kinds = {_python_dtype(v) for v in values}
        dtype = "float32" if "float32" in kinds else kinds.pop() if len(kinds) == 1 else "int64"
        return FieldSpec("tensor", (None,), dtype)
    kinds = sorted({type(v).__name__ for v in values})
    raise TypeError(f"{_path(p)}: cannot describe a list of {', '.join(kinds)}; pass output_signature "
                    f"or use a decoder with array output")


def flatten_ragged(arrays: list) -> Tuple[np.ndarray, np.ndarray]:
    """``[a_0, a_1, ...]`` (arrays that differ in their first dimension) -> ``(values, row_lengths)``,
    the parts of ``tf.RaggedTensor.from_row_lengths``: ``values`` is their concatenation."""
    lengths = np.fromiter((len(a) for a in arrays), dtype=np.int64, count=len(arrays))
    values = np.concatenate(arrays) if arrays else np.zeros((0,), np.float32)
    return values, lengths


def _numbers(values: list, signature: "FieldSpec") -> np.ndarray:
    """A batch of a decoder's Python numbers as the signature's 1-D tensor; a value that the dtype would
    change (a float where the first batch gave integers, an integer where it gave booleans) is refused."""
    arr = np.asarray(values)
    want = np.dtype(signature.dtype)
    if (want.kind in "iu" and arr.dtype.kind not in "biu") or (want.kind == "b" and arr.dtype.kind != "b"):
        raise TypeError(f"a column described as a {signature.dtype} tensor (from the first batch) came with "
                        f"{arr.dtype.name} values ({values[:4]}...): pass output_signature with the dtype that "
                        f"holds every batch's values")
    return arr.astype(want)


def prepare(value: Any, signature: Any, ragged: Optional[Callable[[np.ndarray, np.ndarray], Any]] = None,
            copy: bool = False, sparse: Optional[Callable[[np.ndarray, np.ndarray, tuple], Any]] = None) -> Any:
    """Shape one item for ``from_generator``: walk ``value`` alongside ``signature``; ``ragged`` leaves
    become ``ragged(values, row_lengths)`` (default: the ``(values, row_lengths)`` pair), tuples stay
    tuples (namedtuples become plain tuples), everything else is passed on (tf converts it).

    ``copy``: dense numpy arrays are copied, so that nothing passed on is a view of the reader's shared
    memory (ragged leaves are always new arrays: their concatenation)."""
    if isinstance(signature, FieldSpec):
        if signature.kind == "sparse":
            coo = as_coo(value)
            if coo is None:
                raise TypeError(f"a column described as sparse came as a {type(value).__name__}")
            return coo if sparse is None else sparse(coo.indices, coo.values.copy(), coo.shape)
        if signature.kind == "ragged":
            arrays = list(value)
            inner = signature.shape[2:] if signature.shape is not None else ()
            for a in arrays:
                shape = np.shape(a)[1:]
                if len(shape) != len(inner) or any(d is not None and d != e for d, e in zip(inner, shape)):
                    raise TypeError(f"a column described as ragged {tuple(signature.shape)} {signature.dtype} "
                                    f"came with an array of shape {np.shape(a)}: its values vary in more than "
                                    f"their first dimension (the first batch happened to agree); give the "
                                    f"decoder a fixed output size or pass output_signature with None there")
            values, lengths = flatten_ragged(arrays)
            return (values, lengths) if ragged is None else ragged(values, lengths)
        if signature.kind == "tensor" and isinstance(value, list):
            if len(signature.shape or ()) == 1 and all(isinstance(v, (bool, int, float, np.generic)) for v in value):
                return _numbers(value, signature)  # a decoder's Python numbers: a list per batch
            raise TypeError(f"a column described as a dense {signature.shape} {signature.dtype} tensor came "
                            f"as a list (values of different shapes): the first batch happened to be "
                            f"uniform, or output_signature says dense; give the decoder a fixed output "
                            f"(e.g. BoundingBoxes(max_boxes=...)) or pass output_signature")
        if copy and isinstance(value, np.ndarray):
            return value.copy()
        return _plain(value)
    if isinstance(signature, dict):
        return {k: prepare(value[k], s, ragged, copy, sparse) for k, s in signature.items()}
    if isinstance(signature, tuple):
        return tuple(prepare(v, s, ragged, copy, sparse) for v, s in zip(value, signature))
    if copy and isinstance(value, np.ndarray):  # a user-given signature leaf (a tf.TypeSpec): tf converts it
        return value.copy()
    return _plain(value)


class _Pass:
    """One pass begun by a generator of :func:`batches`: the reader's iterator, and whether a newer
    pass ended it."""

    __slots__ = ("it", "superseded")

    def __init__(self, it: Iterator[Any]) -> None:
        self.it = it
        self.superseded = False

    def end(self, reader: Any) -> None:
        """End this pass, from the thread of a newer one.  tf.data's prefetch thread (one is added to
        every dataset) may be inside this pass's ``next()`` right now, waiting for a batch: the reader is
        then asked to end the pass there, and this waits for that thread to come out (within the
        reader's poll interval)."""
        self.superseded = True
        deadline = time.monotonic() + _END_TIMEOUT
        ask = getattr(reader, "_end_pass_elsewhere", None)  # (any iterable may be given: it waits, then)
        while True:
            try:
                _close(self.it)
                return
            except ValueError as e:  # "generator already executing": another thread is inside it
                if ask is not None:
                    ask()
                    ask = None
                if time.monotonic() > deadline:
                    raise PipelineError(
                        f"this dataset's older iterator did not let go of its pass within {_END_TIMEOUT:.0f} "
                        f"s: iterate a parrecio dataset with one iterator at a time") from e
                time.sleep(0.002)


_END_TIMEOUT = 10.0  # seconds a new iteration waits for an older one's thread to leave its pass


def batches(reader: Any, first: Any = None, first_iter: Optional[Iterator[Any]] = None
            ) -> Callable[[], Iterator[Any]]:
    """A generator function for ``from_generator``: each call is one pass of ``reader``; the first call
    yields ``first`` and then the rest of ``first_iter`` (a pass already begun) when given.

    A call ends the pass of the previous call if that one is unfinished (``tf.data`` runs each in its
    own thread, where the reader would refuse a new pass); the previous generator then raises
    :class:`~parrecio.errors.PipelineError` when resumed, instead of stopping short."""
    pending = [(first, first_iter)] if first_iter is not None else []
    latest: list = [None]  # the _Pass of the latest call
    taken = getattr(reader, "_peek_taken", None)  # (a ParallelReader: the first item was peeked at)

    def gen() -> Iterator[Any]:
        it = None
        if pending:
            it, head = pending[0][1], [pending.pop()[0]]  # popped as it is yielded: not kept for the pass
            if taken is not None and not taken(it):  # set_epoch/load_state_dict ended that pass: begin theirs
                _close(it)
                it = None
        if it is None:
            if latest[0] is not None:
                latest[0].end(reader)
            it, head = iter(reader), []
        this = latest[0] = _Pass(it)
        try:
            try:
                while head:
                    yield head.pop()
                yield from it
            except PipelineError:
                if not this.superseded:
                    raise
            if this.superseded:  # (ended while it waited, or stopped short)
                raise PipelineError("this iteration of the dataset was ended by a newer one (a new "
                                    "pass of the reader): iterate a parrecio dataset with one iterator "
                                    "at a time")
        finally:
            _close(it)
            if latest[0] is this:
                latest[0] = None

    return gen


def _close(it: Any) -> None:
    close = getattr(it, "close", None)
    if close is not None:
        close()


def to_tensor_specs(signature: Any) -> Any:
    """Nested :class:`FieldSpec` -> nested ``tf.TensorSpec`` / ``tf.RaggedTensorSpec`` (imports tf)."""
    import tensorflow as tf

    def conv(s):
        if isinstance(s, dict):
            return {k: conv(v) for k, v in s.items()}
        if isinstance(s, tuple):
            return tuple(conv(v) for v in s)
        if not isinstance(s, FieldSpec):
            return s  # already a tf.TypeSpec
        dtype = tf.string if s.dtype == "string" else tf.as_dtype(np.dtype(s.dtype))
        if s.kind == "sparse":
            return tf.SparseTensorSpec(shape=s.shape, dtype=dtype)
        if s.kind == "ragged":
            return tf.RaggedTensorSpec(shape=s.shape, dtype=dtype, ragged_rank=1,
                                       row_splits_dtype=tf.int64)
        return tf.TensorSpec(shape=s.shape, dtype=dtype)

    return conv(signature)


def from_tensor_specs(specs: Any) -> Any:
    """Nested ``tf.TensorSpec`` / ``tf.RaggedTensorSpec`` -> nested :class:`FieldSpec` (imports tf): how
    :func:`prepare` must shape the values for them. Dicts and tuples are walked; :class:`FieldSpec`
    leaves and any other leaf (another ``tf.TypeSpec``, a list) are kept, and their values are passed on
    to tf as they come. A ``RaggedTensorSpec`` must have ``ragged_rank=1``, ``row_splits_dtype=tf.int64``
    and a numeric dtype (a list of arrays that vary in their first dimension), else ``ValueError``."""
    import tensorflow as tf

    def conv(s):
        if isinstance(s, dict):
            return {k: conv(v) for k, v in s.items()}
        if isinstance(s, tuple):
            return tuple(conv(v) for v in s)
        if isinstance(s, tf.SparseTensorSpec):
            return FieldSpec("sparse", tuple(s.shape.as_list()), s.dtype.name)
        if not isinstance(s, (tf.TensorSpec, tf.RaggedTensorSpec)):
            return s
        shape = tuple(s.shape.as_list()) if s.shape.rank is not None else None
        if isinstance(s, tf.RaggedTensorSpec):
            if s.ragged_rank != 1 or s.dtype == tf.string or shape is None or len(shape) < 2 \
                    or s.row_splits_dtype != tf.int64:
                raise ValueError(f"{s}: parrecio feeds a ragged column (a list of arrays that vary in their "
                                 f"first dimension) as tf.RaggedTensorSpec((None, None, ...), <numeric "
                                 f"dtype>, ragged_rank=1, row_splits_dtype=tf.int64)")
            return FieldSpec("ragged", shape, s.dtype.name)
        if s.dtype == tf.string:
            return FieldSpec("string", shape, "string")
        return FieldSpec("tensor", shape, s.dtype.name)

    return conv(specs)


def dataset(reader: Any, output_signature: Any = None) -> "tf.data.Dataset":
    """``tf.data.Dataset`` of the reader's items; each pass over the dataset is one pass of the reader.

    ``output_signature``: nested ``tf.TypeSpec`` (as for ``from_generator``) or nested
    :class:`FieldSpec`; ``None`` infers it from the first item, which starts the reader's first pass
    now (that item is yielded first when the dataset is first iterated; until then a ParallelReader acts
    as if the pass had not begun: ``state_dict``, ``set_epoch`` and ``load_state_dict`` see it so).
    Batches are taken from the reader when tf.data asks for them (its automatic prefetch is off for this
    dataset), so ``state_dict()`` counts those handed out. Ragged columns are fed as
    ``tf.RaggedTensor`` when the signature says so (an inferred ragged column, or a given
    ``tf.RaggedTensorSpec`` with ``ragged_rank=1``), and sparse RecordIO-protobuf batches as
    ``tf.SparseTensor``. The tensors are copies of the reader's arrays
    (see the module docstring: shared memory stays bounded). Raises ``TypeError`` naming the column when
    the first item cannot be described (that first pass is then ended), ``ValueError`` when the stream is
    empty (the empty rest of an epoch a resumed reader had finished is passed over).
    """
    import tensorflow as tf

    batched = getattr(reader, "batch_size", None) is not None
    first = it = None
    # A ParallelReader's first item is peeked at: until the dataset hands it out, the reader acts as if the
    # pass had not begun (state_dict, set_epoch, load_state_dict).
    peek = getattr(reader, "_peek", None)
    if output_signature is None:
        while True:
            # (a reader resumed from a state saved after an epoch's last batch has nothing left of that
            # epoch: its next pass, the next epoch, is the dataset's first iteration)
            resumed = bool(getattr(reader, "resuming", False))
            try:
                if peek is not None:
                    it = None
                    first, it = peek()
                else:
                    it = iter(reader)
                    first = next(it)
                break
            except StopIteration:
                if it is not None:
                    _close(it)
                if not resumed:
                    raise ValueError("cannot infer output_signature: the reader's stream is empty") from None
    try:
        if it is not None:
            output_signature = infer_signature(first, batched=batched)
        neutral = from_tensor_specs(output_signature)   # how to shape the values
        specs = to_tensor_specs(output_signature)       # what tf is told (a given tf.TypeSpec stays as it is)
    except BaseException:  # (a signature that cannot be inferred or converted, a Ctrl-C)
        first = None
        if it is not None:
            if peek is not None:
                reader._peek_dropped(it)  # (as a pass never begun: state_dict() says nothing was taken)
            else:
                _close(it)
        raise
    gen = batches(reader, first, it)
    del first, it

    def ragged(values, lengths):
        return tf.RaggedTensor.from_row_lengths(values, row_lengths=lengths)

    def sparse(indices, values, shape):
        return tf.sparse.SparseTensor(indices, values, shape)

    def generator():
        for item in gen():
            out = prepare(item, neutral, ragged, copy=True, sparse=sparse)
            del item  # no view of a shared-memory slot is kept while the generator waits
            yield out

    # No prefetch of tf.data's own (its autotune injects one): batches are taken from the reader when asked
    # for, so that state_dict() counts those handed out (a .prefetch(n) of yours reads n ahead).
    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False
    return tf.data.Dataset.from_generator(generator, output_signature=specs).with_options(options)


def _plain(item: Any) -> Any:
    """Namedtuples -> tuples (tf.nest treats them as different structures from a plain tuple signature)."""
    if isinstance(item, tuple) and hasattr(item, "_fields"):
        return tuple(item)
    return item
