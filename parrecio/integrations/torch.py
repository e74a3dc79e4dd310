"""PyTorch adapter: :class:`ParallelIterableDataset` and :func:`to_torch`.

parrecio does its own batching and its own multiprocessing, so the ``DataLoader`` around it must do
neither::

    from torch.utils.data import DataLoader
    from parrecio.decoders import Image, ClassLabel
    from parrecio.integrations.torch import ParallelIterableDataset

    ds = ParallelIterableDataset("train.rec", fields=[Image(size=(224, 224), layout="CHW"), ClassLabel()],
                                 workers=8, batch_size=64)
    loader = DataLoader(ds, batch_size=None, num_workers=0)      # batch_size=None: batches come ready
    for epoch in range(3):
        for images, labels in loader:    # uint8 (64, 3, 224, 224), int64 (64,) tensors, zero-copy
            ...
    ds.close()                           # or: with ParallelIterableDataset(...) as ds:

Numeric numpy arrays become tensors with :func:`torch.from_numpy`, which shares the memory (the tensor
keeps the shared-memory slot alive as the array did); ``bytes``, ``str``, JSON values and lists of them
stay as they are; tuples, dicts and lists of arrays (ragged columns such as boxes) are walked.

``import parrecio.integrations.torch`` does not import torch; ``to_torch`` and
``ParallelIterableDataset`` (created on first access, a real ``torch.utils.data.IterableDataset``
subclass) do.
"""

from __future__ import annotations

import os
import sys
import threading
import warnings
from typing import Any, Callable, Optional

from .dlpack import map_arrays

__all__ = ["ParallelIterableDataset", "to_torch", "DataLoaderWorkerError"]


class DataLoaderWorkerError(RuntimeError):
    """A :class:`ParallelIterableDataset` was iterated inside a ``DataLoader`` worker process."""


_USE = ("parrecio runs its own decoder processes and does its own batching: use DataLoader(dataset, "
        "batch_size=None, num_workers=0) and set workers=/batch_size= on the dataset (ParallelReader) instead.")
_WORKER_MESSAGE = "ParallelIterableDataset was iterated inside a DataLoader worker process. " + _USE


_SPARSE_LAYOUTS = (None, "coo", "csr")


def to_torch(batch: Any, *, pin_memory: bool = False, sparse_layout: Optional[str] = None) -> Any:
    """Convert what a :class:`~parrecio.ParallelReader` yields to tensors, without copying.

    Numeric numpy arrays -> ``torch.from_numpy(array)`` (shares memory; ``tensor.data_ptr() ==
    array.ctypes.data``); numpy scalars -> 0-d tensors; tuples, namedtuples, dicts and lists of arrays
    are walked; everything else (``bytes``, ``str``, lists of those, JSON values) is returned as it is.
    Read-only or byte-swapped arrays (never produced by parrecio's own decoders) are copied first;
    arrays of a dtype torch lacks stay numpy arrays.

    ``pin_memory=True`` copies each tensor into page-locked memory (for fast ``.cuda(non_blocking=True)``)
    when CUDA is available; without CUDA it is ignored.

    ``sparse_layout``: sparse batches of :class:`~parrecio.decoders.ProtobufRecord` features (a
    :class:`~parrecio.decoders.SparseCOO`, or a ``scipy.sparse.csr_matrix`` with ``sparse="csr"``)
    become ``torch.sparse_coo_tensor`` (``"coo"``) or ``torch.sparse_csr_tensor`` (``"csr"``; 2-D only);
    ``None`` (default) walks a SparseCOO as the namedtuple it is and leaves a csr_matrix as it is.
    """
    import torch

    if sparse_layout not in _SPARSE_LAYOUTS:
        raise ValueError(f"sparse_layout must be one of {_SPARSE_LAYOUTS}, got {sparse_layout!r}")
    pin = bool(pin_memory) and torch.cuda.is_available()
    if sparse_layout is not None:
        batch = _sparse_to_torch(batch, sparse_layout, torch)

    def convert(array):
        try:
            tensor = torch.from_numpy(array)
        except TypeError:  # a dtype torch does not support (e.g. uint16 on old versions)
            return array
        return tensor.pin_memory() if pin else tensor

    return map_arrays(batch, convert)


