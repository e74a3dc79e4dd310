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
