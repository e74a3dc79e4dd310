"""A consumer with more than 1024 open descriptors (a training job with many files, sockets, loaders).

``select.select`` refuses a descriptor numbered 1024 or more; a child forked from such a process gets its
new descriptors (a FIFO it opens) above its inherited ones.  The reader process's check for data used
``select`` and failed the pass under ``fork`` ("filedescriptor out of range in select()"); every wait in
the pipeline uses ``poll`` now.  The script runs in its own process: it raises its descriptor limit and
holds 1100 descriptors before the reader starts.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import textwrap

import pytest

from parrecio.pipeline.shm import leftover
from source_helpers import make_payloads, write_rec

SCRIPT = textwrap.dedent("""\
    import os, resource, subprocess, sys
    from parrecio import ParallelReader, Tuning
    if __name__ == "__main__":
        method, source, workers, rec, fifo = sys.argv[1:]
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
        null = os.open(os.devnull, os.O_RDONLY)
        held = [os.dup(null) for _ in range(1100)]
        assert held[-1] >= 1100
        channel = rec
        if source == "fifo":  # written by another process: a forked child must not hold its write end
            channel = fifo
            cat = subprocess.Popen(["sh", "-c", 'exec cat "$0" > "$1"', rec, fifo])
        tuning = Tuning(start_method=method, ring_bytes=1 << 20)
        with ParallelReader(channel, workers=int(workers), tuning=tuning) as reader:
            for payload in reader:
                sys.stdout.buffer.write(len(payload).to_bytes(4, "little") + bytes(payload))
        if source == "fifo":
            cat.wait(30)
""")

_, HARD = resource.getrlimit(resource.RLIMIT_NOFILE)


@pytest.mark.skipif(HARD != resource.RLIM_INFINITY and HARD < 1200, reason="cannot hold 1100 descriptors here")
@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
@pytest.mark.parametrize("source,workers", [("fifo", 1), ("file", 2)])
def test_more_than_1024_descriptors_in_the_consumer(tmp_path, method, source, workers):
    payloads = make_payloads(3000, seed=11, hi=1500)  # 2.3 MB: the 1 MiB ring wraps
    rec = tmp_path / "data.rec"
    write_rec(rec, payloads)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    script = tmp_path / "many_fds.py"
    script.write_text(SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script), method, source, str(workers), str(rec), str(fifo)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr.decode()[-2000:]
    assert leftover(f"parrecio-{proc.pid}-") == []
    got, data = [], memoryview(stdout)
    while data:
        n = int.from_bytes(data[:4], "little")
        got.append(bytes(data[4:4 + n]))
        data = data[4 + n:]
    assert got == payloads


FEW_SCRIPT = textwrap.dedent("""\
    import resource, sys
    from parrecio import ParallelReader
    if __name__ == "__main__":
        folder, workers, limit = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        with ParallelReader(folder, workers=workers, shuffle=True, seed=3) as reader:
            print(len(reader), sorted(bytes(p).decode() for p in reader) == sorted(
                f"{i}-{j}" for i in range(300) for j in range(3)), flush=True)
""")


@pytest.mark.parametrize("workers, limit", [(0, 128), (2, 128), (0, 64), (2, 64)])
def test_a_shuffled_read_of_more_indexed_files_than_descriptors(tmp_path, workers, limit):
    """300 indexed files read by index under ``ulimit -n 128``: a reader of each is kept for the pass, and
    each held its file open -- EMFILE ("Too many open files") before the first sample.  At most 64 are
    open at once now, and no more than a quarter of the limit (under ``ulimit -n 64`` the 64 left none for
    the next ``.idx``); one closed is opened again when read again, checked to be the same file."""
    from parrecio import RecordWriter
    folder = tmp_path / "many"
    folder.mkdir()
    for i in range(300):
        with RecordWriter(str(folder / f"p{i:03d}.rec"), index=str(folder / f"p{i:03d}.idx")) as w:
            for j in range(3):
                w.write(f"{i}-{j}".encode(), key=j)
    script = tmp_path / "few.py"
    script.write_text(FEW_SCRIPT)
    proc = subprocess.run([sys.executable, str(script), str(folder), str(workers), str(limit)], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["900", "True"]


def test_an_indexed_file_let_go_of_and_changed_is_refused_when_read_again(tmp_path, monkeypatch):
    from parrecio.errors import SourceError
    from parrecio.recordio import RecordWriter, index
    monkeypatch.setattr(index._OpenRecs, "limit", 2)
    readers = []
    for i in range(3):
        with RecordWriter(str(tmp_path / f"r{i}.rec"), index=str(tmp_path / f"r{i}.idx")) as w:
            w.write(b"first %d" % i, key=0)
        readers.append(index.IndexedRecordReader(str(tmp_path / f"r{i}.rec")))
    assert readers[0]._fd is None and readers[2]._fd is not None       # the oldest was let go of
    assert readers[0][0] == b"first 0"                                    # and is opened again to read
    assert readers[1]._fd is None                                         # (another let go of instead)
    with open(tmp_path / "r1.rec", "r+b") as f:                           # rewritten while let go of
        f.seek(8)
        f.write(b"FIRST")
    st = os.stat(tmp_path / "r1.rec")
    os.utime(tmp_path / "r1.rec", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # (a coarse clock)
    with pytest.raises(SourceError, match=r"r1.rec changed while it was being read: it was rewritten"):
        readers[1][0]
    for r in readers:
        r.close()


def test_readers_in_reference_cycles_and_threads_never_hang_or_read_a_closed_descriptor(tmp_path, monkeypatch):
    """The garbage collector freed a reader (in a reference cycle) inside the descriptor list's lock, and
    its close took that lock again: a hang within 5,000 readers.  And a read that opened its file again
    could let go of its own descriptor (EBADF)."""
    import gc
    import threading
    from parrecio.recordio import RecordWriter, index
    from pipeline_helpers import deadline
    monkeypatch.setattr(index._OpenRecs, "limit", 2)
    paths = []
    for i in range(4):
        p = str(tmp_path / f"c{i}.rec")
        with RecordWriter(p, index=p[:-4] + ".idx") as w:
            w.write(b"%d" % i, key=0)
        paths.append(p)

    class Holder:
        def __init__(self, path):
            self.reader = index.IndexedRecordReader(path)
            self.me = self  # a cycle: freed by the collector, at any allocation

    with deadline(120):
        gc.set_threshold(50)
        try:
            for i in range(6000):
                Holder(paths[i % 4])
        finally:
            gc.set_threshold(700)
        readers = [index.IndexedRecordReader(p) for p in paths]
        stop = threading.Event()

        def churn():
            while not stop.is_set():
                for r in readers[1:]:
                    assert r.read_at(0) in (b"1", b"2", b"3")

        t = threading.Thread(target=churn)
        t.start()
        try:
            for _ in range(20_000):
                assert readers[0].read_at(0) == b"0"
                readers[0].index_identity()
        finally:
            stop.set()
            t.join()
        for r in readers:
            r.close()
