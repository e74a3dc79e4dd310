"""The reader process: the one process that reads the stream.

::

    source (file, FIFO, stdin, SageMaker channel, s3:// objects)
       |  RecordReader: frames -> records (multipart joined)
       v
    [ reader process ] --records--> groups of len(fields) --(offset, length)--> Chunk --> consumer
       |
       ^-- Release(pos) / Stop from the consumer

It owns the source because a FIFO can be read once, by one process.  It forms groups (one sample each)
and sends one small ``Chunk`` message per chunk of groups, with each payload's place:

- a regular file is mapped and framed in place; payloads are described by their file offsets, and the
  workers read them from the page cache (:mod:`parrecio.pipeline.mapped`);
- a stream (FIFO, stdin, a file object, an S3 object) is read straight into windows of the input ring
  and framed there (:mod:`parrecio.pipeline.ring_windows`): the kernel's copy is the only one;
- what cannot stay where it was read -- multipart records, groups in the shuffle buffer, groups too big
  for the ring -- is copied into the ring, or into a one-off segment (``stats.reader_copied_bytes``).

A pending chunk is sent early whenever the next read would block, so a slow stream still flows.  When
the ring is full it waits for the consumer to release space: a slow consumer pauses the reader.

The group is the unit of capacity: a chunk ends at its last complete group, and a group that does not
fit in half the ring is taken out of it and sent in a one-off segment of its own.  One-off segments in
flight are bounded too (``oneoff_budget`` bytes, but one group is always let through): a slow consumer
pauses the reader there as well.

While it waits -- for data from a stalled FIFO, for ring space, for the one-off budget -- it also
watches the control pipe (``Stop``) and the lifeline (EOF when the consumer died; then it removes the
run's shared memory).  A watchdog thread (:mod:`parrecio.pipeline.children`) covers the waits it cannot
watch itself, such as opening a FIFO that has no writer yet.
"""

from __future__ import annotations

import os
import select
import stat
import time
from array import array
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional, Tuple

from ..errors import ParrecioError
from ..recordio import RecordReader
from .config import PipelineConfig
from .groups import GroupStream, Placement, open_indexed_all
from .mapped import map_stream
from .messages import FILE, IN_RING, ONEOFF, Place, Chunk, ReaderEnd, RemoteError, Release, Stop, StreamStart
from .poller import Poller
from .placement import Mapped, Windows
from .ring import GroupTooLarge, RingWriter
from .ring_windows import RingWindows
from .shm import Segment, sweep

__all__ = ["ReaderJob", "reader_main"]

AUTO_GROUPS = 64              # adaptive chunks: at least this many groups (a typical batch) ...
AUTO_MIN_BYTES = 64 << 10     # ... and, for small records, more until their payloads reach this ...
AUTO_MAX_GROUPS = 2048        # ... but never more groups than this


@dataclass(frozen=True)
class ReaderJob:
    """What one pass's reader process reads, beside the settings (:class:`PipelineConfig`)."""
    source: Any                 # a parrecio.sources Source (picklable)
    epoch: int
    ring_name: str              # the input ring's shared-memory segment
    prefix: str                 # shm name prefix for one-off segments; swept if the consumer dies
    skip: int = 0               # groups of this shard's order to leave out first (a resumed epoch)


class _Stopped(Exception):
    """The consumer asked us to stop, or died."""


@dataclass
class _Stats:
    records: int = 0
    bytes: int = 0
    groups: int = 0
    sharded_out: int = 0
    skipped_groups: int = 0
    skipped_records: int = 0
    skipped_bytes: int = 0
    read_time: float = 0.0
    wait_source_time: float = 0.0
    wait_consumer_time: float = 0.0
    cpu_time: float = 0.0         # CPU seconds of this process since reader_main began
    copied_bytes: int = 0         # payload bytes this process wrote into shared memory (0: all in place)


