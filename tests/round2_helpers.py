"""Decoders and small tools for test_reliability_round2.py.  Module-level, so that decoder processes
started with spawn/forkserver can import them (they get the parent's sys.path, which has tests/ on it)."""

from __future__ import annotations

import hashlib
import os
import queue
import random
import signal
import threading
import time
from typing import List, Optional

import numpy as np


def _marked(payload, marker: bytes) -> bool:
    return bytes(payload[: len(marker)]) == marker


# -- values that do not survive the trip back to the consumer --------------------------------------------

def explode():
    """Called when an :class:`Unrebuildable` is unpickled: rebuilding it fails."""
    raise RuntimeError("this value refuses to be rebuilt")


class Unrebuildable:
    """Pickles fine (by reference to the module-level :func:`explode`); unpickling raises RuntimeError."""

    def __reduce__(self):
        return (explode, ())


class UnpickleFailsOn:
    """``bytes(payload)``, except an :class:`Unrebuildable` for payloads starting with ``marker``."""

    def __init__(self, marker: bytes):
        self.marker = marker

    def __call__(self, payload):
        if _marked(payload, self.marker):
            return Unrebuildable()
        return bytes(payload)


class UnpicklableOn:
    """``bytes(payload)``, except a ``threading.Lock`` (cannot be pickled) for marked payloads."""

    def __init__(self, marker: bytes):
        self.marker = marker

    def __call__(self, payload):
        if _marked(payload, self.marker):
            return threading.Lock()
        return bytes(payload)


class OwnBaseException(BaseException):
    """A BaseException of a decoder's own (neither an Exception nor one Python knows)."""


class BrokenStr(Exception):
    """An exception whose ``str()`` raises."""

    def __str__(self):
        raise AttributeError("no message here")


class NotAnException(Exception):
    """An exception that pickles as something else (a ``__reduce__`` of its own gone wrong)."""

    def __reduce__(self):
        return dict, ((("why", "reduced"),),)


class RaiseBaseOn:
    """``bytes(payload)``, except that marked payloads raise the exception named ``exc_name``: a
    BaseException that is no Exception, or an exception that is hard to carry (its ``str()`` raises, it
    pickles as a dict)."""

    KINDS = {"KeyboardInterrupt": KeyboardInterrupt, "SystemExit": SystemExit, "GeneratorExit": GeneratorExit,
             "OwnBaseException": OwnBaseException, "BrokenStr": BrokenStr, "NotAnException": NotAnException}

    def __init__(self, marker: bytes, exc_name: str):
        self.marker, self.exc_name = marker, exc_name

    def __call__(self, payload):
        if _marked(payload, self.marker):
            raise self.KINDS[self.exc_name](f"{self.exc_name} raised by the decoder")
        return bytes(payload)


# -- a decoder process stopped while it sends a large result -------------------------------------------

BIG = 64 << 20


