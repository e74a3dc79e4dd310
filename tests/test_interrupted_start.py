"""A first pass whose start fails or is cut short by Ctrl-C (docs/ARCHITECTURE.md "Start-up").

What a notebook's user does: interrupt the first batch, run the cell again.  Wherever the
KeyboardInterrupt lands in the start-up -- the ring, the output slots, the janitor, the reader process,
the decoder processes -- everything started is freed, and:
- a source that can be read again (a regular file) is read whole by the next pass, in order;
- a stream that cannot (a FIFO) may have lost bytes to the reader process: the reader is closed, and says
  why when it is used again (never a silently short epoch).
"""

from __future__ import annotations

import multiprocessing
import os
import threading

import numpy as np
import psutil
import pytest

from parrecio import ParallelReader, PipelineError, Tuning
from parrecio.pipeline import resources, run as run_mod
from parrecio.pipeline.shm import Segment
from pipeline_helpers import Fixed, deadline, digest_array, our_children, payloads, wait_until, write_rec

N = 400


def _ours():
    """/dev/shm names of this process's readers."""
    mine = f"parrecio-{os.getpid()}-"
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(mine))


def _janitor(pid: int) -> bool:
    """Whether ``pid`` is the reader's janitor (``sh`` waiting on the lifeline with ``cat``)."""
    try:
        return psutil.Process(pid).name() in ("sh", "cat")
    except psutil.NoSuchProcess:
        return True


def _once(monkeypatch, owner, name, make_raiser):
    """Replace ``owner.name`` by a wrapper that interrupts its first call (``make_raiser(original)``
    gives that call's behaviour) and passes the later ones through."""
    original = getattr(owner, name)
    calls = []

    def wrapper(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            return make_raiser(original)(*args, **kwargs)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, wrapper if not isinstance(original, classmethod) else classmethod(wrapper))
    return calls


def _before(original):
    def call(*args, **kwargs):
        raise KeyboardInterrupt
    return call


def _after(original):
    """The call is made (its process started, its memory allocated), then the interrupt lands."""
    def call(*args, **kwargs):
        original(*args, **kwargs)
        raise KeyboardInterrupt
    return call


_CTX = multiprocessing.get_context("forkserver" if "forkserver" in multiprocessing.get_all_start_methods()
                                   else "spawn")


def _patch(monkeypatch, where):
    """Make the first pass's start-up be interrupted at ``where``."""
    if where == "ring":
        original = Segment.create.__func__

        def create(cls, name, size, *more):
            if name.endswith("ring"):
                seg = original(cls, name, size, *more)  # (created, then the interrupt: the janitor's case)
                raise KeyboardInterrupt
            return original(cls, name, size, *more)
        monkeypatch.setattr(Segment, "create", classmethod(create))
    elif where == "slots":
        _once(monkeypatch, resources, "SlotPool", _before)
    elif where == "janitor":
        _once(monkeypatch, resources, "start_janitor", _after)
    elif where == "feed":
        _once(monkeypatch, run_mod, "Feed", _before)
    elif where in ("reader", "worker0", "worker1"):
        name = "parrecio-reader" if where == "reader" else f"parrecio-worker-{where[-1]}"
        original = _CTX.Process.start

        def start(self):  # (the process is started, then the interrupt lands)
            if self.name == name:
                original(self)
                raise KeyboardInterrupt
            return original(self)
        monkeypatch.setattr(_CTX.Process, "start", start)
    else:
        raise AssertionError(where)


