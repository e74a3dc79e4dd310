"""The spare reader process (docs/ARCHITECTURE.md "Start-up"): once a pass's reader has ended, the next
pass's reader is ready and waits for its job, so that a short pass does not wait ~5-10 ms for a process
start: the same process when its pass ended cleanly (it is *kept*), else one started ahead.  What must
hold: every pass byte-exact and in order whether it got a spare or not, and whatever a kept process read
before (one-off segments, many ring wraps, several files, shuffled and resumed passes); a reader whose
pass failed or was stopped is not kept; a spare that died is replaced (also one killed as its pass
begins, before it took its job); one never used is stopped at
close; sources that cannot be sent to a waiting process (descriptors) get none; a spare whose consumer
dies exits too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import psutil

from parrecio import CorruptRecordError, ParallelReader, Tuning
from parrecio.pipeline.reader_link import Link
from parrecio.pipeline.messages import StreamStart
from parrecio.pipeline.wire import MessageReader
from pipeline_helpers import Fixed, deadline, digest_array, payloads, wait_until, write_rec

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SMALL = Tuning(ring_bytes=1 << 20)


@pytest.fixture
def stream(tmp_path):
    recs = payloads(600, seed=11, max_len=3000)
    path = tmp_path / "s.rec"
    write_rec(path, recs)
    return path, recs, np.stack([digest_array(r) for r in recs])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] != "Z"


@pytest.mark.parametrize("fields", ["raw", "fixed"])
def test_each_pass_after_the_first_is_read_by_the_spare_and_exact(stream, no_leaks, fields):
    path, recs, want = stream
    kw = dict(fields=None) if fields == "raw" else dict(fields=Fixed(), batch_size=16)
    with deadline(60), ParallelReader(path, workers=2, tuning=SMALL, **kw) as reader:
        res = reader._res
        for epoch in range(4):
            spare = res.spare
            assert (spare is None) == (epoch == 0)  # started at the end of the previous pass
            it = iter(reader)
            if spare is not None:
                assert res.run.reader_pid == spare.pid and res.spare is None
            got = list(it)
            if fields == "raw":
                assert got == recs
            else:
                assert np.concatenate(got).tobytes() == want.tobytes()
            assert res.spare is not None and _alive(res.spare.pid)
        last = res.spare.pid
    assert not _alive(last)  # an unused spare is stopped by close()


def test_a_spare_killed_while_it_waits_is_replaced(stream, no_leaks):
    path, recs, _ = stream
    with deadline(60), ParallelReader(path, fields=None, workers=1, tuning=SMALL) as reader:
        assert list(reader) == recs
        spare = reader._res.spare
        os.kill(spare.pid, signal.SIGKILL)
        wait_until(lambda: not spare.proc.is_alive(), what="the spare's death")
        assert list(reader) == recs  # a new reader process, started as usual
        assert reader._res.run is None or reader._res.run.reader_pid != spare.pid


@pytest.mark.parametrize("fields", ["raw", "fixed"])
def test_a_waiting_reader_killed_just_as_its_pass_begins_is_replaced(stream, no_leaks, fields):
    """SIGKILL to the waiting reader (a spare, or the last pass's reader kept) right before the next pass:
    not yet reaped, it looks alive and is given the job, then dies without taking it.  It read nothing, so
    a new process reads the pass, whole and exact (the pass failed with 'the reader process died')."""
    path, recs, want = stream
    kw = dict(fields=None) if fields == "raw" else dict(fields=Fixed(), batch_size=16)
    with deadline(120), ParallelReader(path, workers=2, tuning=SMALL, **kw) as reader:
        list(reader)
        for _ in range(6):
            waiting = reader._res.spare
            os.kill(waiting.pid, signal.SIGKILL)
            got = list(reader)  # (at once: the process is not reaped yet)
            if fields == "raw":
                assert got == recs
            else:
                assert np.concatenate(got).tobytes() == want.tobytes()
            assert not _alive(waiting.pid)


def test_an_early_break_and_a_resume_use_the_spare_exactly(stream, no_leaks):
    path, recs, want = stream
    with deadline(60), ParallelReader(path, fields=Fixed(), workers=2, batch_size=10, tuning=SMALL) as reader:
        assert np.concatenate(list(reader)).tobytes() == want.tobytes()
        taken = []
        for i, batch in enumerate(reader):  # the spare reads this pass; stop in the middle
            taken.append(batch)
            if i == 20:
                state = reader.state_dict()
                break
        reader.load_state_dict(state)
        rest = list(reader)  # a resumed pass (skip > 0) read by the spare started after the break
        assert np.concatenate(taken + rest).tobytes() == want.tobytes()


def test_no_spare_for_a_source_of_descriptors(stream, no_leaks):
    path, recs, _ = stream
    with open(path, "rb") as f, deadline(60), ParallelReader(f, fields=None, workers=1) as reader:
        assert list(reader) == recs
        assert reader._res.spare is None  # a file object is pumped through a descriptor: nothing to send


def test_workers_0_has_no_spare(stream, no_leaks):
    path, recs, _ = stream
    with ParallelReader(path, fields=None, workers=0) as reader:
        assert list(reader) == recs and list(reader) == recs
        assert reader._res.spare is None


def test_a_waiting_spare_exits_with_its_killed_consumer(stream, tmp_path):
    path, recs, _ = stream
    script = tmp_path / "consumer.py"
    script.write_text(textwrap.dedent(f"""
        import sys, time
        sys.path[:0] = [{ROOT!r}, {HERE!r}]
        from parrecio import ParallelReader
        if __name__ == "__main__":
            r = ParallelReader({str(path)!r}, fields=None, workers=1)
            n = sum(1 for _ in r)
            print(n, r._res.spare.pid, flush=True)
            time.sleep(60)
    """))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        n, spare = proc.stdout.readline().split()
        assert int(n) == len(recs) and _alive(int(spare))
        proc.kill()
        proc.wait(10)
        deadline_s = time.monotonic() + 10
        while _alive(int(spare)) and time.monotonic() < deadline_s:
            time.sleep(0.05)
        assert not _alive(int(spare))
        # and nothing of the dead consumer's is left in /dev/shm (its ring): the spare, its last child,
        # swept it before leaving (returning from its wait raced the watchdog thread that sweeps)
        left = [n for n in os.listdir("/dev/shm") if n.startswith(f"parrecio-{proc.pid}-")]
        assert not left, left
    finally:
        proc.kill()


# -- the kept reader ----------------------------------------------------------------------------------
@pytest.mark.parametrize("fields,method,workers", [("raw", None, 2), ("fixed", None, 3), ("fixed", "spawn", 2),
                                                    ("raw", "fork", 1)])
def test_a_reader_that_ended_cleanly_reads_every_later_pass(stream, no_leaks, fields, method, workers):
    """One reader process for every pass: the first pass's (started with its job) waits for the next
    job after its clean end, and so on; each pass byte-exact (the file is read in place; the ring's
    laps are the shuffled passes' below); with each start method, 1-3 workers."""
    path, recs, want = stream
    kw = dict(fields=None) if fields == "raw" else dict(fields=Fixed(), batch_size=16)
    tuning = Tuning(ring_bytes=1 << 20, start_method=method)
    pids = []
    with deadline(60), ParallelReader(path, workers=workers, tuning=tuning, **kw) as reader:
        res = reader._res
        for epoch in range(5):
            it = iter(reader)
            pids.append(res.run.reader_pid)
            got = list(it)
            if fields == "raw":
                assert got == recs
            else:
                assert np.concatenate(got).tobytes() == want.tobytes()
            assert res.spare is not None and res.spare.pid == pids[-1]  # kept, not a new process
    assert len(set(pids)) == 1, pids
    assert not _alive(pids[0])  # stopped by close()


def test_a_kept_reader_serves_one_off_groups_shuffles_and_several_files(tmp_path, no_leaks):
    """What a pass leaves in the process must not leak into the next: one-off segments (groups larger
    than half the ring: their names count on across passes), several files, the shuffle buffer, resumed
    passes.  Against a plain reference of each pass."""
    rng = np.random.default_rng(5)
    files, recs = [], []
    for k in range(3):
        part = payloads(150, seed=20 + k, max_len=4000)
        part[10 * (k + 1)] = rng.integers(0, 256, 700_000, dtype=np.uint8).tobytes()  # > half the ring
        write_rec(tmp_path / f"d{k}.rec", part)
        files.append(tmp_path / f"d{k}.rec")
        recs += part
    tuning = Tuning(ring_bytes=1 << 20)
    with deadline(120), ParallelReader([str(f) for f in files], fields=None, workers=1, tuning=tuning) as reader:
        res = reader._res
        first = None
        for epoch in range(4):
            it = iter(reader)
            first = first or res.run.reader_pid
            assert res.run.reader_pid == first
            assert list(it) == recs
    shuffled = dict(fields=None, tuning=tuning, shuffle=True, shuffle_buffer=64, seed=3)
    with ParallelReader([str(f) for f in files], workers=0, **shuffled) as ref:
        epochs = [list(ref) for _ in range(4)]  # the plain reference: each epoch's order, in this process
    assert all(sorted(e) == sorted(recs) for e in epochs) and epochs[0] != epochs[1]
    with deadline(120), ParallelReader([str(f) for f in files], workers=2, **shuffled) as reader:
        res = reader._res
        pids = set()
        for epoch in range(3):
            it = iter(reader)
            pids.add(res.run.reader_pid)
            assert list(it) == epochs[epoch]  # the kept process reads its job's epoch
        assert len(pids) == 1
        half = []  # epoch 3, broken off (its reader stopped or kept, as it stood) and resumed
        for i, r in enumerate(reader):
            half.append(r)
            if i == 200:
                state = reader.state_dict()
                break
        reader.load_state_dict(state)
        assert half + list(reader) == epochs[3]


def _corrupt(path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(b"\x00\x00\x00\x00")  # the record's magic


def test_a_reader_whose_pass_failed_is_not_kept(tmp_path, no_leaks):
    """A pass that ends with the reader's error (a damaged record under ``on_error="raise"``): its
    process exits, the next pass gets a new one, which fails at the same record."""
    recs = payloads(300, seed=4, max_len=2000)
    offsets = write_rec(tmp_path / "c.rec", recs)
    _corrupt(tmp_path / "c.rec", offsets[250])
    with deadline(60), ParallelReader(str(tmp_path / "c.rec"), fields=None, workers=1, tuning=SMALL) as reader:
        res = reader._res
        pids = []
        for epoch in range(3):
            got = []
            it = iter(reader)
            pids.append(res.run.reader_pid)
            with pytest.raises(CorruptRecordError) as ei:
                for r in it:
                    got.append(r)
            assert got == recs[:250] and ei.value.offset == offsets[250]
            wait_until(lambda: not _alive(pids[-1]), what="the failed pass's reader to exit")
        assert len(set(pids)) == 3, pids


def test_a_reader_stopped_mid_pass_is_not_kept(tmp_path, no_leaks):
    """An early break while the reader still reads (the ring is full): it is stopped, and the resumed
    pass is read by another process, exactly."""
    recs = payloads(6000, seed=9, max_len=3000)  # ~9 MB: twice the mapped bytes a reader may have in flight
    write_rec(tmp_path / "b.rec", recs)
    with deadline(60), ParallelReader(str(tmp_path / "b.rec"), fields=None, workers=1, tuning=SMALL) as reader:
        res = reader._res
        assert list(reader) == recs
        kept = res.spare.pid
        got = []
        for i, r in enumerate(reader):
            got.append(r)
            if i == 99:
                state = reader.state_dict()
                break
        assert res.run is None or res.run.reader_pid == kept
        wait_until(lambda: not _alive(kept), what="the stopped reader to exit")
        reader.load_state_dict(state)
        it = iter(reader)
        assert res.run.reader_pid != kept
        assert got + list(it) == recs


def test_a_kept_reader_does_not_grow(tmp_path, no_leaks):
    """Its memory after 12 shuffled passes is what it was after 2: nothing of a pass stays behind."""
    recs = payloads(2000, seed=6, max_len=6000)
    write_rec(tmp_path / "m.rec", recs)
    with deadline(120), ParallelReader(str(tmp_path / "m.rec"), fields=None, workers=1, tuning=SMALL,
                                       shuffle=True, shuffle_buffer=500) as reader:
        res = reader._res
        rss = []
        for epoch in range(12):
            n = sum(1 for _ in reader)
            assert n == len(recs)
            rss.append(psutil.Process(res.spare.pid).memory_info().rss)
        assert rss[-1] < rss[1] + (8 << 20), [r >> 20 for r in rss]


def test_announced_messages_go_out_with_the_next_one_or_before_a_wait():
    """``Link.announce``: a stream's start goes out in the same write as the next message (the consumer
    finds both in one read: one wake-up), or before the reader would block."""
    import multiprocessing as mp
    data_r, data_w = mp.Pipe(duplex=False)
    ctrl_r, ctrl_w = mp.Pipe(duplex=False)
    life_r, life_w = mp.Pipe(duplex=False)
    try:
        link = Link(data_w, ctrl_r, life_r, 0.01, lambda pos: None, type("S", (), {})())
        inbox = MessageReader(data_r.fileno())
        link.announce(StreamStart(0, "a"))
        assert not data_r.poll(0)  # held
        link.send(StreamStart(1, "b"))
        os.set_blocking(data_r.fileno(), False)
        assert [m.name for m in inbox.read()] == ["a", "b"]  # one write
        link.announce(StreamStart(2, "c"))
        link.watch([], 0.01)  # a wait: what was held went out first
        assert [m.name for m in inbox.read()] == ["c"]
        assert inbox.read() == []
    finally:
        for c in (data_r, data_w, ctrl_r, ctrl_w, life_r, life_w):
            c.close()