def _sparse_to_torch(value: Any, layout: str, torch: Any) -> Any:
    """``value`` with its sparse batches (SparseCOO, scipy CSR) as torch sparse tensors of ``layout``."""
    import numpy as np

    from ..decoders.protobuf_record import SparseCOO, is_csr

    if isinstance(value, SparseCOO):
        tensor = torch.sparse_coo_tensor(torch.from_numpy(np.ascontiguousarray(value.indices.T)),
                                         torch.from_numpy(value.values), value.shape,
                                         check_invariants=False).coalesce()  # valid by construction
        return tensor.to_sparse_csr() if layout == "csr" else tensor
    if is_csr(value):
        tensor = torch.sparse_csr_tensor(torch.from_numpy(value.indptr.astype(np.int64)),
                                         torch.from_numpy(value.indices.astype(np.int64)),
                                         torch.from_numpy(value.data), value.shape,
                                         check_invariants=False)  # scipy's CSR: valid
        return tensor.to_sparse_coo().coalesce() if layout == "coo" else tensor
    if isinstance(value, dict):
        return type(value)((k, _sparse_to_torch(v, layout, torch)) for k, v in value.items())
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_sparse_to_torch(v, layout, torch) for v in value)
    return value


def _check_not_batched_again(reader: Any, caller: Any) -> None:
    """``DataLoader(ds)`` with its default ``batch_size=1`` would batch the reader's batches again and
    yield ``[1, 64, ...]`` tensors without a word: refuse it.  The DataLoader's fetcher calls
    ``iter(dataset)``, or drives one of torch's own wrappers that does (``ChainDataset([ds])``: a few
    frames up, all in ``torch.utils.data``; a wrapper of the user's may unbatch, and is let be); its
    ``auto_collation`` says whether it batches."""
    if reader.batch_size is None:
        return  # single samples: batching them in the DataLoader is what the user asked for
    try:
        from torch.utils.data._utils.fetch import _IterableDatasetFetcher
    except ImportError:  # pragma: no cover - a torch without it: nothing to check against
        return
    import torch.utils.data as tud
    home = os.path.dirname(tud.__file__)
    fetcher, frame = None, caller
    for _ in range(8):  # (once per pass: a short walk up)
        if frame is None or not frame.f_code.co_filename.startswith(home):
            break
        fetcher = frame.f_locals.get("self")
        if isinstance(fetcher, _IterableDatasetFetcher):
            break
        frame = frame.f_back
    if isinstance(fetcher, _IterableDatasetFetcher) and getattr(fetcher, "auto_collation", False):
        raise TypeError(
            f"this ParallelIterableDataset already yields batches of {reader.batch_size}, and the "
            f"DataLoader would batch them again (its batch_size defaults to 1: [1, {reader.batch_size}, "
            f"...] tensors): use DataLoader(dataset, batch_size=None)")


def _check_not_in_worker() -> None:
    import torch.utils.data

    if torch.utils.data.get_worker_info() is not None:
        raise DataLoaderWorkerError(_WORKER_MESSAGE)


_lock = threading.Lock()
_cls: Optional[type] = None


def __getattr__(name: str) -> Any:
    if name == "ParallelIterableDataset":
        return _dataset_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _dataset_class() -> type:
    global _cls
    with _lock:
        if _cls is None:
            _cls = _make_dataset_class()
        return _cls


