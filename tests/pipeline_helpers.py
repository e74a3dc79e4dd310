"""Decoders and streams for the pipeline tests.  Importable by decoder processes under every start
method (spawn/forkserver children get the parent's sys.path, which pytest has put this folder on)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import subprocess
import sys
import time
from typing import List

import numpy as np

from parrecio.decoders import ArraySpec
from parrecio.recordio import RecordWriter


def digest_array(payload, shape=(4, 3)) -> np.ndarray:
    """A deterministic uint8 array from the payload's bytes (sha256, repeated)."""
    n = int(np.prod(shape))
    h = hashlib.sha256(bytes(payload)).digest()
    return np.frombuffer((h * (n // 32 + 1))[:n], np.uint8).reshape(shape).copy()


class Fixed:
    """payload -> digest array of a fixed shape; writes straight into the output slot."""

    def __init__(self, shape=(4, 3)):
        self.shape = tuple(shape)
        self.output_spec = ArraySpec(self.shape, np.uint8)

    def __call__(self, payload):
        return digest_array(payload, self.shape)

    def decode_into(self, payload, out):
        out[...] = digest_array(payload, self.shape)


class FixedNoInto:
    """Like Fixed, but without decode_into: the pipeline copies the returned value into the slot."""

    output_spec = ArraySpec((4, 3), np.uint8)

    def __call__(self, payload):
        return digest_array(payload)


class Sleepy(Fixed):
    """Fixed, after sleeping 0..max_ms milliseconds (chosen by the payload): uneven decode times."""

    def __init__(self, max_ms=3.0):
        super().__init__()
        self.max_ms = max_ms

    def decode_into(self, payload, out):
        time.sleep(hashlib.md5(bytes(payload)).digest()[0] / 255 * self.max_ms / 1000)
        super().decode_into(payload, out)


class Ragged:
    """payload -> int32 array whose length depends on the payload (travels in the result message)."""

    def __call__(self, payload):
        b = bytes(payload)
        return np.frombuffer(b[: len(b) // 4 * 4], np.int32).copy()


PADDED = np.dtype({"names": ["a", "b"], "formats": [">i4", "<f8"], "offsets": [0, 8], "itemsize": 24})


class NonNative:
    """payload -> (a big-endian float32 array, a padded structured array), of ``payload[0] % 3 + 1`` rows
    (ragged) or, with ``fixed``, 2 rows (an output_spec); ``part`` 0 or 1: that array alone.
    payload[0] == ``fail`` raises ValueError."""

    def __init__(self, fixed: bool = False, fail: int = -1, part=None) -> None:
        self.fixed, self.fail, self.part = fixed, fail, part
        if fixed:
            specs = (ArraySpec((2,), ">f4"), ArraySpec((2,), PADDED))
            self.output_spec = specs if part is None else specs[part]

    def __call__(self, payload):
        i = payload[0]
        if i == self.fail:
            raise ValueError("bad sample")
        n = 2 if self.fixed else i % 3 + 1
        s = np.zeros(n, PADDED)
        s["a"], s["b"] = i, -i
        both = (np.full(n, i, ">f4"), s)
        return both if self.part is None else both[self.part]


class Pair:
    """payload -> (fixed digest array, ragged dict): a tuple output_spec like ImageRecord's."""

    output_spec = (ArraySpec((4, 3), np.uint8), None)

    def __call__(self, payload):
        return digest_array(payload), {"n": len(payload)}

    def decode_into(self, payload, out):
        out[0][...] = digest_array(payload)
        return (None, {"n": len(payload)})


class Verbose:
    """Raises ValueError whose message holds the whole payload (as hex) on payloads starting with b"BAD"."""

    def __call__(self, payload):
        if bytes(payload[:3]) == b"BAD":
            raise ValueError(f"cannot read {bytes(payload).hex()}")
        return len(payload)


class FailOn:
    """Raises ValueError on payloads starting with ``marker``, else returns the digest array."""

    output_spec = ArraySpec((4, 3), np.uint8)

    def __init__(self, marker: bytes):
        self.marker = marker

    def __call__(self, payload):
        if bytes(payload[: len(self.marker)]) == self.marker:
            raise ValueError(f"refusing {bytes(payload[:16])!r}")
        return digest_array(payload)


class KillOn(Fixed):
    """SIGKILLs its own process on payloads starting with ``marker`` (a poison record)."""

    def __init__(self, marker: bytes):
        super().__init__()
        self.marker = marker

    def decode_into(self, payload, out):
        if bytes(payload[: len(self.marker)]) == self.marker:
            os.kill(os.getpid(), signal.SIGKILL)
        super().decode_into(payload, out)


class KillOnceOn(Fixed):
    """SIGKILLs its process the first time it meets ``marker`` (a flag file remembers), like an
    OOM kill that does not come back."""

    def __init__(self, marker: bytes, flag_path: str):
        super().__init__()
        self.marker, self.flag_path = marker, flag_path

    def decode_into(self, payload, out):
        if bytes(payload[: len(self.marker)]) == self.marker and not os.path.exists(self.flag_path):
            open(self.flag_path, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        super().decode_into(payload, out)


class KillOnceSlowStart(KillOnceOn):
    """:class:`KillOnceOn` whose process, once the flag file exists, takes ``delay`` s to load it (a
    replacement worker that is still starting when it is given its first task)."""

    def __init__(self, marker: bytes, flag_path: str, delay: float):
        super().__init__(marker, flag_path)
        self.delay = delay

    def __setstate__(self, state):
        self.__dict__.update(state)
        if os.path.exists(self.flag_path):
            time.sleep(self.delay)


def payloads(n: int, seed: int = 0, max_len: int = 200) -> List[bytes]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, int(rng.integers(0, max_len)), dtype=np.uint8).tobytes() for _ in range(n)]


def write_rec(path, records) -> List[int]:
    """Write records with RecordWriter; return each record's byte offset."""
    offsets = []
    with RecordWriter(str(path)) as w:
        for r in records:
            offsets.append(w.tell())
            w.write(r)
    return offsets


def our_children() -> List[int]:
    """Live descendants of this process, zombies excluded.  The forkserver and the resource tracker
    (multiprocessing's own long-lived helpers) do not count, but the workers forked by the
    forkserver do."""
    import psutil

    def alive(p):
        try:
            return p.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    out = []
    for c in psutil.Process().children():
        try:
            cmd = " ".join(c.cmdline())
            below = c.children(recursive=True)
        except psutil.NoSuchProcess:
            continue
        helper = "forkserver" in cmd or "resource_tracker" in cmd
        out += [p.pid for p in ([] if helper else [c]) + below if alive(p)]
    return out


class HangOn(Fixed):
    """Sleeps for an hour on payloads starting with ``marker`` (a decoder that hangs)."""

    def __init__(self, marker: bytes):
        super().__init__()
        self.marker = marker

    def decode_into(self, payload, out):
        if bytes(payload[: len(self.marker)]) == self.marker:
            time.sleep(3600)
        super().decode_into(payload, out)


@contextlib.contextmanager
def deadline(seconds: float):
    """Fail (instead of hanging the suite) when the block runs longer than ``seconds``.

    SIGALRM's handler raises TimeoutError in the main thread, inside whatever wait the consumer is in;
    the exception then goes through the pipeline's own cleanup (generator ``finally``, ``close``)."""
    def on_alarm(signum, frame):
        raise TimeoutError(f"still running after {seconds} s: the pipeline hangs")
    old = signal.signal(signal.SIGALRM, on_alarm)
    t0 = time.monotonic()
    outer, _ = signal.setitimer(signal.ITIMER_REAL, seconds)  # pytest-timeout's alarm, if it set one
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        if outer:  # give the per-test timeout back what is left of it
            signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - t0), 0.001))


def feed_fifo(src, fifo, chunk: int, pause: float) -> subprocess.Popen:
    """Another process that writes the file ``src`` into ``fifo`` in ``chunk``-byte writes, sleeping
    ``pause`` seconds after each: a slow producer."""
    return subprocess.Popen([sys.executable, "-c", (
        "import sys, time\n"
        "data = open(sys.argv[1], 'rb').read()\n"
        "with open(sys.argv[2], 'wb', buffering=0) as f:\n"
        "    for i in range(0, len(data), int(sys.argv[3])):\n"
        "        f.write(data[i:i + int(sys.argv[3])]); time.sleep(float(sys.argv[4]))\n"),
        str(src), str(fifo), str(chunk), str(pause)])


# -- waiting on state instead of sleeping -----------------------------------------------------------------
# A loaded 2-core machine can take seconds for what takes milliseconds on an idle one: tests wait for the
# state they need (a line printed, a process started or gone, a FIFO drained), with a generous deadline,
# and a failure says what never happened.

WAIT = 30.0  # seconds: the default deadline of wait_until


def read_until_error(reader, errors=(Exception,), take=lambda item: item):
    """``(items, error)``: ``take(item)`` of each item one pass of ``reader`` yields until it ends, and
    the exception of ``errors`` that ended it (None when it ended cleanly)."""
    items = []
    try:
        for item in reader:
            items.append(take(item))
    except errors as exc:
        return items, exc
    return items, None


def wait_until(predicate, timeout: float = WAIT, what: str = "the condition", interval: float = 0.01):
    """Poll ``predicate()`` until it returns something truthy; return that.  After ``timeout`` seconds
    raise AssertionError naming ``what`` was awaited."""
    end = time.monotonic() + timeout
    delay = min(interval, 0.001)
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"waited {timeout:g} s for {what}: it did not happen")
        time.sleep(delay)  # a poll interval, not a synchronisation
        delay = min(delay * 2, interval)


