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

import dataclasses
import gc
import itertools
import os
import stat
import time
from array import array
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any, Iterator, Optional, Tuple

from ..errors import ParrecioError, SourceError
from ..recordio import RecordReader
from ..sources.fifo import enlarge_pipe, stoppable
from .config import PipelineConfig
from .groups import GroupStream, Placement, open_indexed_all
from .mapped import map_stream
from .children import CONSUMER_DEATH_GRACE
from .chunker import Chunker
from .messages import FILE, IN_RING, Begun, Place, ReaderEnd, Release, RemoteError, StreamStart
from .placement import Mapped, Windows
from .poller import ReadyCheck, below_buffer
from .reader_link import Link, Stopped
from .ring import GroupTooLarge, RingWriter
from .ring_windows import RingWindows, window_bytes
from .shm import Segment

__all__ = ["ReaderJob", "reader_main", "serve_main"]

_ONEOFF_SERIAL = itertools.count()  # one-off segments this process made (their names' counter)

@dataclass(frozen=True)
class ReaderJob:
    """What one pass's reader process reads, beside the settings (:class:`PipelineConfig`)."""
    source: Any                 # a parrecio.sources Source (picklable)
    epoch: int
    ring_name: str              # the input ring's shared-memory segment
    prefix: str                 # shm name prefix for one-off segments; swept if the consumer dies
    skip: int = 0               # groups of this shard's order to leave out first (a resumed epoch)
    # (tail, head) ring positions to start from: the space between is pinned by views of an earlier pass
    ring_pos: Tuple[int, int] = (0, 0)
    views: bool = False         # views of the ring are handed out, or still held (views.py)
    # after a clean end (its ReaderEnd, no error), wait for the next pass's job instead of exiting: the
    # consumer keeps the process as that pass's reader (see serve_main)
    serve_on: bool = False


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


