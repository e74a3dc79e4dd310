"""The pipeline's child processes: how they start, how they watch their consumer, how they end.

::

    consumer ──start(proc)──> reader process, decoder processes      (forkserver / spawn / fork)
       │ lifeline (a pipe only the consumer writes to: EOF = the consumer is gone)
       └──────────────────────> child_entry: watchdog thread + SIGTERM/SIGHUP handler -> sweep(prefix)

- :func:`child_entry` is every child's entry point.  Ctrl-C is ignored (the consumer handles it and stops
  its children).  A watchdog thread waits on the lifeline, so a child notices its consumer's death even
  while its main thread is blocked in a system call (opening a FIFO that has no writer yet, a read of a
  stalled pipe): it removes the run's shared memory, which the dead consumer cannot, and exits.  SIGTERM
  and SIGHUP (a job scheduler, ``timeout``, a closed terminal: usually sent to the whole process group)
  get the same clean-up when the consumer died of it too.
- :func:`start` starts a child.  Under ``spawn``/``forkserver`` multiprocessing would re-import the user's
  ``__main__`` in the child (by its path, or its module name under ``python -m``): a script without an
  ``if __name__ == "__main__":`` guard -- the README's first snippet saved as a file -- would then run
  again in every decoder process and in the fork server, and fail there.  Our children need nothing of
  ``__main__``: what a decoder takes from it travels by value (:mod:`parrecio.pipeline.shipping`).  So
  ``__main__`` is started like an interactive session's: never re-imported.
- :func:`register_for_fork`: after ``os.fork()`` in the consumer (a logging or evaluation helper), the
  child must not own the parent's pipeline: it closes its copies of the consumer's pipe ends (above all
  the lifeline's write end, which would keep the children of a killed parent alive) and forgets the
  processes, so that its exit neither stops nor terminates them.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.context
import os
import pickle
import shlex
import signal
import subprocess
import sys
import threading
import time
import weakref
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, TypeVar

from ..errors import PipelineError
from ..sources.fds import FdCarrier
from .shm import SHM_DIR, sweep

__all__ = ["child_entry", "environ_now", "start", "start_retrying", "start_forkserver", "start_janitor",
           "describe_exit", "register_for_fork", "close_quietly"]

T = TypeVar("T")

# What every child runs: the fork server imports them once, before it forks the first child.
CHILD_MODULES = ("parrecio.pipeline.worker", "parrecio.pipeline.reader_proc")

TERMINATION_SIGNALS = tuple(s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None))
                            if s is not None)
CONSUMER_DEATH_GRACE = 1.0  # seconds a child that suspects its consumer's death waits for it to show


def describe_exit(code: Optional[int]) -> str:
    """'exit code 1' or 'killed by SIGKILL'."""
    if code is not None and code < 0:
        if -code == getattr(signal, "SIGBUS", None):  # a read of a mapping past the end of its file
            return ("killed by SIGBUS: a file read in place that shrank while it was read, or shared memory "
                    "(/dev/shm) that ran out")
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def child_entry(prefix: str, lifeline: Any, target: Callable[..., None], *args: Any,
                environ: Optional[Dict[str, str]] = None) -> None:
    """Entry point of the reader and decoder processes: set up the watch on the consumer, run ``target``.

    ``prefix`` names the run's shared memory (swept if the consumer dies); ``lifeline`` is the read end
    of the consumer's lifeline pipe; ``environ``: the consumer's ``os.environ`` when it started this
    process (:func:`environ_now`), taken on here."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the consumer's to handle; it stops us
    if hasattr(signal, "pthread_sigmask"):  # (blocked from our start on: see _sigint_held)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    if environ is not None and environ != os.environ:
        # A fork server's children inherit its environment, of when it booted (the first reader): what
        # the script set since would not reach the decoders, as it does under fork, spawn and workers=0.
        os.environ.clear()
        os.environ.update(environ)

    def on_termination(signum: int, frame: Any) -> None:
        # Sent to the whole process group, the signal killed the consumer too: its death shows on the
        # lifeline within moments.  Sent to this child alone, the consumer lives and replaces us.
        if lifeline.poll(CONSUMER_DEATH_GRACE):
            sweep(prefix)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)  # die of the signal, so that the exit status says so

    for sig in TERMINATION_SIGNALS:
        signal.signal(sig, on_termination)
    threading.Thread(target=_watchdog, args=(prefix, lifeline), name="parrecio-lifeline",
                     daemon=True).start()
    target(*args)
    # A target that returned because its consumer died (a spare reader's wait sees the lifeline too) must
    # not leave before the sweep: the watchdog thread that would do it dies with the process.
    if _consumer_gone(lifeline):
        sweep(prefix)


