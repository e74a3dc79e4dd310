"""Arrays joined with their dtype exactly as it was.

NumPy 2's ``concatenate`` and ``stack`` make a result of the *canonical* dtype: a big-endian ``>f4``
comes out ``<f4``, a structured dtype with padding or offsets comes out packed (``itemsize`` 24 -> 12),
so ``.tobytes()`` and ``.view()`` of it differ.  The pipeline joins what decoders return (ragged values
travelling back, batches of several places, padded batches): they must keep the decoder's dtype, as
``workers=0`` does.  Joined into an output array of that dtype, they do.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["concatenated", "stacked"]


def concatenated(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """``np.concatenate(arrays)`` (one dtype and trailing shape) in the arrays' own dtype."""
    first = arrays[0]
    out = np.empty((sum(len(a) for a in arrays), *first.shape[1:]), first.dtype)
    return np.concatenate(arrays, out=out)


def stacked(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """``np.stack(arrays)`` (one dtype and shape) in the arrays' own dtype."""
    first = arrays[0]
    return np.stack(arrays, out=np.empty((len(arrays), *np.shape(first)), first.dtype))
