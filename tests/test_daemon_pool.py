"""parrecio.sources.daemon_pool.DaemonPool: the thread pool of S3 read-ahead.  Results and errors come
through their futures; shutdown cancels what was queued, ends idle threads, and leaves nothing that the
interpreter waits for at exit; a forked child's shutdown of its parent's pool does nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from parrecio.sources.daemon_pool import DaemonPool


def test_results_errors_and_at_most_n_daemon_threads():
    pool = DaemonPool(3, "t-pool")
    names = set()

    def job(i):
        names.add(threading.current_thread().name)
        assert threading.current_thread().daemon
        if i == 7:
            raise KeyError(i)
        time.sleep(0.01)
        return i * i

    futures = [pool.submit(job, i) for i in range(20)]
    assert [f.result(10) for f in futures if f is not futures[7]] == [i * i for i in range(20) if i != 7]
    with pytest.raises(KeyError):
        futures[7].result(10)
    assert names <= {"t-pool 0", "t-pool 1", "t-pool 2"} and len(names) >= 1
    pool.shutdown(wait=True)
    assert not any(t.name.startswith("t-pool") for t in threading.enumerate())
    with pytest.raises(RuntimeError, match="after shutdown"):
        pool.submit(job, 0)


def test_shutdown_cancels_what_is_queued_and_running_work_ends_on_its_own():
    pool = DaemonPool(2, "t-pool2")
    gate = threading.Event()
    running = [pool.submit(gate.wait, 10) for _ in range(2)]
    queued = [pool.submit(lambda: 1) for _ in range(4)]
    time.sleep(0.1)
    pool.shutdown()
    assert all(f.cancelled() for f in queued)  # (none is left pending for ever)
    gate.set()
    assert [f.result(10) for f in running] == [True, True]


def test_a_hung_job_does_not_hold_up_the_exit(tmp_path):
    """A ThreadPoolExecutor's threads are joined at exit: a read hung on a server kept the program alive."""
    script = tmp_path / "hang.py"
    script.write_text(textwrap.dedent("""\
        import threading
        from parrecio.sources.daemon_pool import DaemonPool

        if __name__ == "__main__":
            pool = DaemonPool(2, "hung")
            pool.submit(threading.Event().wait)  # for ever
            pool.shutdown()
        """))
    t0 = time.monotonic()
    subprocess.run([sys.executable, str(script)], check=True, timeout=30,
                   env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert time.monotonic() - t0 < 10


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_childs_shutdown_leaves_the_parents_pool_alone():
    pool = DaemonPool(1, "t-pool3")
    assert pool.submit(lambda: 5).result(10) == 5
    pid = os.fork()
    if pid == 0:  # the child: its copy of the pool has no threads; its lock may be held by one
        pool._lock.acquire()
        pool.shutdown(wait=True)  # (would deadlock on the lock)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert status == 0
    assert pool.submit(lambda: 6).result(10) == 6  # the parent's pool works on
    pool.shutdown(wait=True)
