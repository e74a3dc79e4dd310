"""Reliability, round 2: groups larger than the ring, bounded one-off segments, errors that keep the
samples before them, results that cannot travel, time that is not the decoders', stopped and forked
processes, signals to the whole process group, threads, stdin scripts, validation and seeding.

Each test states the exact expected behaviour (payloads byte for byte, order, counts, error type and
message, nothing left running, nothing left in /dev/shm).  Anything that could hang runs under
``deadline()`` or in a subprocess with a timeout.  Subprocess scripts are files written to ``tmp_path``
with an ``if __name__ == "__main__":`` guard (except the stdin scripts of case 13) and put tests/ on
``sys.path`` so that the helper decoders are importable by spawn/forkserver children."""

from __future__ import annotations

import gc
import json
import logging
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import defaultdict

import numpy as np
import pytest

from parrecio import DecodeError, ParallelReader, PipelineError, Tuning
from parrecio.decoders import Raw
from parrecio.pipeline.shm import leftover, sweep
from pipeline_helpers import (FailOn, Fixed, HangOn, KillOn, Sleepy, catches, deadline, digest_array, fifo_unread,
                              is_blocked, payloads, proc_state, wait_until, write_rec)
from round2_helpers import (Lines, RaiseBaseOn, SeedProbe, StopWhileSending, UnpicklableOn, UnpickleFailsOn,
                            alive, big_value, kill_quietly, oneoff_bytes, open_fds, wait_gone)

from test_reliability import stream  # noqa: F401  (the same 300-record stream, as a fixture)

HERE = os.path.dirname(os.path.abspath(__file__))

# A close() that is prompt takes well under a second, a few on a loaded 2-core machine; the slowest
# bounded way out that is no hang (close() waiting 10 s for the iterating thread) takes longer.
PROMPT_CLOSE = 8.0


# -- helpers -----------------------------------------------------------------------------------------------

def write_script(tmp_path, name: str, body: str) -> str:
    """A consumer script file: tests/ on sys.path, ``body`` under the ``__main__`` guard."""
    text = textwrap.dedent(f"""\
        import os, sys, time, signal
        # SIGINT raises KeyboardInterrupt, SIGTERM and SIGHUP kill, whatever dispositions the test run was
        # started with (nohup ignores SIGHUP; a background job of a non-interactive shell ignores SIGINT)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        sys.path.insert(0, {HERE!r})
        from parrecio import ParallelReader, Tuning
        if __name__ == "__main__":
        """) + textwrap.indent(textwrap.dedent(body), "    ")
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def start(script: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, script], stdout=subprocess.PIPE, text=True, **kw)


def parse_pids(line: str):
    """``"<tag> <prefix> <pid> <pid> ..."`` -> (prefix, [pids])."""
    parts = line.split()
    return parts[1], [int(p) for p in parts[2:]]


def wait_lines(lines: Lines, *starts: str, timeout: float = 60):
    """Read ``lines`` until a line starting with each of ``starts`` was seen (in any order), for up to
    ``timeout`` seconds; return the first such line of each (None for those that never came)."""
    end = time.monotonic() + timeout

    def found():
        return [next((x for x in lines.seen if x.startswith(s)), None) for s in starts]

    while None in found():
        left = end - time.monotonic()
        if left <= 0 or lines.get(left) is None:
            break
    return found()


