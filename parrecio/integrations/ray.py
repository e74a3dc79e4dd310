"""Ray Data adapter: :func:`read_recordio` turns RecordIO files into a ``ray.data.Dataset`` of decoded samples.

::

    import ray
    from parrecio.decoders import BoundingBoxes, ClassLabel, Image
    from parrecio.integrations.ray import read_recordio

    ds = read_recordio(["train-0.rec", "train-1.rec"],
                       fields={"image": Image(size=(224, 224)), "boxes": BoundingBoxes(max_boxes=16),
                               "label": ClassLabel()})
    for batch in ds.iter_torch_batches(batch_size=64):      # {"image": uint8 (64, 224, 224, 3), ...}
        ...

One row per sample (a *group* of ``len(fields)`` consecutive records, as for
:class:`~parrecio.ParallelReader`), one column per field.  Nothing of parrecio's own pipeline runs: no reader
process, no shared-memory ring, no decoder pool.  Ray runs *read tasks* on its workers, across the cluster,
and each task frames and decodes its part of the input with the same decoder objects, in the worker's
own process.

**Read tasks** (:meth:`RecordIODatasource.read_ranges`)::

    file without .idx   -> one task: the whole file, streamed
    file with its .idx  -> ranges of whole groups [start, stop) of the .idx's sorted offsets,
                           read by offset (pread); never a range that cuts a group
    tasks per indexed file: the read parallelism Ray asks for (override_num_blocks=), minus one per
    unindexed file, shared between the indexed files by their size (at least 1, at most its groups)

The ``.idx`` beside a ``.rec`` is :func:`parrecio.recordio.paths.index_path` (``train.rec`` ->
``train.idx``).  The driver lists the files and parses the ``.idx`` files when the dataset is created,
so a missing path, a malformed or foreign ``.idx`` (an offset past the end of its file, an offset listed
twice, a record count that is not a multiple of the group size) fails there, naming the file and the
byte offset.  A task gets only the offsets of its own range.

**Columns**: each field's column is named as ParallelReader names the field (the key of a ``fields``
dict; ``"0"``, ``"1"``... for a list; ``"0"`` for a single decoder; ``"record"`` for ``fields=None``).
Fixed-shape arrays (``Image(size=...)``, ``BoundingBoxes(max_boxes=...)``, ``ClassLabel()``) become Ray
tensor columns (0-d arrays: plain numeric columns), written by the decoder straight into the block's
array (``decode_into``); ragged arrays (``BoundingBoxes()``) variable-shaped tensor columns; ``bytes``
binary columns; JSON values what ``ray.data.from_items`` makes of them (numbers of one column and block
that mix ints and floats: all floats, Arrow's one type per column).  A field whose values are tuples
-- ``ImageRecord`` (``(image, label)``) or any decoder with a tuple ``output_spec`` -- gives one column
per part, ``"<field>_image"`` / ``"<field>_label"`` (``"<field>_0"``, ``"<field>_1"``... for other
decoders); for a single decoder (``fields=ImageRecord(...)``) just ``"image"`` / ``"label"``.
``include_paths`` / ``include_offsets`` add the ``"path"`` of the sample's file and the ``"offset"`` of
its first record.

**Errors** are parrecio's: a payload a decoder refuses raises :class:`~parrecio.DecodeError`, broken framing
:class:`~parrecio.CorruptRecordError`, each naming the file (``.source``), the byte offset of the sample's
first record (``.offset``) and the sample's index *in its file* (``.index``), worded as ParallelReader
words them.  Ray re-raises a task's exception in the driver as a ``RayTaskError`` that is also an
instance of the original class, so ``except DecodeError as err`` works, and ``index``, ``offset`` and
``source`` read the same on that wrapper as on ``err.cause`` (parrecio's own exception); the message names
all three either way.  ``on_error="skip"`` drops such samples (logged as
warnings by the worker) and, for framing errors, resyncs on the next record.

**Random decoders** (``Image(crop=RandomResizedCrop(), flip=0.5)``, and ``BoundingBoxes(image=...)`` /
``Mask`` following such an image) get one key per sample, the same for every field of the sample (the
boxes follow the image's crop): ``sample_key(seed, epoch, file number, index in file)``, so a sample's
pixels do not depend on the split into tasks, the worker or a retry.  With ``seed=None`` (the default)
each run of a task draws a fresh base, so every pass over the dataset draws new crops (Ray re-reads the
data on each pass); an int ``seed`` gives the same crops on every pass (vary ``epoch=``).  The keys are
not ParallelReader's (which counts positions in its reader's order), so such pixels differ from it.  A
streamed file (no ``.idx``) counts the samples delivered: after a damaged group skipped there the later
samples' indexes (their keys, the numbers in errors) are lower by the groups skipped than in an indexed read
(the damage may hide how many groups it took).

**Order**: the tasks are listed in file order, then range order; Ray keeps that order only with
``ray.data.DataContext.get_current().execution_options.preserve_order = True`` (the order of
ParallelReader without shuffle).  Shuffle with Ray (``ds.random_shuffle()``,
``ds.randomize_block_order()``, ``iter_batches(local_shuffle_buffer_size=...)``).

**Where the files are**: a read task may run on any node, and opens the path it was given.  So the
paths must name the same files on every node: a shared filesystem (NFS, EFS, FSx for Lustre, a FUSE
mount of a bucket) or identical copies at the same path (the driver's ``.idx`` offsets are used
everywhere).  ``driver_node_only=True`` is for files on the driver's node alone: every task then runs
there (Ray's ``ray.io/node-id`` label; Ray's own ``local://`` paths, which do the same, are deprecated).
URLs (``s3://``, ``gs://``, ``http://``, ``local://``...) are refused: mount the bucket, or copy the files.

``import parrecio.integrations.ray`` does not import Ray; :func:`read_recordio` and
``RecordIODatasource`` (a ``ray.data.Datasource`` subclass, created on first access) do.
"""