@dataclass
class _Pending:
    """The chunk being filled."""
    stream_id: int = 0
    first_seq: int = 0
    n: int = 0
    nbytes: int = 0
    ring_offs: array = field(default_factory=lambda: array("q"))
    lens: array = field(default_factory=lambda: array("q"))
    stream_offs: array = field(default_factory=lambda: array("q"))
    place: Place = IN_RING          # the ring, or a mapped file (see parrecio.pipeline.mapped)


@dataclass
class _InFlight:
    """What the reader sent that the consumer has not released yet (bounded by the settings' budgets)."""
    oneoff: int = 0   # bytes of one-off segments
    mapped: int = 0   # bytes of groups read in place from mapped files
    made: int = 0     # one-off segments made (their names' counter)


class _ChunkSize:
    """How many groups a chunk takes.  A chunk is one message to a worker and one result back: ~50-100 us
    of the consumer's time, so it should carry enough work.  Adaptive sizing: at least AUTO_GROUPS
    groups, and small records keep filling it up to AUTO_MIN_BYTES (at most AUTO_MAX_GROUPS groups).
    An explicit chunk_groups is exact.

    Ramp-up: the first chunk of each worker fills only its share of one output slot, so that the pass's
    first batch comes after slot_size / workers decodes per worker, not 2 * slot_size."""

    def __init__(self, cfg: PipelineConfig) -> None:
        groups = cfg.reader_chunk_groups()
        if groups is None:
            self.min_groups, self.max_groups, self.min_bytes = AUTO_GROUPS, AUTO_MAX_GROUPS, AUTO_MIN_BYTES
        else:
            self.min_groups = self.max_groups = groups
            self.min_bytes = 0
        self.full_groups = (self.min_groups, self.max_groups)
        self.ramp = cfg.workers if cfg.chunk_groups is None and cfg.layout.has_fixed and cfg.workers else 0
        if self.ramp:
            self.min_groups = self.max_groups = max(1, cfg.slot_size // cfg.workers)

    def sent(self) -> None:
        """A chunk of groups was sent: one step of the ramp-up."""
        if self.ramp:
            self.ramp -= 1
            if not self.ramp:
                self.min_groups, self.max_groups = self.full_groups


class _Reader:
    def __init__(self, cfg: PipelineConfig, job: ReaderJob, data_conn, ctrl_conn, lifeline) -> None:
        self.cfg = cfg
        self.job = job
        self.data = data_conn
        self.ctrl = ctrl_conn
        self.lifeline = lifeline
        self.seg = Segment.attach(job.ring_name)
        self.mem = memoryview(self.seg.buf)
        self.ring = RingWriter(self.seg.size, self._wait_for_release)
        self.stats = _Stats()
        self.poller = Poller()
        self.cpu0 = time.process_time()
        self.seq = job.skip   # next sequence number (groups of this shard's order; a resumed epoch
        #                       starts past the groups it leaves out, which are never sent)
        self.groups = GroupStream(cfg, job.epoch, job.skip)
        self.place = IN_RING      # where the stream being read lies: the ring, or a mapped file
        self.pending = _Pending()
        self.group_end = 0        # ring position after the last complete group: what a chunk may release
        self.sent_end = 0         # the group_end of the last chunk sent
        self.windows: Optional[RingWindows] = None  # the stream being read into the ring, if it is
        self.flight = _InFlight()
        self.size = _ChunkSize(cfg)

    # -- control ---------------------------------------------------------------------------------
    def _handle_ctrl(self) -> None:
        while self.ctrl.poll():
            msg = self.ctrl.recv()
            if isinstance(msg, Release):
                self.ring.release(msg.pos)
                self.flight.oneoff -= msg.oneoff_bytes
                self.flight.mapped -= msg.mapped_bytes
            elif isinstance(msg, Stop):
                raise _Stopped()

    def _watch(self, extra: list, timeout: float) -> list:
        """Wait until one of ``extra`` is ready, handling control messages and consumer death."""
        # one poll set, registered again only when ``extra`` changes (a wait per FIFO read when the
        # stream is slower than we are: multiprocessing's wait() would build a selector each time)
        self.poller.watch(tuple(extra), lambda: extra + [self.ctrl, self.lifeline])
        ready = self.poller.wait(timeout)
        if self.lifeline in ready:
            sweep(self.job.prefix)
            raise _Stopped()
        if self.ctrl in ready:
            self._handle_ctrl()
        return ready

    def _wait_for_release(self, needed_tail: int) -> int:
        self.flush(release=True)
        t0 = time.perf_counter()
        while self.ring.tail < needed_tail:
            self._watch([], self.cfg.poll_interval)
        self.stats.wait_consumer_time += time.perf_counter() - t0
        return self.ring.tail

    # -- chunks ----------------------------------------------------------------------------------
    def flush(self, release: bool = False) -> None:
        """Send the pending chunk.  With ``release``, send an empty one when nothing is pending but the
        watermark rose since the last chunk (ring space that only garbage holds, see
        :mod:`parrecio.pipeline.ring_windows`): the consumer releases it in order."""
        p = self.pending
        if p.n or (release and self.group_end > self.sent_end):
            self.data.send(Chunk(p.first_seq if p.n else self.seq, p.n, p.stream_id, p.ring_offs, p.lens,
                                 p.stream_offs, self.group_end, p.place))
            self.sent_end = self.group_end
            if p.place.is_file:
                self.flight.mapped += p.nbytes  # the consumer releases sum(lens) of the chunk
            self.pending = _Pending(stream_id=p.stream_id, first_seq=self.seq)
            if p.n:
                self.size.sent()
        self._handle_ctrl()

    def _advance(self, pos: int) -> None:
        """Everything below ring position ``pos`` (and the head) is framed and sent, or garbage."""
        self.group_end = max(self.group_end, min(pos, self.ring.head))

    def _emit_group(self, stream_id: int, payloads: list, first_offset: int) -> None:
        """A complete group held in this process (shuffled, read by index, or too big for the ring):
        into the ring if it fits in half of it, else into a one-off segment."""
        sizes = [len(b) for b in payloads]
        try:
            offs = self.ring.place(sizes)  # waits for ring space (sending what is pending first)
        except GroupTooLarge:
            self._emit_oneoff(stream_id, payloads, first_offset)
            return
        mem = self.mem
        for off, b, n in zip(offs, payloads, sizes):
            mem[off:off + n] = b
        self.stats.copied_bytes += sum(sizes)
        self._emit_placed(stream_id, list(zip(offs, sizes)), first_offset)

    def _emit_placed(self, stream_id: int, parts: list, first_offset: int,
                     place: Place = IN_RING) -> None:
        """A complete group whose records are all in the ring or all in the mapped file ``place``: add
        it to the pending chunk."""
        p = self.pending
        if p.n and (p.stream_id != stream_id or p.place != place):  # a chunk names one stream and
            self.flush()                                             # one place
            p = self.pending
        if place.is_file and self.flight.mapped:
            self._wait_for_mapped(sum(n for _, n in parts) + p.nbytes)
            p = self.pending
        if p.n == 0:
            p.stream_id, p.first_seq, p.place = stream_id, self.seq, place
        for off, n in parts:
            p.ring_offs.append(off)
            p.lens.append(n)
            p.nbytes += n
        p.stream_offs.append(first_offset)
        p.n += 1
        self.seq += 1
        self.group_end = self.ring.head if self.windows is None else self.windows.watermark()
        size = self.size
        if p.n >= size.max_groups or p.nbytes >= self.cfg.chunk_bytes or (
                p.n >= size.min_groups and p.nbytes >= size.min_bytes):
            self.flush()

    def _wait_for_mapped(self, nbytes: int) -> None:
        """Pause while mapped groups in flight would exceed their budget with ``nbytes`` more (the
        page cache costs no shared memory, but descriptors in flight must stay bounded)."""
        if self.flight.mapped + nbytes <= self.cfg.mapped_budget:
            return
        self.flush()
        t0 = time.perf_counter()
        while self.flight.mapped and self.flight.mapped + nbytes > self.cfg.mapped_budget:
            self._watch([], self.cfg.poll_interval)
        self.stats.wait_consumer_time += time.perf_counter() - t0

    def _emit_oneoff(self, stream_id: int, payloads: list, first_offset: int) -> None:
        """A group too big for the ring gets a segment of its own (a chunk of one group), once the
        one-off segments in flight leave room for it in the budget."""
        self.flush()
        total = sum(map(len, payloads))
        if self.flight.oneoff and self.flight.oneoff + total > self.cfg.oneoff_budget:
            t0 = time.perf_counter()
            while self.flight.oneoff and self.flight.oneoff + total > self.cfg.oneoff_budget:
                self._watch([], self.cfg.poll_interval)
            self.stats.wait_consumer_time += time.perf_counter() - t0
        seg = Segment.create(f"{self.job.prefix}r{os.getpid()}x{self.flight.made}", total)
        self.flight.made += 1
        offs, lens, pos = array("q"), array("q"), 0
        for b in payloads:
            seg.buf[pos:pos + len(b)] = b
            offs.append(pos)
            lens.append(len(b))
            pos += len(b)
        self.stats.copied_bytes += total
        seg.close()  # the consumer owns it from now on and unlinks it after delivery
        self.flight.oneoff += total  # the consumer releases sum(lens) of the chunk: the same number
        self.data.send(Chunk(self.seq, 1, stream_id, offs, lens, array("q", [first_offset]),
                             self.group_end, Place(ONEOFF, seg.name)))
        self.sent_end = self.group_end
        self.seq += 1

    # -- the stream ------------------------------------------------------------------------------
    def run(self) -> None:
        """This shard's groups of the epoch (:class:`~parrecio.pipeline.groups.GroupStream`), placed:
        a group whose records stay where they were read goes out as their offsets, a held one is
        copied into the ring or a one-off segment."""
        cfg, gs = self.cfg, self.groups
        if cfg.by_index:
            opened: list = []
            try:
                readers = open_indexed_all(cfg, self.job.source, opened)
                names = [str(rec) for rec, _ in cfg.index_paths]
                for g in gs.indexed(readers, names, lambda i, name: self.data.send(StreamStart(i, name))):
                    if g.parts is None:  # a group that cannot be read keeps its position in the order
                        self.flush()     # (a chunk's groups have consecutive positions)
                        self.seq += 1
                    else:
                        self._emit_group(g.stream_id, g.parts, g.offset)
                    self._handle_ctrl()
            finally:
                for r in opened:
                    r.close()
        else:
            for g in gs.groups(self._streams()):
                parts = g.parts or []  # (a streamed group always has its parts)
                if g.held:
                    self._emit_group(g.stream_id, parts, g.offset)
                else:
                    self._emit_placed(g.stream_id, parts, g.offset, self.place)
        self.flush()

    def _streams(self) -> Iterator[Tuple[int, str, RecordReader, Placement]]:
        """Each stream of the epoch, opened and framed where it lies, for the group stream.

        A mapped file's records stay in the page cache; a stream's are read into ring windows and stay
        there (:mod:`parrecio.pipeline.placement`).  Shuffled groups and equal shards of a stream are
        held from the start (they wait in the shuffle buffer, or for the epoch's end): then a stream is
        read into a private buffer, not into the ring."""
        cfg = self.cfg
        held = self.groups.holds
        for stream_id, stream in enumerate(self.job.source.streams(self.job.epoch)):
            self.flush()
            self.data.send(StreamStart(stream_id, stream.name))
            try:
                mapped = map_stream(stream.file)
                if mapped is None:
                    yield from self._streamed(stream_id, stream, held)
                    continue
                mm, segment, start = mapped
                reader = RecordReader.over(mm, start, join=cfg.join, on_corrupt=cfg.on_error,
                                           max_record_bytes=cfg.max_record_bytes, source_name=stream.name)
                in_file = self.place = Place(FILE, segment)
                if held:
                    place = Placement()
                    place.start = start  # (the records are copied out; the Realigner needs where they lie)
                else:
                    place = Mapped(mm, start, lambda rd, _gs: self._frame_flat(stream_id, rd, mm, in_file, start))
                t0 = time.perf_counter()
                try:
                    yield stream_id, stream.name, reader, place
                finally:
                    self.stats.read_time += time.perf_counter() - t0
                    reader.close()
                    try:
                        mm.close()
                    except BufferError:  # a view escaped (an exception's traceback): the mapping goes with it
                        pass
            finally:
                try:
                    stream.file.close()
                except OSError:
                    pass

    def _streamed(self, stream_id: int, stream: Any, held: bool) -> Iterator[Tuple[int, str, RecordReader, Placement]]:
        """A stream that is not a mapped file: read straight into the ring, unless every group is held."""
        cfg = self.cfg
        self.windows = None if held else RingWindows(self.ring, self.seg.buf, self.mem, self._advance)
        self.place = IN_RING
        try:
            reader = RecordReader(_Watched(stream.file, self), join=cfg.join, on_corrupt=cfg.on_error,
                                  max_record_bytes=cfg.max_record_bytes, source_name=stream.name,
                                  buffers=self.windows)
            try:
                place = Placement() if self.windows is None else \
                    Windows(self.windows, self.ring, self.mem, self._advance)
                yield stream_id, stream.name, reader, place
                if self.windows is not None:  # the unused end of its last window: for the next stream
                    self.windows.finish()
            finally:
                reader.close()
        finally:
            self.windows = None

    def _frame_flat(self, stream_id: int, reader: RecordReader, mm: Any, in_file: Place, start: int) -> Tuple[int, int]:
        """The hot loop of the commonest small-record case (the group stream's ``Placement.flat``): a
        mapped file, one record per group, no shards, no shuffle, no resume skip.  Each record is three
        array appends to the pending chunk; the chunk's counters live in locals and are written back
        before anything else looks at them.  Returns the records and payload bytes it framed."""
        cfg = self.cfg
        size, chunk_bytes = self.size, cfg.chunk_bytes
        max_groups, min_groups, min_bytes = size.max_groups, size.min_groups, size.min_bytes
        records = nbytes = k = nb = 0
        p: Optional[_Pending] = None
        try:
            for offset, view in reader.iter_views():
                n = len(view)
                records += 1
                nbytes += n
                if view.obj is not mm:  # a multipart record, joined in a new buffer: through the ring
                    if p is not None:
                        p.n, p.nbytes, p = k, nb, None
                        self.seq = self.pending.first_seq + k
                    self._emit_group(stream_id, [bytes(view)], offset)
                    continue
                if p is None:  # open (or continue) the pending chunk
                    p = self.pending
                    if p.n and (p.stream_id != stream_id or p.place != in_file):
                        self.flush()
                        p = self.pending
                    if self.flight.mapped:
                        self._wait_for_mapped(p.nbytes + min(chunk_bytes, cfg.mapped_budget // 2))
                        p = self.pending
                    if p.n == 0:
                        p.stream_id, p.first_seq, p.place = stream_id, self.seq, in_file
                    k, nb = p.n, p.nbytes
                    add_off, add_len, add_stream_off = p.ring_offs.append, p.lens.append, p.stream_offs.append
                add_off(start + offset + 8)  # its payload starts 8 bytes after its frame
                add_len(n)
                add_stream_off(offset)
                k += 1
                nb += n
                if k >= max_groups or nb >= chunk_bytes or (k >= min_groups and nb >= min_bytes):
                    p.n, p.nbytes, p = k, nb, None
                    self.seq = self.pending.first_seq + k
                    self.flush()
                    max_groups, min_groups = size.max_groups, size.min_groups  # the ramp-up may be over
        finally:
            if p is not None:
                p.n, p.nbytes = k, nb
                self.seq = p.first_seq + k
        return records, nbytes

    def finish(self, error: Optional[BaseException]) -> None:
        st = self.stats
        st.__dict__.update(self.groups.counters())
        st.groups = self.seq
        self.flush()
        st.cpu_time = time.process_time() - self.cpu0
        self.data.send(ReaderEnd(self.seq, dict(st.__dict__), error))


class _Watched:
    """The stream as RecordReader sees it: before a read that would block, send what is pending and
    keep watching the consumer; count the time spent reading."""

    def __init__(self, file, reader: _Reader) -> None:
        # Read below any Python-level buffer: data waiting in a BufferedReader would be invisible to
        # select(), and we would wait for bytes we already have.
        raw = getattr(file, "raw", None)
        self._file = raw if raw is not None and hasattr(raw, "readinto") else file
        self._reader = reader
        try:
            self._fd: Optional[int] = file.fileno()
            self._regular = _is_regular(self._fd)
        except (AttributeError, OSError, ValueError):
            self._fd, self._regular = None, True
        if self._fd is not None and not self._regular:
            _enlarge_pipe(self._fd)
        self.name = getattr(file, "name", None)
        # Bytes the raw reader holds above the fd (a stream whose first bytes were read to check them)
        self._pending = getattr(self._file, "pending", _nothing_pending)

    def _await_data(self) -> None:
        if self._regular or self._pending():
            return
        r = self._reader
        if not select.select([self._fd], [], [], 0)[0]:
            r.flush()  # the next read would block: let the decoders have what we hold
            t0 = time.perf_counter()
            while self._fd not in r._watch([self._fd], r.cfg.poll_interval):
                pass  # woken by a control message or a timeout: keep watching until data comes
            r.stats.wait_source_time += time.perf_counter() - t0

    def readinto(self, buf) -> int:
        self._await_data()
        t0 = time.perf_counter()
        try:
            n = self._file.readinto(buf)
        finally:
            self._reader.stats.read_time += time.perf_counter() - t0
        return n

    def read(self, n: int = -1) -> bytes:
        self._await_data()
        t0 = time.perf_counter()
        try:
            return self._file.read(n)
        finally:
            self._reader.stats.read_time += time.perf_counter() - t0

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        pass  # the reader process closes the stream itself


def _enlarge_pipe(fd: int) -> None:
    """Grow a pipe's (FIFO's) kernel buffer to the largest an unprivileged process may set
    (``/proc/sys/fs/pipe-max-size``, 1 MiB by default): with the default 64 KiB the writer and this
    process take turns every 64 KiB, and a FIFO loop reads at about half the speed."""
    try:
        import fcntl
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return
        with open("/proc/sys/fs/pipe-max-size") as f:
            size = int(f.read())
        if fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ) < size:
            fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, size)
    except (ImportError, AttributeError, OSError, ValueError):
        pass  # not Linux, or the limit is lower for us (the other end set it, or a per-user quota)


def _nothing_pending() -> int:
    return 0


def _is_regular(fd: int) -> bool:
    return stat.S_ISREG(os.fstat(fd).st_mode)


def reader_main(cfg: PipelineConfig, job: ReaderJob, data_conn, ctrl_conn, lifeline) -> None:
    """Entry point of the reader process (started through :func:`parrecio.pipeline.children.child_entry`)."""
    r = None
    try:
        r = _Reader(cfg, job, data_conn, ctrl_conn, lifeline)
        try:
            r.run()
            r.finish(None)
        except _Stopped:
            return
        except ParrecioError as exc:
            r.finish(exc)
        except Exception as exc:
            r.finish(RemoteError(exc))
    except _Stopped:
        return
    except (EOFError, OSError):
        # Our pipes broke: the consumer closed them, or died (then its lifeline says so soon after).
        if lifeline.poll(cfg.poll_interval):
            sweep(job.prefix)
    finally:
        if r is not None:
            r.mem.release()
            r.seg.close()
