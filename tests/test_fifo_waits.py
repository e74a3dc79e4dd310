"""Waits for a FIFO are said within seconds, and end as documented (parrecio/sources/fifo.py).

A Pipe-mode FIFO that does not appear, one that has no writer, one that another process has open for
reading (two readers of a FIFO split its bytes: it is not opened): each is a WARNING on the stderr of the
user's script after ``GRACE_S`` (2 s), naming the FIFO and the reason, then a ``SourceError`` at
``fifo_timeout``; with ``workers=0`` (the consumer opens it) and ``workers=1`` (the reader process does).
The scripts run as the user runs them (a file with a ``__main__`` guard, default logging), and leave no
process and no ``/dev/shm`` segment behind.  The in-process tests cover the repeat interval, an empty
stream, a FIFO replaced while waited on and the byte a probe reads.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import re
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from parrecio.errors import SourceError
from parrecio.pipeline.shm import leftover
from parrecio.sources import fifo as fifo_mod
from parrecio.sources import resolve
from parrecio.sources.fifo import FifoWait, fifo_readers, open_fifo
from source_helpers import make_payloads, write_rec

TIMEOUT = 4.0      # fifo_timeout of the scripts
SLACK = 3.0        # a loaded machine's lateness, on top of what is asserted
PIPE = {"TrainingInputMode": "Pipe", "RecordWrapperType": "RecordIO"}

READER = textwrap.dedent("""\
    import os, sys, time
    from parrecio import ParallelReader

    if __name__ == "__main__":
        channel, workers, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
        print("start", os.getpid(), flush=True)
        t0 = time.monotonic()
        try:
            with ParallelReader(channel, workers=workers, fifo_timeout=timeout) as reader:
                n = sum(1 for _ in reader)
            print("samples", n, flush=True)
        except Exception as exc:
            print("error", f"{time.monotonic() - t0:.2f}", type(exc).__name__, exc, flush=True)
    """)

HOLDER = textwrap.dedent("""\
    import os, sys, time

    if __name__ == "__main__":
        fd = os.open(sys.argv[1], os.O_RDONLY | os.O_NONBLOCK)  # a reader that holds it (and reads nothing)
        print("holding", flush=True)
        time.sleep(float(sys.argv[2]))
    """)


class Output:
    """A subprocess's stdout and stderr lines, each with the time it arrived, read by threads."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.lines: "queue.Queue" = queue.Queue()
        self.seen = {"out": [], "err": []}
        for name, stream in (("out", proc.stdout), ("err", proc.stderr)):
            threading.Thread(target=self._pump, args=(name, stream), daemon=True).start()

    def _pump(self, name: str, stream) -> None:
        for line in stream:
            self.lines.put((name, time.monotonic(), line.rstrip("\n")))

    def wait_for(self, name: str, pattern: str, timeout: float):
        """``(arrival time, line)`` of the first line of ``name`` that matches ``pattern``, or None."""
        end = time.monotonic() + timeout
        for seen_at, line in self.seen[name]:
            if re.search(pattern, line):
                return seen_at, line
        while time.monotonic() < end:
            try:
                got, at, line = self.lines.get(timeout=max(0.0, end - time.monotonic()))
            except queue.Empty:
                break
            self.seen[got].append((at, line))
            if got == name and re.search(pattern, line):
                return at, line
        return None

    def all(self, name: str) -> list:
        while True:
            try:
                got, at, line = self.lines.get_nowait()
            except queue.Empty:
                return [line for _, line in self.seen[name]]
            self.seen[got].append((at, line))


def _config(root) -> None:
    (root / "config").mkdir(parents=True)
    (root / "data").mkdir()
    (root / "config" / "inputdataconfig.json").write_text(json.dumps({"train": PIPE}))