def _make_dataset_class() -> type:
    import torch.utils.data

    from ..pipeline.parallel_reader import ParallelReader

    class ParallelIterableDataset(torch.utils.data.IterableDataset):
        """A ``torch.utils.data.IterableDataset`` over a :class:`~parrecio.ParallelReader`.

        ``ParallelIterableDataset(reader)`` wraps an existing reader;
        ``ParallelIterableDataset(factory)`` calls ``factory()`` (no arguments) for the reader when it is
        first needed; ``ParallelIterableDataset(channel, fields=..., workers=..., batch_size=..., ...)``
        creates ``ParallelReader(channel, ...)`` when first needed. The reader's processes start at the
        first iteration and live until :meth:`close` (also the context-manager exit), across epochs.

        Each ``iter()`` is one epoch (one pass of the reader); items are converted with
        :func:`to_torch` (zero-copy). Use it with ``DataLoader(ds, batch_size=None, num_workers=0)``:
        iterating it inside a DataLoader worker process raises :class:`DataLoaderWorkerError`, since
        parrecio already decodes in parallel and batches.

        Args:
            pin_memory: copy tensors into page-locked memory when CUDA is available (ignored, with a
                warning, otherwise). ``DataLoader(..., pin_memory=True)`` does the same in a thread.
            convert: ``False`` yields the reader's numpy items unchanged (``default_convert`` of the
                DataLoader still turns arrays into tensors, also without a copy).
            sparse_layout: ``"coo"`` or ``"csr"``: sparse RecordIO-protobuf batches as torch sparse
                tensors of that layout (see :func:`to_torch`); ``None`` leaves them as they are.

        ``len(ds)`` is ``len(reader)`` (batches, or samples without ``batch_size``) when the reader
        knows its length; otherwise it raises ``TypeError`` (which ``list()`` and friends accept).

        Note: with ``batch_size=None`` the DataLoader passes every item through ``default_convert``,
        which turns tuples into lists (``for x, y in loader`` still works) and leaves tensors alone.
        """

        def __init__(self, reader: Any = None, *args: Any, pin_memory: bool = False, convert: bool = True,
                     sparse_layout: Optional[str] = None, **reader_kwargs: Any) -> None:
            super().__init__()
            self._reader: Optional[ParallelReader] = None
            self._factory: Optional[Callable[[], Any]] = None
            if isinstance(reader, ParallelReader):
                if args or reader_kwargs:
                    raise TypeError("ParallelIterableDataset(reader) takes no reader arguments")
                self._reader = reader
            elif callable(reader) and not args and not reader_kwargs:
                self._factory = reader
            elif reader is None:
                raise TypeError("ParallelIterableDataset needs a ParallelReader, a factory returning "
                                "one, or ParallelReader arguments (channel, fields=..., ...)")
            else:
                channel = reader
                self._factory = lambda: ParallelReader(channel, *args, **reader_kwargs)
            self.convert = bool(convert)
            if sparse_layout not in _SPARSE_LAYOUTS:
                raise ValueError(f"sparse_layout must be one of {_SPARSE_LAYOUTS}, got {sparse_layout!r}")
            self.sparse_layout = sparse_layout  # to_torch's: sparse protobuf features as torch sparse tensors
            self.pin_memory = bool(pin_memory)
            if self.pin_memory and not torch.cuda.is_available():
                warnings.warn("ParallelIterableDataset(pin_memory=True): CUDA is not available, "
                              "pin_memory is ignored", RuntimeWarning, stacklevel=2)
                self.pin_memory = False
            self._closed = False

        @property
        def reader(self) -> ParallelReader:
            """The underlying :class:`~parrecio.ParallelReader` (created on first access)."""
            if self._reader is None:
                if self._closed:
                    raise RuntimeError("this ParallelIterableDataset is closed")
                reader = self._factory()
                if not isinstance(reader, ParallelReader):
                    raise TypeError(f"the reader factory returned {type(reader).__name__}, "
                                    f"not a ParallelReader")
                self._reader = reader
            return self._reader

        def __iter__(self):
            _check_not_in_worker()
            _check_not_batched_again(self.reader, sys._getframe(1))
            return self._epoch()

        def set_epoch(self, epoch: int) -> None:
            """The next pass is epoch ``epoch`` (:meth:`ParallelReader.set_epoch`): call it before each
            epoch with the same value on every rank, as with ``DistributedSampler``."""
            self.reader.set_epoch(epoch)

        def state_dict(self) -> dict:
            """:meth:`ParallelReader.state_dict`: the epoch and position after the last batch handed out."""
            return self.reader.state_dict()

        def load_state_dict(self, state: dict) -> None:
            """:meth:`ParallelReader.load_state_dict`: the next pass is the rest of that epoch."""
            self.reader.load_state_dict(state)

        def _epoch(self):
            # The pass begins at the first next(), not at iter(loader): a set_epoch() or load_state_dict()
            # between the two is for this pass (it was left to the one after, silently).
            items = iter(self.reader)
            try:
                if not self.convert:
                    yield from items
                    return
                pin, layout = self.pin_memory, self.sparse_layout
                for item in items:
                    yield to_torch(item, pin_memory=pin, sparse_layout=layout)
            finally:
                items.close()

        def __len__(self) -> int:
            try:
                return len(self.reader)
            except TypeError as exc:
                raise TypeError(f"the length of this ParallelIterableDataset is unknown: {exc}") from None

        def close(self) -> None:
            """Close the reader: stop its processes, remove its shared memory (tensors already handed
            out stay valid). Idempotent. A reader you passed in is closed too."""
            self._closed = True
            if self._reader is not None:
                self._reader.close()

        def __enter__(self):
            return self

        def __exit__(self, *exc: Any) -> None:
            self.close()

        def __getstate__(self):
            raise TypeError("a ParallelIterableDataset cannot be pickled (e.g. sent to the worker processes of "
                            "a DataLoader with num_workers > 0 under spawn or forkserver): " + _USE)

        def __repr__(self) -> str:
            inner = repr(self._reader) if self._reader is not None else "<reader not created yet>"
            return f"ParallelIterableDataset({inner}, convert={self.convert}, pin_memory={self.pin_memory})"

    ParallelIterableDataset.__module__ = __name__
    ParallelIterableDataset.__qualname__ = "ParallelIterableDataset"
    return ParallelIterableDataset