from __future__ import annotations

import functools
import inspect
import logging
import numbers
import os
import random
import re
import stat
from dataclasses import dataclass
from typing import Any, Iterator, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from ..pipeline.decode import DecodePlan, FieldFailed, failure_error
from ..decoders.base import ArraySpec, is_passthrough, is_random, payload_kinds, sample_key, spec_of
from ..decoders.imagerecord import ImageRecord
from ..errors import CorruptRecordError, DecodeError, SourceError
from ..recordio.framing import DEFAULT_MAX_RECORD_BYTES, HEADER_SIZE, JOINS, read_record
from ..recordio.index import IndexedRecordReader, IndexMismatch, check_end, check_index, check_shift
from ..recordio.paths import index_path
from ..recordio.reader import RecordReader

log = logging.getLogger("parrecio")

__all__ = ["read_recordio", "RecordIODatasource", "ReadRange", "plan_ranges"]

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_ON_ERROR = ("raise", "skip")
_DEFAULT_BLOCK_BYTES = 128 << 20   # Ray's default target_max_block_size
_MAX_BLOCK_ROWS = 1 << 16          # rows of one output block at most (tiny records)
_FIRST_ROWS = 256                  # rows allocated first when a task's row count is unknown
_READ_HINT = 64 << 10              # bytes asked for when a record's span is unknown


# -- settings ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Settings:
    """What every read task needs, checked once on the driver; travels (pickled) with each task."""

    decoders: Tuple[Any, ...]
    names: Tuple[str, ...]                   # field names, as ParallelReader names them
    specs: Tuple[Any, ...]                   # OutputSpec per field (None: ragged or passthrough)
    passthrough: Tuple[bool, ...]
    randoms: Tuple[bool, ...]                # fields whose decoder takes the sample's key
    parts: Tuple[Optional[Tuple[str, ...]], ...]   # per field: its columns when its values are tuples
    columns: Tuple[Tuple[str, ...], ...]     # per field: the column name(s) it fills
    join: str
    on_error: str
    max_record_bytes: int
    include_paths: bool
    include_offsets: bool
    seed: Optional[int]                      # None: a fresh key base per task run
    epoch: int

    @property
    def nfields(self) -> int:
        return len(self.decoders)

    @property
    def fixed_bytes(self) -> int:
        """Bytes of the fixed-shape outputs of one sample."""
        total = 0
        for spec in self.specs:
            for s in (spec if isinstance(spec, tuple) else (spec,)):
                if isinstance(s, ArraySpec):
                    total += s.nbytes
        return total


def _settings(fields: Any, join: str, on_error: str, max_record_bytes: Any, include_paths: Any,
              include_offsets: Any, seed: Any = None, epoch: Any = 0) -> _Settings:
    from ..pipeline.fields import normalize_fields  # the one rule for names and kinds
    if join not in JOINS:
        raise ValueError(f"join must be 'mxnet' or 'concat', not {join!r}")
    if on_error not in _ON_ERROR:
        raise ValueError(f"on_error must be 'raise' or 'skip', not {on_error!r}")
    if isinstance(max_record_bytes, bool) or not isinstance(max_record_bytes, numbers.Integral):
        raise TypeError(f"max_record_bytes must be an int (bytes), not {type(max_record_bytes).__name__}")
    if max_record_bytes < 1:
        raise ValueError(f"max_record_bytes must be >= 1, not {max_record_bytes!r}")
    for name, value in (("include_paths", include_paths), ("include_offsets", include_offsets)):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be True or False, not {value!r}")
    for name, value in (("seed", seed), ("epoch", epoch)):
        if value is None and name == "seed":
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"{name} must be an int, not {type(value).__name__} ({value!r})")
        if value < 0:
            raise ValueError(f"{name} must be >= 0, not {value!r}")
    kind, names, decoders = normalize_fields(fields)
    passthrough = tuple(is_passthrough(d) for d in decoders)
    randoms = tuple(is_random(d) and not p for d, p in zip(decoders, passthrough))
    specs = tuple(None if p else spec_of(d) for d, p in zip(decoders, passthrough))
    parts: List[Optional[Tuple[str, ...]]] = []
    columns: List[Tuple[str, ...]] = []
    for name, dec, spec, p in zip(names, decoders, specs, passthrough):
        if p or not (isinstance(spec, tuple) or isinstance(dec, ImageRecord)):
            parts.append(None)
            columns.append((name,))
            continue
        labels = ("image", "label") if isinstance(dec, ImageRecord) else tuple(map(str, range(len(spec))))
        parts.append(labels)
        columns.append(labels if kind == "single" else tuple(f"{name}_{x}" for x in labels))
    every = [c for cols in columns for c in cols]
    every += ["path"] * include_paths + ["offset"] * include_offsets
    dup = sorted({c for c in every if every.count(c) > 1})
    if dup:
        raise ValueError(f"column name(s) {dup} would be used twice (fields {list(names)}, include_paths="
                         f"{include_paths}, include_offsets={include_offsets}): rename the fields")
    _check_picklable(decoders, names)
    return _Settings(tuple(decoders), tuple(names), specs, passthrough, randoms, tuple(parts), tuple(columns),
                     join, on_error, int(max_record_bytes), include_paths, include_offsets,
                     None if seed is None else int(seed), int(epoch))


