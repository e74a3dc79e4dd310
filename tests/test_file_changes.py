"""A file that changes while a pass reads it (parrecio/pipeline/mapped.py): truncated, rewritten in place,
appended to.  The pass ends with a SourceError that names the file and what happened -- whatever
``on_error`` says, with or without worker processes, batched or not -- after samples that are all exact;
never a SIGBUS in the user's process (its payloads come from the file with ``pread``, not through the
mapping), never a sample of other bytes.

The change is made from the loop body, after the third sample: the reader process is then ahead, waiting
for the consumer (a 1 MiB ring bounds what is in flight to 4 MiB of the 9 MB file), or framing.
"""

from __future__ import annotations

import hashlib
import os
import random

import pytest

from parrecio import ParallelReader, Tuning
from parrecio.errors import SourceError
from source_helpers import write_rec

N = 3000


def digest(payload) -> str:
    return hashlib.sha256(payload).hexdigest()


@pytest.fixture
def rec(tmp_path):
    rng = random.Random(7)
    payloads = [rng.randbytes(rng.randint(0, 6000)) for _ in range(N)]  # ~9 MB
    path = tmp_path / "data.rec"
    write_rec(path, payloads)
    return str(path), payloads


def _read(path, payloads, change, *, workers=2, mode="raw", batch_size=None, on_error="raise",
          method=None) -> list:
    """The samples until the error (checked against ``payloads`` as they come); ``change(path)`` is
    called after the third."""
    fields = [digest] if mode == "decoded" else None
    tuning = Tuning(ring_bytes=1 << 20, **({"start_method": method} if method else {}))
    got = []
    with ParallelReader(path, fields=fields, workers=workers, batch_size=batch_size, on_error=on_error,
                        tuning=tuning) as reader:
        for item in reader:
            items = item if batch_size else [item]
            for x in items:
                want = payloads[len(got)]
                assert (x[0] if mode == "decoded" else bytes(x)) == (digest(want) if mode == "decoded" else want)
                got.append(x)
                if len(got) == 3:
                    change(path)
    return got


def _truncate_to(size):
    return lambda path: os.truncate(path, size)


@pytest.mark.parametrize("mode,batch_size", [("raw", None), ("raw", 16), ("decoded", None)])
@pytest.mark.parametrize("cut", ["page", "third"])
def test_truncated_while_read(rec, no_leaks, mode, batch_size, cut):
    path, payloads = rec
    size = os.path.getsize(path)
    to = 65536 if cut == "page" else size // 3  # (a third: within a page, whose tail then reads as zeros)
    with pytest.raises(SourceError, match=rf"{path} changed while it was being read: it was truncated from "
                                          rf"{size} to {to} bytes"):
        _read(path, payloads, _truncate_to(to), mode=mode, batch_size=batch_size)


@pytest.mark.parametrize("method", ["fork", "spawn"])
@pytest.mark.parametrize("workers", [0, 1])
def test_truncated_while_read_any_start_method_and_in_process(rec, no_leaks, method, workers):
    path, payloads = rec
    size = os.path.getsize(path)
    with pytest.raises(SourceError, match=rf"{path} changed while it was being read: it was truncated from "
                                          rf"{size} to 65536 bytes"):
        _read(path, payloads, _truncate_to(65536), workers=workers, method=method)


def _rewrite(path):
    """The payload bytes of records 1000-1099 changed, the framing and the size kept; a new mtime."""
    with open(path, "r+b") as f:
        data = bytearray(f.read())
        pos = 0
        for i in range(1100):
            n = int.from_bytes(data[pos + 4:pos + 8], "little") & ((1 << 29) - 1)
            if i >= 1000:
                data[pos + 8:pos + 8 + n] = bytes(b ^ 0xFF for b in data[pos + 8:pos + 8 + n])
            pos += 8 + ((n + 3) & -4)
        f.seek(0)
        f.write(data)
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # (a coarse clock may not tick)


@pytest.mark.parametrize("workers,mode,on_error", [(2, "raw", "raise"), (2, "decoded", "skip"), (0, "raw", "raise")])
def test_rewritten_in_place_while_read(rec, no_leaks, workers, mode, on_error):
    """Nothing of the new bytes is delivered (each sample is compared as it comes), and a worker that
    finds the file changed ends the pass even under ``on_error="skip"``: it is not one bad sample."""
    path, payloads = rec
    with pytest.raises(SourceError, match=rf"{path} changed while it was being read: it was rewritten"):
        _read(path, payloads, _rewrite, workers=workers, mode=mode, on_error=on_error)


@pytest.mark.parametrize("workers", [0, 2])
def test_grown_while_read_is_a_change_too(rec, tmp_path, no_leaks, workers):
    """Appended to, or rewritten whole with more bytes (``open(path, "wb")``): the file's size and time
    cannot tell the two apart, so a file that grows is a change as well."""
    path, payloads = rec
    more = tmp_path / "more.rec"
    write_rec(more, [b"appended"])
    size = os.path.getsize(path)

    def append(p):
        with open(p, "ab") as f:
            f.write(more.read_bytes())
    with pytest.raises(SourceError, match=rf"{path} changed while it was being read: it grew from {size} to "
                                          rf"{size + 16} bytes"):
        _read(path, payloads, append, workers=workers)
    with ParallelReader(path, workers=workers) as reader:  # the next reader reads it all
        assert [bytes(x) for x in reader][N:] == [b"appended"]


def test_rewritten_whole_with_more_bytes_while_read(rec, no_leaks):
    path, payloads = rec
    rng = random.Random(8)
    other = [rng.randbytes(rng.randint(0, 6000)) for _ in range(N + 100)]

    def rewrite(p):
        write_rec(p, other)  # (open(path, "wb"): the same inode, truncated, then written longer)
    # (the reader process may look while the file is being written, shorter than it was, or after)
    with pytest.raises(SourceError, match=rf"{path} changed while it was being read: it (grew|was truncated)"):
        _read(path, payloads, rewrite)
