"""The messages sent once per task travel as plain tuples (``__reduce__`` of messages.Task, Chunk and Release):
every field must come back equal, whatever the place, the arrays (empty too) and the flags."""

from __future__ import annotations

import pickle
from array import array
from multiprocessing.reduction import ForkingPickler

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parrecio.pipeline.messages import FILE, IN_RING, ONEOFF, Chunk, Place, Release, Task
from parrecio.pipeline.wire import send_message


def _round_trip(task: Task) -> Task:
    return pickle.loads(ForkingPickler.dumps(task))  # what Connection.send / recv do


def test_each_place_and_flag_comes_back():
    dest = [("parrecio-ab12-slot-3", 0, 5, 64), ("parrecio-ab12-slot-4", 64, 0, 60)]
    for place in (IN_RING, Place(FILE, "file:/data/a.rec"), Place(ONEOFF, "parrecio-ab12-big-7")):
        for isolated, split in ((False, False), (True, False), (False, True)):
            task = Task(9, 1 << 40, 3, 124, place, array("q", range(248)), array("q", range(1, 249)), dest,
                        isolated, split, 17)
            back = _round_trip(task)
            assert back == task
            assert type(back.ring_offs) is array and back.ring_offs.typecode == "q"
            assert back.place.is_file == (place.kind == FILE) and back.place.is_oneoff == (place.kind == ONEOFF)


def test_retired_slots_come_back():
    task = Task(3, 0, 0, 2, IN_RING, array("q", [0, 8]), array("q", [8, 8]), retired=("p-s7", "p-s9"))
    assert _round_trip(task).retired == ("p-s7", "p-s9") and _round_trip(task) == task


def test_an_empty_task_comes_back():
    task = Task(0, 0, 0, 0, IN_RING, array("q"), array("q"))
    assert _round_trip(task) == task


@settings(max_examples=60, deadline=None)
@given(offs=st.lists(st.integers(-(1 << 63), (1 << 63) - 1), max_size=40),
       lens=st.lists(st.integers(0, (1 << 63) - 1), max_size=40),
       name=st.text(max_size=30), kind=st.sampled_from([0, 1, 2]), epoch=st.integers(0, 1 << 31),
       pair=st.integers(-1, 1 << 62))
def test_any_arrays_come_back(offs, lens, name, kind, epoch, pair):
    task = Task(1, 2, 0, len(offs), Place(kind, name), array("q", offs), array("q", lens), [], False, False, epoch,
                pair)
    assert _round_trip(task) == task


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 40), nf=st.integers(1, 3), data=st.data(), kind=st.sampled_from([0, 1, 2]),
       name=st.text(max_size=30), first=st.integers(0, 1 << 62), end=st.integers(0, 1 << 62))
def test_any_chunk_comes_back(n, nf, data, kind, name, first, end):
    q = st.integers(-(1 << 63), (1 << 63) - 1)
    offs = data.draw(st.lists(q, min_size=n * nf, max_size=n * nf))
    lens = data.draw(st.lists(st.integers(0, (1 << 63) - 1), min_size=n * nf, max_size=n * nf))
    stream_offs = data.draw(st.lists(q, min_size=n, max_size=n))
    chunk = Chunk(first, n, data.draw(st.integers(0, 1000)), array("q", offs), array("q", lens),
                  array("q", stream_offs), end, Place(kind, name))
    back = _round_trip(chunk)
    assert back == chunk and type(back.place) is Place
    assert all(type(a) is array and a.typecode == "q" for a in (back.ring_offs, back.lens, back.stream_offs))


def test_release_comes_back_and_send_message_is_what_connection_recv_reads():
    import multiprocessing
    rel = Release(1 << 40, 3, 1 << 33)
    assert _round_trip(rel) == rel and _round_trip(Release(5)) == Release(5, 0, 0)
    r, w = multiprocessing.Pipe(duplex=False)
    task = Task(9, 1 << 40, 3, 2, Place(FILE, "file:/a.rec"), array("q", [1, 2, 3, 4]), array("q", [5, 6, 7, 8]),
                [("seg", 0, 1, 2)], False, True, 3, 17)
    for msg in (rel, task, Chunk(0, 0, 0, array("q"), array("q"), array("q"), 7)):
        send_message(w.fileno(), msg)
        assert r.recv() == msg
    r.close()
    w.close()


def test_a_signal_between_a_read_and_its_bookkeeping_breaks_the_frame_reader(monkeypatch):
    """Ctrl-C that lands right after ``os.readv`` returned (the handler runs before the count is added)
    lost the bytes it read: the next header came from amid a body, and the pass's shutdown, draining that
    pipe, raised MemoryError (a length of gigabytes) in place of the KeyboardInterrupt.  Such a reader
    is broken now: it reads no more, says so as a partial frame (its worker is replaced), and the
    exception is the one raised."""
    import fcntl
    import os
    from parrecio.pipeline import wire
    from parrecio.pipeline.messages import TaskDone
    r, w = os.pipe()
    try:
        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 1 << 20)
        inbox = wire.FrameReader(r)
        body = bytes(range(256)) * 1000  # over the first read's 64 KiB: the rest comes by readv
        wire.send_result(w, TaskDone(7, [], 0.5, 123), body, False)
        wire.send_result(w, TaskDone(8, [], 0.5, 123), body, False)
        real, calls = os.readv, []

        def readv_then_interrupt(fd, bufs):
            calls.append(real(fd, bufs))
            raise KeyboardInterrupt

        monkeypatch.setattr(wire.os, "readv", readv_then_interrupt)
        with pytest.raises(KeyboardInterrupt):
            inbox.read()
        monkeypatch.setattr(wire.os, "readv", real)
        assert calls and inbox.broken and inbox.eof and inbox.partial
        assert inbox.read() == []  # (before: a header read from amid the body)
    finally:
        os.close(w)
        os.close(r)