def finish(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:  # pragma: no cover
        pass


def stopped_descendants():
    import psutil
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() == psutil.STATUS_STOPPED:
                out.append(p.pid)
        except psutil.NoSuchProcess:
            pass
    return out


def write_config(root, channels) -> None:
    (root / "config").mkdir(parents=True, exist_ok=True)
    (root / "data").mkdir(exist_ok=True)
    (root / "config" / "inputdataconfig.json").write_text(json.dumps(channels))


PIPE_RECORDIO = {"TrainingInputMode": "Pipe", "RecordWrapperType": "RecordIO",
                 "S3DistributionType": "FullyReplicated"}
PIPE_NONE = {"TrainingInputMode": "Pipe", "RecordWrapperType": "None", "S3DistributionType": "FullyReplicated"}


# -- 1. a group larger than the ring ------------------------------------------------------------------------

def big_records(n=60, seed=11):
    """Random sizes 100 B .. 500 KB; records 6-8, 30-32 and 45-47 near 500 KB, so that groups of 3 (and of
    2) are larger than a 1 MiB ring (half of it)."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(100, 500_000, n)
    for i in (6, 7, 8, 30, 31, 32, 45, 46, 47):
        sizes[i] = rng.integers(470_000, 500_000)
    return [rng.integers(0, 256, int(s), dtype=np.uint8).tobytes() for s in sizes]


BIG_FIELDS = {"raw2": lambda: [Raw()] * 2, "raw3": lambda: [Raw()] * 3, "fixed3": lambda: [Raw(), Fixed(), Raw()]}


@pytest.mark.parametrize("fields", list(BIG_FIELDS))
def test_01_group_larger_than_the_ring(tmp_path, no_leaks, fields):
    recs = big_records()
    path = tmp_path / "big.rec"
    write_rec(path, recs)
    decs = BIG_FIELDS[fields]()
    nf = len(decs)
    groups = [recs[i:i + nf] for i in range(0, len(recs), nf)]
    assert max(sum(map(len, g)) for g in groups) > (1 << 20 if nf == 3 else 1 << 19)
    got = []
    with deadline(60):
        with ParallelReader(path, fields=decs, workers=2, tuning=Tuning(ring_bytes=1 << 20)) as reader:
            for s in reader:
                got.append(s)
    assert len(got) == len(groups)
    bad = []
    for i, (s, g) in enumerate(zip(got, groups)):
        for f, d in enumerate(decs):
            ok = np.array_equal(s[f], digest_array(g[f])) if isinstance(d, Fixed) else s[f] == g[f]
            if not ok:
                bad.append((i, f))
    assert bad == []


def test_01_killed_consumer_of_big_groups_leaves_nothing(tmp_path):
    recs = big_records()
    path = tmp_path / "big.rec"
    write_rec(path, recs)
    script = write_script(tmp_path, "consumer.py", f"""
        from parrecio.decoders import Raw
        from pipeline_helpers import Fixed
        r = ParallelReader({str(path)!r}, fields=[Raw(), Fixed(), Raw()], workers=2, tuning=Tuning(ring_bytes=1 << 20))
        it = iter(r)
        print("pids", r._res.prefix, r._res.run.reader.pid, *r.worker_pids, flush=True)
        for _ in range(13):  # past groups 2 and 10, each larger than the ring
            next(it)
        print("took", flush=True)
        time.sleep(60)  # until the test kills it
        """)
    proc = start(script)
    lines = Lines(proc.stdout)
    prefix, pids, took, left = None, [], None, None
    try:
        first = lines.wait_for("pids", 60)
        assert first is not None, f"the consumer printed nothing: {lines.seen}"
        prefix, pids = parse_pids(first)
        took = lines.wait_for("took", 30)
        proc.kill()
        proc.wait(10)
        left = wait_gone(pids, prefix)
    finally:
        finish(proc)
        kill_quietly(pids)
        if prefix:
            sweep(prefix)
    assert took is not None, "the consumer did not get 13 samples within 30 s (the pipeline hangs)"
    assert left == ([], [])


# -- 2. one-off segments are bounded ------------------------------------------------------------------------

@pytest.mark.parametrize("ring_bytes", [8 << 20, 128 << 10])
def test_02_oneoff_segments_in_flight_are_bounded(tmp_path, no_leaks, ring_bytes):
    n, size = 40, 5 << 20

    def rec(i):
        return np.random.default_rng(1000 + i).bytes(size)

    path = tmp_path / "huge.rec"
    write_rec(path, (rec(i) for i in range(n)))
    peak = [0]
    stop = threading.Event()

    def sampler(prefix):
        while not stop.is_set():
            peak[0] = max(peak[0], oneoff_bytes(prefix))
            time.sleep(0.002)  # the sampling period

    count, wrong = 0, []
    th = None
    try:
        with deadline(90):
            with ParallelReader(path, workers=1, tuning=Tuning(ring_bytes=ring_bytes)) as reader:
                it = iter(reader)
                prefix = reader._res.prefix
                th = threading.Thread(target=sampler, args=(prefix,), daemon=True)
                th.start()
                for i, s in enumerate(it):
                    peak[0] = max(peak[0], oneoff_bytes(prefix))
                    if s != rec(i):
                        wrong.append(i)
                    count += 1
                    time.sleep(0.05)  # a slow consumer: results pile up in one-off segments
    finally:
        stop.set()
        if th is not None:
            th.join(5)
    assert count == n and wrong == []
    assert peak[0] <= max(ring_bytes, size), (
        f"{peak[0] / 2**20:.1f} MiB of one-off segments at once (budget {max(ring_bytes, size) / 2**20:.1f} MiB)")


# -- 3. the samples before an error are delivered, as a short batch -----------------------------------------

def test_03_short_batch_before_the_decode_error(tmp_path, no_leaks):
    recs = payloads(60, seed=3)
    recs[37] = b"FAIL" + recs[37]
    path = tmp_path / "f.rec"
    offsets = write_rec(path, recs)
    got = []
    with deadline(60):
        with ParallelReader(path, fields=FailOn(b"FAIL"), workers=2, batch_size=10) as reader:
            with pytest.raises(Exception) as ei:
                for b in reader:
                    got.append(np.array(b, copy=True))
    assert isinstance(ei.value, DecodeError), repr(ei.value)
    assert [len(b) for b in got] == [10, 10, 10, 7]
    for k, b in enumerate(got):
        assert np.array_equal(b, np.stack([digest_array(r) for r in recs[10 * k:10 * k + len(b)]]))
    assert (ei.value.index, ei.value.offset) == (37, offsets[37])


# -- 4. results that cannot travel back, BaseExceptions in decoders -----------------------------------------

def _marked_stream(tmp_path, n=30, at=13, marker=b"MARK", seed=4):
    recs = payloads(n, seed=seed)
    recs[at] = marker + recs[at]
    path = tmp_path / "m.rec"
    offsets = write_rec(path, recs)
    return path, recs, offsets


def _read_marked(path, dec, workers: int, on_error: str):
    """Read ``path`` with ``dec``: (samples before the error, the error or None, skipped, replaced)."""
    got, err = [], None
    with deadline(60):
        with ParallelReader(path, fields=dec, workers=workers, on_error=on_error,
                            tuning=Tuning(chunk_groups=4)) as reader:
            try:
                for s in reader:
                    got.append(s)
            except Exception as exc:
                err = exc
            return got, err, reader.stats.skipped, reader.stats.workers_replaced


def _check_marked(recs, offsets, got, err, skipped, on_error: str, said: str) -> None:
    """Sample 13 (marked) failed: raised at its place, naming ``said``, or skipped alone."""
    if on_error == "raise":
        assert isinstance(err, DecodeError), repr(err)
        assert got == recs[:13]
        assert (err.index, err.offset) == (13, offsets[13])
        assert said in str(err)
    else:
        assert err is None, repr(err)
        assert got == recs[:13] + recs[14:]
        assert skipped == 1


@pytest.mark.parametrize("on_error", ["raise", "skip"])
@pytest.mark.parametrize("kind", ["cannot be unpickled", "cannot be pickled"])
def test_04_result_that_cannot_travel(tmp_path, no_leaks, kind, on_error):
    path, recs, offsets = _marked_stream(tmp_path)
    dec = UnpickleFailsOn(b"MARK") if kind == "cannot be unpickled" else UnpicklableOn(b"MARK")
    got, err, skipped, _ = _read_marked(path, dec, 2, on_error)
    _check_marked(recs, offsets, got, err, skipped, on_error, kind)


@pytest.mark.parametrize("exc_name", ["KeyboardInterrupt", "SystemExit", "GeneratorExit", "OwnBaseException",
                                      "BrokenStr", "NotAnException"])
@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_04_decoder_raising_a_base_exception(tmp_path, no_leaks, exc_name, on_error):
    """Whatever a decoder raises is a DecodeError of its sample, naming the exception's type: GeneratorExit
    and a BaseException of the decoder's own killed the decoder process (twice: a 'poison record' that
    named nothing); an exception whose str() raises did too; one that pickles as a dict escaped as an
    AttributeError and took the good samples of its task with it."""
    path, recs, offsets = _marked_stream(tmp_path)
    got, err, skipped, replaced = _read_marked(path, RaiseBaseOn(b"MARK", exc_name), 2, on_error)
    assert replaced == 0
    _check_marked(recs, offsets, got, err, skipped, on_error, exc_name)


@pytest.mark.parametrize("exc_name", ["BrokenStr", "NotAnException"])
@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_04_workers_0_and_exceptions_hard_to_carry(tmp_path, no_leaks, exc_name, on_error):
    """The same with workers=0: an exception whose str() raises escaped as that AttributeError, under
    skip too, and ended the pass."""
    path, recs, offsets = _marked_stream(tmp_path)
    got, err, skipped, _ = _read_marked(path, RaiseBaseOn(b"MARK", exc_name), 0, on_error)
    _check_marked(recs, offsets, got, err, skipped, on_error, exc_name)


# -- 5. the consumer's own time is not the decoders' --------------------------------------------------------

def test_05_slow_loop_body_does_not_kill_workers(tmp_path, no_leaks, caplog):
    recs = payloads(300, seed=5)
    path = tmp_path / "c.rec"
    write_rec(path, recs)
    out = []
    with caplog.at_level(logging.WARNING, logger="parrecio"):
        with deadline(90):
            with ParallelReader(path, fields=Fixed(), workers=2, batch_size=8, tuning=Tuning(chunk_groups=8, task_timeout=1)) as reader:
                for i, b in enumerate(reader):
                    out.append(b.copy())
                    if i in (3, 12, 24):
                        time.sleep(2.5)  # the training step is slow: results wait in the pipes
                replaced, reruns = reader.stats.workers_replaced, reader.stats.reruns
    got = np.concatenate(out)
    assert got.shape == (300, 4, 3) and np.array_equal(got, np.stack([digest_array(r) for r in recs]))
    assert (replaced, reruns) == (0, 0)
    assert [r.getMessage() for r in caplog.records if "made no progress" in r.getMessage()] == []


def test_05_stopped_consumer_does_not_kill_workers(tmp_path):
    recs = payloads(600, seed=55)
    path = tmp_path / "c.rec"
    write_rec(path, recs)
    script = write_script(tmp_path, "consumer.py", f"""
        import numpy as np
        from pipeline_helpers import Fixed, digest_array, payloads
        recs = payloads(600, seed=55)
        out = []
        with ParallelReader({str(path)!r}, fields=Fixed(), workers=2, batch_size=8,
                            tuning=Tuning(chunk_groups=8, task_timeout=1)) as r:
            for i, b in enumerate(r):
                out.append(b.copy())
                if i == 0:
                    print("pids", r._res.prefix, r._res.run.reader.pid, *r.worker_pids, flush=True)
                if i == 5:
                    print("flowing", flush=True)
                time.sleep(0.05)  # a slow consumer: the pass lasts ~4 s, long enough to be stopped in
            replaced = r.stats.workers_replaced
        got = np.concatenate(out)
        exact = got.shape[0] == len(recs) and np.array_equal(got, np.stack([digest_array(x) for x in recs]))
        print("done", got.shape[0], exact, replaced, flush=True)
        """)
    proc = start(script)
    lines = Lines(proc.stdout)
    prefix, pids, done = None, [], None
    try:
        first = lines.wait_for("pids", 60)
        assert first is not None, f"the consumer printed nothing: {lines.seen}"
        prefix, pids = parse_pids(first)
        assert lines.wait_for("flowing", 60) is not None, f"the consumer got no 6 batches: {lines.seen}"
        proc.send_signal(signal.SIGSTOP)
        wait_until(lambda: proc_state(proc.pid) == "T", what="the consumer to be stopped")
        time.sleep(3)  # the behaviour under test: the consumer stays stopped 3 x task_timeout
        proc.send_signal(signal.SIGCONT)
        done = lines.wait_for("done", 60)
        proc.wait(10)
        left = wait_gone(pids, prefix)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
        finish(proc)
        kill_quietly(pids)
        if prefix:
            sweep(prefix)
    assert done == "done 600 True 0"
    assert left == ([], [])


# -- 6. a decoder stopped while it sends a large result ------------------------------------------------------

def test_06_decoder_stopped_while_sending_a_large_result(tmp_path, no_leaks):
    recs = payloads(40, seed=6)
    recs[10] = b"BIG!" + recs[10]
    path = tmp_path / "b.rec"
    write_rec(path, recs)
    flag = tmp_path / "flag"
    got = []
    replaced = ended = None
    try:
        with deadline(120):
            with ParallelReader(path, fields=StopWhileSending(b"BIG!", str(flag)), workers=2, tuning=Tuning(chunk_groups=2, task_timeout=2)) as reader:
                for s in reader:
                    got.append(s)
                ended = time.time()
                replaced = reader.stats.workers_replaced
    finally:
        kill_quietly(stopped_descendants())  # a worker left stopped must not linger
    assert flag.exists()
    # from the moment the decoder made the flag (just before it was stopped) to the end of the pass: the
    # stopped worker's task_timeout (2 s), its replacement and the rerun, not a wait for the stopped one
    since_stop = ended - flag.stat().st_mtime
    assert since_stop < 60, f"the pass ended {since_stop:.1f} s after the decoder was stopped"
    assert len(got) == 40
    wrong = [i for i, s in enumerate(got) if s != (big_value(recs[i]) if i == 10 else recs[i])]
    assert wrong == []
    assert replaced == 1


# -- 7. the stalled-FIFO watch ------------------------------------------------------------------------------

def _stalling_writer(tmp_path, data: bytes, sleep: float) -> subprocess.Popen:
    """Another process that writes ``data`` into the FIFO ``tmp_path/fifo`` and then keeps it open
    ``sleep`` seconds without writing more."""
    src = tmp_path / "half.bin"
    src.write_bytes(data)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    writer = tmp_path / "writer.py"
    writer.write_text(textwrap.dedent(f"""\
        import time
        if __name__ == "__main__":
            data = open({str(src)!r}, "rb").read()
            with open({str(fifo)!r}, "wb", buffering=0) as f:
                f.write(data)
                open({str(tmp_path / "written")!r}, "w").close()
                time.sleep({sleep})  # the behaviour under test: the FIFO stays open, nothing more comes
        """))
    return subprocess.Popen([sys.executable, str(writer)])


def wait_stalled(tmp_path, reader_pid: int) -> None:
    """Wait until the stalling writer has written everything, the reader process has read all of it
    and it is blocked, waiting for more."""
    wait_until(lambda: (tmp_path / "written").exists() and fifo_unread(tmp_path / "fifo") == 0
               and is_blocked(reader_pid), what="the reader to read all there is and wait on the stalled FIFO")


def test_07_killed_consumer_while_the_fifo_stalls_after_releases(tmp_path):
    recs = payloads(20, seed=71)
    src = tmp_path / "s.rec"
    offsets = write_rec(src, recs)
    writer = _stalling_writer(tmp_path, src.read_bytes()[:offsets[10]], 60)  # 10 records, then a stall
    script = write_script(tmp_path, "consumer.py", f"""
        from pipeline_helpers import Fixed
        r = ParallelReader({str(tmp_path / "fifo")!r}, fields=Fixed(), workers=1, tuning=Tuning(chunk_groups=1))
        it = iter(r)
        next(it)
        print("reader", r._res.run.reader.pid, flush=True)
        sys.stdin.readline()  # the test says when the reader has read all there is and waits on the FIFO
        for _ in range(3):
            next(it)  # each delivery sends the waiting reader a Release
        print("pids", r._res.prefix, r._res.run.reader.pid, *r.worker_pids, flush=True)
        time.sleep(60)  # until the test kills it
        """)
    proc = start(script, stdin=subprocess.PIPE)
    lines = Lines(proc.stdout)
    prefix, pids, left = None, [], None
    try:
        first = lines.wait_for("reader", 60)
        assert first is not None, f"the consumer printed nothing: {lines.seen}"
        reader_pid = int(first.split()[1])
        wait_stalled(tmp_path, reader_pid)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        line = lines.wait_for("pids", 60)
        assert line is not None, f"the consumer did not take 3 more samples: {lines.seen}"
        prefix, pids = parse_pids(line)
        wait_until(lambda: is_blocked(reader_pid), what="the reader to handle the Releases and wait again")
        proc.kill()
        proc.wait(10)
        left = wait_gone(pids, prefix)
    finally:
        finish(proc)
        finish(writer)
        kill_quietly(pids)
        if prefix:
            sweep(prefix)
    assert left == ([], [])


def test_07_close_after_releases_on_a_stalled_fifo_is_prompt(tmp_path, no_leaks):
    recs = payloads(20, seed=72)
    src = tmp_path / "s.rec"
    offsets = write_rec(src, recs)
    writer = _stalling_writer(tmp_path, src.read_bytes()[:offsets[10]], 60)
    reader = None
    took, got = None, []
    try:
        with deadline(90):
            reader = ParallelReader(str(tmp_path / "fifo"), fields=Fixed(), workers=1, tuning=Tuning(chunk_groups=1))
            it = iter(reader)
            got.append(next(it))
            wait_stalled(tmp_path, reader._res.run.reader.pid)
            got += [next(it) for _ in range(3)]
            t0 = time.monotonic()
            reader.close()
            took = time.monotonic() - t0
            del it
    finally:
        if reader is not None:
            reader.close()
        finish(writer)
    assert all(np.array_equal(a, digest_array(r)) for a, r in zip(got, recs)) and len(got) == 4
    assert took < PROMPT_CLOSE


# -- 8. Pipe mode without the RecordIO wrapper: early flush on a stall ---------------------------------------

def test_08_pipe_mode_without_wrapper_flushes_when_the_stream_stalls(tmp_path, no_leaks):
    root = tmp_path / "sm"
    write_config(root, {"train": PIPE_NONE})
    recs = payloads(10, seed=8)
    src = tmp_path / "src.rec"
    write_rec(src, recs)
    fifo = root / "data" / "train_0"
    os.mkfifo(fifo)
    writer = tmp_path / "writer.py"
    writer.write_text(textwrap.dedent(f"""\
        import time
        if __name__ == "__main__":
            data = open({str(src)!r}, "rb").read()
            with open({str(fifo)!r}, "wb", buffering=0) as f:
                for i in range(0, len(data), 64):  # small pieces, with pauses: a slow stream
                    f.write(data[i:i + 64])
                    time.sleep(0.01)
                open({str(tmp_path / "written")!r}, "w").close()
                time.sleep(120)  # everything written, but the FIFO stays open: the stream stalls
        """))
    wproc = subprocess.Popen([sys.executable, str(writer)])
    reader = None
    first_at = close_took = None
    got = []
    try:
        with deadline(90):  # well before the stall ends (EOF would flush the 10 records anyway)
            reader = ParallelReader("train", sm_input_dir=str(root), workers=1, tuning=Tuning(chunk_groups=64))
            it = iter(reader)
            got.append(next(it))
            first_at = time.time()
            got += [next(it) for _ in range(9)]
            # the last record came with the writer's last bytes: let it note that before it is stopped
            wait_until(lambda: (tmp_path / "written").exists(), 30, "the writer's flag file")
            t1 = time.monotonic()
            reader.close()
            close_took = time.monotonic() - t1
            del it
    finally:
        if reader is not None:
            reader.close()
        finish(wproc)
    # the first sample came when the stream stalled at the latest (mostly it comes before: each read
    # that would block flushes), not when 64 groups or EOF came
    written = tmp_path / "written"
    assert written.exists(), "the writer did not get to the stall"
    first_after = first_at - written.stat().st_mtime
    assert first_after < 30, f"the first sample came {first_after:.1f} s after the stream stalled"
    assert got == recs
    assert close_took < PROMPT_CLOSE


# -- 9. SIGTERM / SIGHUP to the whole process group ----------------------------------------------------------

@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_09_signal_to_the_process_group(tmp_path, stream, sig):
    path, _, _ = stream
    script = write_script(tmp_path, "consumer.py", f"""
        from pipeline_helpers import Sleepy
        r = ParallelReader({str(path)!r}, fields=Sleepy(20.0), workers=2, batch_size=4)
        it = iter(r)
        next(it)
        print("pids", r._res.prefix, r._res.run.reader.pid, *r.worker_pids, flush=True)
        for _ in it:
            pass
        time.sleep(60)  # until the signal
        """)
    proc = start(script, start_new_session=True)
    lines = Lines(proc.stdout)
    prefix, pids, left = None, [], None
    try:
        first = lines.wait_for("pids", 60)
        assert first is not None, f"the consumer printed nothing: {lines.seen}"
        prefix, pids = parse_pids(first)
        # every child still running has its SIGTERM/SIGHUP handler (the one that sweeps): a decoder
        # process still starting would just die of the signal, and the test would not test it
        wait_until(lambda: all(catches(p, signal.SIGTERM, signal.SIGHUP) for p in alive(pids)),
                   what="the children to install their SIGTERM/SIGHUP handlers")
        os.killpg(proc.pid, sig)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            pass
        left = wait_gone(pids + [proc.pid], prefix, timeout=30)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        finish(proc)
        kill_quietly(pids)
        if prefix:
            sweep(prefix)
    assert left == ([], [])


# -- 10. os.fork() in the consumer ---------------------------------------------------------------------------

@pytest.mark.parametrize("workers", [0, 2])
def test_10_a_forked_child_that_reads_the_parents_reader_is_told_so(tmp_path, workers):
    """A child of os.fork() that went on iterating the parent's pass got the samples decoded already (685,
    with workers), then 'ended by close() or by a new iteration' -- which it never did -- and with
    workers=0 read the rest of the parent's file itself; a new pass said 'closed'.  Both name the fork
    now, at once, and the parent's pass stays whole (audit)."""
    recs = payloads(3000, seed=12)
    path = tmp_path / "f.rec"
    write_rec(path, recs)
    r, w = os.pipe()
    with ParallelReader(str(path), fields=Raw(), workers=workers) as reader:
        it = iter(reader)
        got = [bytes(next(it)) for _ in range(500)]
        pid = os.fork()
        if pid == 0:  # the child: report both errors through the pipe, never return into pytest
            try:
                said = []
                for attempt in (lambda: next(it), lambda: list(reader)):
                    try:
                        attempt()
                        said.append("no error")
                    except PipelineError as exc:
                        said.append(str(exc))
                os.write(w, json.dumps(said).encode())
            finally:
                os._exit(0)
        os.close(w)
        with os.fdopen(r) as f:
            said = json.loads(f.read())
        os.waitpid(pid, 0)
        got += [bytes(x) for x in it]
    assert got == recs
    why = (f"the ParallelReader was made in process {os.getpid()}, and this process ({pid}) is the child of an "
           f"os.fork() of it: only the process that made a reader reads it; make a new ParallelReader in this "
           f"process")
    assert said == [why, "this ParallelReader is closed: " + why]


