"""Zero-copy hand-over of parrecio's numpy results through DLPack (JAX, CuPy, PyTorch, TensorFlow, ...).

Fixed-shape columns are writable numpy views of shared memory, so they export through the DLPack
protocol (``array.__dlpack__()``, numpy >= 1.22) without a copy: the consumer's tensor then keeps the
shared memory alive, exactly as the numpy array did::

    import torch, jax.numpy as jnp
    t = torch.from_dlpack(images)        # same memory (torch.from_numpy is the same thing for torch)
    j = jnp.from_dlpack(images)          # JAX on CPU: zero-copy when the buffer is suitably aligned
    back = np.from_dlpack(t)             # and back to numpy, no copy

:func:`map_arrays` applies such a conversion to every numeric array of a sample or batch (tuples,
namedtuples, dicts, lists of arrays), leaving everything else (``bytes``, ``str``, JSON values) as it is::

    for batch in reader:
        batch = map_arrays(batch, jnp.from_dlpack)

Nothing here imports a framework.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

__all__ = ["map_arrays", "exportable", "NUMERIC_KINDS"]

#: numpy dtype kinds that DLPack (and the frameworks) can represent: bool, ints, uints, floats, complex.
NUMERIC_KINDS = "biufc"


def exportable(array: np.ndarray) -> bool:
    """Whether ``array`` can be handed over through DLPack without a copy: a numeric dtype in native
    byte order, writable (numpy refuses to export read-only arrays), no negative strides."""
    return (array.dtype.kind in NUMERIC_KINDS and array.dtype.isnative and array.flags.writeable
            and all(s >= 0 for s in array.strides))


def map_arrays(value: Any, fn: Callable[[np.ndarray], Any], *, copy_unexportable: bool = True) -> Any:
    """Return ``value`` with every numeric numpy array ``a`` replaced by ``fn(a)``.

    Walks what parrecio yields: tuples (namedtuples keep their type), dicts, and lists *whose elements
    are arrays* (ragged columns, e.g. a list of ``(k, 5)`` box arrays). Other lists (``bytes`` columns,
    JSON values) and every non-array leaf are returned as they are, unconverted and unwalked. Numpy
    scalars become 0-d arrays first. Arrays of non-numeric dtypes (object, str, bytes) are left alone.

    With ``copy_unexportable`` (default), an array that cannot be exported without a copy (read-only,
    foreign byte order, negative strides) is copied first, so that ``fn`` always gets a well-behaved
    array; with ``False`` it is passed as it is.
    """
    if isinstance(value, np.ndarray):
        return _leaf(value, fn, copy_unexportable)
    if isinstance(value, np.generic):
        if value.dtype.kind not in NUMERIC_KINDS:
            return value
        return fn(np.array(value))
    if isinstance(value, tuple):
        items = [map_arrays(v, fn, copy_unexportable=copy_unexportable) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    if isinstance(value, dict):
        return type(value)((k, map_arrays(v, fn, copy_unexportable=copy_unexportable))
                           for k, v in value.items())
    if isinstance(value, list) and value and any(isinstance(v, (np.ndarray, np.generic)) for v in value):
        return [map_arrays(v, fn, copy_unexportable=copy_unexportable)
                if isinstance(v, (np.ndarray, np.generic)) else v for v in value]
    return value


def _leaf(array: np.ndarray, fn: Callable[[np.ndarray], Any], copy_unexportable: bool) -> Any:
    if array.dtype.kind not in NUMERIC_KINDS:
        return array
    if copy_unexportable and not exportable(array):
        dtype = array.dtype if array.dtype.isnative else array.dtype.newbyteorder("=")
        array = np.array(array, dtype=dtype, copy=True, order="K")
        if any(s < 0 for s in array.strides):  # pragma: no cover - order="K" already drops them
            array = np.ascontiguousarray(array)
    return fn(array)
