"""Helpers for the sources tests: data makers, stream readers, child-process and FIFO-writer targets.

Importable by spawn/forkserver children (pytest puts ``tests/`` on ``sys.path``, and multiprocessing
passes ``sys.path`` to its children).
"""

from __future__ import annotations

import hashlib
import io
import os
import random
import time
from typing import List, Sequence, Tuple

from parrecio.recordio import RecordReader, RecordWriter

CHILD_TIMEOUT = 30.0
_LETTERS = bytes(b"abcdefghijklmnop"[i % 16] for i in range(256))


def make_payloads(n: int, seed: int = 0, lo: int = 0, hi: int = 300) -> List[bytes]:
    """``n`` random payloads of ``lo..hi`` bytes (letters only: never the RecordIO magic)."""
    rng = random.Random(seed)
    return [rng.randbytes(rng.randint(lo, hi)).translate(_LETTERS) for _ in range(n)]


def write_rec(path, payloads: Sequence[bytes]) -> bytes:
    """Write ``payloads`` as an MXNet-framed ``.rec`` file; return the file's bytes."""
    with RecordWriter(os.fspath(path)) as writer:
        for payload in payloads:
            writer.write(payload)
    with open(path, "rb") as f:
        return f.read()


def records_of(data: bytes, join: str = "mxnet") -> List[bytes]:
    """The record payloads of a RecordIO byte string."""
    return [r.payload for r in RecordReader(io.BytesIO(data), join=join)]


def read_epoch(source, epoch: int) -> List[Tuple[str, bytes]]:
    """``[(stream name, bytes), ...]`` of one epoch, read here."""
    out = []
    for stream in source.streams(epoch):
        with stream.file as f:
            out.append((stream.name, f.read()))
    return out


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def summarize(source, epochs) -> list:
    """``[[(name, sha256, size) per stream] per epoch]``, or ``("error", type name, message)``."""
    try:
        result = []
        for epoch in epochs:
            streams = []
            for stream in source.streams(epoch):
                with stream.file as f:
                    data = f.read()
                streams.append((stream.name, digest(data), len(data)))
            result.append(streams)
        return result
    except Exception as exc:  # returned as data: the test asserts on it
        return ("error", type(exc).__name__, str(exc))


def child_read(sources, epochs, conn) -> None:
    """Child-process target: send ``[summarize(source, epochs) for source in sources]``."""
    try:
        conn.send([summarize(source, epochs) for source in sources])
    finally:
        conn.close()


def read_in_child(method: str, sources, epochs=(0,), timeout: float = CHILD_TIMEOUT):
    """Start one ``method`` child (``fork``/``spawn``/``forkserver``) that reads each of ``sources``.

    Returns the child's list of :func:`summarize` results, one per source.
    """
    import multiprocessing

    ctx = multiprocessing.get_context(method)
    here, there = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=child_read, args=(list(sources), list(epochs), there), daemon=True)
    proc.start()
    there.close()
    try:
        if not here.poll(timeout):
            raise AssertionError(f"{method} child sent nothing within {timeout} s")
        return here.recv()
    finally:
        proc.join(timeout)
        if proc.is_alive():
            proc.kill()
            proc.join()
        here.close()


def fifo_feeder(data_dir: str, channel: str, epochs: Sequence[bytes], delay: float, chunk: int) -> None:
    """Writer-process target: after ``delay`` s, serve each epoch's bytes as FIFO ``<channel>_<e>``.

    Writes ``chunk`` bytes at a time (small writes, so the reader sees short reads), removes each FIFO
    once written.
    """
    for epoch, data in enumerate(epochs):
        time.sleep(delay)
        path = os.path.join(data_dir, f"{channel}_{epoch}")
        os.mkfifo(path)
        try:
            fd = os.open(path, os.O_WRONLY)  # blocks until the reader opens it
            try:
                for start in range(0, len(data), chunk):
                    os.write(fd, data[start:start + chunk])
            finally:
                os.close(fd)
        finally:
            os.unlink(path)


def make_jpeg(seed: int, size=(40, 30)) -> bytes:
    """A small real JPEG (random-ish colours), made with PIL."""
    from PIL import Image

    rng = random.Random(seed)
    image = Image.new("RGB", size, tuple(rng.randrange(256) for _ in range(3)))
    for _ in range(5):
        x, y = rng.randrange(size[0]), rng.randrange(size[1])
        image.putpixel((x, y), tuple(rng.randrange(256) for _ in range(3)))
    buf = io.BytesIO()
    image.save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def frame_flags(data: bytes) -> List[Tuple[int, int]]:
    """``[(cflag, length), ...]`` of every frame of a RecordIO byte string (checks magic and padding)."""
    import struct

    out, pos = [], 0
    while pos < len(data):
        magic, lrec = struct.unpack_from("<II", data, pos)
        assert magic == 0xCED7230A, f"bad magic at {pos}"
        length = lrec & ((1 << 29) - 1)
        out.append((lrec >> 29, length))
        pad = -length % 4
        assert data[pos + 8 + length:pos + 8 + length + pad] == b"\0" * pad
        pos += 8 + length + pad
    return out


def wait_for_path(path, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} did not appear within {timeout} s")
        time.sleep(0.01)


# -- S3 on moto (tests/test_sources_s3.py, tests/test_real_scale.py) ---------------------------------------
def moto_endpoint():
    """Start a moto S3 server on a free loopback port; a generator for a fixture: yields its endpoint
    URL, stops it afterwards.  The caller has checked that moto is installed."""
    import logging

    from moto import server as moto_server
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def use_moto(monkeypatch, url: str, tmp_path) -> None:
    """The standard AWS configuration pointing at the moto server ``url``: AWS_ENDPOINT_URL and dummy
    credentials, no other AWS_* variable and no profile or config file of the machine."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_ENDPOINT_URL", url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