def test_10_forked_child_that_exits_does_not_disturb_the_pass(tmp_path):
    path = tmp_path / "long.rec"
    write_rec(path, payloads(2000, seed=10, max_len=2000))  # ~2 MB through a 64 KiB ring: the reader
    script = write_script(tmp_path, "consumer.py", f"""     # is still at work when the consumer forks
        import numpy as np
        from pipeline_helpers import Sleepy, digest_array, payloads
        recs = payloads(2000, seed=10, max_len=2000)
        r = ParallelReader({str(path)!r}, fields=Sleepy(2.0), workers=2, batch_size=10, tuning=Tuning(ring_bytes=1 << 16))
        out = []
        try:
            for i, b in enumerate(r):
                out.append(b.copy())
                if i == 0:
                    print("pids", r._res.prefix, r._res.run.reader.pid, *r.worker_pids, flush=True)
                if i == 3:
                    print("reader-alive", r._res.run.reader.is_alive(), flush=True)
                    sys.stdout.flush()
                    sys.stderr.flush()
                    pid = os.fork()
                    if pid == 0:
                        sys.exit(0)  # a child that does nothing
                    os.waitpid(pid, 0)
        except Exception as exc:
            print("error", type(exc).__name__, str(exc).replace(chr(10), " "), flush=True)
        r.close()
        got = np.concatenate(out) if out else np.zeros((0, 4, 3), np.uint8)
        exact = got.shape[0] == len(recs) and np.array_equal(got, np.stack([digest_array(x) for x in recs]))
        print("done", got.shape[0], exact, flush=True)
        """)
    proc = start(script)
    lines = Lines(proc.stdout)
    prefix, pids, done, left = None, [], None, None
    try:
        first = lines.wait_for("pids", 60)
        assert first is not None, f"the consumer printed nothing: {lines.seen}"
        prefix, pids = parse_pids(first)
        done = lines.wait_for("done", 60)
        proc.wait(10)
        left = wait_gone(pids, prefix)
    finally:
        finish(proc)
        kill_quietly(pids)
        if prefix:
            sweep(prefix)
    assert "reader-alive True" in lines.seen  # the fork happened while the reader process was at work
    assert done == "done 2000 True", lines.seen
    assert left == ([], [])