class _Reader:
    """This shard's groups of one pass, placed: the group stream read over the epoch's streams, each
    group sent where its records lie (:class:`~parrecio.pipeline.chunker.Chunker`), or copied into the
    ring or a one-off segment when they cannot stay there."""

    def __init__(self, cfg: PipelineConfig, job: ReaderJob, data_conn, ctrl_conn, lifeline) -> None:
        self.job = job
        self.stats = _Stats(cpu_time=-time.process_time())  # (the end adds process_time() again)
        self.seg = Segment.attach(job.ring_name)
        self.mem = self.seg.mem
        self.ring = RingWriter(self.seg.size, self._wait_for_release, *job.ring_pos)
        self.window = window_bytes(self.seg.size)
        if job.views:
            # A view the user keeps (if only as the loop variable, while it asks for the next sample)
            # holds back its chunk and every chunk after it.  Windows and chunks of 1/16 of the ring,
            # groups of at most two windows in it (larger ones take one-off segments): a chunk then holds
            # at most ~3/16 of the ring, and the reader needs ~4/16 to go on, so the loop variable's view
            # never stops it and a few more may be kept.  (Smaller chunks cost the consumer more per GB:
            # 1/32 of the ring, 0.07-0.11 s/GB of 100 KB records against 0.05-0.06.)
            self.window = window_bytes(self.seg.size, 16)
            self.ring.max_span = 2 * self.window
            cfg = dataclasses.replace(cfg, chunk_bytes=min(cfg.chunk_bytes, self.window))
        self.cfg = cfg
        self.link = Link(data_conn, ctrl_conn, lifeline, cfg.poll_interval, self.ring.release,
                         self.stats)
        self.link.report_waits = job.views
        self.out = Chunker(cfg, self.link, self.ring, job.skip)
        if job.views:  # stretches of garbage (an early wrap skips up to 48 MiB) are chunks of their own
            self.out.cut_gap = self.window // 8
        self.groups = GroupStream(cfg, job.epoch, job.skip)
        self.place = IN_RING      # where the stream being read lies: the ring, or a mapped file
        self.changed: Optional[SourceError] = None  # how the file read in place when framing stopped changed

    def _wait_for_release(self, needed_tail: int) -> int:
        out = self.out
        if out.watermark is not None:
            # Everything below the windows' watermark is framed: what the wait needs lies there ("Why
            # waits end", ring_windows).  A held group placed after a wrap ahead of the window puts the
            # next wait inside bytes framed since the last chunk's group_end; without this, the flush
            # below sent nothing and the reader waited for itself for ever (the consumer had released all).
            out.advance(out.watermark())
        out.flush(release=True)
        ring = self.ring
        self.link.wait_while(lambda: ring.tail < needed_tail)
        return ring.tail

    # -- groups that are copied ------------------------------------------------------------------
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
        self.out.add(stream_id, list(zip(offs, sizes)), first_offset)

    def _emit_oneoff(self, stream_id: int, payloads: list, first_offset: int) -> None:
        """A group too big for the ring gets a segment of its own (a chunk of one group), once the
        one-off segments in flight leave room for it in the budget."""
        self.out.flush()
        total, flight, budget = sum(map(len, payloads)), self.link.flight, self.cfg.oneoff_budget
        self.link.wait_while(lambda: bool(flight.oneoff) and flight.oneoff + total > budget)
        # (named by a counter of the process, not of the pass: a process that serves several passes must
        # not reuse the name of a segment an earlier pass's consumer still holds)
        seg = Segment.create(f"{self.job.prefix}r{os.getpid()}x{next(_ONEOFF_SERIAL)}", total,
                             f"a group larger than half the input ring (at byte offset {first_offset})")
        offs, lens, pos = array("q"), array("q"), 0
        for b in payloads:
            seg.buf[pos:pos + len(b)] = b
            offs.append(pos)
            lens.append(len(b))
            pos += len(b)
        self.stats.copied_bytes += total
        seg.close()  # the consumer owns it from now on and unlinks it after delivery
        flight.oneoff += total  # the consumer releases sum(lens) of the chunk: the same number
        self.out.add_oneoff(stream_id, seg.name, offs, lens, first_offset)

    # -- the stream ------------------------------------------------------------------------------
    def run(self) -> None:
        """This shard's groups of the epoch (:class:`~parrecio.pipeline.groups.GroupStream`), placed:
        a group whose records stay where they were read goes out as their offsets, a held one is
        copied into the ring or a one-off segment."""
        cfg, gs, out = self.cfg, self.groups, self.out
        if cfg.by_index:
            opened: list = []
            gs.defer_checks, out.check = True, gs.check_reads  # (once per file before each chunk goes out)
            try:
                readers = open_indexed_all(cfg, self.job.source, opened)
                names = [str(rec) for rec, _ in cfg.index_paths]
                for g in gs.indexed(readers, names, lambda i, name: self.link.announce(StreamStart(i, name))):
                    if g.parts is None:
                        out.unreadable()
                    else:
                        self._emit_group(g.stream_id, g.parts, g.offset)
                    self.link.handle_ctrl()
                out.flush()  # (the last chunk, checked: its files are closed below)
            finally:
                out.check = None
                for r in opened:
                    r.close()
        else:
            for g in gs.groups(self._streams()):
                parts = g.parts or []  # (a streamed group always has its parts)
                if g.held:
                    self._emit_group(g.stream_id, parts, g.offset)
                else:
                    out.add(g.stream_id, parts, g.offset, self.place)
        out.flush()

    def _streams(self) -> Iterator[Tuple[int, str, RecordReader, Placement]]:
        """Each stream of the epoch, opened and framed where it lies, for the group stream.

        A mapped file's records stay in the page cache; a stream's are read into ring windows and stay
        there (:mod:`parrecio.pipeline.placement`).  Shuffled groups and equal shards of a stream are
        held from the start (they wait in the shuffle buffer, or for the epoch's end): then a stream is
        read into a private buffer, not into the ring."""
        cfg = self.cfg
        held = self.groups.holds
        streams = stoppable(self.job.source.streams(self.job.epoch), self.link.handle_ctrl)  # (a Stop ends a FIFO wait)
        for stream_id, stream in enumerate(streams):
            self.out.flush()
            try:
                mapped = map_stream(stream.file)
                # (the consumer knows the file mapped: if this process dies of SIGBUS -- the file shrank
                # under a copy of a held group -- it says which file changed)
                self.link.announce(StreamStart(stream_id, stream.name, mapped[1] if mapped else None))
                if mapped is None:
                    yield from self._streamed(stream_id, stream, held)
                    continue
                mm, segment, start, check = mapped
                self.out.check = check  # (before each chunk it sends, and after each wait for releases)
                reader = RecordReader.over(mm, start, join=cfg.join, on_corrupt=cfg.on_error,
                                           max_record_bytes=cfg.max_record_bytes, source_name=stream.name)
                in_file = self.place = Place(FILE, segment)
                if held:
                    place = Placement()
                    place.start = start  # (the records are copied out; the Realigner needs where they lie)
                else:
                    place = Mapped(mm, start, lambda rd, _gs, tally: self.out.add_flat(
                        stream_id, rd, mm, in_file, start, self._emit_group, tally))
                t0 = time.perf_counter()
                try:
                    yield stream_id, stream.name, reader, place
                    # framed to its end: the groups copied out of it (held in the shuffle buffer, or in a
                    # chunk not sent yet) are checked once more, after their reads (no chunk may go out
                    # before a check of its own: a file that fits the buffer was never checked at all)
                    check()
                except GeneratorExit:  # the framing stopped early (an error, a Stop): the file changed?
                    self.changed = _changed(check)  # (asked now: its descriptor closes below)
                    raise
                finally:
                    self.out.check = None
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
        cfg, out = self.cfg, self.out
        windows = None if held else RingWindows(self.ring, self.mem, out.advance, self.window)
        out.watermark = None if windows is None else windows.watermark
        self.place = IN_RING
        try:
            reader = RecordReader(_Watched(stream.file, self.link, out), join=cfg.join, on_corrupt=cfg.on_error,
                                  max_record_bytes=cfg.max_record_bytes, source_name=stream.name,
                                  buffers=windows)
            try:
                place = Placement() if windows is None else Windows(windows, self.ring, self.mem, out.advance)
                yield stream_id, stream.name, reader, place
                if windows is not None:  # the unused end of its last window: for the next stream
                    windows.finish()
            finally:
                reader.close()
        finally:
            out.watermark = None

    def explain(self, exc: Exception) -> Exception:
        """``exc``, or what explains it: the file being read in place changed (its framing then finds
        another file's bytes: a bad magic, a length past the end)."""
        check, self.out.check = self.out.check, None
        changed = _changed(check) if check is not None else self.changed
        if changed is None:
            return exc
        changed.__cause__ = exc
        return changed

    def finish(self, error: Optional[BaseException]) -> None:
        st = self.stats
        st.__dict__.update(self.groups.counters())
        st.groups = self.out.seq
        self.out.flush()
        st.cpu_time += time.process_time()
        self.link.send(ReaderEnd(self.out.seq, dict(st.__dict__), error))


