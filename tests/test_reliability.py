"""Faults injected for real: killed workers, poison records, a killed consumer, Ctrl-C, stalled
sources.  Each compares the output with an undisturbed run and checks processes and /dev/shm after."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from parrecio import DecodeError, ParallelReader, Tuning
from parrecio.pipeline.shm import leftover
from pipeline_helpers import (Fixed, KillOn, KillOnceOn, KillOnceSlowStart, Sleepy, digest_array, is_blocked,
                              payloads, wait_until, write_rec)
from round2_helpers import Lines, alive, wait_gone
from test_pipeline import flatten

HERE = os.path.dirname(os.path.abspath(__file__))

# A close() that is prompt takes well under a second, a few on a loaded 2-core machine; the slowest
# bounded way out that is no hang (close() waiting 10 s for the iterating thread) takes longer.
PROMPT_CLOSE = 8.0


@pytest.fixture(scope="module")
def stream(tmp_path_factory):
    recs = payloads(300, seed=7)
    path = tmp_path_factory.mktemp("rel") / "s.rec"
    offsets = write_rec(path, recs)
    return path, recs, offsets


def test_killed_worker_is_replaced_and_its_groups_rerun(stream, no_leaks):
    path, recs, _ = stream
    expected = [digest_array(r) for r in recs]
    out = []
    with ParallelReader(path, fields=Sleepy(4.0), workers=2, batch_size=10, tuning=Tuning(chunk_groups=8)) as reader:
        for i, batch in enumerate(reader):
            out.append(batch.copy())
            if i in (3, 12):
                victim = reader.worker_pids[i % 2]
                os.kill(victim, signal.SIGKILL)
                wait_until(lambda: not alive([victim]), what=f"the killed worker {victim} to die")
        assert reader.stats.workers_replaced >= 2
        assert len(reader.worker_pids) == 2 and victim not in reader.worker_pids
    got = flatten(out)
    assert len(got) == len(expected)
    assert all(np.array_equal(a, b) for a, b in zip(got, expected))


def test_worker_killed_once_by_a_record_rerun_identically(stream, tmp_path, no_leaks):
    path, recs, _ = stream
    marked = list(recs)
    marked[123] = b"OOM!" + recs[123]
    p2 = tmp_path / "m.rec"
    write_rec(p2, marked)
    # prefetch=1: a worker holds one task at a time, so its death orphans exactly one task (with more, a
    # task queued behind the fatal one is orphaned too or not, by timing).  One death, one replacement,
    # one orphaned task (re-run as one isolated task per group: those are not counted as reruns).
    with ParallelReader(p2, fields=KillOnceOn(b"OOM!", str(tmp_path / "flag")), workers=2,
                        batch_size=16, tuning=Tuning(prefetch=1)) as reader:
        got = flatten(list(reader))
        assert (reader.stats.workers_replaced, reader.stats.reruns) == (1, 1)
    assert all(np.array_equal(a, digest_array(r)) for a, r in zip(got, marked))
    assert len(got) == len(marked)


class KillOnceOnEach(Fixed):
    """SIGKILLs its process the first time it meets each of ``markers`` (flag files remember): two kills
    from outside, as an OOM killer that strikes twice within a second."""

    def __init__(self, markers, flag_dir: str):
        super().__init__()
        self.markers, self.flag_dir = markers, flag_dir

    def decode_into(self, payload, out):
        for i, marker in enumerate(self.markers):
            flag = os.path.join(self.flag_dir, f"killed-{i}")
            if bytes(payload[:len(marker)]) == marker and not os.path.exists(flag):
                open(flag, "w").close()
                os.kill(os.getpid(), signal.SIGKILL)
        super().decode_into(payload, out)


@pytest.mark.parametrize("batch_size", [None, 16])
def test_a_second_death_in_the_reruns_of_a_dead_workers_task_is_no_poison_verdict(stream, tmp_path, batch_size,
                                                                                    no_leaks):
    """The worker dies on record 120; the worker that re-runs record 125 alone dies too (each once).
    Every group of the first task counted as having killed a worker, so the second death made record 125
    a poison record ("died twice while decoding this sample"), lost.  A worker keeps the group it decodes
    on the progress board, and only that one is suspected."""
    path, recs, _ = stream
    marked = list(recs)
    marked[120] = b"KIL1" + recs[120]
    marked[125] = b"KIL2" + recs[125]
    p2 = tmp_path / "m.rec"
    write_rec(p2, marked)
    with ParallelReader(p2, fields=KillOnceOnEach([b"KIL1", b"KIL2"], str(tmp_path)), workers=2,
                        batch_size=batch_size) as reader:
        got = flatten(list(reader)) if batch_size else [s.copy() for s in reader]
        assert (reader.stats.workers_replaced, reader.stats.skipped) == (2, 0)
    assert len(got) == len(marked)
    assert all(np.array_equal(a, digest_array(r)) for a, r in zip(got, marked))


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_a_replacement_killed_before_it_takes_a_rerun_is_no_poison_verdict(stream, tmp_path, method, no_leaks):
    """The worker dies on record 123 (once); its replacement is killed from outside while it still loads
    its decoders, with the first group of the orphaned task queued to it: that death says nothing of the
    group, which was taken for a poison record ("died twice while decoding this sample") and lost.  A
    worker now says when it takes an isolated re-run; one it never took is re-run again."""
    path, recs, _ = stream
    marked = list(recs)
    marked[123] = b"OOM!" + recs[123]
    p2 = tmp_path / "m.rec"
    write_rec(p2, marked)
    flag = str(tmp_path / "flag")
    killed: list = []
    with ParallelReader(p2, fields=KillOnceSlowStart(b"OOM!", flag, 1.5), workers=1, batch_size=16,
                        tuning=Tuning(prefetch=1, start_method=method)) as reader:
        def kill_the_replacement(first: int) -> None:
            wait_until(lambda: os.path.exists(flag), what="the worker to die on record 123")
            wait_until(lambda: reader.worker_pids and reader.worker_pids[0] != first, what="a replacement")
            time.sleep(0.3)  # (well inside its 1.5 s start)
            victim = reader.worker_pids[0]
            os.kill(victim, signal.SIGKILL)
            killed.append(victim)
        out, killer = [], None
        for batch in reader:
            out.append(batch.copy())
            if killer is None:
                killer = threading.Thread(target=kill_the_replacement, args=(reader.worker_pids[0],))
                killer.start()
        killer.join(30)
        assert len(killed) == 1 and reader.stats.workers_replaced == 2 and reader.stats.skipped == 0
    got = flatten(out)
    assert len(got) == len(marked)
    assert all(np.array_equal(a, digest_array(r)) for a, r in zip(got, marked))


def test_poison_record_becomes_a_decode_error(stream, tmp_path, no_leaks):
    path, recs, _ = stream
    marked = list(recs)
    marked[200] = b"POISON" + recs[200]
    p2 = tmp_path / "p.rec"
    offsets = write_rec(p2, marked)
    got = []
    with ParallelReader(p2, fields=KillOn(b"POISON"), workers=2) as reader:
        with pytest.raises(DecodeError) as ei:
            for s in reader:
                got.append(s)
        # Two deaths, two replacements: the worker running the poison group's chunk, then the one running
        # that group alone.  reruns counts orphaned tasks: the second death orphans exactly one (an isolated
        # task runs alone on its worker); the first orphans the fatal task plus, by timing, the task queued
        # behind it (prefetch=2).  The skip run below has prefetch=1, where the count is exact.
        assert reader.stats.workers_replaced == 2
        assert 2 <= reader.stats.reruns <= 3
    assert len(got) == 200
    assert (ei.value.index, ei.value.offset) == (200, offsets[200])
    # (how it died, in the error itself: it was only in the warnings logged)
    assert "died twice while decoding this sample, killed by SIGKILL the second time" in str(ei.value)
    with ParallelReader(p2, fields=KillOn(b"POISON"), workers=2, on_error="skip", batch_size=50,
                        tuning=Tuning(prefetch=1)) as reader:
        got = flatten(list(reader))
        assert (reader.stats.skipped, reader.stats.workers_replaced, reader.stats.reruns) == (1, 2, 2)
    assert len(got) == 299
    assert all(np.array_equal(a, digest_array(r)) for a, r in zip(got, marked[:200] + marked[201:]))


def _script(body: str) -> str:
    return textwrap.dedent(f"""
        import os, sys, time, signal
        # SIGINT raises KeyboardInterrupt, SIGTERM and SIGHUP kill, whatever dispositions the test run was
        # started with (nohup ignores SIGHUP; a background job of a non-interactive shell ignores SIGINT)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        sys.path.insert(0, {HERE!r})
        from parrecio import ParallelReader
        from pipeline_helpers import Sleepy
        if __name__ == "__main__":
        """) + textwrap.indent(textwrap.dedent(body), "    ")


def test_killed_consumer_leaves_nothing_behind(stream):
    path, _, _ = stream
    proc = subprocess.Popen([sys.executable, "-c", _script(f"""
        r = ParallelReader({str(path)!r}, fields=Sleepy(20.0), workers=2, batch_size=4)
        it = iter(r)
        next(it)
        print("pids", r._res.prefix, r._res.run.reader.pid, *r.worker_pids, flush=True)
        time.sleep(60)  # until the test kills it
        """)], stdout=subprocess.PIPE, text=True)
    try:
        line = Lines(proc.stdout).wait_for("pids", 60)
        assert line is not None, "the consumer printed nothing within 60 s"
        prefix, pids = line.split()[1], [int(p) for p in line.split()[2:]]
        assert leftover(prefix)
    finally:
        proc.kill()
        proc.wait()
    left, segs = wait_gone(pids, prefix, timeout=30)
    assert left == [] and segs == []


def test_ctrl_c_on_a_stalled_fifo_returns_promptly(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    proc = subprocess.Popen([sys.executable, "-c", _script(f"""
        r = ParallelReader({str(fifo)!r}, workers=1)
        it = iter(r)
        try:
            print("pids", r._res.prefix, r._res.run.reader.pid, flush=True)
            next(it)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            r.close()
        """)], stdout=subprocess.PIPE, text=True)
    lines = Lines(proc.stdout)
    writer = None
    try:
        def open_writer():  # a writer that never writes (the stream stalls), once the reader opened it
            try:
                return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:  # ENXIO: no reader has the FIFO open yet
                return None
        writer = wait_until(open_writer, what="the reader process to open the FIFO")
        line = lines.wait_for("pids", 60)
        assert line is not None, f"the consumer printed nothing: {lines.seen}"
        prefix, reader_pid = line.split()[1:]
        wait_until(lambda: is_blocked(proc.pid), what="the consumer to block in next() on the stalled FIFO")
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        assert lines.wait_for("interrupted", 60) is not None, lines.seen
        proc.wait(60)
        took = time.monotonic() - t0
        assert took < PROMPT_CLOSE, f"Ctrl-C, close() and exit took {took:.1f} s"
    finally:
        if writer is not None:
            os.close(writer)
        proc.kill()
        proc.wait()
    left, segs = wait_gone([int(reader_pid)], prefix, timeout=30)
    assert left == [] and segs == []


def test_close_returns_promptly_while_the_source_stalls(tmp_path, no_leaks):
    recs = payloads(20, seed=9)
    src = tmp_path / "src.rec"
    write_rec(src, recs)
    data = open(src, "rb").read()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    proc = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\n"
        "with open(sys.argv[1], 'wb', buffering=0) as f:\n"
        "    f.write(sys.stdin.buffer.read()); time.sleep(60)\n"), str(fifo)], stdin=subprocess.PIPE)  # then stalls
    proc.stdin.write(data[: len(data) // 2])
    proc.stdin.close()
    try:
        reader = ParallelReader(str(fifo), workers=1)
        it = iter(reader)
        assert next(it) == recs[0]
        t0 = time.monotonic()
        reader.close()
        assert time.monotonic() - t0 < PROMPT_CLOSE
        del it
    finally:
        proc.kill()
        proc.wait()


def test_reader_process_death_is_reported(tmp_path, no_leaks):
    from parrecio import PipelineError
    path = tmp_path / "big.rec"
    write_rec(path, payloads(300, seed=2, max_len=4000))  # ~600 KB: the reader waits on a 64 KB ring
    with ParallelReader(path, fields=Sleepy(20.0), workers=1, batch_size=2, tuning=Tuning(ring_bytes=1 << 16)) as reader:
        it = iter(reader)
        next(it)
        os.kill(reader._res.run.reader.pid, signal.SIGKILL)
        with pytest.raises(PipelineError, match="reader process died.*SIGKILL"):
            for _ in it:
                pass


def test_reader_that_fails_before_it_can_read_says_why(tmp_path, no_leaks):
    """The reader process's first step, attaching the input ring, fails (here: a ring that does not
    exist).  It reports the error as its ReaderEnd, so the consumer raises what failed instead of "the
    reader process died (exit code 0)"; nothing is sent when the consumer is gone (its pipe broken).
    reader_main runs in this process, on real pipes."""
    import multiprocessing
    from parrecio.pipeline.messages import ReaderEnd, RemoteError
    from parrecio.pipeline.reader_proc import ReaderJob, reader_main
    path = tmp_path / "s.rec"
    write_rec(path, payloads(10, seed=3))
    with ParallelReader(path, workers=1) as reader:
        cfg, source = reader._res.cfg, reader._res.source
        job = ReaderJob(source, 0, "parrecio-test-no-such-ring", "parrecio-test-no-such-", skip=7)
        data_r, data_w = multiprocessing.Pipe(duplex=False)
        ctrl_r, ctrl_w = multiprocessing.Pipe(duplex=False)
        life_r, life_w = multiprocessing.Pipe(duplex=False)  # life_w held: the consumer is alive
        try:
            reader_main(cfg, job, data_w, ctrl_r, life_r)
            assert data_r.poll(5.0)
            end = data_r.recv()
            assert isinstance(end, ReaderEnd) and end.n_groups == 7
            assert isinstance(end.error, RemoteError) and end.error.type_name == "FileNotFoundError"
            assert not data_r.poll(0.1)
            data_r.close()  # the consumer's end gone: nothing to say, and no error either
            reader_main(cfg, job, data_w, ctrl_r, life_r)
        finally:
            for c in (data_w, ctrl_r, ctrl_w, life_r, life_w):
                c.close()


def test_hanging_decoder_is_killed_and_its_sample_reported(stream, tmp_path, no_leaks):
    from pipeline_helpers import HangOn
    path, recs, _ = stream
    marked = list(recs[:60])
    marked[42] = b"HANG" + marked[42]
    p2 = tmp_path / "h.rec"
    offsets = write_rec(p2, marked)
    t0 = None
    got = []
    with ParallelReader(p2, fields=HangOn(b"HANG"), workers=2, tuning=Tuning(task_timeout=0.5)) as reader:
        with pytest.raises(DecodeError) as ei:
            for s in reader:
                if t0 is None:
                    t0 = time.monotonic()  # the workers are up: from here, two 0.5 s task timeouts
                got.append(s)
        took = time.monotonic() - t0
    assert (ei.value.index, ei.value.offset) == (42, offsets[42])
    assert len(got) == 42 and all(np.array_equal(a, digest_array(r)) for a, r in zip(got, marked))
    assert took < 30, f"the hanging decoder was given up on {took:.1f} s after the first sample (it sleeps 1 h)"