@pytest.mark.parametrize("where", ["ring", "slots", "janitor", "reader", "feed", "worker0", "worker1"])
def test_a_first_pass_interrupted_in_its_start_reads_the_file_whole_next_time(tmp_path, monkeypatch, no_leaks,
                                                                              where):
    path = tmp_path / "s.rec"
    recs = payloads(N, seed=11)
    write_rec(path, recs)
    want = np.stack([digest_array(r) for r in recs]).tobytes()
    reader = ParallelReader(path, fields=Fixed(), workers=2, batch_size=16,
                            tuning=Tuning(chunk_groups=16, start_method=_CTX.get_start_method()))
    try:
        _patch(monkeypatch, where)
        # (the exception is kept, as a notebook keeps sys.last_traceback: its frames must not be what
        # stops the processes of the failed start)
        with deadline(60), pytest.raises(KeyboardInterrupt) as held:
            next(iter(reader))
        monkeypatch.undo()
        assert reader.state.value != "closed"
        # No process of the failed start runs on (a reader process would read, and write into the ring,
        # beside the next pass's): none at all, or only the janitor where the shared part had started.
        kept = _janitor if where in ("reader", "feed") else (lambda pid: False)
        wait_until(lambda: [p for p in our_children() if not kept(p)] == [], what="no process of the start")
        del held
        with deadline(60):
            for _ in range(2):  # the pass again, and the next epoch
                assert np.concatenate(list(reader)).tobytes() == want
        assert reader.stats.epochs == 2
    finally:
        reader.close()
    assert _ours() == []


def test_a_reader_interrupted_in_its_start_frees_what_it_started_at_once(tmp_path, monkeypatch, no_leaks):
    """Not at close(): the failed start's processes and memory are gone before the user tries again."""
    path = tmp_path / "s.rec"
    write_rec(path, payloads(N, seed=12))
    reader = ParallelReader(path, fields=Fixed(), workers=2, tuning=Tuning(start_method=_CTX.get_start_method()))
    try:
        _patch(monkeypatch, "worker1")
        with deadline(60), pytest.raises(KeyboardInterrupt):
            next(iter(reader))
        assert _ours() == [] and reader.worker_pids == []
        with deadline(30):
            while our_children():  # (the worker started before the interrupt is stopped, the janitor reaped)
                threading.Event().wait(0.05)
    finally:
        reader.close()


def test_a_fifo_read_by_a_start_that_was_interrupted_is_not_read_again_short(tmp_path, monkeypatch, no_leaks):
    """The reader process had begun to read the FIFO: a new start would deliver an epoch without its first
    bytes.  The reader is closed instead, and says why."""
    src = tmp_path / "s.rec"
    write_rec(src, payloads(N, seed=13))
    fifo = tmp_path / "f.fifo"
    os.mkfifo(fifo)

    def feed():
        try:
            with open(fifo, "wb") as w:
                w.write(src.read_bytes())
        except BrokenPipeError:  # the reader process was stopped: what it did not read is lost
            pass
    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    reader = ParallelReader(str(fifo), fields=Fixed(), workers=2, tuning=Tuning(start_method=_CTX.get_start_method()))
    try:
        _patch(monkeypatch, "worker1")
        with deadline(60), pytest.raises(KeyboardInterrupt):
            next(iter(reader))
        monkeypatch.undo()
        with pytest.raises(PipelineError, match=r"closed: its pass of epoch 0 failed to start \(KeyboardInterrupt\) "
                                                r"after reading from .*f\.fifo.*, which cannot be read again"):
            iter(reader)
        assert reader.state.value == "closed"
    finally:
        reader.close()
        writer.join(10)
    assert _ours() == []


def test_workers0_interrupted_in_its_start_reads_a_fifo_whole_next_time(tmp_path, monkeypatch):
    """``workers=0`` reads nothing before the first ``next()``: an interrupt in the pass's making loses
    nothing, even of a FIFO."""
    src = tmp_path / "s.rec"
    recs = payloads(N, seed=14)
    write_rec(src, recs)
    fifo = tmp_path / "f.fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_bytes(src.read_bytes()), daemon=True)
    writer.start()
    from parrecio.pipeline import parallel_reader
    reader = ParallelReader(str(fifo), fields=Fixed(), workers=0, batch_size=16)
    try:
        _once(monkeypatch, parallel_reader, "InlineRun", _before)
        with pytest.raises(KeyboardInterrupt):
            next(iter(reader))
        monkeypatch.undo()
        with deadline(60):
            got = np.concatenate(list(reader))
        assert got.tobytes() == np.stack([digest_array(r) for r in recs]).tobytes()
    finally:
        reader.close()
        writer.join(10)