def test_10_killed_consumer_with_a_live_forked_child(tmp_path, stream):
    path, _, _ = stream
    script = write_script(tmp_path, "consumer.py", f"""
        from pipeline_helpers import Sleepy
        r = ParallelReader({str(path)!r}, fields=Sleepy(20.0), workers=2, batch_size=4)
        it = iter(r)
        next(it)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            open({str(tmp_path / "in-child")!r}, "w").close()  # past os.fork(): its after-fork clean-up ran
            time.sleep(60)  # a child that lives on
            os._exit(0)
        print("pids", r._res.prefix, r._res.run.reader.pid, *r.worker_pids, flush=True)
        print("child", pid, flush=True)
        next(it)
        print("parked", flush=True)
        time.sleep(60)  # until the test kills it
        """)
    proc = start(script)
    lines = Lines(proc.stdout)
    prefix, pids, child, left, child_alive = None, [], None, None, None
    try:
        first, child_line, parked = wait_lines(lines, "pids", "child", "parked")
        assert None not in (first, child_line, parked), f"the consumer printed: {lines.seen}"
        prefix, pids = parse_pids(first)
        child = int(child_line.split()[1])
        wait_until((tmp_path / "in-child").exists, what="the forked child to run")
        proc.kill()
        proc.wait(10)
        left = wait_gone(pids, prefix)
        child_alive = alive([child])
    finally:
        finish(proc)
        kill_quietly(pids + ([child] if child else []))
        if prefix:
            sweep(prefix)
    assert child_alive == [child]  # the forked child still lived while the pipeline was checked
    assert left == ([], [])