def _changed(check: Any) -> Optional[SourceError]:
    """The error ``check()`` raises, if it does."""
    try:
        check()
    except SourceError as exc:
        return exc
    return None


class _Watched:
    """The stream as RecordReader sees it: before a read that would block, send what is pending and
    keep watching the consumer; count the time spent reading."""

    def __init__(self, file, link: Link, out: Chunker) -> None:
        self._file, self._pending = below_buffer(file)  # (read below any Python-level buffer)
        self._link, self._out = link, out
        try:
            self._fd: Optional[int] = file.fileno()
            self._regular = _is_regular(self._fd)
        except (AttributeError, OSError, ValueError):
            self._fd, self._regular = None, True
        # (poll, not select: a child forked from a process with over 1024 descriptors gets high numbers)
        self._readable: Optional[ReadyCheck] = None
        if self._fd is not None and not self._regular:
            enlarge_pipe(self._fd)
            self._readable = ReadyCheck(self._fd)
        self.name = getattr(file, "name", None)

    def _await_data(self) -> None:
        if self._regular or self._pending():
            return
        link = self._link
        assert self._readable is not None
        if not self._readable.ready():
            self._out.flush()  # the next read would block: let the decoders have what we hold
            t0 = time.perf_counter()
            while self._fd not in link.watch([self._fd], link.poll_interval):
                pass  # woken by a control message or a timeout: keep watching until data comes
            link.stats.wait_source_time += time.perf_counter() - t0

    def readinto(self, buf) -> int:
        self._await_data()
        t0 = time.perf_counter()
        try:
            n = self._file.readinto(buf)
        finally:
            self._link.stats.read_time += time.perf_counter() - t0
        return n

    def read(self, n: int = -1) -> bytes:
        self._await_data()
        t0 = time.perf_counter()
        try:
            return self._file.read(n)
        finally:
            self._link.stats.read_time += time.perf_counter() - t0

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        pass  # the reader process closes the stream itself