def environ_now() -> Dict[str, str]:
    """``os.environ`` now, for :func:`child_entry`'s ``environ``."""
    return dict(os.environ)


def _consumer_gone(lifeline: Any) -> bool:
    """Whether the lifeline shows the consumer's death (nothing is ever written to it: readable is EOF)."""
    try:
        return bool(lifeline.poll(0))
    except (OSError, ValueError):
        return False  # closed by this process: it is ending anyway


def _watchdog(prefix: str, lifeline: Any) -> None:
    """Wait for the consumer's death (EOF on the lifeline); then clean up after it and leave at once,
    whatever the main thread is blocked in."""
    try:
        lifeline.poll(None)
    except (OSError, ValueError):
        return  # the lifeline was closed by this process: it is ending anyway
    sweep(prefix)
    os._exit(0)


_STARTING = threading.local()  # .hiding: this thread is starting one of our children (see below)
_MAIN_KEYS = ("init_main_from_path", "init_main_from_name", "main_path")


def _without_main(original: Callable[[str], Dict[str, Any]]) -> Callable[[str], Dict[str, Any]]:
    def get_preparation_data(name: str) -> Dict[str, Any]:
        if not getattr(_STARTING, "hiding", False):
            return original(name)
        try:
            data = _in_some_dir(original, name)
        except AttributeError:
            # ``python -m pdb train.py``: pdb gives ``__main__`` a new namespace without ``__spec__``, which
            # this reads to tell the child how to import the script -- left out below anyway.  Read it
            # with a bare ``__main__`` in its place, for that call only.
            data = _with_bare_main(lambda n: _in_some_dir(original, n), name)
        for key in _MAIN_KEYS:
            data.pop(key, None)
        return data
    get_preparation_data.parrecio_original = original  # type: ignore[attr-defined]
    return get_preparation_data


def _in_some_dir(original: Callable[[str], Dict[str, Any]], name: str) -> Dict[str, Any]:
    """``original(name)``, also once this process's working directory was deleted: it asks for it
    (``os.getcwd()``, a bare FileNotFoundError then) only for the child to change into it.  Our children
    need none -- every path they are given is absolute -- so they start in ``/`` then."""
    try:
        return original(name)
    except FileNotFoundError:
        try:
            os.getcwd()
        except FileNotFoundError:
            pass
        else:
            raise  # (something else is missing)
    from multiprocessing import spawn
    real = spawn.os
    spawn.os = _RootCwd(real)  # type: ignore[assignment]  # (only the module's own name: os stays os)
    try:
        return original(name)
    finally:
        spawn.os = real


