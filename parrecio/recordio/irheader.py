"""The image-record header of MXNet's ``.rec`` files (``IRHeader``), packed and unpacked.

MXNet's ``im2rec`` (``python/mxnet/recordio.py``: ``IRHeader``, ``pack``, ``unpack``; C++ side
``src/io/image_recordio.h``: ``ImageRecordIO::Header``) stores, at the start of every record payload::

    [flag u32][label f32][id u64][id2 u64]   struct "<IfQQ", 24 bytes, little-endian
    [flag x f32 labels]                        only when flag > 0 (then ``label`` is 0)
    [image bytes]                              JPEG/PNG/... or anything else

``flag == 0`` means a scalar label in ``label``; ``flag > 0`` means ``flag`` float32 labels follow the
header.  :func:`pack` and :func:`unpack` reproduce ``mxnet.recordio.pack``/``unpack`` byte for byte, with
two deliberate differences in :func:`unpack`: a buffer too short for its header or labels raises
:class:`~parrecio.errors.DecodeError` (MXNet raises ``struct.error``/``ValueError``), and the label array is
a copy (so it never pins a shared-memory ring slot), while the image data is never copied when the payload
is a ``memoryview`` or numpy array.
"""

from __future__ import annotations

import numbers
import struct
from typing import Any, NamedTuple, Tuple, Union

import numpy as np

from ..errors import DecodeError

__all__ = ["IRHeader", "IR_FORMAT", "IR_SIZE", "pack", "unpack"]

IR_FORMAT = "<IfQQ"
"""``struct`` format of the header: flag u32, label f32, id u64, id2 u64 (little-endian)."""
IR_SIZE = struct.calcsize(IR_FORMAT)  # 24 bytes
_IR = struct.Struct(IR_FORMAT)

BytesLike = Union[bytes, bytearray, memoryview, np.ndarray]


class IRHeader(NamedTuple):
    """Header of an MXNet image record (``mxnet.recordio.IRHeader``).

    ``flag``: number of float32 labels stored after the header (0: the scalar ``label`` is used).
    ``label``: the scalar label (float), or after :func:`unpack` of a ``flag > 0`` record a float32 numpy
    array of ``flag`` labels; :func:`pack` also accepts any sequence/array here.
    ``id``, ``id2``: unsigned 64-bit record ids (``id2`` usually 0).
    """

    flag: int
    label: Any
    id: int
    id2: int


def pack(header: Union[IRHeader, Tuple[Any, Any, int, int]], data: BytesLike) -> bytes:
    """Return ``header`` packed in front of ``data``, exactly as ``mxnet.recordio.pack`` does.

    A numeric ``header.label`` (int, float, numpy scalar) forces ``flag = 0``.  Any other label (list,
    tuple, numpy array, even 0-d) is converted to float32: ``flag`` becomes its number of elements,
    ``label`` becomes 0, and the labels (4 bytes each) are written between the 24-byte header and ``data``.
    ``data`` is any bytes-like object (the image bytes).
    """
    header = IRHeader(*header)
    if isinstance(header.label, numbers.Number):
        header = header._replace(flag=0)
        labels = b""
    else:
        arr = np.asarray(header.label, dtype=np.float32)
        header = header._replace(flag=arr.size, label=0)
        labels = arr.astype("<f4", copy=False).tobytes()
    return b"".join((_IR.pack(*header), labels, data))


def unpack(payload: BytesLike) -> Tuple[IRHeader, BytesLike]:
    """Split a record payload into its :class:`IRHeader` and the data after it (``mxnet.recordio.unpack``).

    ``payload`` may be ``bytes``, ``bytearray``, a ``memoryview`` or a 1-D numpy ``uint8`` array.  The data
    returned is ``payload`` sliced past the header (and the labels when ``flag > 0``): for a ``memoryview`` or
    numpy array that slice is a view (no copy, valid as long as the underlying buffer is); for ``bytes`` and
    ``bytearray`` it is a copy of the same type, as in MXNet.  With ``flag > 0`` the returned header's
    ``label`` is a float32 numpy array of ``flag`` values (a copy).

    Raises :class:`~parrecio.errors.DecodeError` when ``payload`` is shorter than the 24-byte header plus
    ``4 * flag`` bytes of labels.
    """
    if not isinstance(payload, (bytes, bytearray, memoryview, np.ndarray)):
        payload = memoryview(payload)
    if isinstance(payload, memoryview) and (payload.format != "B" or payload.ndim != 1):
        payload = payload.cast("B")
    elif isinstance(payload, np.ndarray) and (payload.ndim != 1 or payload.dtype != np.uint8):
        payload = np.ascontiguousarray(payload).reshape(-1).view(np.uint8)
    size = payload.nbytes if isinstance(payload, (memoryview, np.ndarray)) else len(payload)
    if size < IR_SIZE:
        raise DecodeError(f"image record of {size} bytes is shorter than its {IR_SIZE}-byte IRHeader")
    flag, label, id_, id2 = _IR.unpack_from(payload, 0)
    start = IR_SIZE
    if flag > 0:
        end = IR_SIZE + 4 * flag
        if size < end:
            raise DecodeError(f"image record of {size} bytes is too short for its IRHeader and {flag} "
                              f"float32 labels ({end} bytes)")
        label = np.frombuffer(payload, dtype="<f4", count=flag, offset=IR_SIZE).astype(np.float32)
        start = end
    return IRHeader(flag, label, id_, id2), payload[start:]
