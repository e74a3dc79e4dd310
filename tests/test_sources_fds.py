"""stdin and open file objects: descriptors carried to reader processes, pump threads, one epoch only."""

import gzip
import io
import os
import pickle
import subprocess
import sys
import textwrap
import time

import pytest

from parrecio.errors import SourceError
from parrecio.sources import FdSource, PumpSource, resolve
from source_helpers import digest, make_payloads, read_epoch, read_in_child, summarize, write_rec

HERE = os.path.dirname(os.path.abspath(__file__))
METHODS = ["fork", "spawn", "forkserver"]


def expect(name, data):
    return [[(name, digest(data), len(data))]]


@pytest.fixture
def rec(tmp_path):
    path = tmp_path / "data.rec"
    return str(path), write_rec(path, make_payloads(300, seed=3, hi=2000))


def _piped(tmp_path, data: bytes, bufsize: int = 0) -> subprocess.Popen:
    """A ``cat`` process writing ``data`` into a pipe: ``.stdout`` is the read end (raw if ``bufsize=0``).

    Another process writes, not a thread: a child forked from this process would inherit a thread's
    write end and never see the end of the pipe.
    """
    path = tmp_path / f"piped-{len(data)}"
    path.write_bytes(data)
    return subprocess.Popen(["cat", str(path)], stdout=subprocess.PIPE, bufsize=bufsize)


def test_regular_file_object_is_read_from_its_position_without_moving_it(rec):
    path, data = rec
    with open(path, "rb") as f:
        f.read(12)  # buffered: the descriptor's own offset is far ahead
        source = resolve(f)
        assert isinstance(source, FdSource) and source.kind == "fileobj"
        # (named with where it starts: the byte offsets of its errors count from there)
        assert read_epoch(source, 0) == [(f"<file object {path} from byte 12>", data[12:])]
        assert f.tell() == 12 and f.read(4) == data[12:16]  # the user's object is untouched
        source.release()


@pytest.mark.parametrize("make", ["bytesio", "gzip", "buffered-pipe"])
def test_objects_without_a_safe_descriptor_are_pumped(rec, tmp_path, make):
    path, data = rec
    if make == "bytesio":
        obj = io.BytesIO(b"skip" + data)
        obj.read(4)
    elif make == "gzip":  # GzipFile.fileno() works, but is the *compressed* file's descriptor
        with gzip.open(tmp_path / "data.rec.gz", "wb") as gz:
            gz.write(data)
        obj = gzip.open(tmp_path / "data.rec.gz", "rb")
        assert obj.fileno() >= 0
    else:  # a buffered reader over a pipe may hold bytes its descriptor no longer has
        cat = _piped(tmp_path, b"xy" + data, bufsize=-1)
        obj = cat.stdout
        assert obj.read(2) == b"xy"
    with resolve(obj) as source:
        assert isinstance(source, PumpSource)
        [(_, got)] = read_epoch(source, 0)
        assert got == data
    obj.close()
    if make == "buffered-pipe":
        cat.wait(10)


def test_unbuffered_pipe_uses_its_descriptor(rec, tmp_path):
    _, data = rec
    cat = _piped(tmp_path, data)
    with cat.stdout as raw:
        with resolve(raw) as source:
            assert isinstance(source, FdSource) and not isinstance(source, PumpSource)
            assert read_epoch(source, 0)[0][1] == data
    cat.wait(10)


def test_one_epoch_only_and_reading_twice(rec):
    path, data = rec
    with open(path, "rb") as f, resolve(f) as source:
        assert source.epochs_supported == 1
        with pytest.raises(SourceError, match="an open file object can be read only once; epoch 1"):
            next(source.streams(1))
        read_epoch(source, 0)
        with pytest.raises(SourceError, match="already read"):
            next(source.streams(0))


def test_text_mode_and_closed_objects_are_refused(rec):
    path, _ = rec
    with open(path, "r", encoding="latin-1") as f:
        with pytest.raises(SourceError, match="text mode"):
            resolve(f)
    with open(path, "rb") as f:
        pass
    with pytest.raises(SourceError, match="is closed"):
        resolve(f)


class _Failing(io.RawIOBase):
    """A readable object that gives ``good`` bytes, then raises."""

    def __init__(self, good: bytes):
        self.good = good

    def readable(self):
        return True

    def read(self, n=-1):
        if self.good:
            out, self.good = self.good[:n], self.good[n:]
            return out
        raise ConnectionResetError("the server went away")


def test_pump_error_reaches_the_reader_as_source_error():
    with resolve(_Failing(b"x" * 100_000)) as source:
        [stream] = source.streams(0)
        with stream.file as f, pytest.raises(SourceError, match="reading the file object failed: "
                                                                  "ConnectionResetError: the server went away"):
            f.read()


def test_released_pump_is_a_truncation_error_and_release_never_hangs():
    data = os.urandom(3 << 20)  # far more than a socket buffer: the pump blocks on a full socket
    source = resolve(io.BytesIO(data))
    [stream] = source.streams(0)
    head = stream.file.read(1000)
    assert head == data[:1000]
    start = time.monotonic()
    source.release()
    source.release()  # idempotent
    assert time.monotonic() - start < 1.5
    with stream.file as f, pytest.raises(SourceError, match="ended early"):
        f.read()
    with pytest.raises(SourceError, match="released or already-read"):
        pickle.dumps(source)


def test_pump_release_when_never_read_and_after_reader_closed():
    source = resolve(io.BytesIO(os.urandom(2 << 20)))
    [stream] = source.streams(0)
    stream.file.read(10)
    stream.file.close()  # the reader side is gone
    start = time.monotonic()
    source.release()
    assert time.monotonic() - start < 1.5
    unread = resolve(io.BytesIO(os.urandom(2 << 20)))
    del unread  # the finalizer releases it


