"""A pass stopped while it waits for its source ends at once and takes nothing (parrecio/sources/fifo.py
``stoppable``; README "SageMaker" and "Reliability").

A Pipe-mode pass ended (Ctrl-C, ``close()`` from another thread) before its FIFO was there, or before a
writer opened it, leaves that FIFO to the next pass.  The reader process used to go on waiting through
the second it is given to stop, open the FIFO when it came, and so use up that epoch (the next pass read
the one after); with ``workers=0`` the wait, and a read of a FIFO whose writer stalls, did not end at all.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

from parrecio import ParallelReader, PipelineError
from pipeline_helpers import deadline
from source_helpers import make_payloads, records_of, write_rec

PIPE = {"TrainingInputMode": "Pipe", "RecordWrapperType": "RecordIO"}


class Channel:
    """SageMaker's side of channel ``train``: FIFO ``train_<k>`` made after ``appear[k]`` s (from
    :meth:`start`), opened for writing (which waits for a reader), written whole, removed."""

    def __init__(self, root, epochs, appear) -> None:
        (root / "config").mkdir()
        (root / "data").mkdir()
        (root / "config" / "inputdataconfig.json").write_text(json.dumps({"train": PIPE}))
        self.root, self.epochs, self.appear = root, epochs, appear
        self.served: list = []  # (epoch, "whole" or "broken pipe")
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def start(self) -> "Channel":
        self.t0 = time.monotonic()
        self.thread.start()
        return self

    def _serve(self) -> None:
        for k, data in enumerate(self.epochs):
            time.sleep(max(0.0, self.t0 + self.appear[k] - time.monotonic()))
            path = self.root / "data" / f"train_{k}"
            os.mkfifo(path)
            try:
                with open(path, "wb") as w:  # (waits for a reader)
                    w.write(data)
                self.served.append((k, "whole"))
            except BrokenPipeError:
                self.served.append((k, "broken pipe"))
            finally:
                os.unlink(path)


def _epochs(tmp_path, n=2):
    datas = []
    for k in range(n):
        datas.append(write_rec(tmp_path / f"e{k}.rec", [b"E%d-" % k + p for p in make_payloads(40, seed=k)]))
    return datas


@pytest.mark.parametrize("workers", [1, 2])
def test_ctrl_c_while_the_reader_process_waits_for_the_fifo(tmp_path, workers, no_leaks):
    """Ctrl-C at 0.4 s; train_0 comes at 1.0 s, within the second a reader process was given to stop (both
    counted from the same moment).  SIGINT gets Python's own handler for the while: a suite started from a
    background job (``cmd &`` in a script) runs with SIGINT ignored, and the Ctrl-C then raised nothing."""
    datas = _epochs(tmp_path)
    channel = Channel(tmp_path, datas, appear=[1.0, 0.0])
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with deadline(60), ParallelReader("train", workers=workers, sm_input_dir=str(tmp_path),
                                          fifo_timeout=20) as r:
            timer = threading.Timer(0.4, os.kill, (os.getpid(), signal.SIGINT))  # (a real signal: it ends a poll)
            channel.start()
            timer.start()
            with pytest.raises(KeyboardInterrupt):
                next(iter(r))
            timer.join()
            time.sleep(1.5)  # past train_0's coming: the stopped reader process must not have taken it
            assert channel.served == []
            assert list(r) == records_of(datas[0])  # epoch 0, whole
            assert list(r) == records_of(datas[1])
    finally:
        signal.signal(signal.SIGINT, old)
    assert channel.served == [(0, "whole"), (1, "whole")]


def test_close_from_another_thread_while_workers0_waits_for_the_fifo(tmp_path, no_leaks):
    datas = _epochs(tmp_path, 1)
    channel = Channel(tmp_path, datas, appear=[1.5])
    r = ParallelReader("train", workers=0, sm_input_dir=str(tmp_path), fifo_timeout=20)
    channel.start()  # (counted from here, as the close)
    threading.Timer(0.4, r.close).start()
    start = time.monotonic()
    with deadline(60), pytest.raises(PipelineError, match="this pass was ended by close()"):
        next(iter(r))
    assert time.monotonic() - start < 1.4  # it waited for the FIFO: until it came, then read it
    with deadline(60), ParallelReader("train", workers=0, sm_input_dir=str(tmp_path), fifo_timeout=20) as again:
        assert list(again) == records_of(datas[0])
    assert channel.served == [(0, "whole")]


def test_close_from_another_thread_ends_a_workers0_read_of_a_stalled_fifo(tmp_path, no_leaks):
    fifo = tmp_path / "f.fifo"
    os.mkfifo(fifo)
    data = write_rec(tmp_path / "s.rec", make_payloads(20))
    release = threading.Event()

    def stall():  # a record and a half, then nothing, the FIFO held open
        with open(fifo, "wb") as w:
            w.write(data[:len(data) // 2])
            w.flush()
            release.wait(60)
    writer = threading.Thread(target=stall, daemon=True)
    writer.start()
    try:
        r = ParallelReader(str(fifo), workers=0)
        got, box = [], {}

        def iterate():
            try:
                for x in r:
                    got.append(x)
            except BaseException as exc:
                box["error"] = exc
        it = threading.Thread(target=iterate, daemon=True)
        it.start()
        time.sleep(1.0)  # blocked in a read by now
        r.close()
        it.join(5)
        assert not it.is_alive()  # it stayed blocked in read() for good
        assert isinstance(box.get("error"), PipelineError) and "ended by close()" in str(box["error"])
        assert got == records_of(data)[:len(got)] and got
    finally:
        release.set()
        writer.join(10)
