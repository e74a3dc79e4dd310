"""The process's surroundings taken away or capped: its working directory deleted, its address space
capped, a /dev/shm it may not write.  Each either reads as usual or is a ``PipelineError`` that names the
cause -- never a bare ``OSError`` without a file name, never advice about the wrong thing.  Each runs in
a fresh interpreter (a cwd or a limit is the process's own)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap

import pytest

from parrecio.pipeline import shm
from parrecio.pipeline.shm import leftover
from recordio_helpers import frame


def _run(tmp_path, text: str, *args) -> subprocess.Popen:
    """``text`` run as a script with ``args``, to its end (its ``stdout``, ``stderr`` as attributes)."""
    script = tmp_path / "hostile.py"
    script.write_text(text)
    proc = subprocess.Popen([sys.executable, str(script), *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=str(tmp_path),
                            env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    proc.stdout, proc.stderr = proc.communicate(timeout=240)  # type: ignore[assignment]
    return proc


CWD_SCRIPT = textwrap.dedent("""\
    import hashlib, os, signal, sys, tempfile
    from parrecio import ParallelReader, SourceError, Tuning

    def digest(p):
        return hashlib.sha1(bytes(p)).hexdigest()

    if __name__ == "__main__":
        method, path, case = sys.argv[1], sys.argv[2], sys.argv[3]
        cwd = tempfile.mkdtemp()
        os.chdir(cwd)
        with ParallelReader(path, fields=digest, workers=2, tuning=Tuning(start_method=method)) as r:
            if case == "before":
                os.rmdir(cwd)                      # before the first pass starts any process
            for epoch in range(2):
                print(epoch, ",".join(r), flush=True)
                if case == "between" and epoch == 0:
                    os.rmdir(cwd)                  # then a decoder dies: its replacement starts now
                    os.kill(r.worker_pids[0], signal.SIGKILL)
        try:
            ParallelReader(os.path.join(os.path.dirname(path), "missing.rec"), workers=0)
        except SourceError as e:
            print("error", e)
    """)


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
@pytest.mark.parametrize("case", ["before", "between"])
def test_a_deleted_working_directory_starts_every_process_and_names_itself(tmp_path, method, case):
    """multiprocessing asks for the working directory (``os.getcwd()``) to start a spawn or forkserver
    child in it: once deleted, every start failed with a bare ``FileNotFoundError`` (no file name), the
    fork server's at the first pass, a dead decoder's replacement at a later one.  The children start
    in ``/`` then: every path they are given is absolute.  A missing file's message said the cwd with
    ``os.getcwd()`` too."""
    payloads = [os.urandom(50 + i) for i in range(120)]
    path = tmp_path / "x.rec"
    path.write_bytes(b"".join(frame(p) for p in payloads))
    proc = _run(tmp_path, CWD_SCRIPT, method, path, case)
    assert proc.returncode == 0, proc.stderr[-3000:]
    want = ",".join(hashlib.sha1(p).hexdigest() for p in payloads)
    assert proc.stdout.splitlines() == [f"0 {want}", f"1 {want}",
                                        f"error no such file or directory: '{tmp_path}/missing.rec' (cwd deleted)"]
    assert leftover(f"parrecio-{proc.pid}-") == []


AS_SCRIPT = textwrap.dedent("""\
    import resource, sys
    import numpy  # (imported before the cap)
    from parrecio import ParallelReader, PipelineError, Tuning
    if __name__ == "__main__":
        resource.setrlimit(resource.RLIMIT_AS, (400 << 20, 400 << 20))
        try:
            with ParallelReader(sys.argv[1], workers=1, tuning=Tuning(ring_bytes=256 << 20)) as r:
                print("read", len(list(r)))
        except PipelineError as e:
            print("error", e)
        with ParallelReader(sys.argv[1], workers=0) as r:
            print("workers=0", [bytes(p) for p in r] == [b"%08d" % i for i in range(10)])
    """)


def test_an_address_space_cap_too_small_for_the_ring_is_named(tmp_path):
    """``ulimit -v`` (a batch system's vmem limit) below what the ring maps: a bare ``OSError: [Errno 12]
    Cannot allocate memory`` from mmap, naming neither the segment, nor the cap, nor a way out."""
    path = tmp_path / "x.rec"
    path.write_bytes(b"".join(frame(b"%08d" % i) for i in range(10)))
    proc = _run(tmp_path, AS_SCRIPT, path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0] == ("error cannot map 256.0 MiB of shared memory for the input ring (ring_bytes=268435456): "
                        "this process's address space is full (capped at 400 MiB by `ulimit -v`). Ask for less "
                        "(ring_bytes=, fewer workers, a smaller batch_size), raise the limit, or read with "
                        "workers=0 (no shared memory)"), lines
    assert lines[1:] == ["workers=0 True"]
    assert leftover(f"parrecio-{proc.pid}-") == []


def test_free_bytes_of_a_dev_shm_this_process_may_not_write_is_unknown(tmp_path, monkeypatch):
    """A /dev/shm that is not ours to write (a root-owned tmpfs of mode 755, seen by another user) fails
    to create with EACCES, which says so; before it came a warning to give it more shared memory, which
    is not what is wrong.  Its free space is not told (as for a read-only one): no fitting, no warning.
    (As root every directory is writable to ``os.access``: the answer it gives another user is stood in.)"""
    monkeypatch.setattr(shm, "SHM_DIR", str(tmp_path))
    assert shm.free_bytes() is not None
    monkeypatch.setattr(shm.os, "access", lambda path, mode: not (path == str(tmp_path) and mode & os.W_OK))
    assert shm.free_bytes() is None
