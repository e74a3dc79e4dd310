"""``workers=0``: one pass read and decoded in the consumer's own process (PyTorch's ``num_workers=0``).

::

    source.streams(epoch)                                      (opened here, not in a reader process)
       |  RecordReader.iter_views(): records as views of its buffer
       v
    [ groups ]  len(fields) records per group; shard filter; shuffle buffer or .idx permutation
       |         (the same RNG calls, in the same order, as the reader process: same orders)
       v
    [ decode ]  decoder(payload) per field, in this thread; fixed-shape fields written into their
       |         sample's (or batch's) array with write_into; an error becomes the same DecodeError
       v
    samples or batches, in stream order                   (no Sample objects, no shared memory)

Nothing is started: no process, no pipe, no shared memory.  Decoders need not be picklable, ``pdb``
stops inside them, and when decoding costs less than moving the data between processes this is the
fastest mode.  The output is what ``workers >= 1`` gives for the same arguments: the same values in the
same order, the same errors at the same index, offset and source, the same ``on_error="skip"`` counts,
the same shuffle for a given seed and epoch, the same shards.

Payload lifetime: a view from ``iter_views()`` is valid until the reader takes its next step.  The last
record of a group is handed to the decoders as that view; earlier records of a group, and every record
that waits in the shuffle buffer, are copied to ``bytes`` first.  As in a decoder process, a decoder is
given a read-only ``memoryview``, released after the call (a decoder that keeps it fails there).

The common case -- one field, no shuffle, no shards, no batches -- has a loop of its own with nothing per
record but the read, the decoder call and the yield.  ``Json()`` fields call ``orjson.loads`` directly
(the decoder itself runs again on a payload that fails, to raise its own error).

Differences from the process pipeline, on purpose: a ``KeyboardInterrupt``/``SystemExit`` raised while a
decoder runs is not a decode error of that sample (Ctrl-C must stop the consumer); an exception that is
not a :class:`~parrecio.ParrecioError` raised while reading propagates as it is (the reader process
wraps it in a ``PipelineError``); a decode error's traceback continues into the decoder's own frames.
Counters (``stats.samples``, ``records``, ...) are added at the end of the pass, and there is no split
of the time between the pipeline and the user's loop (``wait_workers_time``, ``user_time`` stay 0).
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from typing import Any, Callable, Iterator, List, Optional, Sequence

import numpy as np

from ..decoders.base import ArraySpec, is_random, sample_key, write_into
from ..decoders.basic import Json
from ..errors import CorruptRecordError, DecodeError, field_error
from ..recordio import RecordReader
from .batching import batch_error, collate, shaper
from .plan import EvenShards, epoch_order, resume_overrun, whole_groups
from .mismatch import field_note
from ..decoders.sniff import sniff
from .resync import for_stream
from .run import Cursor, _ended

log = logging.getLogger("parrecio")

__all__ = ["InlineRun"]

_PASS, _RAGGED, _FIXED, _TUPLE = range(4)  # how a field is decoded


def _fast_calls() -> dict:
    """Decoder type -> a C function giving the same value for any payload the decoder accepts (and
    failing on the others, which are then given to the decoder itself for its own error)."""
    import orjson
    return {Json: orjson.loads}


_FAST = _fast_calls()
_NO_WRITE = frozenset(map(id, [bytes, *_FAST.values()]))  # calls that never write into the payload
_CONTEXT = 16   # records sniffed at the start of each stream, for a decode error's hint


class _ThisProcess:
    """What ``telemetry()`` asks of ``run.reader``: here the reading is done by this very process."""

    def __init__(self) -> None:
        self.pid = os.getpid()


class _Timed:
    """The stream as RecordReader sees it: one underlying read per call (``readinto1``, so that a FIFO
    never blocks for more than it has), the time spent reading counted in ``stats.read_time``."""

    def __init__(self, file: Any, stats: Any) -> None:
        self._file = file
        self._stats = stats
        self._readinto = getattr(file, "readinto1", None) or getattr(file, "readinto", None)
        self.name = getattr(file, "name", None)

    def readinto(self, buf) -> Optional[int]:
        t0 = time.perf_counter()
        try:
            if self._readinto is not None:
                return self._readinto(buf)
            data = (getattr(self._file, "read1", None) or self._file.read)(len(buf))
            if data is None:
                return None
            buf[:len(data)] = data
            return len(data)
        finally:
            self._stats.read_time += time.perf_counter() - t0

    def readable(self) -> bool:
        return True


class InlineRun:
    """One pass over the stream, read and decoded by the thread that iterates it.  Has what
    :class:`~parrecio.ParallelReader` uses of a :class:`~parrecio.pipeline.run.Run` (``thread``,
    ``aborted``, ``completed``, ``delivered``, ``abort``, ``shutdown``, ``forget_after_fork``, and for
    ``telemetry()``: ``reader.pid``, ``chunks``, ``ring_in_use``); :meth:`items` is the pass itself."""

    chunks = ()  # nothing waits between processes

    def __init__(self, res: Any, epoch: int, skip: int = 0) -> None:
        self.res = res            # the ParallelReader's Resources (only its source and stats are used)
        self.cfg = res.cfg
        self.epoch = epoch
        self.skip = skip          # groups of this shard's order already delivered (a resumed epoch)
        self.cursor = Cursor(skip)  # where the user stands: set before each item is yielded
        self.positions: Optional[int] = None  # of this shard's order gone through, once completed
        self.nf = self.cfg.nfields
        self.stats = res.stats
        self.thread = threading.current_thread()
        self.owner_pid = os.getpid()
        self.reader = _ThisProcess()
        self.aborted = False      # ended from outside (close(), a new pass) before the consumer was done
        self.completed = False    # the whole stream was delivered without an error
        self.closed = False
        self.delivered = 0        # samples yielded in this pass (counted at its end)
        self._gen: Any = None       # a weak reference to the pass's generator
        self._started = 0.0
        self._open: List[Any] = []  # files and readers of the pass, closed by abort() when it is safe
        specs = self.cfg.layout.specs
        self.kinds = [_PASS if p else _RAGGED if s is None else _FIXED if isinstance(s, ArraySpec) else _TUPLE
                      for p, s in zip(self.cfg.passthrough, specs)]
        self.specs = list(specs)
        self.calls = [bytes if k == _PASS else _FAST.get(type(d), d) if k == _RAGGED else d
                      for k, d in zip(self.kinds, self.cfg.decoders)]
        self.randoms = [is_random(d) and k != _PASS for k, d in zip(self.kinds, self.cfg.decoders)]
        # counters of the group stage, added to stats at the end of the pass
        self.records = self.nbytes = self.skipped_groups = self.sharded_out = 0
        self.first_kinds: dict = {}  # source -> the sniff() kinds of its first _CONTEXT records

    # -- lifecycle (as Run) ------------------------------------------------------------------------
    def ring_in_use(self) -> int:
        return 0

    def abort(self) -> None:
        """End the pass from outside (close(), a new pass): the consumer's iterator raises if resumed."""
        self.aborted = not self.closed
        self.shutdown()

    def shutdown(self) -> None:
        """Close the pass's files now, unless the iterating thread is inside the pass at this moment (a
        close() from another thread): then it closes them itself when it comes out.  Idempotent."""
        if os.getpid() != self.owner_pid:
            return
        self.closed = True
        gen = self._gen() if self._gen is not None else None
        if gen is not None and gen.gi_running:
            return
        opened, self._open = self._open, []
        for obj in opened:
            try:
                obj.close()
            except Exception:
                pass

    def forget_after_fork(self) -> None:
        self.closed = True
        self._open = []

    # -- the pass ----------------------------------------------------------------------------------
    def items(self, batch_size: Optional[int], drop_last: bool, kind: str, names: Sequence[str],
              on_end: Optional[Callable[["InlineRun", float], None]] = None) -> Iterator[Any]:
        """What the user iterates: samples (or batches) in stream order; raises the first error under
        ``on_error="raise"`` after everything before it (a short batch first).

        ``on_end(run, seconds)`` is called when the pass ends (completed, failed, broken off or closed),
        with the time from its first ``next()``: the owner's bookkeeping, done here rather than in a
        wrapping generator, which would cost a few percent per sample on small records.  Only the
        generator holds it (the run is held by the owner: no reference cycle)."""
        cfg = self.cfg
        if (self.nf == 1 and kind == "single" and batch_size is None and cfg.shuffle_mode is None
                and cfg.num_shards == 1 and cfg.even_shards is None and not self.skip
                and self.kinds[0] != _FIXED and self.kinds[0] != _TUPLE and not self.randoms[0]):
            gen = self._single(on_end)
        else:
            gen = self._general(batch_size, drop_last, kind, names, on_end)
        self._gen = weakref.ref(gen)
        return gen

    def _single(self, on_end: Any) -> Iterator[Any]:
        """One field, no shuffle, no shards, no batches: the per-record path, kept short."""
        self._started = time.perf_counter()
        if self.aborted:
            raise _ended()
        call = self.calls[0]
        readonly = id(call) not in _NO_WRITE  # decoders get read-only payloads, as in the pipeline
        raise_ = self.cfg.on_error == "raise"
        seq = skipped = nbytes = failed = 0
        err = None
        cursor = self.cursor
        streams = self._streams()
        try:
            try:
                for source, reader in streams:
                    kinds = self.first_kinds[source] = []
                    for offset, view in reader.iter_views():
                        nbytes += len(view)
                        if len(kinds) < _CONTEXT:  # what a decode error's hint compares with (mismatch.py)
                            kinds.append(sniff(view))
                        try:
                            if readonly:  # as a decoder process: a read-only view, released after the call
                                ro = view.toreadonly()
                                try:
                                    value = call(ro)
                                finally:
                                    ro.release()  # BufferError if the decoder kept it
                            else:
                                value = call(view)
                        except Exception as exc:
                            e = self._failed(0, exc, [view], seq, offset, source)
                            if raise_:
                                err, failed = e, 1
                                break
                            seq += 1
                            skipped += 1
                            continue
                        seq += 1
                        cursor.pos = seq
                        yield value
                        if self.aborted:
                            raise _ended()
                    if err is not None:
                        break
            except CorruptRecordError as exc:
                err = exc.located(seq)
            if err is not None:
                raise err
            self.completed = True
        finally:
            streams.close()
            self.records += seq + failed
            self.nbytes += nbytes
            self._count(seq - skipped, skipped, on_end)

    def _general(self, batch_size: Optional[int], drop_last: bool, kind: str, names: Sequence[str],
                 on_end: Any) -> Iterator[Any]:
        """Any group size, shards, shuffles, fixed-shape fields, batches."""
        self._started = time.perf_counter()
        if self.aborted:
            raise _ended()
        nf, kinds, calls, specs = self.nf, self.kinds, self.calls, self.specs
        cfg = self.cfg
        decoders, randoms = cfg.decoders, self.randoms
        keyed = any(randoms)
        fields = range(nf)
        raise_ = self.cfg.on_error == "raise"
        shape = None if kind == "tuple" else shaper(kind, names)
        batched = batch_size is not None
        if batched:
            new_arrays, new_lists, columns = self._batch_parts(batch_size, shape)
        arrays = lists = None
        row = 0           # samples in the batch being filled
        seq = batched_to = self.skip   # position in this shard's order; after the batch filled so far
        cursor = self.cursor
        skipped = delivered = 0
        err = None
        groups = self._groups()
        try:
            try:
                for parts, offset, source in groups:
                    if parts is None:  # a group the index lists but that cannot be read (skipped)
                        seq += 1
                        continue
                    if batched and arrays is None:
                        arrays, lists = new_arrays(), new_lists()
                    vals: List[Any] = [None] * nf
                    f, p = 0, None
                    # as in a decoder process (parrecio.pipeline.worker): the same key, the same pixels
                    key = sample_key(cfg.seed, self.epoch, cfg.shard_index, seq) if keyed else None
                    try:
                        for f in fields:
                            k, p = kinds[f], parts[f]
                            if k == _PASS:
                                vals[f] = bytes(p)
                                continue
                            if id(calls[f]) in _NO_WRITE:
                                vals[f] = calls[f](p)
                                continue
                            # as a decoder process: a read-only memoryview, released after the call
                            p = p.toreadonly() if type(p) is memoryview else memoryview(p)
                            fkey = key if randoms[f] else None
                            try:
                                if k == _RAGGED:
                                    vals[f] = calls[f](p) if fkey is None else calls[f](p, key=fkey)
                                elif batched:
                                    out = arrays[f]
                                    out = out[row, ...] if k == _FIXED else \
                                        tuple(a[row, ...] if a is not None else None for a in out)
                                    vals[f] = write_into(decoders[f], p, specs[f], out, fkey)
                                else:
                                    vals[f] = self._one_fixed(f, p, fkey)
                            finally:
                                p.release()  # BufferError if the decoder kept it
                    except Exception as exc:
                        e = self._failed(f, exc, parts, seq, offset, source)
                        seq += 1
                        if raise_:
                            err = e
                            break
                        skipped += 1
                        continue
                    seq += 1
                    if not batched:
                        delivered += 1
                        cursor.pos = seq
                        yield tuple(vals) if shape is None else shape(vals)
                        if self.aborted:
                            raise _ended()
                        continue
                    for f in fields:
                        lst = lists[f]
                        if lst is None:
                            continue
                        if kinds[f] == _TUPLE:
                            for part, v in zip(lst, vals[f]):
                                if part is not None:
                                    part.append(v)
                        else:
                            lst.append(vals[f])
                    row += 1
                    batched_to = seq  # the position after the batch's last sample
                    if row == batch_size:
                        batch = columns(arrays, lists, row, batched_to - row)
                        arrays = lists = None
                        row = 0
                        delivered += batch_size
                        cursor.pos = batched_to
                        yield batch
                        if self.aborted:
                            raise _ended()
            except CorruptRecordError as exc:
                err = exc.located(seq)
            if row:
                delivered += row  # counted as the pipeline counts them: even when drop_last drops them
                if err is not None or not drop_last:  # the samples before an error come out first
                    batch = columns(arrays, lists, row, batched_to - row)
                    arrays = lists = None
                    row = 0
                    cursor.pos = batched_to
                    yield batch
            if err is not None:
                raise err
            self.positions = seq
            self.completed = True
        finally:
            groups.close()
            self._count(delivered, skipped, on_end)

    # -- decoding helpers --------------------------------------------------------------------------
    def _one_fixed(self, f: int, payload: Any, key: Optional[int] = None) -> Any:
        """A fixed-shape field of one sample (no batch), as the pipeline gives it: ``arr[0]`` of an
        array of one row, written through ``arr[0, ...]`` (so a ``()`` shape gives a numpy scalar)."""
        spec = self.specs[f]
        if isinstance(spec, ArraySpec):
            arr = np.empty((1,) + spec.shape, spec.dtype)
            write_into(self.cfg.decoders[f], payload, spec, arr[0, ...], key)
            return arr[0]
        arrs = [None if s is None else np.empty((1,) + s.shape, s.dtype) for s in spec]
        rest = write_into(self.cfg.decoders[f], payload, spec,
                          tuple(None if a is None else a[0, ...] for a in arrs), key)
        return tuple(r if a is None else a[0] for a, r in zip(arrs, rest))

    def _batch_parts(self, batch_size: int, shape: Any):
        """(new_arrays, new_lists, columns) for batches: per field, the batch's fixed-shape arrays
        (one ``(batch_size, *shape)`` array per spec), the lists of its other values, and the columns
        of a batch of ``n`` samples (stacked with ``collate`` as the pipeline does)."""
        kinds, specs, fields = self.kinds, self.specs, range(self.nf)

        def new_arrays() -> list:
            out: list = [None] * len(kinds)
            for f in fields:
                if kinds[f] == _FIXED:
                    out[f] = np.empty((batch_size,) + specs[f].shape, specs[f].dtype)
                elif kinds[f] == _TUPLE:
                    out[f] = tuple(None if s is None else np.empty((batch_size,) + s.shape, s.dtype)
                                   for s in specs[f])
            return out

        def new_lists() -> list:
            out: list = [None] * len(kinds)
            for f in fields:
                if kinds[f] in (_PASS, _RAGGED):
                    out[f] = []
                elif kinds[f] == _TUPLE:
                    out[f] = [[] if s is None else None for s in specs[f]]
            return out

        def columns(arrays: list, lists: list, n: int, first_seq: int) -> Any:
            cols: list = []
            try:
                for f in fields:
                    k = kinds[f]
                    if k == _FIXED:
                        a = arrays[f]
                        cols.append(a if n == batch_size else a[:n])
                    elif k == _TUPLE:
                        cols.append(tuple(collate(lst) if a is None else a if n == batch_size else a[:n]
                                          for a, lst in zip(arrays[f], lists[f])))
                    else:
                        cols.append(collate(lists[f]))
            except DecodeError as exc:  # a batch its values refuse (ProtobufSample): name the sample
                raise batch_error(exc, lambda i: first_seq + i) from None
            return tuple(cols) if shape is None else shape(tuple(cols))

        return new_arrays, new_lists, columns

    def _failed(self, f: int, exc: BaseException, group: Sequence[Any], index: int, offset: int,
                source: str) -> DecodeError:
        """The DecodeError of field ``f`` of sample ``index`` (whose payloads are ``group``), worded as the
        pipeline words it (``field 'name' (decoder): reason; the payload is ...``); logged when skipped."""
        dec = self.cfg.decoders[f]
        if self.calls[f] is not dec:  # a fast call failed: the decoder's own error is the one to raise
            try:
                dec(group[f])
            except Exception as own:
                exc = own
        note = ""
        try:
            note = field_note(str(exc), self.cfg.decoders, group, f, self.first_kinds.get(source),
                              f"the first {len(self.first_kinds.get(source) or ())} records of {source}")
        except Exception:  # a hint must never hide the error itself
            pass
        err = field_error(f"field {self.cfg.names[f]!r} ({dec!r})", exc, index, offset, source, note)
        err.__traceback__ = exc.__traceback__  # post-mortem lands in the decoder's frame
        if self.cfg.on_error != "raise":
            log.warning("parrecio: skipped %s", err)
        return err

    def _count(self, delivered: int, skipped: int, on_end: Any) -> None:
        """The end of the pass: its counters into ``stats``, then the owner's ``on_end``."""
        st = self.stats
        self.delivered += delivered
        st.samples += delivered
        st.skipped += skipped + self.skipped_groups
        st.records += self.records
        st.bytes += self.nbytes
        st.sharded_out += self.sharded_out
        self.records = self.nbytes = self.skipped_groups = self.sharded_out = 0
        if on_end is not None:
            on_end(self, time.perf_counter() - self._started)

    # -- reading -----------------------------------------------------------------------------------
    def _streams(self) -> Iterator[Any]:
        """``(name, RecordReader)`` for each stream of the epoch, closed after it is read."""
        cfg, st = self.cfg, self.stats
        streams = self.res.source.streams(self.epoch)
        try:
            for stream in streams:
                opened = [stream.file]
                self._open = opened  # what abort() closes: this stream only (a reader holds its buffer)
                try:
                    reader = RecordReader(_Timed(stream.file, st), join=cfg.join, on_corrupt=cfg.on_error,
                                          max_record_bytes=cfg.max_record_bytes, source_name=stream.name)
                    opened.append(reader)
                    yield stream.name, reader
                    st.skipped_records += reader.skipped_records
                    st.skipped_bytes += reader.skipped_bytes
                finally:
                    self._open = []
                    for obj in reversed(opened):
                        try:
                            obj.close()
                        except OSError:
                            pass
        finally:
            streams.close()

    def _groups(self) -> Iterator[Any]:
        """``(payloads, first_offset, source)`` per group of this shard, in delivery order, exactly as
        the reader process forms and orders them (:meth:`parrecio.pipeline.reader_proc._Reader.run`):
        the same shard filter, equal shards and draws from ``default_rng([seed, epoch])`` in the same
        order, the same groups left out first in a resumed epoch.  ``(None, offset, source)`` stands
        for a group the index lists but that cannot be read (skipped)."""
        cfg = self.cfg
        if cfg.by_index:
            yield from self._indexed()
            return
        rng = np.random.default_rng([cfg.seed, self.epoch]) if cfg.shuffle_mode is not None else None
        skip = self.skip
        streams = self._streams()
        try:
            groups = self._stream_groups(streams)
            if cfg.shuffle_mode == "buffer":
                groups = self._shuffled(groups, rng)
            for item in groups:
                if skip:  # a resumed epoch: delivered before
                    skip -= 1
                    continue
                yield item
            if skip:  # a resumed epoch shorter than its saved position
                raise resume_overrun(self.skip, self.skip - skip, self.epoch)
        finally:
            streams.close()

    def _shuffled(self, groups: Iterator[Any], rng: Any) -> Iterator[Any]:
        """Through a shuffle buffer of ``shuffle_buffer`` groups: once it is full, each new group swaps
        with a random one, which goes out; at the end the rest in random order."""
        capacity, buf = self.cfg.shuffle_buffer, []
        for item in groups:
            if len(buf) < capacity:
                buf.append(item)
                continue
            i = int(rng.integers(len(buf)))
            buf[i], item = item, buf[i]
            yield item
        for i in rng.permutation(len(buf)):
            yield buf[i]

    def _stream_groups(self, streams: Iterator[Any]) -> Iterator[Any]:
        """This shard's groups of each stream in turn, in stream order
        (:meth:`parrecio.pipeline.reader_proc._Reader._frame`), equal shards applied."""
        cfg, nf = self.cfg, self.nf
        num_shards, shard = cfg.num_shards, cfg.shard_index
        even = EvenShards(num_shards, shard, cfg.even_shards) if cfg.even_shards is not None else None
        hold = cfg.shuffle_mode == "buffer" or even is not None  # groups outlive the reader's next step
        group_index = 0   # groups seen in the stream (all shards)
        last = nf - 1
        for source, reader in streams:
            parts: list = []
            first_offset = 0
            skipped_seen = 0
            keep = True
            records = nbytes = 0
            realign = for_stream(cfg, source)
            kinds = self.first_kinds[source] = []
            try:
                for offset, view in reader.iter_views():
                    records += 1
                    nbytes += len(view)
                    if records <= _CONTEXT:  # what a decode error's hint compares with (mismatch.py)
                        kinds.append(sniff(view))
                    if reader.skipped_records != skipped_seen:  # a corrupt region was skipped: group broken
                        skipped_seen = reader.skipped_records
                        realign.damaged(reader.last_corrupt, bool(parts))
                        parts = []
                    if realign.aligning and not realign.starts_group(offset, view):
                        continue  # a record of a group the damage broke
                    if not parts:
                        first_offset = offset
                        if num_shards > 1:
                            keep = group_index % num_shards == shard
                            if even is not None and not keep:
                                keep = even.wants_copy(group_index)
                    if not keep:
                        parts.append(None)
                    elif hold or len(parts) < last:
                        parts.append(bytes(view))  # kept past this step of the reader
                    else:
                        parts.append(view)  # the group's last record: decoded before the next step
                    if len(parts) == nf:
                        g = group_index
                        group_index += 1
                        if even is not None:
                            self.sharded_out += g % num_shards != shard
                            yield from even.group(g, (parts, first_offset, source) if keep else None)
                        elif not keep:
                            self.sharded_out += 1
                        else:
                            yield parts, first_offset, source
                        parts = []
            finally:
                self.records += records
                self.nbytes += nbytes
                self.skipped_groups += realign.skipped_groups
            if parts:
                msg = (f"stream ended inside a group: {len(parts)} of {nf} records "
                       f"(the stream's record count is not a multiple of the group size)")
                if cfg.on_error == "raise":
                    raise CorruptRecordError(msg, first_offset, source=source)
                self.skipped_groups += 1
        if even is not None:
            yield from even.end(group_index)

    def _indexed(self) -> Iterator[Any]:
        """This shard's groups read by their ``.idx`` offsets, in the epoch's order
        (:meth:`parrecio.pipeline.reader_proc._Reader._run_indexed`)."""
        from ..sources.resolver import open_indexed, read_groups
        cfg, nf = self.cfg, self.nf
        readers: list = []
        offsets: list = []
        groups = None
        names = [str(rec) for rec, _ in cfg.index_paths]
        try:
            for rec, idx in cfg.index_paths:  # local files: pread; s3:// objects: ranged GETs, read ahead
                r = open_indexed(self.res.source, rec, idx, join=cfg.join,
                                 max_record_bytes=cfg.max_record_bytes)
                readers.append(r)
                self._open.append(r)
            for stream_id, r in enumerate(readers):
                offs, cut = whole_groups(r.offsets, nf, names[stream_id], cfg.on_error)
                self.skipped_groups += cut
                offsets.append(offs)
            order, others = epoch_order(cfg, self.epoch, offsets)
            self.sharded_out += others
            st = self.stats
            if self.skip > len(order):
                raise resume_overrun(self.skip, len(order), self.epoch)
            groups = read_groups(readers, offsets, nf, order[self.skip:])
            while True:
                t0 = time.perf_counter()
                try:
                    item = next(groups, None)
                finally:
                    st.read_time += time.perf_counter() - t0
                if item is None:
                    break
                stream_id, offs, payloads = item
                if isinstance(payloads, CorruptRecordError):
                    if cfg.on_error == "raise":
                        raise payloads
                    self.skipped_groups += 1
                    st.skipped_records += 1
                    yield None, offs[0], names[stream_id]
                    continue
                self.records += nf
                self.nbytes += sum(map(len, payloads))
                yield payloads, offs[0], names[stream_id]
        finally:
            if groups is not None:
                groups.close()
            for r in readers:
                r.close()
