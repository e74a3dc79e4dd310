"""The consumer's non-blocking reader of result frames (parrecio.pipeline.wire.FrameReader): whatever way the
bytes arrive -- many frames in one read, a frame split anywhere, bodies from 0 bytes to several pipe
buffers, a writer that stops halfway or dies -- every complete frame comes out once, byte for byte, in
order, and the reader never blocks."""

from __future__ import annotations

import os
import threading
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from parrecio.pipeline.messages import TaskDone
from parrecio.pipeline.wire import _HEADER, FrameReader, send_result


def _frame(task_id: int, body: bytes, split: bool = False) -> bytes:
    return _HEADER.pack(len(body), task_id, task_id * 0.5, 1000 + task_id, split) + body



def _collect(reader: FrameReader, want: int, total: int, deadline: float = 10.0) -> list:
    """The frames ``reader`` assembles until ``want`` came (``total`` bytes sent in all)."""
    got: list = []
    end = time.monotonic() + deadline
    while len(got) < want:
        assert time.monotonic() < end, (f"{len(got)} of {want} frames after {deadline} s: {reader.received} "
                                        f"of {total} bytes read, partial={reader.partial}")
        t0 = time.monotonic()
        got += [(f.task_id, f.cpu, f.pid, f.split, bytes(f.body)) for f in reader.read()]
        assert time.monotonic() - t0 < 1.0  # read() never waits for the writer
        if len(got) < want:
            time.sleep(0.001)
    return got


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.sampled_from([0, 1, 7, 32, 33, 100, 4095, 65_535, 65_536, 65_537, 200_000]),
                      min_size=1, max_size=12),
       cuts=st.lists(st.integers(1, 70_000), min_size=1, max_size=30))
def test_frames_come_out_whole_and_in_order_however_the_bytes_arrive(sizes, cuts):
    frames = [_frame(i, bytes([i & 255, 255 - (i & 255)]) * (s // 2) + bytes([i & 255]) * (s % 2), i % 3 == 0)
              for i, s in enumerate(sizes)]
    stream = b"".join(frames)
    r, w = os.pipe()
    reader = FrameReader(r)

    least = len(stream) // 300 + 1  # (at most ~300 writes: one byte at a time, 2 MB would take minutes)

    def write():  # the stream in pieces of the given sizes, with pauses: frames split anywhere
        pos, k = 0, 0
        while pos < len(stream):
            n = max(cuts[k % len(cuts)], least)
            # (blocks while the pipe is full: the reader drains it; a signal may cut a write short)
            try:
                pos += os.write(w, stream[pos:pos + n])
            except BrokenPipeError:  # the test failed: the reader's end is closed
                return
            k += 1
            if k % 3 == 0:
                time.sleep(0.0005)

    t = threading.Thread(target=write, daemon=True)
    t.start()
    ok = False
    try:
        got = _collect(reader, len(frames), len(stream))
        ok = True
    finally:
        if not ok:
            os.close(r)  # the writer gets EPIPE instead of blocking on a full pipe
        t.join()
        os.close(w)
    assert got == [(i, i * 0.5, 1000 + i, i % 3 == 0, f[_HEADER.size:]) for i, f in enumerate(frames)]
    assert not reader.partial and reader.received == len(stream)
    assert reader.read() == [] and reader.eof  # the writer is gone
    os.close(r)


def test_many_small_frames_in_one_read_and_nothing_more_asked_of_an_empty_pipe():
    r, w = os.pipe()
    reader = FrameReader(r)
    os.write(w, b"".join(_frame(i, b"x" * i) for i in range(50)))
    got = reader.read()
    assert [(f.task_id, bytes(f.body)) for f in got] == [(i, b"x" * i) for i in range(50)]
    assert reader.read() == [] and not reader.eof and not reader.partial  # empty, writer alive
    os.close(w)
    assert reader.read() == [] and reader.eof
    os.close(r)


def test_a_writer_that_stops_halfway_leaves_a_partial_frame_then_dies():
    r, w = os.pipe()
    reader = FrameReader(r)
    whole = _frame(1, b"a" * 10)
    cut = _frame(2, b"b" * 100_000)[:50_000]
    os.write(w, whole + cut)
    assert [(f.task_id, bytes(f.body)) for f in reader.read()] == [(1, b"a" * 10)]
    assert reader.partial and not reader.eof  # stopped halfway: a partial frame, no error, no wait
    assert reader.read() == [] and reader.partial
    os.close(w)  # it died: the cut frame is dropped
    assert reader.read() == [] and reader.eof
    os.close(r)


def test_a_header_cut_short_is_partial():
    r, w = os.pipe()
    reader = FrameReader(r)
    os.write(w, _frame(3, b"zz")[:5])
    assert reader.read() == [] and reader.partial and reader.received == 5
    os.write(w, _frame(3, b"zz")[5:])
    assert [(f.task_id, bytes(f.body)) for f in reader.read()] == [(3, b"zz")] and not reader.partial
    os.close(w)
    os.close(r)


def test_frames_written_by_send_result_before_the_writer_closed_all_count():
    r, w = os.pipe()
    reader = FrameReader(r)
    for i in range(5):
        send_result(w, TaskDone(i, [], 0.25, 77), bytes(range(i * 40 % 256)) * 3, i == 4)
    os.close(w)
    got = reader.read()
    assert [(f.task_id, f.cpu, f.pid, f.split, bytes(f.body)) for f in got] == \
        [(i, 0.25, 77, i == 4, bytes(range(i * 40 % 256)) * 3) for i in range(5)]
    assert not reader.partial
    assert reader.read() == [] and reader.eof  # (the read that emptied the pipe did not ask again)
    os.close(r)