@pytest.mark.parametrize("where", ["workers", "reader"])
def test_ctrl_c_inside_close_still_removes_the_shared_memory(stream, no_leaks, monkeypatch, where):
    """Ctrl-C that lands in close() while it waits for the processes to stop: close() raises the
    KeyboardInterrupt, but the ring, the output slots and the pairs board are gone, and the processes
    end (the lifeline).  close() marked the reader closed first and stopped at the interrupt: nothing
    ever removed the segments (a second close() returned at once; found by an outside audit)."""
    path, recs, _ = stream
    reader = ParallelReader(path, fields=Fixed(), workers=2, batch_size=8)
    it = iter(reader)
    next(it)
    mine = set(leftover(f"parrecio-{os.getpid()}-"))
    assert any(n.endswith("ring") for n in mine) and any(n.endswith("pairs") for n in mine)
    if where == "reader":  # the pass's reader process, stopped by the run's abort
        from parrecio.pipeline import reader_handle as target
        cls, name = target.ReaderHandle, "stop"
    else:
        cls, name = multiprocessing.process.BaseProcess, "join"
    original = getattr(cls, name)
    calls = []

    def interrupted(self, *args, **kwargs):
        if not calls:
            calls.append(1)
            raise KeyboardInterrupt
        return original(self, *args, **kwargs)
    monkeypatch.setattr(cls, name, interrupted)
    with pytest.raises(KeyboardInterrupt):
        reader.close()
    monkeypatch.setattr(cls, name, original)
    assert calls and set(leftover(f"parrecio-{os.getpid()}-")) & mine == set()
    reader.close()  # (idempotent)
    del it