@pytest.mark.parametrize("method", METHODS)
def test_sources_pickle_into_children(rec, tmp_path, method):
    """Every kind of carried source, read in a child of each start method, gives the same bytes."""
    path, data = rec
    cat = _piped(tmp_path, data)
    regular = open(path, "rb")
    regular.read(7)
    objs = [regular, io.BytesIO(data), cat.stdout]
    sources = [resolve(str(tmp_path)), *map(resolve, objs)]
    try:
        got = read_in_child(method, sources)
        assert got == [
            expect(path, data),
            expect(f"<file object {path} from byte 7>", data[7:]),
            expect("<BytesIO object>", data),
            expect(f"<file object fd {cat.stdout.fileno()}>", data),
        ]
        assert regular.tell() == 7
    finally:
        for source in sources:
            source.release()
        for obj in objs:
            obj.close()
        cat.wait(10)


@pytest.mark.parametrize("method", METHODS)
def test_pump_survives_forked_copies_of_its_socket(method):
    """Any process forked after the pump started holds its socket; the reader still sees the end."""
    data = os.urandom(600_000)
    with resolve(io.BytesIO(data)) as source:
        assert read_in_child(method, [source]) == [expect("<BytesIO object>", data)]


STDIN_SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, {here!r})
    from parrecio.errors import SourceError
    from parrecio.sources import resolve
    from source_helpers import read_in_child
    source = resolve("-")
    [got] = read_in_child({method!r}, [source])
    try:
        next(source.streams(1))
    except SourceError as exc:
        once = str(exc)
    print(repr((got, once)))
""")


@pytest.mark.parametrize("method", METHODS)
def test_stdin_via_a_pipe_is_read_in_a_child(method):
    data = b"".join(make_payloads(400, seed=5, hi=1500))  # bigger than a pipe buffer
    script = STDIN_SCRIPT.format(here=HERE, method=method)
    proc = subprocess.run([sys.executable, "-c", script], input=data, capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr.decode()
    got, once = eval(proc.stdout.decode())
    assert got == expect("<stdin>", data)
    assert "stdin can be read only once" in once


def test_summarize_reports_errors_as_data(tmp_path):
    assert summarize(resolve(io.BytesIO(b"")), [1])[0] == "error"


def _open_fds() -> dict:
    out = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            out[int(fd)] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # (the listing's own descriptor)
            pass
    return out


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_readers_of_file_objects_leave_no_descriptor_open(rec, method):
    """Each ParallelReader over an open file or a BytesIO used to leave two descriptors open for good:
    the fork server's module list pickled the source, and reducing a descriptor's carrier outside a
    child's start hands a duplicate to multiprocessing's resource sharer, kept until someone asks."""
    from parrecio import ParallelReader, Tuning
    path, data = rec
    want = make_payloads(300, seed=3, hi=2000)
    tuning = Tuning(start_method=method)

    def read(obj) -> list:
        with ParallelReader(obj, workers=2, tuning=tuning) as reader:
            return [bytes(p) for p in reader]

    with open(path, "rb") as f:
        assert read(f) == want  # the first: the fork server starts (its pipes stay, as they should)
    before = _open_fds()
    for _ in range(3):
        with open(path, "rb") as f:
            assert read(f) == want
        assert read(io.BytesIO(data)) == want
    after = _open_fds()
    assert {fd: what for fd, what in after.items() if before.get(fd) != what} == {}


def test_plain_picklable_tells_descriptors_apart_without_side_effects(rec, tmp_path):
    from parrecio.pipeline.children import plain_picklable
    path, _ = rec
    before = _open_fds() if os.path.isdir("/proc/self/fd") else {}
    with open(path, "rb") as f:
        source = resolve(f)
        assert plain_picklable(source) is False  # a descriptor inside: not for a process started earlier
        source.release()
    assert plain_picklable(resolve(str(tmp_path))) is True
    assert plain_picklable(lambda: 0) is False  # (does not pickle)
    if before:
        assert _open_fds() == before


@pytest.mark.parametrize("workers", [0, 2])
def test_a_quiet_peers_object_closes_after_the_reader_and_its_buffer_is_read(workers):
    """A buffered reader over a socket whose peer sent its records and stays connected, quiet.  The pump
    blocked in the object's read1(), holding its lock past close(): the user's own close() of the object
    (the end of a `with`) waited for ever (audit).  It reads once the descriptor is ready now -- and
    the bytes the object held buffered already (the user read its first 2 bytes: the rest of what the
    peer sent is in the object's buffer, not in the socket) are read at once, not after the peer's next
    send."""
    import socket
    import threading
    from parrecio import ParallelReader, RecordWriter
    a, b = socket.socketpair()
    buf = io.BytesIO()
    with RecordWriter(buf) as w:
        for i in range(50):
            w.write(b"rec %d" % i)
    a.sendall(b"xy" + buf.getvalue())
    f = b.makefile("rb")
    assert f.read(2) == b"xy"  # (the object now holds the rest in its buffer)
    got, closed = [], threading.Event()
    try:
        with ParallelReader(f, workers=workers) as reader:
            for i, rec in enumerate(reader):
                got.append(bytes(rec))
                if i == 49:
                    break
        closer = threading.Thread(target=lambda: (f.close(), closed.set()), daemon=True)
        closer.start()
        assert closed.wait(5), "the file object's close() waited for the pump"
    finally:
        a.close()
        b.close()
    assert got == [b"rec %d" % i for i in range(50)]