def big_value(payload) -> bytes:
    """The deterministic 64 MiB value of a payload."""
    return hashlib.sha256(bytes(payload)).digest() * (BIG // 32)


# write(2) and writev(2) numbers, as /proc/<pid>/task/<tid>/syscall shows them, and poll(2)/ppoll(2): a
# decoder process whose result pipe is full waits for room there (its writes do not block, so that it can
# ring the consumer's bell: parrecio.pipeline.pairing); the first poll after the decode is that wait
_WRITE_SYSCALLS = {"x86_64": {"1", "20", "7", "271"}, "aarch64": {"64", "66", "73"}}


def _in_syscall(path: str) -> str:
    """The number of the system call the thread is in ("running" when in none)."""
    with open(path) as f:
        return f.read().split()[0]


def _stop_me_while_sending() -> None:
    """SIGSTOP this process while it is writing its result into the result pipe.

    The brief's way is ``threading.Timer(0.02, os.kill, (pid, SIGSTOP))``, but 20 ms after the decoder
    returns the 64 MiB value may still be being pickled (nothing sent yet, which any liveness check
    handles).  So a watcher thread looks at what the main thread does (``/proc/self/task/<tid>/syscall``)
    and stops the process once it has been blocked in write()/writev() (or in the poll() that waits for
    room in the full pipe) for a few milliseconds: part of the result is in the pipe, the rest cannot
    follow until the consumer reads.  Where that file is not
    available, the Timer it is.
    """
    import platform
    pid = os.getpid()
    path = f"/proc/self/task/{pid}/syscall"
    writes = _WRITE_SYSCALLS.get(platform.machine())
    try:
        _in_syscall(path)
    except (OSError, IndexError):
        writes = None
    if writes is None:
        threading.Timer(0.02, os.kill, (pid, signal.SIGSTOP)).start()
        return

    def watch():
        end = time.monotonic() + 10
        seen = 0
        while time.monotonic() < end and seen < 3:
            try:
                seen = seen + 1 if _in_syscall(path) in writes else 0
            except (OSError, IndexError):
                break
            time.sleep(0.001)
        os.kill(pid, signal.SIGSTOP)

    threading.Thread(target=watch, daemon=True).start()


class StopWhileSending:
    """Small ``bytes`` for every payload, except marked ones: :func:`big_value` (64 MiB, ragged, so it
    travels pickled in the result message).  The first time (a flag file remembers) it also arranges for
    its own process to be SIGSTOPped while that result is being sent."""

    def __init__(self, marker: bytes, flag_path: str):
        self.marker, self.flag_path = marker, flag_path

    def __call__(self, payload):
        if _marked(payload, self.marker):
            if not os.path.exists(self.flag_path):
                open(self.flag_path, "w").close()
                _stop_me_while_sending()
            return big_value(payload)
        return bytes(payload)


# -- seeding -------------------------------------------------------------------------------------------

class SeedProbe:
    """``(pid, random.random(), np.random.random())`` for every payload (a ragged tuple), after sleeping
    ``sleep`` seconds."""

    def __init__(self, sleep: float = 0.0):
        self.sleep = sleep

    def __call__(self, payload):
        if self.sleep:
            time.sleep(self.sleep)
        return (os.getpid(), random.random(), float(np.random.random()))


# -- processes and output --------------------------------------------------------------------------------

class Lines:
    """The lines a subprocess prints, read by a thread, so that waiting for one can time out."""

    def __init__(self, stream) -> None:
        self.q: "queue.Queue[Optional[str]]" = queue.Queue()
        self.seen: List[str] = []
        self._t = threading.Thread(target=self._pump, args=(stream,), daemon=True)
        self._t.start()

    def _pump(self, stream) -> None:
        try:
            for line in stream:
                self.q.put(line.rstrip("\n"))
        except (ValueError, OSError):
            pass
        self.q.put(None)

    def get(self, timeout: float) -> Optional[str]:
        """The next line, or None at EOF or after ``timeout`` seconds."""
        try:
            line = self.q.get(timeout=timeout)
        except queue.Empty:
            return None
        if line is None:
            self.q.put(None)  # EOF stays EOF
        else:
            self.seen.append(line)
        return line

    def wait_for(self, start: str, timeout: float) -> Optional[str]:
        """The first line that starts with ``start`` within ``timeout`` seconds, or None."""
        end = time.monotonic() + timeout
        while True:
            left = end - time.monotonic()
            if left <= 0:
                return None
            line = self.get(left)
            if line is None:
                return None
            if line.startswith(start):
                return line


def alive(pids) -> List[int]:
    """The pids of ``pids`` that still run (zombies count as gone)."""
    import psutil
    out = []
    for p in pids:
        try:
            if psutil.Process(p).status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def wait_gone(pids, prefix: str, timeout: float = 8.0):
    """Wait up to ``timeout`` s for every pid to end and every segment of ``prefix`` to go; return
    ``(pids still alive, segments left)``."""
    from parrecio.pipeline.shm import leftover
    end = time.monotonic() + timeout
    while True:
        a, segs = alive(pids), leftover(prefix)
        if (not a and not segs) or time.monotonic() > end:
            return a, segs
        time.sleep(0.05)


def kill_quietly(pids) -> None:
    """SIGKILL (after SIGCONT) every pid of ``pids`` that still runs: clean-up after a failed test."""
    for p in pids:
        for sig in (signal.SIGKILL, signal.SIGCONT):
            try:
                os.kill(p, sig)
            except (ProcessLookupError, PermissionError):
                pass


def oneoff_bytes(prefix: str) -> int:
    """Total size of the one-off segments of ``prefix`` now in /dev/shm (not the ring ``<prefix>ring``,
    not the output slots ``<prefix>s<N>``)."""
    total = 0
    try:
        names = os.listdir("/dev/shm")
    except OSError:
        return 0
    for n in names:
        if not n.startswith(prefix):
            continue
        rest = n[len(prefix):]
        if rest == "ring" or (rest[:1] == "s" and rest[1:].isdigit()):
            continue
        try:
            total += os.stat(os.path.join("/dev/shm", n)).st_size
        except FileNotFoundError:
            pass
    return total


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))