def test_the_shared_memory_names_are_gone_before_the_processes_stop(stream, no_leaks, monkeypatch):
    """close() stopped (and joined) the processes first and removed the shared memory after: a SIGKILL in
    between, with the children gone and nothing left to sweep, left 250-380 MB in /dev/shm.  The names go
    first (the mappings stay valid); until the processes have stopped, they sweep after a dead consumer."""
    from parrecio.pipeline.resources import Resources
    path, recs, _ = stream
    reader = ParallelReader(path, fields=Fixed(), workers=2, batch_size=8)
    it = iter(reader)
    next(it)
    mine = f"parrecio-{os.getpid()}-"
    assert any(n.endswith("ring") for n in leftover(mine))
    seen = []
    original = Resources._close_processes

    def stopping(self):
        seen.append(sorted(leftover(mine)))
        return original(self)
    monkeypatch.setattr(Resources, "_close_processes", stopping)
    reader.close()
    del it
    assert seen == [[]]  # (before: the ring, the slots and the pairs board, still named)


LATE_WORKERS = textwrap.dedent("""\
    import os, sys, tempfile
    from parrecio import ParallelReader, RecordWriter, Tuning
    if __name__ == "__main__":
        d = tempfile.mkdtemp()
        path = os.path.join(d, "x.rec")
        with RecordWriter(path) as w:
            for i in range(3):
                w.write(b"%d" % i)
        for _ in range(3):  # a pass of 3 records is over before the last of 4 spawned workers has started
            with ParallelReader(path, fields=lambda p: bytes(p), workers=4, tuning=Tuning(start_method="spawn")) as r:
                assert list(r) == [b"0", b"1", b"2"]
        print("ok")
    """)


def test_a_worker_that_starts_after_close_leaves_quietly(tmp_path):
    """close() removes the shared memory's names before it stops the processes: a decoder process still
    starting then found no ring and died with a traceback on stderr (3 of 3 readers here)."""
    script = tmp_path / "late.py"
    script.write_text(LATE_WORKERS)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0 and proc.stdout.split() == ["ok"], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]


# -- 11. threads ----------------------------------------------------------------------------------------------

def test_11_close_from_another_thread_ends_the_pass(stream, no_leaks):
    path, recs, _ = stream
    reader = ParallelReader(path, fields=Sleepy(40.0), workers=2, batch_size=4)
    go = threading.Event()
    closed = {}

    def closer():
        go.wait(60)
        t0 = time.monotonic()
        try:
            reader.close()
        except BaseException as exc:  # noqa: B902 - reported below
            closed["exc"] = exc
        closed["took"] = time.monotonic() - t0

    th = threading.Thread(target=closer, daemon=True)
    th.start()
    got, err = [], None
    try:
        with deadline(30):
            try:
                for i, b in enumerate(reader):
                    got.append(b.copy())
                    if i == 2:
                        go.set()
            except Exception as exc:
                err = exc
    finally:
        go.set()
        th.join(30)
        reader.close()
    assert not th.is_alive(), "close() from the other thread did not return within 30 s"
    assert "exc" not in closed, repr(closed.get("exc"))
    assert closed["took"] < PROMPT_CLOSE
    assert isinstance(err, PipelineError), repr(err)
    assert "ended by close()" in str(err) and "reader process died" not in str(err)
    assert 3 <= len(got) < 75
    assert all(np.array_equal(b, np.stack([digest_array(r) for r in recs[4 * k:4 * k + 4]]))
               for k, b in enumerate(got))