class _RootCwd:
    """``os`` as multiprocessing's spawn module sees it while it prepares a child of a process whose
    working directory is gone: ``getcwd()`` is ``/``."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def getcwd(self) -> str:
        return "/"

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def _with_bare_main(original: Callable[[str], Dict[str, Any]], name: str) -> Dict[str, Any]:
    import types
    main = sys.modules["__main__"]
    bare = types.ModuleType("__main__")
    bare.__spec__ = None
    sys.modules["__main__"] = bare
    try:
        return original(name)
    finally:
        sys.modules["__main__"] = main


@contextlib.contextmanager
def _main_not_reimported() -> Iterator[None]:
    """While this thread starts a child, what multiprocessing sends it to re-import ``__main__`` by (its
    path, its module name) is left out, as for an interactive session; see the module docstring.

    Multiprocessing's ``spawn.get_preparation_data`` (what the spawn and forkserver starts send the
    child, and the fork server) is wrapped once, and drops those keys only for a thread inside this
    block: ``__main__`` itself is never touched.  (Hiding its ``__file__`` and ``__spec__`` for the start
    hid them from the decoders pickled meanwhile -- a decoder that reads ``__file__`` failed with
    NameError in every worker --, from the user's other threads, and from a ``ProcessPoolExecutor``
    started in one of them; and ``os.fork()`` meanwhile left the child's ``__main__`` without them.)"""
    from multiprocessing import spawn
    if not hasattr(spawn.get_preparation_data, "parrecio_original"):
        spawn.get_preparation_data = _without_main(spawn.get_preparation_data)
    was = getattr(_STARTING, "hiding", False)
    _STARTING.hiding = True
    try:
        with _start_method_left_unset():
            yield
    finally:
        _STARTING.hiding = was


@contextlib.contextmanager
def _start_method_left_unset() -> Iterator[None]:
    """A start method the user has not chosen stays unchosen: the preparation data of a spawn or
    forkserver start asks multiprocessing for its start method, which fixes the default for the process
    (made at the construction of a reader, for the fork server, a later ``set_start_method("spawn")`` for
    the user's own pool raised 'context has already been set')."""
    default = getattr(multiprocessing.context, "_default_context", None)
    unset = default is not None and getattr(default, "_actual_context", False) is None
    try:
        yield
    finally:
        if unset and default._actual_context is default._default_context:
            default._actual_context = None


# The janitor's wait for the end of its stdin (the lifeline): a ``cat`` killed by a signal (status > 128)
# is started again -- the lifeline is still open, and a sweep then would remove a live run's shared memory.
_WAIT = "while :; do cat >/dev/null 2>&1; [ $? -gt 128 ] || break; done"


def start_janitor(prefix: str, lifeline_fd: int, detached: bool = False) -> Optional[Any]:
    """Start a process that removes the run's shared memory (``SHM_DIR/<prefix>*``) once the lifeline
    ends -- once this process is gone, however it went; on a clean close it finds nothing left.

    The children sweep when their consumer dies, but not always: before the first of them runs (the ring
    and the output slots are allocated first: a kill in that start-up, or SIGTERM to the whole group while
    the children still import, left them), and once they are gone (a Jupyter kernel that shuts down or
    restarts sends SIGTERM to every child of its own, the decoders and the reader end as asked, and is then
    killed: 90-400 MB per restart).  So a ``sh`` that waits on the lifeline with ``cat``, then ``rm``, in a
    session of its own (no signal sent to this process's group reaches it) and ignoring SIGHUP, SIGINT and
    SIGTERM.

    It is a child of this process, which reaps it at close (the returned ``Popen``): one left to init is
    reaped only where init reaps -- in a container whose first process is the training script itself it
    would stay a zombie.  ``detached`` (in a Jupyter kernel, which ends its children itself): left to init
    at once instead, and None is returned.  None too where it cannot be started (no ``/bin/sh``, no
    /dev/shm)."""
    if not os.path.isdir(SHM_DIR) or not os.path.exists("/bin/sh"):
        return None
    target = shlex.quote(os.path.join(SHM_DIR, prefix))
    try:
        if not detached:  # (the lifeline is its stdin)
            return subprocess.Popen(["/bin/sh", "-c", f'trap "" HUP INT TERM; {_WAIT}; rm -f -- {target}*'],
                                    stdin=lifeline_fd, start_new_session=True, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
        # (the lifeline comes as stdin, moved to fd 3: a background list's stdin is /dev/null, and dash
        # takes one-digit descriptors only -- a Jupyter kernel's pipe is numbered in the fifties)
        script = (f'exec 3<&0 </dev/null; (trap "" HUP INT TERM; exec 0<&3; {_WAIT}; rm -f -- {target}*) '
                  f'>/dev/null 2>&1 &')
        subprocess.run(["/bin/sh", "-c", script], stdin=lifeline_fd, start_new_session=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        pass
    return None


@contextlib.contextmanager
def _sigint_held(proc: Any) -> Iterator[None]:
    """SIGINT blocked in this thread while it starts a child, which inherits the mask (through fork, and
    exec under spawn) until :func:`child_entry` ignores SIGINT and unblocks it.  A Ctrl-C to the process
    group while a spawned child still imported and unpickled (a second or so) raised KeyboardInterrupt
    there, and its traceback -- numpy's "Importing the numpy C-extensions failed" among them -- reached
    the user's terminal beside their own handling of it.  One that reaches this process meanwhile is
    delivered when the block ends.  Not for a fork server's children: they get its mask, not ours, and
    a server this start launches (the last one died) would keep SIGINT blocked for good -- in the user's
    own ``forkserver`` children too."""
    method = getattr(proc, "_start_method", None)
    if method == "forkserver":
        yield
        return
    if method == "spawn":
        # (the start of multiprocessing's resource tracker, at the first such child, unblocks SIGINT
        # instead of restoring the mask: started first, it leaves ours alone)
        from multiprocessing import resource_tracker
        resource_tracker.ensure_running()
    try:
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    except (AttributeError, OSError, ValueError):  # pragma: no cover - no pthread_sigmask
        yield
        return
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def start(proc: Any) -> None:
    """Start the multiprocessing process ``proc``, without re-importing ``__main__`` in it (and, when this
    start launches the fork server, in the fork server: see :func:`_main_not_reimported`)."""
    try:
        with _main_not_reimported(), _sigint_held(proc):
            proc.start()
    except BaseException as exc:
        # (a Ctrl-C that lands once the process exists: stopped here, it cannot run on unseen -- a reader
        # process writing into the ring beside the next pass's -- until the lifeline ends)
        if proc.pid is not None:
            proc.kill()
            proc.join(1.0)
        if isinstance(exc, (EOFError, ConnectionError)):  # (the fork server died under it: a bare EOFError)
            raise PipelineError(f"cannot start the {proc.name} process: the fork server died while it started "
                                f"it (the next pass starts a new one)") from exc
        raise


def start_retrying(ctx: Any, start_once: Callable[[], T]) -> T:
    """``start_once()`` (it makes its pipes and starts a child), tried again for up to 2 s where a dying
    fork server answered nothing.  Such a server (SIGTERM to the whole process group: a container
    stopped, a job preempted; Ctrl-C while it imported its preloads) makes multiprocessing raise
    EOFError (:func:`start`: a PipelineError caused by it), and a new server is started only once the
    old one is seen dead: a child started meanwhile -- a worker replaced while a pass shut down, the
    next pass's reader right after a caught KeyboardInterrupt -- failed."""
    deadline = time.monotonic() + 2.0
    while True:
        try:
            return start_once()
        except (EOFError, ConnectionError, PipelineError) as exc:
            # (start() says what an EOFError there means: a PipelineError caused by it)
            if isinstance(exc, PipelineError) and not isinstance(exc.__cause__, (EOFError, ConnectionError)):
                raise
            if ctx.get_start_method() != "forkserver" or time.monotonic() > deadline:
                raise
        time.sleep(0.05)


def start_forkserver(uses: Iterable[Any] = ()) -> None:
    """Launch the ``forkserver`` start method's server now, if it is not running yet, and return at once.

    It preloads :data:`CHILD_MODULES` and the library modules that the children's arguments ``uses``
    (decoders, the source) import when they unpickle (the image decoder: Pillow): imported once there,
    not in each child after its fork.  Its start-up (a fresh
    interpreter, numpy, Pillow: most of the time to a first batch) then overlaps what the consumer does
    meanwhile (the ring and the output slots); the first child's start waits for it.  Modules of the
    user's own are left to the children: importing them in the server could have side effects that the
    user never asked for there.  A preload list the user set (``set_forkserver_preload``) is kept, ours
    added to it: the server is the process's one, the user's own forkserver pools start from it too --
    but for ``__main__`` (multiprocessing's default), which the server is never to import."""
    from multiprocessing import forkserver
    theirs = getattr(getattr(forkserver, "_forkserver", None), "_preload_modules", None) or []
    theirs = [m for m in theirs if m != "__main__"]
    forkserver.set_forkserver_preload(list(dict.fromkeys(theirs + list(CHILD_MODULES) + library_modules(uses))))
    with _main_not_reimported():  # the server's preparation data names __main__'s file too
        forkserver.ensure_running()


class _Nowhere:
    def write(self, data: Any) -> int:
        return len(data)


class _ModuleLister(pickle.Pickler):
    """Pickles to nowhere (nothing is kept: a decoder holding a large table costs no memory here),
    noting the module of every object, class and function on the way.

    A descriptor's carrier (:class:`~parrecio.sources.fds.FdCarrier`: an open file object or stdin as the
    source) is noted, not reduced: reducing it outside a child's start hands a duplicate of the
    descriptor to ``multiprocessing``'s resource sharer, which keeps it open until some process asks for
    it -- none ever does for a pickle to nowhere (two descriptors leaked per reader)."""

    def __init__(self) -> None:
        super().__init__(_Nowhere(), protocol=pickle.HIGHEST_PROTOCOL)
        self.modules: Dict[str, None] = {}  # (ordered)
        self.carriers = 0  # descriptors' carriers met

    def persistent_id(self, obj: Any) -> Optional[str]:
        self.modules[type(obj).__module__] = None
        if isinstance(obj, FdCarrier):
            self.carriers += 1
            return "fd"
        if isinstance(obj, type) or callable(obj):
            name = getattr(obj, "__module__", None)
            if isinstance(name, str):
                self.modules[name] = None
        return None


def plain_picklable(obj: Any) -> bool:
    """Whether ``obj`` pickles, with no descriptor inside (one that could go to a process started earlier,
    by a pipe, as a spare reader's job does); tried without side effects (see :class:`_ModuleLister`)."""
    lister = _ModuleLister()
    try:
        lister.dump(obj)
    except Exception:
        return False
    return lister.carriers == 0


def library_modules(objs: Iterable[Any]) -> List[str]:
    """The ``parrecio`` modules that unpickling ``objs`` imports (nested decoders too: ``ImageRecord``
    holds an ``Image``); what cannot be pickled is skipped (:mod:`.shipping` reports it)."""
    found: Dict[str, None] = {}
    for obj in objs:
        lister = _ModuleLister()
        try:
            lister.dump(obj)
        except Exception:
            continue
        found.update(lister.modules)
    return [m for m in found if m.startswith("parrecio.")]


# -- os.fork() in the consumer ------------------------------------------------------------------------
_FORK_AWARE: "weakref.WeakSet[Any]" = weakref.WeakSet()


def register_for_fork(obj: Any) -> None:
    """Call ``obj.forget_after_fork()`` in the child of every later ``os.fork()`` of this process."""
    _FORK_AWARE.add(obj)


def _after_fork_in_child() -> None:
    for obj in list(_FORK_AWARE):
        try:
            obj.forget_after_fork()
        except Exception:  # never let our bookkeeping break the user's fork
            pass
    _FORK_AWARE.clear()
    try:
        _forget_fork_server()
    except Exception:
        pass


def _forget_fork_server() -> None:
    """In the child of an ``os.fork()``: the parent's fork server is not this process's child, and
    multiprocessing's check that it still runs (``os.waitpid``) raises ``ChildProcessError`` here, so no
    reader made after the fork could start a process.  Forget it (and close this copy of its "alive"
    pipe, which would keep it running after the parent): the first start here boots a server of its own.
    Its lock is new too, in case a thread of the parent held it at the fork."""
    fs = sys.modules.get("multiprocessing.forkserver")
    server = getattr(fs, "_forkserver", None)
    if server is None or getattr(server, "_forkserver_pid", None) is None:
        return
    fd = getattr(server, "_forkserver_alive_fd", None)
    for name in ("_forkserver_pid", "_forkserver_address", "_forkserver_alive_fd", "_forkserver_authkey"):
        if hasattr(server, name):
            setattr(server, name, None)
    server._lock = threading.Lock()
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)


def close_quietly(*conns: Any) -> None:
    """Close each connection that is not None, ignoring one already closed or broken."""
    for conn in conns:
        if conn is not None:
            try:
                conn.close()
            except OSError:
                pass


def forget_processes(procs: Any) -> None:
    """In a forked child: drop ``procs`` from multiprocessing's list of children, so that the child's
    exit neither terminates nor joins processes it does not own."""
    from multiprocessing import process
    for p in procs:
        process._children.discard(p)  # private, but the only way: it is what _exit_function walks


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