def test_close_from_another_thread_while_a_failed_start_is_freed(tmp_path, monkeypatch, no_leaks):
    """close() lands while the failed start is being freed (the phase reads CLOSED meanwhile): it returned
    at once, then the reader went back to NEW with its source never released.  It is closed after all."""
    path = tmp_path / "s.rec"
    write_rec(path, payloads(50, seed=15))
    reader = ParallelReader(path, fields=Fixed(), workers=1)
    released = []
    source = reader._res.source
    original_release = source.release
    monkeypatch.setattr(source, "release", lambda: (released.append(1), original_release())[1])
    _once(monkeypatch, resources, "SlotPool", _before)
    original_rest = resources.Resources._close_rest
    closer = []

    def close_rest(self):
        if not closer:  # close() from another thread, while this one frees the failed start
            closer.append(threading.Thread(target=reader.close))
            closer[0].start()
            wait_until(lambda: self.close_asked, what="close() to be asked")
        return original_rest(self)
    monkeypatch.setattr(resources.Resources, "_close_rest", close_rest)
    with deadline(60), pytest.raises(KeyboardInterrupt):
        next(iter(reader))
    closer[0].join(30)
    assert not closer[0].is_alive()
    assert reader.state.value == "closed" and reader._res.closed and released
    with pytest.raises(PipelineError, match="closed"):
        iter(reader)


@pytest.mark.parametrize("where", ["fit_memory", "SlotPool"])
def test_close_from_a_signal_handler_in_the_middle_of_the_start(tmp_path, monkeypatch, where, no_leaks):
    """close() in a signal handler runs in the middle of start() (the lock is re-entrant): it freed what
    was there, start() went on to allocate the output slots, failed, and its clean-up found the reader
    closed already: the slots stayed in /dev/shm for good.  Now the start frees them, and the pass ends
    as one ended by close()."""
    src = tmp_path / "s.rec"
    write_rec(src, payloads(N, seed=21))
    reader = ParallelReader(str(src), fields=Fixed(), workers=2, batch_size=16,
                            tuning=Tuning(start_method=_CTX.get_start_method()))

    def closing(original):
        def call(*args, **kwargs):
            reader.close()  # what the handler does, between two steps of the start
            return original(*args, **kwargs)
        return call
    _once(monkeypatch, resources, where, closing)
    try:
        with deadline(60), pytest.raises(PipelineError, match="ended by close"):
            next(iter(reader))
        assert _ours() == []
        assert reader.state.value == "closed"
    finally:
        reader.close()


def test_close_from_a_signal_handler_in_the_middle_of_a_pass(tmp_path, monkeypatch, no_leaks):
    """The same inside the pipeline, mid-pass: the pass ended as if complete (its chunks emptied by the
    close), or with whatever the close broke under it (KeyError: 313), not as a pass ended by close()."""
    src = tmp_path / "s.rec"
    write_rec(src, payloads(N, seed=22))
    reader = ParallelReader(str(src), fields=Fixed(), workers=2, batch_size=16,
                            tuning=Tuning(start_method=_CTX.get_start_method(), chunk_groups=16))
    calls = []
    original = run_mod.Run._store

    def store(self, task, frame):
        calls.append(1)
        if len(calls) == 3:
            reader.close()  # what the handler does, between two steps of the consumer
        return original(self, task, frame)
    monkeypatch.setattr(run_mod.Run, "_store", store)
    try:
        got = []
        with deadline(60), pytest.raises(PipelineError, match="ended by close"):
            for batch in reader:
                got.append(batch.copy())
        rows = [row for batch in got for row in batch]  # (the batches before it: a prefix, in order)
        assert all(np.array_equal(a, digest_array(r)) for a, r in zip(rows, payloads(N, seed=22)))
        assert len(rows) == 16 * len(got) < N
        assert _ours() == []
    finally:
        reader.close()