def _is_regular(fd: int) -> bool:
    return stat.S_ISREG(os.fstat(fd).st_mode)


def _report(data_conn: Any, n_groups: int, exc: BaseException) -> None:
    """A last ``ReaderEnd`` carrying ``exc``, unless the pipe is gone: the consumer then raises what
    failed, not "the reader process died (exit code 0)"."""
    try:
        data_conn.send(ReaderEnd(n_groups, {}, RemoteError(exc)))
    except (EOFError, OSError):
        pass


def serve_main(cfg: PipelineConfig, data_conn, ctrl_conn, lifeline, job: Optional[ReaderJob] = None) -> None:
    """Entry point of the reader process (started through :func:`parrecio.pipeline.children.child_entry`):
    it reads ``job``'s pass, or, without one (a *spare* started ahead of its pass, see
    :meth:`parrecio.pipeline.resources.Resources.prepare_spare`), waits for its :class:`ReaderJob` on the
    control pipe first.  A pass that ended cleanly with ``job.serve_on`` leaves the process waiting for
    the next pass's job: the consumer keeps it as that pass's reader instead of starting another.  A
    ``Stop``, a closed pipe or its consumer's death (the lifeline, watched in the same wait) end a
    waiting process; it holds nothing of its last pass then (every stream closed, the ring detached)."""
    while True:
        if job is None:
            job = _next_job(cfg, ctrl_conn, lifeline)
            if job is None:
                return
            try:
                data_conn.send(Begun())  # (before anything is read: see ReaderHandle.receive)
            except (EOFError, OSError):
                return
        if not reader_main(cfg, job, data_conn, ctrl_conn, lifeline) or not job.serve_on:
            return
        job = None
        # The pass's objects are in reference cycles (the ring's wait calls back into its reader), and
        # what they hold -- a reader by index keeps the parsed .idx, ~13 MiB per 100k records -- would
        # pile up epoch after epoch in a process that allocates few containers (a full collection is
        # rare): one collection per pass, while no pass is waiting.
        gc.collect()


def _next_job(cfg: PipelineConfig, ctrl_conn, lifeline) -> Optional[ReaderJob]:
    """The next pass's job, or None when the process is to end.  Releases the consumer sent for the last
    pass before it saw that pass's end are read and dropped: that pass's ring space is the next job's
    to describe (``ring_pos``)."""
    while True:
        ready = wait([ctrl_conn, lifeline], cfg.poll_interval)
        if lifeline in ready:
            return None  # (child_entry sweeps the run's shared memory)
        if ctrl_conn not in ready:
            continue
        try:
            msg = ctrl_conn.recv()
        except (EOFError, OSError):
            # Its end closed without a Stop: the consumer died, and its lifeline closes in the same
            # moment, maybe a moment later; wait for that, so that child_entry sweeps what it left.
            lifeline.poll(CONSUMER_DEATH_GRACE)
            return None
        if isinstance(msg, ReaderJob):
            return msg
        if not isinstance(msg, Release):
            return None  # Stop


def reader_main(cfg: PipelineConfig, job: ReaderJob, data_conn, ctrl_conn, lifeline) -> bool:
    """Read one pass: ``job``'s groups to the consumer, then its ``ReaderEnd``.  True when the pass
    ended cleanly (every group sent, no error): the process may serve another."""
    r = None
    try:
        r = _Reader(cfg, job, data_conn, ctrl_conn, lifeline)
        try:
            r.run()
            r.finish(None)
            return True
        except Stopped:
            return False
        except Exception as exc:
            why = r.explain(exc)
            r.finish(why if isinstance(why, ParrecioError) else RemoteError(why))
    except Stopped:
        return False
    except (EOFError, OSError) as exc:
        # Our pipes broke: the consumer closed them, or died (then its lifeline says so soon after, and
        # child_entry, seeing it, cleans up after it), or something failed before we could report it
        # (attaching the ring): say what, if we can.
        if not lifeline.poll(cfg.poll_interval):
            _report(data_conn, job.skip if r is None else r.out.seq, exc)
    finally:
        if r is not None:
            r.seg.close()  # (and its memoryview)
    return False
