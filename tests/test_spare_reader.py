"""The spare reader process (docs/ARCHITECTURE.md "Start-up"): once a pass's reader has ended, the next
pass's reader is started ahead and waits for its job, so that a short pass does not wait ~5-10 ms for a
process start.  What must hold: every pass byte-exact and in order whether it got a spare or not; a
spare that died is replaced; one never used is stopped at close; sources that cannot be sent to a
waiting process (descriptors) get none; a spare whose consumer dies exits too.
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

from parrecio import ParallelReader, Tuning
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
