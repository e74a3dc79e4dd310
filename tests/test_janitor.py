"""Shared memory removed even when every process of a run is gone before the consumer could clean up.

A Jupyter kernel that shuts down or restarts sends SIGTERM to each of its children (the reader and the
decoder processes end, as asked: their consumer is alive) and is then killed: nothing was left to sweep
its ring and output slots (90-400 MB of /dev/shm per kernel restart).  A janitor (``children.start_janitor``:
a shell outside the consumer's process group, and in a kernel outside its family too) removes them once
the lifeline ends.  The first script imports ipykernel, as a kernel has.  Everywhere, the janitor covers the
start-up too: the shared memory exists before the first child runs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from parrecio.pipeline.shm import leftover
from pipeline_helpers import payloads, write_rec

SCRIPT = textwrap.dedent("""\
    import os, signal, sys, time
    import ipykernel  # (what a Jupyter kernel has imported: the janitor is started there only)
    import psutil
    from parrecio import ParallelReader, Tuning
    if __name__ == "__main__":
        reader = ParallelReader(sys.argv[1], fields=lambda p: len(p), workers=2, batch_size=8,
                                tuning=Tuning(start_method=sys.argv[2]))
        it = iter(reader)
        next(it)
        kids = psutil.Process().children(recursive=True)
        print(len([n for n in os.listdir("/dev/shm") if n.startswith(f"parrecio-{os.getpid()}-")]), flush=True)
        for k in kids:  # what ipykernel does at shutdown: SIGTERM to every child
            k.terminate()
        psutil.wait_procs(kids, timeout=5)
        os.kill(os.getpid(), signal.SIGKILL)  # then the kernel itself is killed
""")


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs /dev/shm")
@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_children_terminated_then_the_consumer_killed_leave_no_shared_memory(tmp_path, method):
    path = tmp_path / "d.rec"
    write_rec(path, payloads(2000, seed=3))
    script = tmp_path / "kernel.py"
    script.write_text(SCRIPT)
    _killed_leaves_nothing(script, path, method)  # (the ring and the pairs board were there)


def _killed_leaves_nothing(script, path, method, env=None):
    """Run ``script PATH METHOD``, which prints how many segments it made and dies of SIGKILL: every one
    of them is removed within 10 s."""
    proc = subprocess.Popen([sys.executable, str(script), str(path), method], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL, err[-2000:]
    assert int(out.split()[0]) >= 2
    deadline = time.monotonic() + 10
    while leftover(f"parrecio-{proc.pid}-") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert leftover(f"parrecio-{proc.pid}-") == []


KILLED_IN_START = textwrap.dedent("""\
    import os, signal, sys
    from parrecio import ParallelReader, Tuning
    from parrecio.pipeline import slots
    from pipeline_helpers import Fixed
    if __name__ == "__main__":
        made = slots.SlotPool.__init__
        def then_killed(self, *args, **kwargs):  # the ring and the slots exist, no child has run yet
            made(self, *args, **kwargs)
            print(len([n for n in os.listdir("/dev/shm") if n.startswith(f"parrecio-{os.getpid()}-")]), flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        slots.SlotPool.__init__ = then_killed
        reader = ParallelReader(sys.argv[1], fields=Fixed(), workers=2, batch_size=8,
                                tuning=Tuning(start_method=sys.argv[2]))
        next(iter(reader))
""")


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs /dev/shm")
@pytest.mark.parametrize("method", ["forkserver", "spawn", "fork"])
def test_a_consumer_killed_before_its_first_child_runs_leaves_no_shared_memory(tmp_path, method):
    """The ring and the output slots are made before any child runs (and sweeps): a SIGKILL, or SIGTERM
    to the whole group while the children still import, left them in /dev/shm for good (8 of 8 runs under
    spawn in an audit, 101-128 MB each).  The janitor, started before them in every process (not only in
    a kernel), removes them; the consumer reaps it at close (no_leaks checks that elsewhere)."""
    script, path, env = _script_beside_tests(tmp_path, KILLED_IN_START, 200)
    _killed_leaves_nothing(script, path, method, env)  # (the ring and the slots were there)


def _script_beside_tests(tmp_path, text, records):
    """``(script, data, env)``: ``text`` as a script that imports this folder's helpers, a file of
    ``records`` payloads, and the environment that lets it import them."""
    path = tmp_path / "d.rec"
    write_rec(path, payloads(records, seed=3))
    script = tmp_path / "script.py"
    script.write_text(text)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.abspath(__file__)),
                                                       os.environ.get("PYTHONPATH", "")]))
    return script, path, env


FORKED = textwrap.dedent("""\
    import sys, warnings
    from parrecio import ParallelReader, Tuning
    from pipeline_helpers import Fixed
    if __name__ == "__main__":
        warnings.simplefilter("default", ResourceWarning)
        with ParallelReader(sys.argv[1], fields=Fixed(), workers=2, batch_size=8,
                            tuning=Tuning(start_method="fork")) as r:
            print(sum(len(b) for b in r))
""")


def test_forked_children_say_nothing_of_the_parents_janitor(tmp_path):
    """A child started with ``fork`` drops its copy of the janitor's Popen: "ResourceWarning: subprocess
    ... is still running" on stderr from each of them."""
    script, path, env = _script_beside_tests(tmp_path, FORKED, 100)
    proc = subprocess.run([sys.executable, str(script), str(path)], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.split() == ["100"], proc.stderr[-2000:]
    assert "ResourceWarning" not in proc.stderr, proc.stderr[-2000:]


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs /dev/shm")
def test_a_killed_janitor_cat_waits_again_and_sweeps_nothing_of_a_live_run(tmp_path, no_leaks):
    """The janitor ran ``cat; rm``: a SIGKILL of its ``cat`` (the janitor ignores HUP, INT and TERM; KILL
    it cannot) removed the live run's ring, and every later pass failed ("No such file ... -ring").  A
    ``cat`` killed by a signal is started again on the lifeline, which is still open; once the consumer
    is gone the janitor sweeps as before (the other tests here)."""
    import psutil
    from parrecio import ParallelReader
    path = tmp_path / "j.rec"
    recs = payloads(300, seed=5)
    write_rec(path, recs)
    prefix = f"parrecio-{os.getpid()}-"
    with ParallelReader(path, fields=None, workers=1) as reader:
        assert list(reader) == recs
        janitor = reader._res.janitor
        assert janitor is not None
        segments = leftover(prefix)

        def cat(not_pid=None):
            """The janitor's cat (a child forked by sh is named sh until it has exec'd cat)."""
            deadline = time.monotonic() + 5
            while True:
                kids = [c for c in psutil.Process(janitor.pid).children() if c.pid != not_pid]
                try:
                    if len(kids) == 1 and kids[0].name() == "cat":
                        return kids[0]
                except psutil.NoSuchProcess:
                    pass
                assert time.monotonic() < deadline, f"no cat: {kids}"
                time.sleep(0.02)

        killed = None
        for _ in range(2):
            killed = cat(killed.pid if killed is not None else None)
            killed.kill()
            killed.wait(5)
            assert cat(killed.pid).pid != killed.pid  # started again, on the same lifeline
            assert janitor.poll() is None and leftover(prefix) == segments
        assert list(reader) == recs  # the ring is still there