def _start(tmp_path, script: str, *args, env=None) -> subprocess.Popen:
    path = tmp_path / ("reader.py" if script is READER else "holder.py")
    path.write_text(script)
    return subprocess.Popen([sys.executable, str(path), *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=str(tmp_path))


def _run_reader(tmp_path, workers: int, reason: str, *, channel="train", env=None):
    """Run the reader script until it fails; assert the warning (``reason``) came after GRACE_S, within
    seconds, once; return ``(warning line, error line)`` after checking that nothing is left behind."""
    import psutil

    proc = _start(tmp_path, READER, channel, workers, TIMEOUT, env=env)
    out = Output(proc)
    children = []
    try:
        started = out.wait_for("out", r"^start ", 60)
        assert started is not None, out.all("err")
        warned = out.wait_for("err", r"^parrecio: ", fifo_mod.GRACE_S + 3 + SLACK)
        assert warned is not None, f"no warning within {fifo_mod.GRACE_S + 3 + SLACK} s: {out.all('err')}"
        took = warned[0] - started[0]
        assert fifo_mod.GRACE_S - 0.2 <= took < fifo_mod.GRACE_S + 3 + SLACK, took
        assert re.search(reason, warned[1]), warned[1]
        children = psutil.Process(proc.pid).children(recursive=True)  # the reader process, the fork server
        failed = out.wait_for("out", r"^error ", TIMEOUT + 10 + SLACK)
        assert failed is not None, (out.all("out"), out.all("err"))
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    waited = float(failed[1].split()[1])
    assert TIMEOUT - 0.1 <= waited < TIMEOUT + 1 + SLACK + (2 if workers else 0), waited
    warnings = [line for line in out.all("err") if line.startswith("parrecio: ")]
    assert warnings == [warned[1]], out.all("err")  # said once: the next would come REPEAT_S later
    gone, alive = psutil.wait_procs(children, timeout=10)
    assert alive == []
    assert leftover(f"parrecio-{proc.pid}-") == []
    return warned[1], failed[1]


@pytest.mark.parametrize("workers", [0, 1])
def test_a_fifo_that_does_not_appear_is_said_then_is_a_source_error(tmp_path, workers):
    root = tmp_path / "sm"
    _config(root)
    fifo = root / "data" / "train_0"
    warning, error = _run_reader(tmp_path, workers, "it does not exist yet",
                                 env=dict(os.environ, SM_INPUT_DIR=str(root)))
    assert warning.startswith(f"parrecio: epoch 0 of SageMaker channel 'train' (Pipe mode): still waiting for "
                              f"{fifo} after ")
    assert "SageMaker creates it when the epoch starts" in warning
    assert f"waiting up to {TIMEOUT:g} s in all (fifo_timeout), then a SourceError" in warning
    assert error.split(maxsplit=2)[2].startswith("SourceError SageMaker channel 'train' (Pipe mode): the FIFO "
                                                 f"of epoch 0, {fifo}, did not appear within {TIMEOUT:g} s")


@pytest.mark.parametrize("workers", [0, 1])
def test_a_fifo_without_a_writer_is_said_then_is_a_source_error(tmp_path, workers):
    root = tmp_path / "sm"
    _config(root)
    fifo = root / "data" / "train_0"
    os.mkfifo(fifo)
    warning, error = _run_reader(tmp_path, workers, "no process has opened it for writing yet",
                                 env=dict(os.environ, SM_INPUT_DIR=str(root)))
    assert f"still waiting for {fifo} after " in warning
    assert f"the FIFO of epoch 0, {fifo}, exists but no writer opened it within {TIMEOUT:g} s" in error
    assert fifo_readers(os.stat(fifo)) == []  # it let go of it


@pytest.mark.parametrize("workers", [0, 1])
def test_a_fifo_that_another_process_reads_is_not_opened(tmp_path, workers):
    root = tmp_path / "sm"
    _config(root)
    fifo = root / "data" / "train_0"
    os.mkfifo(fifo)
    holder = _start(tmp_path, HOLDER, fifo, 60)
    try:
        assert holder.stdout.readline().strip() == "holding"
        warning, error = _run_reader(tmp_path, workers, rf"another process has it open for reading \(pid {holder.pid}: ",
                                     env=dict(os.environ, SM_INPUT_DIR=str(root)))
        assert "holder.py" in warning and "two readers of one FIFO split its bytes" in warning
        assert f"{fifo}, was held open for reading by another process (pid {holder.pid}: " in error
        # it never opened it: a writer now finds the holder as the only reader
        assert [h.pid for h in fifo_readers(os.stat(fifo))] == [holder.pid]
    finally:
        holder.kill()
        holder.wait()


def test_a_plain_fifo_waits_for_its_writer_without_a_timeout_and_then_reads_it(tmp_path):
    """A FIFO path (not SageMaker): the wait is said, is not an error, and the stream is read whole."""
    fifo = tmp_path / "stream"
    os.mkfifo(fifo)
    payloads = make_payloads(50, seed=3)
    data = write_rec(tmp_path / "src.rec", payloads)
    proc = _start(tmp_path, READER, fifo, 1, 0.5)  # fifo_timeout is for SageMaker channels only
    out = Output(proc)
    try:
        assert out.wait_for("out", r"^start ", 60) is not None, out.all("err")
        warned = out.wait_for("err", r"^parrecio: ", fifo_mod.GRACE_S + 3 + SLACK)
        assert warned is not None, out.all("err")
        assert warned[1] == (f"parrecio: FIFO source: still waiting for {fifo} after 2 s: it exists, but no process "
                             f"has opened it for writing yet; waiting as long as it takes (not an error; close() "
                             f"or Ctrl-C ends the wait)") or "after 3 s" in warned[1], warned[1]
        time.sleep(1.0)  # past the 0.5 s that would be a timeout
        with open(fifo, "wb") as f:
            f.write(data)
        done = out.wait_for("out", r"^(samples|error) ", 60)
        assert done is not None and done[1] == f"samples {len(payloads)}", (done, out.all("err"))
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# -- in this process (the wait of workers=0, or of a reader process) ------------------------------------------

def _pipe_source(tmp_path, timeout: float):
    root = tmp_path / "sm"
    _config(root)
    return resolve("train", sm_input_dir=str(root), fifo_timeout=timeout), root / "data" / "train_0"


def test_notices_repeat_at_their_interval_and_say_a_change_of_reason_at_once(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(fifo_mod, "GRACE_S", 0.2)
    monkeypatch.setattr(fifo_mod, "REPEAT_S", 0.6)
    source, fifo = _pipe_source(tmp_path, 2.0)
    later = fifo.parent / "train_1"
    threading.Timer(1.0, lambda: os.mkfifo(fifo)).start()  # missing -> there, without a writer
    caplog.set_level(logging.WARNING, logger="parrecio")
    start = time.monotonic()
    os.mkfifo(later)
    with pytest.raises(SourceError, match="exists but no writer opened it within 2 s"):
        list(source.streams(0))
    assert 2.0 <= time.monotonic() - start < 2.0 + SLACK
    messages = [r.getMessage() for r in caplog.records if r.name == "parrecio"]
    kinds = ["missing" if "does not exist yet" in m else "no writer" if "no process has opened it" in m else m
             for m in messages]
    # ~0.2 s and ~0.8 s: missing (with the later epoch's FIFO as a hint); ~1.0 s: the new reason at once;
    # then every 0.6 s (~1.6 s).  A loaded machine may run a look late, never add one.
    assert kinds[0] == "missing" and "no writer" in kinds and set(kinds) == {"missing", "no writer"}, messages
    assert 3 <= len(kinds) <= 5 and kinds == sorted(kinds), messages  # all "missing" before "no writer"
    assert f"{later} exists, so epoch 0 was probably served already" in messages[0]
    assert "s left of fifo_timeout=2, then a SourceError" in messages[-1]


def test_a_writer_that_comes_and_goes_without_writing_is_an_empty_stream(tmp_path):
    if not sys.platform.startswith("linux"):
        pytest.skip("told apart from 'no writer yet' by POLLHUP, on Linux")
    source, fifo = _pipe_source(tmp_path, 20)
    os.mkfifo(fifo)

    def writer():
        time.sleep(0.3)
        os.close(os.open(fifo, os.O_WRONLY))  # blocks until the reader has it open

    t = threading.Thread(target=writer)
    t.start()
    start = time.monotonic()
    [stream] = list(source.streams(0))
    with stream.file as f:
        assert f.read() == b""
    assert time.monotonic() - start < 5
    t.join()


def test_a_fifo_replaced_while_waited_on_is_opened_again(tmp_path):
    """pipe-serve replaces a stale FIFO of the epoch's name (unlink, mkfifo): the new one is read."""
    source, fifo = _pipe_source(tmp_path, 20)
    os.mkfifo(fifo)
    data = make_payloads(1, seed=1)[0]

    def replace_and_write():
        time.sleep(0.5)
        os.unlink(fifo)
        os.mkfifo(fifo)
        with open(fifo, "wb") as f:  # blocks until the reader opened the new one
            f.write(data)

    t = threading.Thread(target=replace_and_write)
    t.start()
    [stream] = list(source.streams(0))
    with stream.file as f:
        assert f.read() == data
    t.join()


def test_the_byte_a_probe_reads_is_given_back(tmp_path, monkeypatch):
    """Data that comes between the poll and the read of the probe: the byte read is the stream's first."""
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    wfd = os.open(fifo, os.O_RDWR)  # a writer (and a reader: not counted as one) that never blocks
    try:
        os.write(wfd, b"abcdef")

        class NoEvents:  # the poll that saw nothing yet
            def register(self, fd, events):
                pass

            def poll(self, timeout):
                return []

        monkeypatch.setattr(fifo_mod.select, "poll", NoEvents)
        f = open_fifo(str(fifo), FifoWait("test", 5))
        os.close(wfd)
        wfd = None
        with f:
            assert f.raw.pending() == 1 and f.name == str(fifo)
            assert f.read() == b"abcdef"
    finally:
        if wfd is not None:
            os.close(wfd)


def test_fifo_readers_finds_read_only_holders_only(tmp_path):
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    holder = _start(tmp_path, HOLDER, fifo, 60)
    rdwr = subprocess.Popen([sys.executable, "-c", "import os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR); "
                             "print('holding', flush=True); time.sleep(60)", str(fifo)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding" and rdwr.stdout.readline().strip() == "holding"
        found = fifo_readers(os.stat(fifo))
        if not sys.platform.startswith("linux"):
            assert found == []
            return
        assert [h.pid for h in found] == [holder.pid]
        assert found[0].description.startswith(f"pid {holder.pid}: {sys.executable} ")
        assert fifo_readers(os.stat(fifo), [rdwr.pid]) == []
    finally:
        for p in (holder, rdwr):
            p.kill()
            p.wait()