def test_11_two_threads_iterating_one_reader(stream, no_leaks):
    path, recs, _ = stream
    expected = np.stack([digest_array(r) for r in recs])
    reader = ParallelReader(path, fields=Sleepy(10.0), workers=2, batch_size=10)
    barrier = threading.Barrier(2)
    results = {}

    def consume(name):
        out = []
        try:
            barrier.wait(30)
            for b in reader:
                out.append(b.copy())
        except BaseException as exc:  # noqa: B902 - reported below
            results[name] = ("error", exc, out)
        else:
            results[name] = ("done", None, out)

    threads = [threading.Thread(target=consume, args=(n,), daemon=True) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    hung = [t.name for t in threads if t.is_alive()]
    reader.close()
    for t in threads:
        t.join(10)
    assert hung == []
    kinds = sorted(r[0] for r in results.values())
    assert kinds == ["done", "error"], {k: (r[0], repr(r[1])) for k, r in results.items()}
    [(_, err, _)] = [r for r in results.values() if r[0] == "error"]
    [(_, _, out)] = [r for r in results.values() if r[0] == "done"]
    assert isinstance(err, PipelineError) and "another thread" in str(err), repr(err)
    got = np.concatenate(out)
    assert got.shape == expected.shape and np.array_equal(got, expected)


# -- 12. killed while waiting for a Pipe-mode FIFO -------------------------------------------------------------

@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_12_killed_while_waiting_for_the_pipe_mode_fifo(tmp_path, sig):
    root = tmp_path / "sm"
    write_config(root, {"train": PIPE_RECORDIO})  # and no train_0 FIFO at all
    script = write_script(tmp_path, "consumer.py", f"""
        r = ParallelReader("train", sm_input_dir={str(root)!r}, workers=1)
        it = iter(r)
        print("pids", r._res.prefix, r._res.run.reader.pid, flush=True)
        next(it)
        """)
    proc = start(script, cwd=str(tmp_path))
    lines = Lines(proc.stdout)
    prefix, pids, left = None, [], None
    try:
        first = lines.wait_for("pids", 60)
        assert first is not None, f"the consumer printed nothing: {lines.seen}"
        prefix, pids = parse_pids(first)
        # the reader process is past its start (its handlers are in) and asleep in its wait for the FIFO
        wait_until(lambda: catches(pids[0], signal.SIGTERM) and is_blocked(pids[0]),
                   what="the reader process to wait for the FIFO")
        proc.send_signal(sig)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            pass
        left = wait_gone(pids + [proc.pid], prefix, timeout=30)
    finally:
        finish(proc)
        kill_quietly(pids)
        if prefix:
            sweep(prefix)
    assert left == ([], [])


# -- 13. a script piped to python's stdin ----------------------------------------------------------------------

def _stdin_script(reader_args: str, decoder_class: bool = False) -> str:
    return textwrap.dedent(f"""\
        import os, shutil, sys, tempfile, time
        sys.path.insert(0, {HERE!r})
        from parrecio import ParallelReader, Tuning
        from pipeline_helpers import Fixed, payloads, write_rec
        """) + (textwrap.dedent("""\
        class MyDecoder:
            def __call__(self, payload):
                return bytes(payload)
        """) if decoder_class else "") + textwrap.dedent(f"""\
        d = tempfile.mkdtemp()
        try:
            path = os.path.join(d, "s.rec")
            write_rec(path, payloads(50, seed=13))
            try:
                t0 = time.monotonic()
                with ParallelReader(path, workers=2{reader_args}) as r:
                    n = sum(1 for _ in r)
                print("count", n, os.getpid(), round(time.monotonic() - t0, 3), flush=True)
            except Exception as exc:
                print("error", type(exc).__name__, str(exc).replace(chr(10), " "), flush=True)
        finally:
            shutil.rmtree(d)
        """)


@pytest.mark.parametrize("fields", ["", ", fields=Fixed()"], ids=["raw", "fixed"])
@pytest.mark.parametrize("method", ["", ", tuning=Tuning(start_method='spawn')"], ids=["default", "spawn"])
def test_13_script_piped_to_stdin(method, fields):
    proc = subprocess.run([sys.executable, "-"], input=_stdin_script(method + fields), text=True,
                          capture_output=True, timeout=90)
    assert proc.returncode == 0, proc.stderr[-3000:]
    words = proc.stdout.split()
    assert words[:2] == ["count", "50"], (proc.stdout, proc.stderr[-3000:])
    assert leftover(f"parrecio-{words[2]}-") == []


@pytest.mark.parametrize("how", ["stdin", "-c"])
def test_13_decoder_defined_in_a_file_less_main_travels_by_value(how):
    """Once refused (a TypeError naming __main__), such a decoder is now shipped by value (cloudpickle)."""
    script = _stdin_script(", fields=MyDecoder(), tuning=Tuning(start_method='spawn')", decoder_class=True)
    if how == "stdin":
        proc = subprocess.run([sys.executable, "-"], input=script, text=True, capture_output=True, timeout=90)
    else:  # python -c: no __main__.__file__ at all (what a notebook cell has too)
        proc = subprocess.run([sys.executable, "-c", script], text=True, capture_output=True, timeout=90)
    words = proc.stdout.split()
    assert words[:2] == ["count", "50"], (proc.stdout, proc.stderr[-3000:])
    # the reader's own time (two spawned workers, 50 samples), not the interpreter's start: no worker
    # that dies at start again and again before the pass gets going
    assert float(words[3]) < 45, proc.stderr[-3000:]


# -- 15. tuning values validated up front ----------------------------------------------------------------------

BAD_VALUES = [("prefetch", 0), ("slot_samples", 0), ("ring_bytes", 10), ("chunk_groups", 0),
              ("task_timeout", 0), ("shuffle_buffer", 0), ("max_record_bytes", 0),
              ("workers", -1), ("batch_size", 0), ("batch_size", True)]


@pytest.mark.parametrize("name, value", BAD_VALUES, ids=[f"{n}={v!r}" for n, v in BAD_VALUES])
def test_15_tuning_values_are_validated(stream, no_leaks, name, value):
    from parrecio.pipeline.tuning import TUNING_KEYWORDS
    path, _, _ = stream
    expected = TypeError if value is True else ValueError
    reader = None
    try:
        with pytest.raises(expected) as ei:  # a Tuning checks its values when it is made
            kw = {"tuning": Tuning(**{name: value})} if name in TUNING_KEYWORDS else {name: value}
            if name == "shuffle_buffer":
                kw["shuffle"] = True
            reader = ParallelReader(path, **kw)
    finally:
        if reader is not None:
            reader.close()
    assert name in str(ei.value)


def test_15_validation_comes_before_stdin_is_duplicated(no_leaks):
    gc.collect()
    before = open_fds()
    with pytest.raises(ValueError) as ei:
        ParallelReader("-", tuning=Tuning(prefetch=0))
    after = open_fds()
    assert "prefetch" in str(ei.value)
    assert after == before


# -- 16. the reader process fails to start ------------------------------------------------------------------

def _fd_table():
    out = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            out[int(fd)] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass
    return out


def test_16_reader_process_that_fails_to_start_leaks_no_fd(stream, monkeypatch, no_leaks):
    from multiprocessing import forkserver
    path, _, _ = stream
    cls = multiprocessing.get_context("forkserver").Process
    original = cls.start

    def failing_start(self):
        if self.name == "parrecio-reader":
            raise OSError("boom")
        return original(self)

    monkeypatch.setattr(cls, "start", failing_start)
    forkserver.ensure_running()  # the forkserver's own descriptors are there before and after
    gc.collect()
    before = _fd_table()
    reader = ParallelReader(path, fields=Fixed(), workers=1)
    err = None
    try:
        with deadline(30):
            for _ in reader:
                pass
    except Exception as exc:
        err = f"{type(exc).__name__}: {exc}"
        ok = isinstance(exc, (OSError, PipelineError)) and not isinstance(exc, TimeoutError)
        held = exc  # its traceback keeps the failed start's frames (and any pipe left open there) alive
    else:
        ok, held = False, None
    reader.close()
    after = _fd_table()
    del held
    assert ok, err
    extra = {fd: t for fd, t in after.items() if before.get(fd) != t}
    assert len(after) == len(before) and extra == {}


# -- 17. seeding, and counting what happens to workers --------------------------------------------------------

def _probe(path, seed, kill_at=None):
    """Run SeedProbe over ``path``: ({pid: [(random, np.random), ...] in order}, first pids, last pids,
    samples, workers_replaced, killed pid)."""
    by_pid = defaultdict(list)
    n, killed, first = 0, None, []
    with deadline(60):
        with ParallelReader(path, fields=SeedProbe(0.003), workers=2, seed=seed, tuning=Tuning(chunk_groups=1)) as reader:
            for i, (pid, a, b) in enumerate(reader):
                if i == 0:
                    first = list(reader.worker_pids)
                by_pid[pid].append((a, b))
                n += 1
                if kill_at is not None and i == kill_at:
                    killed = first[0]
                    os.kill(killed, signal.SIGKILL)
            last = list(reader.worker_pids)
            replaced = reader.stats.workers_replaced
    return by_pid, first, last, n, replaced, killed


def _values(seq):
    return {a for a, _ in seq}, {b for _, b in seq}


def _disjoint(s1, s2):
    (a1, b1), (a2, b2) = _values(s1), _values(s2)
    return not (a1 & a2) and not (b1 & b2)


@pytest.fixture(scope="module")
def probe_stream(tmp_path_factory):
    path = tmp_path_factory.mktemp("seed") / "p.rec"
    write_rec(path, payloads(200, seed=17))
    return path


def test_17_two_workers_draw_different_random_streams(probe_stream, no_leaks):
    by_pid, first, last, n, replaced, _ = _probe(probe_stream, 5)
    assert n == 200 and replaced == 0 and first == last
    assert sorted(by_pid) == sorted(first)
    assert all(len(by_pid[p]) >= 5 for p in first)
    assert _disjoint(by_pid[first[0]], by_pid[first[1]])


def test_17_replacement_worker_does_not_replay_the_dead_workers_stream(probe_stream, no_leaks):
    by_pid, first, last, n, replaced, killed = _probe(probe_stream, 5, kill_at=20)
    assert n == 200 and replaced == 1
    [new] = [p for p in last if p not in first]
    assert killed in by_pid and new in by_pid
    assert _disjoint(by_pid[new], by_pid[killed]), "the replacement replays the dead worker's random stream"


def test_17_random_and_numpy_random_draw_different_streams(probe_stream, no_leaks):
    """Both are MT19937 seeded by init_by_array: given the same 256 bits, random.random() equalled
    np.random.random() at every draw (a decoder's flip and its noise perfectly correlated)."""
    by_pid, first, _, n, _, _ = _probe(probe_stream, 5)
    assert n == 200
    for p in first:
        a, b = _values(by_pid[p])
        assert not (a & b), "random and numpy.random draw the same stream"


def test_17_seeds_5_and_6_share_no_stream(probe_stream, no_leaks):
    run5, w5, _, n5, _, _ = _probe(probe_stream, 5)
    run6, w6, _, n6, _, _ = _probe(probe_stream, 6)
    assert n5 == n6 == 200
    shared = [(i, j) for i, p in enumerate(w5) for j, q in enumerate(w6) if not _disjoint(run5[p], run6[q])]
    assert shared == [], "(worker of seed 5, worker of seed 6) pairs that draw the same stream"


def test_17_no_progress_warning_once_per_killed_worker(tmp_path, no_leaks, caplog):
    recs = payloads(60, seed=17)
    recs[42] = b"HANG" + recs[42]
    path = tmp_path / "h.rec"
    offsets = write_rec(path, recs)
    with caplog.at_level(logging.WARNING, logger="parrecio"):
        with deadline(60):
            with ParallelReader(path, fields=HangOn(b"HANG"), workers=2, tuning=Tuning(task_timeout=0.5)) as reader:
                with pytest.raises(DecodeError) as ei:
                    for _ in reader:
                        pass
                replaced = reader.stats.workers_replaced
    warnings = [r.getMessage() for r in caplog.records if "made no progress" in r.getMessage()]
    assert (ei.value.index, ei.value.offset) == (42, offsets[42])
    assert replaced >= 2
    assert len(warnings) == replaced, warnings


def test_17_poison_record_replaces_exactly_two_workers(tmp_path, no_leaks):
    recs = payloads(120, seed=171)
    recs[50] = b"POISON" + recs[50]
    path = tmp_path / "p.rec"
    offsets = write_rec(path, recs)
    got = []
    with deadline(60):
        with ParallelReader(path, fields=KillOn(b"POISON"), workers=2) as reader:
            with pytest.raises(DecodeError) as ei:
                for s in reader:
                    got.append(s)
            replaced = reader.stats.workers_replaced
    assert (ei.value.index, ei.value.offset) == (50, offsets[50])
    assert len(got) == 50 and all(np.array_equal(a, digest_array(r)) for a, r in zip(got, recs))
    assert replaced == 2
