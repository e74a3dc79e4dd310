"""A file that changes while a *shuffled* or equally sharded pass reads it: by its ``.idx`` offsets
(``pread``), or copied into the shuffle buffer.  As for a pass in file order (test_file_changes.py), the
pass ends with a SourceError that names the file -- whatever ``on_error`` says -- and no sample is of
other bytes: every one delivered is one of the file's payloads as written.

Before, a read by index never looked at the file again (2,744 of 3,000 samples were the rewritten bytes,
no error; a truncation was counted as 2,705 skipped samples under ``on_error="skip"``), a chunk that failed
its check was sent anyway at the reader's end, and groups held in the shuffle buffer were never checked
after their copy (200,000 samples mixed from two versions of the file).
"""

from __future__ import annotations

import hashlib
import os
import random
import threading
import time

import pytest

from parrecio import ParallelReader, RecordWriter, Tuning
from parrecio.errors import SourceError
from test_file_changes import _rewrite

N = 3000


def digest(payload) -> str:
    return hashlib.sha256(bytes(payload)).hexdigest()


def _write(path, payloads, index: bool) -> None:
    with RecordWriter(str(path), index=str(path.with_suffix(".idx")) if index else None) as w:
        for key, p in enumerate(payloads):
            w.write(p, key=key)


@pytest.fixture
def payloads():
    rng = random.Random(11)
    return [rng.randbytes(rng.randint(0, 6000)) for _ in range(N)]  # ~9 MB


def _read(path, payloads, change, **kw) -> int:
    """Samples until the error, each checked to be one of ``payloads``; ``change(path)`` after the third."""
    known = {digest(p) for p in payloads}
    n = 0
    with ParallelReader(str(path), tuning=Tuning(ring_bytes=1 << 20), **kw) as reader:
        for item in reader:
            assert digest(item) in known, f"sample {n} is not of the file as it was written"
            n += 1
            if n == 3:
                change(str(path))
    return n


def _rewrite_all(path):
    """Every payload byte inverted, the framing and the size kept; a new mtime (whatever a chunk holds,
    it is of other bytes now)."""
    with open(path, "r+b") as f:
        data = bytearray(f.read())
        pos = 0
        while pos < len(data):
            n = int.from_bytes(data[pos + 4:pos + 8], "little") & ((1 << 29) - 1)
            data[pos + 8:pos + 8 + n] = bytes(b ^ 0xFF for b in data[pos + 8:pos + 8 + n])
            pos += 8 + ((n + 3) & -4)
        f.seek(0)
        f.write(data)
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def _truncate(path):
    os.truncate(path, 65536)


def _append(path):
    with open(path, "ab") as f:
        f.write(b"\x0a\x23\xd7\xce\x04\x00\x00\x00more")


@pytest.mark.parametrize("how, change, said", [
    ("index", _rewrite, "it was rewritten"), ("index", _truncate, "it was truncated from"),
    ("index", _append, "it grew from"), ("even_shards", _rewrite, "it was rewritten"),
    ("buffer", _rewrite, "it was rewritten"), ("buffer", _rewrite_all, "it was rewritten"),
    ("buffer", _truncate, "it was truncated from")])
@pytest.mark.parametrize("workers, on_error", [(0, "raise"), (2, "raise"), (0, "skip"), (2, "skip")])
def test_a_shuffled_read_of_a_file_that_changes_ends_with_a_source_error(tmp_path, payloads, how, change, said,
                                                                         workers, on_error, no_leaks):
    path = tmp_path / "data.rec"
    _write(path, payloads, index=how != "buffer")
    kw = dict(num_shards=2, shard_index=0, even_shards="pad") if how == "even_shards" else dict(shuffle=True)
    with pytest.raises(SourceError, match=rf"{path} changed while it was being read: {said}"):
        _read(path, payloads, change, workers=workers, on_error=on_error, **kw)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_file_that_fits_the_shuffle_buffer_is_read_whole_of_one_version_or_refused(tmp_path, workers, no_leaks):
    """Every group waits in the buffer until the file is framed: a rewrite during the framing (same size,
    same framing, other bytes) is refused, or comes too late to be seen -- never a mix of the two."""
    rng = random.Random(5)
    old = [rng.randbytes(8) for _ in range(60_000)]
    new = [bytes(b ^ 0xFF for b in p) for p in old]
    path = tmp_path / "d.rec"
    _write(path, new, index=False)
    rewritten = path.read_bytes()
    _write(path, old, index=False)
    data = path.read_bytes()
    for delay in (0.05, 0.15, 0.3):
        def rewrite():  # in place (never shorter: a file opened while being written is read as it is)
            time.sleep(delay)
            with open(path, "r+b") as f:
                f.write(rewritten)
            st = os.stat(path)
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
        t = threading.Thread(target=rewrite)
        got = []
        with ParallelReader(str(path), workers=workers, shuffle=True, shuffle_buffer=100_000) as reader:
            t.start()
            try:
                got = [bytes(p) for p in reader]
            except SourceError as e:
                assert "changed while it was being read" in str(e)
            finally:
                t.join()
        versions = {"old" if p in set(old) else "new" if p in set(new) else "other" for p in got[:1000]}
        assert len(versions) <= 1 and "other" not in versions, (delay, versions)
        if got:
            assert sorted(got) == sorted(old if versions == {"old"} else new)
        path.write_bytes(data)  # (the next round starts from the old version)


def test_a_chunk_that_failed_its_check_is_never_sent(tmp_path, no_leaks):
    """The reader process's check failed before a chunk went out; the error ended its framing, and its
    last flush sent that same chunk without a check: rewritten samples came before the error (samples 85
    and 127 of this stream).  The chunk is dropped now."""
    rng = random.Random(7)
    payloads = [b"%06d" % i + rng.randbytes(rng.randint(0, 3000)) for i in range(N)]
    path = tmp_path / "data.rec"
    _write(path, payloads, index=False)
    with pytest.raises(SourceError, match=rf"{path} changed while it was being read: it was rewritten"):
        _read(path, payloads, _rewrite_all, workers=2, shuffle=True)


@pytest.mark.parametrize("workers", [1, 3])
def test_groups_larger_than_half_the_ring_read_by_index_are_checked_too(tmp_path, workers, no_leaks):
    """Such a group travels in a segment of its own, sent at once: with the checks made once per chunk,
    it went out unchecked (7 of 10 samples were the rewritten bytes, no error).  (With workers=0 the ten
    are read, and checked, before the first sample is out.)"""
    rng = random.Random(2)
    payloads = [rng.randbytes(600_000) for _ in range(10)]
    path = tmp_path / "big.rec"
    _write(path, payloads, index=True)
    with pytest.raises(SourceError, match=rf"{path} changed while it was being read: it was rewritten"):
        _read(path, payloads, _rewrite_all, workers=workers, shuffle=True)