def proc_state(pid: int):
    """The state letter of ``pid`` from /proc/<pid>/stat ('R', 'S', 'T', 'Z', ...), None when gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()[0]  # after "pid (comm) "; comm may hold spaces


def is_blocked(pid: int, checks: int = 3, gap: float = 0.02) -> bool:
    """True when ``pid`` is asleep (state 'S') at ``checks`` looks ``gap`` seconds apart: blocked in a
    wait, not passing through one."""
    for i in range(checks):
        if i:
            time.sleep(gap)
        if proc_state(pid) != "S":
            return False
    return True


def catches(pid: int, *signums: int) -> bool:
    """True when process ``pid`` has a handler installed for every signal of ``signums`` (SigCgt in
    /proc/<pid>/status): it has got past the point of its start where it installs them."""
    try:
        with open(f"/proc/{pid}/status") as f:
            line = next(x for x in f if x.startswith("SigCgt:"))
    except (OSError, StopIteration):
        return False
    mask = int(line.split()[1], 16)
    return all(mask >> (s - 1) & 1 for s in signums)


def has_open(pid: int, path) -> bool:
    """True when process ``pid`` has ``path`` open (a descriptor in /proc/<pid>/fd points at it)."""
    target = os.path.realpath(str(path))
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                return True
        except OSError:
            pass
    return False


def fifo_unread(path) -> int:
    """Bytes written into the FIFO ``path`` and not read yet (FIONREAD).  Opens a read end for a moment:
    call it only once the writer has opened its end (else this open would be the reader it waits for)."""
    import fcntl
    import struct
    import termios
    fd = os.open(str(path), os.O_RDONLY | os.O_NONBLOCK)
    try:
        return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]
    finally:
        os.close(fd)


class Drain:
    """Everything a binary stream (a subprocess's stdout or stderr) gives, collected by a thread into
    ``data``, so that a test can wait for some output without blocking on the stream."""

    def __init__(self, stream) -> None:
        import threading
        self.data = b""
        self.eof = False
        self._stream = stream
        self._t = threading.Thread(target=self._pump, daemon=True)
        self._t.start()

    def _pump(self) -> None:
        try:
            while True:
                chunk = self._stream.read1(65536) if hasattr(self._stream, "read1") else self._stream.read(65536)
                if not chunk:
                    break
                self.data += chunk
        except (ValueError, OSError):
            pass
        self.eof = True

    def join(self, timeout: float = WAIT) -> bytes:
        """Wait for EOF (up to ``timeout`` s); return what was read."""
        self._t.join(timeout)
        return self.data