def _check_picklable(decoders: Sequence[Any], names: Sequence[str]) -> None:
    """Read tasks take the decoders to Ray's workers with cloudpickle: say which field cannot travel."""
    import cloudpickle
    for name, dec in zip(names, decoders):
        try:
            cloudpickle.dumps(dec)
        except Exception as exc:
            raise TypeError(f"field {name!r}: the decoder {dec!r} cannot be pickled, and Ray's read tasks "
                            f"need it in their worker processes: {type(exc).__name__}: {exc}") from exc


# -- the files and their read tasks --------------------------------------------------------------------
@dataclass(frozen=True)
class _File:
    """One input file as the driver found it."""

    path: str
    size: int
    offsets: Optional[np.ndarray]   # sorted start offsets of its whole groups' records (from the .idx)
    index: str = ""                 # its .idx
    stop: int = 0                   # where its last whole group ends: the first record left out, or its size


class ReadRange(NamedTuple):
    """One read task: the file, and the groups ``[start, stop)`` of its ``.idx`` (both ``None``: the whole
    file, streamed, for a file without an index)."""

    path: str
    start: Optional[int]
    stop: Optional[int]


def plan_ranges(groups: Sequence[Optional[int]], sizes: Sequence[int],
                parallelism: int) -> List[Tuple[int, Optional[int], Optional[int]]]:
    """``(file, start, stop)`` per read task, in file order, for files of ``groups[i]`` groups (``None``:
    no index, one task for the whole file) and ``sizes[i]`` bytes, aiming at ``parallelism`` tasks.

    An indexed file gets at least one task (none when it has no group) and at most one per group; the
    tasks left after one per unindexed file are shared between the indexed files in proportion to their
    size (largest remainders); a file's groups are cut into that many near-equal consecutive ranges."""
    indexed = [i for i, g in enumerate(groups) if g]
    budget = max(int(parallelism) - sum(g is None for g in groups), len(indexed))
    share = {i: 1 for i in indexed}
    extra = budget - len(indexed)
    if extra > 0 and indexed:
        weight = [max(int(sizes[i]), 1) for i in indexed]
        total = float(sum(weight))
        want = [budget * w / total for w in weight]
        share = {i: min(max(1, int(x)), groups[i]) for i, x in zip(indexed, want)}
        # hand out what rounding left, largest remainder first, never more tasks than groups
        left = budget - sum(share.values())
        order = sorted(zip(indexed, want), key=lambda t: (-(t[1] - int(t[1])), t[0]))
        while left > 0:
            given = False
            for i, _ in order:
                if left and share[i] < groups[i]:
                    share[i] += 1
                    left -= 1
                    given = True
            if not given:
                break
    out: List[Tuple[int, Optional[int], Optional[int]]] = []
    for i, g in enumerate(groups):
        if g is None:
            out.append((i, None, None))
        elif g:
            k = share[i]
            cuts = [g * j // k for j in range(k + 1)]
            out.extend((i, a, b) for a, b in zip(cuts, cuts[1:]))
    return out


def _paths(paths: Any) -> List[str]:
    """The files ``paths`` names (files, directories, globs, lists of those: the rules of
    ``parrecio.sources``), as absolute paths."""
    from ..sources.files import expand_patterns
    items = list(paths) if isinstance(paths, (list, tuple)) else [paths]
    if not items:
        raise SourceError("read_recordio: no paths given")
    for item in items:
        if not isinstance(item, (str, bytes, os.PathLike)) or isinstance(item, bool):
            raise TypeError(f"paths must be a path, a glob or a list of them, got {item!r}")
        text = os.fsdecode(item)
        if _URL.match(text):
            scheme = text.split("://")[0]
            hint = ("; for files on the driver's node only, give their path and driver_node_only=True"
                    if scheme == "local" else "")
            raise SourceError(
                f"{text!r}: read_recordio reads files by path, on a filesystem every Ray node mounts (NFS, "
                f"EFS, FSx for Lustre, a FUSE mount of the bucket); {scheme}:// URLs are not supported{hint}")
    # absolute: a task's worker may have another working directory (or run on another node)
    return [os.path.abspath(p) for p in expand_patterns([os.fsdecode(i) for i in items])]


def _files(paths: Sequence[str], nf: int, on_error: str, use_index: bool) -> List[Tuple[_File, Optional[int]]]:
    """``(file, groups)`` per path (``groups`` None: no ``.idx``, or ``use_index=False``), every index
    parsed and checked against its file."""
    from ..pipeline.plan import whole_groups
    from ..sources.files import CHECKED_FILES, check_heads
    check_heads(paths[:CHECKED_FILES])  # a file of another format: refused here, as ParallelReader does
    out = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError as exc:
            raise SourceError(f"cannot use {path!r}: {exc.strerror or exc}") from exc
        if not stat.S_ISREG(st.st_mode):
            raise SourceError(f"{path!r} is not a regular file: Ray's read tasks open each file by its path, "
                              f"maybe on another node (a FIFO or a device cannot be read that way)")
        idx = index_path(path)
        if not (use_index and os.path.isfile(idx)):
            out.append((_File(path, st.st_size, None), None))
            continue
        with IndexedRecordReader(path, idx) as probe:  # (the index parsed once, for both)
            listed = sorted(probe.offsets)
            # its offsets, then its first group and last record read: a stale index fails here, as
            # ParallelReader's does (each record's end is checked as it is read)
            check_index(probe, listed, nf)
        offs, cut = whole_groups(listed, nf, path, on_error)
        if cut:
            log.warning("parrecio: %s: the index lists a last group of fewer than %d records; it is skipped",
                        path, nf)
        arr = np.asarray(offs, dtype=np.int64)
        stop = listed[len(offs)] if cut else st.st_size
        out.append((_File(path, st.st_size, arr, idx, stop), len(arr) // nf))
    return out


@dataclass(frozen=True)
class _Task:
    """One read task, as it travels to a Ray worker: the settings, the file, and the range's offsets."""

    settings: _Settings
    path: str
    file_number: int                 # the file's position in the dataset's list (part of the sample keys)
    first_group: int                 # index in the file of the range's first group (0 when streamed)
    offsets: Optional[np.ndarray]    # the range's record offsets (None: stream the whole file)
    end: int                         # the offset after the range's last record (its span), or the file size
    block_bytes: int                 # the target size of an output block
    size: int = 0                    # the file's size
    index: str = ""                  # the file's .idx (its records' ends are checked against it)


# -- decoding ------------------------------------------------------------------------------------------
class _Columns:
    """The output block being filled: fixed-shape outputs written in place, the rest in lists."""

    def __init__(self, st: _Settings, rows: int, cap: int) -> None:
        self.st = st
        self.plan = DecodePlan(st.decoders, st.specs, st.passthrough)
        self.cap = cap
        self.n = 0
        self.payload_bytes = 0  # payloads of fields that are not written in place (a size estimate)
        self._alloc(max(1, min(rows, cap)))

    def _alloc(self, rows: int) -> None:
        self.rows = rows
        self.arrays: List[Any] = []
        self.lists: List[Any] = []
        for spec, parts in zip(self.st.specs, self.st.parts):
            if isinstance(spec, ArraySpec):
                self.arrays.append(np.empty((rows,) + spec.shape, spec.dtype))
                self.lists.append(None)
            elif isinstance(spec, tuple):
                self.arrays.append(tuple(None if s is None else np.empty((rows,) + s.shape, s.dtype)
                                         for s in spec))
                self.lists.append([[] if s is None else None for s in spec])
            else:
                self.arrays.append(None)
                self.lists.append([[] for _ in parts] if parts else [])
        self.paths: List[str] = []
        self.offsets: List[int] = []

    def grow(self) -> None:
        """Room for more rows (the fixed arrays doubled, up to ``cap``)."""
        old_arrays, n = self.arrays, self.n
        old_lists, old_paths, old_offsets = self.lists, self.paths, self.offsets
        self._alloc(min(2 * self.rows, self.cap))
        for f, old in enumerate(old_arrays):
            if isinstance(old, np.ndarray):
                self.arrays[f][:n] = old[:n]
            elif isinstance(old, tuple):
                for new, o in zip(self.arrays[f], old):
                    if o is not None:
                        new[:n] = o[:n]
        self.lists, self.paths, self.offsets = old_lists, old_paths, old_offsets

    def add(self, payloads: Sequence[Any], index: int, offset: int, path: str, key: Optional[int]) -> None:
        """Decode one group into row ``n``; nothing is appended unless every field decoded.  ``key``: the
        sample's key, given to every ``random`` decoder of the group (one key: one crop for the image and
        its boxes)."""
        st, row = self.st, self.n
        if row == self.rows:
            self.grow()
        outs = [a[row, ...] if isinstance(a, np.ndarray) else
                tuple(None if x is None else x[row, ...] for x in a) if isinstance(a, tuple) else None
                for a in self.arrays]
        try:  # ParallelReader's decode path (parrecio.pipeline.decode): the same payload views, the same errors
            vals = self.plan.decode(payloads, outs, key)
        except FieldFailed as exc:
            err = _decode_error(st, exc.field, exc.error, payloads, index, offset, path)
            raise err from err.__cause__
        for f, parts in enumerate(st.parts):
            if parts and st.specs[f] is None and not (isinstance(vals[f], tuple) and len(vals[f]) == len(parts)):
                exc = TypeError(f"expected a tuple of {len(parts)} values ({', '.join(parts)}), "
                                f"got {type(vals[f]).__name__}")
                err = _decode_error(st, f, exc, payloads, index, offset, path)
                raise err from err.__cause__
        for f, (spec, parts) in enumerate(zip(st.specs, st.parts)):
            if isinstance(spec, ArraySpec):
                continue
            if isinstance(spec, tuple) or parts:
                for lst, v in zip(self.lists[f], vals[f]):
                    if lst is not None:
                        lst.append(v)
            else:
                self.lists[f].append(vals[f])
            self.payload_bytes += len(payloads[f])
        self.paths.append(path)
        self.offsets.append(offset)
        self.n += 1

    def full(self, block_bytes: int) -> bool:
        return self.n >= self.cap or self.n * self.st.fixed_bytes + self.payload_bytes >= block_bytes

    def block(self) -> Any:
        """The rows so far as a Ray block (a pyarrow Table)."""
        from ray.data.block import BlockAccessor
        st, n = self.st, self.n
        batch = {}
        for f, (spec, cols) in enumerate(zip(st.specs, st.columns)):
            if isinstance(spec, ArraySpec):
                batch[cols[0]] = self.arrays[f][:n]
            elif isinstance(spec, tuple):
                for col, a, lst in zip(cols, self.arrays[f], self.lists[f]):
                    batch[col] = a[:n] if a is not None else _column(lst)
            elif st.parts[f]:
                for col, lst in zip(cols, self.lists[f]):
                    batch[col] = _column(lst)
            else:
                batch[cols[0]] = _column(self.lists[f])
        if st.include_paths:
            batch["path"] = _column(self.paths)
        if st.include_offsets:
            batch["offset"] = np.asarray(self.offsets, dtype=np.int64)
        return BlockAccessor.batch_to_block(batch)


def _column(values: List[Any]) -> np.ndarray:
    """A list of values as a numpy column: stacked when they are arrays of one shape and dtype, numeric
    when they are numbers, else an object array (ragged arrays, bytes, str, JSON values)."""
    if values and all(isinstance(v, (np.ndarray, np.generic)) for v in values):
        first = values[0]
        if all(v.shape == first.shape and v.dtype == first.dtype for v in values):
            return np.stack(values)
    elif values and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values) \
            and len({type(v) for v in values}) == 1:
        try:  # (ints past int64 -- a uint64 hash in JSON -- made numpy choose float64: values changed)
            return np.asarray(values, dtype=np.int64 if isinstance(values[0], int) else np.float64)
        except OverflowError:
            pass  # an object column, as ray.data.from_items makes of them: the exact ints
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def _decode_error(st: _Settings, f: int, exc: BaseException, payloads: Sequence[Any], index: int, offset: int,
                  path: str) -> DecodeError:
    """The DecodeError of field ``f`` of sample ``index`` (whose payloads are ``payloads``), worded as
    ParallelReader words it (``field 'name' (decoder): reason; the payload is ... (sample i, byte offset o
    of path)``)."""
    err = failure_error(st, FieldFailed(f, exc), payloads, index, offset, path)
    if isinstance(exc, DecodeError):
        err.__cause__ = exc.__cause__ or exc
    return err


class _Pread:
    """A framing source over ``os.pread`` (as :class:`~parrecio.recordio.index.IndexedRecordReader` reads):
    the first read of a record asks for its whole span, so most records cost one call."""

    __slots__ = ("fd", "hint", "lo", "data")

    def __init__(self, fd: int, hint: int) -> None:
        self.fd, self.hint, self.lo, self.data = fd, hint, 0, memoryview(b"")

    def view(self, offset: int, nbytes: int) -> memoryview:
        rel = offset - self.lo
        if rel < 0 or rel + nbytes > len(self.data):
            self.data = memoryview(os.pread(self.fd, max(nbytes, self.hint), offset))
            self.lo, rel, self.hint = offset, 0, _READ_HINT
        return self.data[rel:rel + nbytes]


def _indexed_groups(task: _Task) -> Iterator[Tuple[int, int, Optional[List[Any]]]]:
    """``(index, offset, payloads)`` per group of the task's range, read by offset; ``payloads`` None for
    a group whose framing is broken (``on_error="skip"``)."""
    st, nf, path = task.settings, task.settings.nfields, task.path
    offs = task.offsets
    limit = st.max_record_bytes + HEADER_SIZE + 3
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise SourceError(f"cannot open {path!r}: {exc.strerror or exc}") from exc
    try:
        nxt = list(offs[1:]) + [task.end]
        for g in range(len(offs) // nf):
            index, first = task.first_group + g, int(offs[g * nf])
            payloads: Optional[List[Any]] = []
            for r in range(g * nf, (g + 1) * nf):
                offset = int(offs[r])
                span = min(max(int(nxt[r]) - offset, HEADER_SIZE), limit)
                try:
                    got = read_record(_Pread(fd, span), offset, join=st.join,
                                      max_record_bytes=st.max_record_bytes, source=path)
                    if got is None:
                        raise CorruptRecordError("no record here: offset at or past the end of the file",
                                                 offset, source=path)
                    check_end(offset, got[1], int(nxt[r]), task.size, path, task.index,
                              lambda at, n: os.pread(fd, n, at))
                except CorruptRecordError as exc:
                    try:  # (or the index is off from here)
                        check_shift(exc, offset, int(nxt[r]), int(nxt[r + 1]) if r + 1 < len(nxt) else None,
                                    task.size, path, task.index, lambda at, n: os.pread(fd, n, at))
                    except IndexMismatch as mismatch:
                        exc = mismatch
                    if st.on_error == "raise" or isinstance(exc, IndexMismatch):  # (not one sample's)
                        raise exc.located(index) from None
                    log.warning("parrecio: skipped %s", exc.located(index))
                    payloads = None
                    break
                payloads.append(got[0])
            yield index, first, payloads
    finally:
        os.close(fd)


def _streamed_groups(task: _Task) -> Iterator[Tuple[int, int, Optional[List[Any]]]]:
    """``(index, offset, payloads)`` per group of a whole file, streamed (no index), through
    ParallelReader's group stream (:mod:`parrecio.pipeline.groups`): with ``on_error="skip"`` a group
    broken by a corrupt region is dropped and the groups after it are realigned by the same rule
    (:mod:`parrecio.pipeline.resync`), or the task fails."""
    from ..pipeline.groups import GroupStream, InOrder, Placement
    st, path = task.settings, task.path
    reader = RecordReader(path, join=st.join, on_corrupt=st.on_error, max_record_bytes=st.max_record_bytes,
                          source_name=path)
    rules = InOrder(st.nfields, tuple(payload_kinds(d) for d in st.decoders), st.names, st.on_error)
    gs = GroupStream(rules, st.epoch)
    index = 0
    try:
        try:  # records held as bytes (Placement): a view is valid until the reader's next step only
            for g in gs.groups(iter([(0, path, reader, Placement())])):
                yield index, g.offset, g.parts
                index += 1
        except CorruptRecordError as exc:
            raise exc.located(index) from None
    finally:
        reader.close()
    if gs.count.skipped_groups:
        log.warning("parrecio: skipped %d group(s) of %s: damage inside them, or the file ends inside "
                    "a group", gs.count.skipped_groups, path)


def _read_task(task: _Task) -> Iterator[Any]:
    """The body of one Ray read task: decode the task's groups into blocks of about ``block_bytes``."""
    st = task.settings
    per_row = max(st.fixed_bytes, 1)
    cap = max(1, min(_MAX_BLOCK_ROWS, task.block_bytes // per_row))
    indexed = task.offsets is not None
    left = len(task.offsets) // st.nfields if indexed else _FIRST_ROWS  # rows to allocate for
    keyed = any(st.randoms)
    if keyed:  # sample keys from (seed, epoch, file, index in file): independent of the split into tasks
        base = st.seed if st.seed is not None else random.SystemRandom().getrandbits(63)
    groups = _indexed_groups(task) if indexed else _streamed_groups(task)
    cols = _Columns(st, left, cap)
    try:
        for index, offset, payloads in groups:
            if indexed:
                left -= 1
            if payloads is None:
                continue
            key = sample_key(base, st.epoch, task.file_number, index) if keyed else None
            try:
                cols.add(payloads, index, offset, task.path, key)
            except DecodeError as err:
                if st.on_error == "raise":
                    raise
                log.warning("parrecio: skipped %s", err)
                continue
            if cols.full(task.block_bytes):
                yield cols.block()
                cols = _Columns(st, left if indexed else cols.n, cap)
    finally:
        groups.close()
    if cols.n:
        yield cols.block()


# -- the Datasource ------------------------------------------------------------------------------------
class _Plan:
    """The part of the datasource that does not need Ray: the checked settings and files."""

    def __init__(self, paths: Any, fields: Any, *, join: str = "mxnet", on_error: str = "raise",
                 max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES, use_index: bool = True,
                 include_paths: bool = False, include_offsets: bool = False, seed: Optional[int] = None,
                 epoch: int = 0, driver_node_only: bool = False) -> None:
        for name, value in (("use_index", use_index), ("driver_node_only", driver_node_only)):
            if not isinstance(value, bool):
                raise TypeError(f"{name} must be True or False, not {value!r}")
        self.settings = _settings(fields, join, on_error, max_record_bytes, include_paths, include_offsets,
                                  seed, epoch)
        self.driver_node_only = driver_node_only
        names = _paths(paths)
        found = _files(names, self.settings.nfields, on_error, use_index)
        self.files = [f for f, _ in found]
        self.groups = [g for _, g in found]

    def read_ranges(self, parallelism: int) -> List[ReadRange]:
        """The read tasks for a requested ``parallelism``: ``ReadRange(path, start, stop)`` each, in file
        order (see the module docstring for the rule)."""
        plan = plan_ranges(self.groups, [f.size for f in self.files], max(1, int(parallelism)))
        return [ReadRange(self.files[i].path, a, b) for i, a, b in plan]

    def estimate_inmemory_data_size(self) -> int:
        """Decoded bytes, roughly: per indexed file its groups times the fixed-shape outputs of a sample,
        or the file's size when that is larger (payloads kept as they are, unindexed files)."""
        per = self.settings.fixed_bytes
        return int(sum(f.size if g is None else max(f.size, g * per) for f, g in zip(self.files, self.groups)))

    def tasks(self, parallelism: int, block_bytes: Optional[int]) -> List[Tuple[_Task, Optional[int], int]]:
        """``(task, rows, bytes)`` per read task: rows known for an indexed range (None otherwise, and
        under ``on_error="skip"``), bytes estimated."""
        st, nf = self.settings, self.settings.nfields
        block = int(block_bytes or _DEFAULT_BLOCK_BYTES)
        out = []
        for i, a, b in plan_ranges(self.groups, [f.size for f in self.files], max(1, int(parallelism))):
            f = self.files[i]
            if a is None:
                out.append((_Task(st, f.path, i, 0, None, f.size, block), None, f.size))
                continue
            offs = f.offsets[a * nf:b * nf].copy()
            end = int(f.offsets[b * nf]) if b * nf < len(f.offsets) else f.stop
            nbytes = end - int(offs[0])
            rows = b - a
            task = _Task(st, f.path, i, a, offs, end, block, f.size, f.index)
            out.append((task, None if st.on_error == "skip" else rows, max(nbytes, rows * st.fixed_bytes)))
        return out


def _ray_data() -> Any:
    """``ray.data``, or an ImportError that says what to install."""
    try:
        import ray.data
    except ImportError as exc:
        raise ImportError(f"parrecio.integrations.ray needs Ray Data: pip install 'parrecio[ray]' (or "
                          f"'ray[data]'; 'ray[train]' too for iter_torch_batches) ({exc})") from exc
    return ray.data


@functools.lru_cache(maxsize=None)
def _datasource_class() -> type:
    ray_data = _ray_data()
    from ray.data.block import BlockMetadata
    from ray.data.datasource import ReadTask

    class RecordIODatasource(ray_data.Datasource):
        """RecordIO files as a Ray Data datasource: one row per sample (a group of ``len(fields)``
        records), one column per field, decoded with parrecio's decoders in the read tasks.

        Takes :func:`read_recordio`'s arguments but the Ray ones; ``ray.data.read_datasource(source,
        ...)`` reads it.  The files are listed and their ``.idx`` files checked here, on the driver.
        """

        def __init__(self, paths: Any, fields: Any = None, *, join: str = "mxnet", on_error: str = "raise",
                     max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES, use_index: bool = True,
                     include_paths: bool = False, include_offsets: bool = False, seed: Optional[int] = None,
                     epoch: int = 0, driver_node_only: bool = False) -> None:
            super().__init__()
            self._plan = _Plan(paths, fields, join=join, on_error=on_error,
                               max_record_bytes=max_record_bytes, use_index=use_index,
                               include_paths=include_paths, include_offsets=include_offsets, seed=seed,
                               epoch=epoch, driver_node_only=driver_node_only)

        @property
        def paths(self) -> List[str]:
            """The files read, in order."""
            return [f.path for f in self._plan.files]

        def read_ranges(self, parallelism: int) -> List[ReadRange]:
            """The read tasks :meth:`get_read_tasks` makes for ``parallelism``."""
            return self._plan.read_ranges(parallelism)

        def get_name(self) -> str:
            return "RecordIO"

        @property
        def supports_distributed_reads(self) -> bool:
            return not self._plan.driver_node_only

        def estimate_inmemory_data_size(self) -> Optional[int]:
            return self._plan.estimate_inmemory_data_size()

        def get_read_tasks(self, parallelism: int, per_task_row_limit: Optional[int] = None,
                           data_context: Any = None) -> List[Any]:
            if data_context is None:
                data_context = ray_data.DataContext.get_current()
            block_bytes = getattr(data_context, "target_max_block_size", None)
            out = []
            for task, rows, nbytes in self._plan.tasks(parallelism, block_bytes):
                meta = BlockMetadata(num_rows=rows, size_bytes=int(nbytes), input_files=[task.path],
                                     exec_stats=None)
                limit = {} if per_task_row_limit is None else {"per_task_row_limit": per_task_row_limit}
                out.append(ReadTask(functools.partial(_read_task, task), meta, **limit))
            return out

        def __repr__(self) -> str:
            st = self._plan.settings
            return f"RecordIODatasource({len(self._plan.files)} files, fields={list(st.names)})"

    RecordIODatasource.__module__ = __name__
    RecordIODatasource.__qualname__ = "RecordIODatasource"
    return RecordIODatasource


def __getattr__(name: str) -> Any:
    if name == "RecordIODatasource":
        return _datasource_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _ray_keywords() -> frozenset:
    params = inspect.signature(_ray_data().read_datasource).parameters
    return frozenset(n for n, p in params.items()
                     if n != "datasource" and p.kind is not inspect.Parameter.VAR_KEYWORD)


def read_recordio(paths: Any, fields: Any = None, *, join: str = "mxnet", on_error: str = "raise",
                  max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES, use_index: bool = True,
                  include_paths: bool = False, include_offsets: bool = False, seed: Optional[int] = None,
                  epoch: int = 0, driver_node_only: bool = False, override_num_blocks: Optional[int] = None,
                  **ray_options: Any) -> Any:
    """Read RecordIO files into a ``ray.data.Dataset`` of decoded samples (see the module docstring).

    Args:
        paths: a ``.rec`` path, a directory (its ``*.rec`` files in name order), a glob, or a list of those
            (the rules of :class:`~parrecio.ParallelReader`), on a filesystem every node sees.
        fields: one decoder per record of a group, as for ParallelReader: a dict ``name -> decoder``
            (columns named by the keys), a list (columns ``"0"``, ``"1"``...), one decoder, or ``None``
            (each record's bytes, column ``"record"``).
        join: multipart records: ``"mxnet"`` (default; MXNet / dmlc-core files) or ``"concat"`` (records
            written through SageMaker's RecordIO wrapper).
        on_error: ``"raise"`` (default): an undecodable sample or broken framing fails the read with
            :class:`~parrecio.DecodeError` / :class:`~parrecio.CorruptRecordError` naming the file, the
            byte offset and the sample's index in its file; ``"skip"``: drop it (a warning is logged).
        max_record_bytes: the largest record accepted (64 MiB); a larger length word is corruption.
        use_index: read indexed files by their ``.idx`` (split into several tasks); ``False`` streams every
            file in one task (for ``.idx`` files you do not trust).
        include_paths, include_offsets: add a ``"path"`` column (the sample's file, an absolute path) /
            an ``"offset"`` column (the byte offset of its first record).
        seed, epoch: the sample keys of ``random`` decoders (``Image(crop=RandomResizedCrop(), flip=0.5)``
            and ``BoundingBoxes(image=...)``, ``Mask`` following it): ``sample_key(seed, epoch, file number,
            index in file)``, the same key for every field of a sample, whatever the split into tasks.
            ``seed=None`` (default): a fresh random base each time a task runs, so every pass over the
            dataset draws new crops; an int: reproducible crops, the same on every pass (give each epoch
            its own ``epoch=``, e.g. one ``read_recordio`` per epoch).
        driver_node_only: the files exist on the driver's node only: run every read task there.
        override_num_blocks: the number of read tasks to aim for (default: Ray's choice from the data
            size and the cluster's CPUs).  Unindexed files are one task each whatever it says.
        **ray_options: passed to ``ray.data.read_datasource`` (``concurrency``, ``num_cpus``, ``memory``,
            ``resources``, ``label_selector``, ``runtime_env``, ...); anything else is a ``TypeError``.

    The files and their ``.idx`` files are listed and checked now (a missing path is a
    :class:`~parrecio.SourceError`); decoding happens when the dataset is consumed.
    """
    ray_data = _ray_data()
    unknown = sorted(set(ray_options) - _ray_keywords())
    if unknown:
        raise TypeError(f"read_recordio() got unexpected keyword argument(s) {unknown}: neither parrecio's "
                        f"nor ray.data.read_datasource's")
    if override_num_blocks is not None:
        if isinstance(override_num_blocks, bool) or not isinstance(override_num_blocks, numbers.Integral):
            raise TypeError(f"override_num_blocks must be an int, not {type(override_num_blocks).__name__}")
        if override_num_blocks < 1:
            raise ValueError(f"override_num_blocks must be >= 1, not {override_num_blocks!r}")
        ray_options["override_num_blocks"] = int(override_num_blocks)
    source = _datasource_class()(paths, fields, join=join, on_error=on_error, max_record_bytes=max_record_bytes,
                                 use_index=use_index, include_paths=include_paths,
                                 include_offsets=include_offsets, seed=seed, epoch=epoch,
                                 driver_node_only=driver_node_only)
    return ray_data.read_datasource(source, **ray_options)
