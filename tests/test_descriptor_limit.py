"""Batches and views the user keeps each hold a file descriptor (a mapping of a shared-memory segment
holds one: CPython's ``mmap`` keeps a duplicate), in the consumer and in each decoder process.  With the
usual soft limit of 1024, ``list(reader)`` of ~1000 small batches died with a bare ``OSError: [Errno 24]
Too many open files`` (the fork server with an EOFError) although /dev/shm held under 1 MiB: the limit is
now raised to the hard one when it is reached (parrecio/pipeline/shm.py), and where that is reached too
the error is a PipelineError that says what holds the descriptors and what to do.

Each case runs in a fresh interpreter: the limits are the process's."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import textwrap

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

SCRIPT = textwrap.dedent("""\
    import json, os, resource, struct, sys, tempfile
    soft, hard = int(sys.argv[1]), int(sys.argv[2])
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    from parrecio import ParallelReader
    from parrecio.decoders import ClassLabel
    from parrecio.pipeline.shm import leftover
    d = tempfile.mkdtemp()
    path = os.path.join(d, "labels.rec")
    with open(path, "wb") as f:  # 6400 records of one digit: 400 batches of 16, 400 output slots kept
        for i in range(6400):
            p = str(i % 10).encode()
            f.write(struct.pack("<II", 0xced7230a, len(p)) + p + b"\\0" * (-len(p) % 4))
    out = {}
    try:
        with ParallelReader(path, fields=ClassLabel(), batch_size=16, workers=int(sys.argv[3])) as r:
            kept = list(r)
            out["labels"] = [int(x) for b in kept for x in b]
            del kept
            out["again"] = sum(len(b) for b in r)  # (the pool's slots: still mapped)
    except Exception as exc:
        out["error"] = [type(exc).__name__, str(exc)]
    out["soft"] = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    out["leftover"] = leftover(f"parrecio-{os.getpid()}-")
    print(json.dumps(out))
    """)


def _run(soft: int, hard: int, workers: int) -> dict:
    import json
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(soft), str(hard), str(workers)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]  # (the fork server's EOFError, too)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _hard() -> int:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return 1 << 20 if hard == resource.RLIM_INFINITY else hard


@pytest.mark.skipif(_hard() < 2048, reason="the hard limit on descriptors is too low to raise the soft one")
@pytest.mark.parametrize("workers", [1, 2])
def test_kept_batches_past_the_soft_limit_raise_it(workers):
    got = _run(256, _hard(), workers)
    assert "error" not in got, got["error"]
    assert got["labels"] == [i % 10 for i in range(6400)] and got["again"] == 6400
    assert 256 < got["soft"] <= _hard()
    assert got["leftover"] == []


@pytest.mark.parametrize("workers", [1, 2])
def test_kept_batches_past_the_hard_limit_say_so(workers):
    got = _run(200, 200, workers)
    kind, message = got["error"]
    assert kind == "PipelineError"
    assert "no file descriptor left (200 allowed, the hard limit)" in message
    assert "raise the limit (`ulimit -n`), or keep copies (np.array(batch), bytes(view))" in message
    assert got["leftover"] == []
