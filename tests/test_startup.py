"""Start-up: what the time to a first batch is made of (docs/ARCHITECTURE.md "Start-up").

- The fork server boots at construction, preloading the children's modules and the library modules that
  the fields and the source unpickle (nested decoders too), while the consumer goes on.
- The packages export lazily: a decoder or reader process imports what it runs, not the whole library;
  every public name still resolves as before.
- The first pass starts its reader process before the decoder processes; a decoder that fails to start
  then frees everything (reader included) and leaks nothing (what a later pass does after that:
  tests/test_interrupted_start.py).
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from parrecio import ParallelReader, PipelineError, Tuning
from parrecio.pipeline.children import CHILD_MODULES, library_modules
from pipeline_helpers import Fixed, Sleepy, deadline, digest_array, payloads, write_rec

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _run(tmp_path, body: str, timeout: float = 120) -> str:
    """Run ``body`` as a script file in a fresh interpreter (its own fork server); its stdout."""
    script = tmp_path / "probe.py"
    script.write_text("import sys\nsys.path[:0] = [%r, %r]\n" % (ROOT, HERE)
                      + "if __name__ == '__main__':\n" + textwrap.indent(textwrap.dedent(body), "    "))
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout


# -- the fork server boots at construction, with what the children will import ----------------------------

@pytest.mark.skipif("forkserver" not in multiprocessing.get_all_start_methods(), reason="no forkserver")
def test_fork_server_boots_at_construction_with_the_fields_modules(tmp_path):
    from image_helpers import gt_boxes_json, jpeg
    path = tmp_path / "s.rec"
    recs = []
    for i in range(40):
        recs += [jpeg(64 + i, 48, seed=i), gt_boxes_json([(i % 3, 1, 2, 10, 8)], 64 + i, 48)]
    write_rec(path, recs)
    out = _run(tmp_path, f"""
        import json
        from multiprocessing import forkserver
        import psutil
        from parrecio import ParallelReader
        from parrecio.decoders import BoundingBoxes, Image
        def servers():
            return [p for p in psutil.Process().children()
                    if "forkserver" in " ".join(p.cmdline())]
        before = len(servers())
        fields = [Image(size=(32, 24)), BoundingBoxes(max_boxes=4)]
        r = ParallelReader({str(path)!r}, fields=fields, workers=2, batch_size=8)
        # At construction, not at the first pass: a child of ours whose pid multiprocessing recorded as
        # the server's.  (Its command line says "forkserver" only once its exec is done, which may be a
        # moment after ensure_running() returned: counting servers() at once raced with it.)
        server = forkserver._forkserver._forkserver_pid
        booted = int(server in [p.pid for p in psutil.Process().children()])
        import time
        t0 = time.monotonic()
        while [p.pid for p in servers()] != [server] and time.monotonic() - t0 < 10:
            time.sleep(0.01)
        booted *= int([p.pid for p in servers()] == [server])
        preload = list(forkserver._forkserver._preload_modules)
        got = [[a.tobytes() for a in batch] for batch in r]
        r.close()
        with ParallelReader({str(path)!r}, fields=fields, workers=0, batch_size=8) as r0:
            want = [[a.tobytes() for a in batch] for batch in r0]
        print(json.dumps({{"before": before, "booted": booted, "preload": preload, "same": got == want,
                           "batches": len(got)}}))
    """)
    import json
    doc = json.loads(out.strip().splitlines()[-1])
    assert doc["before"] == 0 and doc["booted"] == 1
    assert doc["same"] and doc["batches"] == 5
    assert doc["preload"][:len(CHILD_MODULES)] == list(CHILD_MODULES)
    assert {"parrecio.decoders.image", "parrecio.decoders.labels", "parrecio.sources.files"} <= set(doc["preload"])
    assert "__main__" not in doc["preload"]  # the probe script is not re-imported there


@pytest.mark.skipif("forkserver" not in multiprocessing.get_all_start_methods(), reason="no forkserver")
def test_a_preload_list_the_user_set_is_kept(tmp_path):
    """The fork server is the process's one: a user's ``set_forkserver_preload`` (for their own pools)
    was replaced by ours, and their modules were imported in each child instead of once."""
    path = tmp_path / "s.rec"
    write_rec(path, payloads(20))
    out = _run(tmp_path, f"""
        import json
        from multiprocessing import forkserver
        forkserver.set_forkserver_preload(["fractions", "decimal"])
        from parrecio import ParallelReader
        r = ParallelReader({str(path)!r}, workers=1)
        n = sum(1 for _ in r)
        r.close()
        print(json.dumps({{"preload": list(forkserver._forkserver._preload_modules), "n": n}}))
    """)
    import json
    doc = json.loads(out.strip().splitlines()[-1])
    assert doc["n"] == 20
    assert doc["preload"][:2] == ["fractions", "decimal"]
    assert doc["preload"][2:2 + len(CHILD_MODULES)] == list(CHILD_MODULES)


def test_workers_0_starts_no_fork_server(tmp_path):
    path = tmp_path / "s.rec"
    write_rec(path, payloads(20, seed=1))
    out = _run(tmp_path, f"""
        import psutil
        from parrecio import ParallelReader
        r = ParallelReader({str(path)!r}, workers=0)
        n = sum(1 for _ in r)
        r.close()
        print(n, len(psutil.Process().children()))
    """)
    assert out.split() == ["20", "0"]


def test_library_modules_of_nested_decoders_and_what_cannot_be_pickled():
    from parrecio.decoders import BoundingBoxes, Image, ImageRecord
    mods = library_modules([ImageRecord(Image(size=(8, 8))), BoundingBoxes()])
    assert mods[:2] == ["parrecio.decoders.imagerecord", "parrecio.decoders.image"]  # the wrapped Image too
    assert "parrecio.decoders.labels" in mods and all(m.startswith("parrecio.") for m in mods)
    # a user's decoder: its own module is left to the children (the library's that it holds are not);
    # a lambda does not pickle: skipped
    assert library_modules([Fixed()]) == ["parrecio.decoders.base"]  # (its ArraySpec)
    assert library_modules([lambda p: p, object()]) == []


# -- lazy exports ---------------------------------------------------------------------------------------

def test_a_child_imports_only_what_it_runs(tmp_path):
    out = _run(tmp_path, """
        import parrecio.pipeline.worker, parrecio.pipeline.reader_proc
        heavy = ["parrecio.pipeline.parallel_reader", "parrecio.pipeline.resources", "parrecio.pipeline.run",
                 "parrecio.sources.s3", "parrecio.sources.resolver", "parrecio.decoders.image",
                 "parrecio.decoders.augment", "parrecio.decoders.protobuf_record", "PIL"]
        print(" ".join(m for m in heavy if m in sys.modules) or "none")
    """)
    assert out.strip() == "none"


@pytest.mark.parametrize("package", ["parrecio", "parrecio.pipeline", "parrecio.decoders", "parrecio.sources"])
def test_every_public_name_resolves(package, tmp_path):
    mod = importlib.import_module(package)
    for name in mod.__all__:
        value = getattr(mod, name)
        assert value is not None
        assert name in dir(mod)
        origin = getattr(value, "__module__", None)
        if isinstance(origin, str) and origin.startswith("parrecio."):  # the object its submodule defines
            assert getattr(sys.modules[origin], name, value) is value
    with pytest.raises(AttributeError, match=f"module '{package}' has no attribute 'no_such_name'"):
        getattr(mod, "no_such_name")
    out = _run(tmp_path, f"""
        ns = {{}}
        exec("from {package} import *", ns)
        import {package} as m
        print(sorted(set(m.__all__) - set(ns)))
    """)
    assert out.strip() == "[]"


def test_sniff_is_the_function_after_its_module_is_imported():
    import parrecio.decoders.sniff  # noqa: F401  (the submodule of the same name)
    from parrecio.decoders import sniff
    assert callable(sniff) and not hasattr(sniff, "__path__") and sniff.__name__ == "sniff"


# -- the reader process first; a decoder that fails to start ------------------------------------------

@pytest.mark.parametrize("failing", [0, 1])
def test_a_decoder_that_fails_to_start_frees_everything(tmp_path, monkeypatch, no_leaks, failing):
    path = tmp_path / "s.rec"
    recs = payloads(200, seed=3)
    write_rec(path, recs)
    ctx = multiprocessing.get_context("forkserver" if "forkserver" in multiprocessing.get_all_start_methods()
                                      else "spawn")
    cls = ctx.Process
    original = cls.start
    order = []

    def start(self):
        order.append(self.name)
        if self.name == f"parrecio-worker-{failing}":
            raise OSError("no more processes")
        return original(self)

    monkeypatch.setattr(cls, "start", start)
    reader = ParallelReader(path, fields=Fixed(), workers=2)
    with deadline(30), pytest.raises(OSError, match="no more processes"):
        next(iter(reader))
    assert order[0] == "parrecio-reader"  # its first chunk is on its way while the decoders start
    assert reader.worker_pids == [] and not [n for n in os.listdir("/dev/shm") if n.startswith(
        f"parrecio-{os.getpid()}-")]
    monkeypatch.undo()  # a regular file can be read again: the next pass starts anew, and reads it all
    with deadline(60):
        got = np.stack(list(reader))
    assert got.tobytes() == np.stack([digest_array(r) for r in recs]).tobytes()
    reader.close()


def test_the_first_pass_is_complete_and_in_order(tmp_path, no_leaks):
    path = tmp_path / "s.rec"
    recs = payloads(500, seed=4)
    write_rec(path, recs)
    want = np.stack([digest_array(r) for r in recs])
    with deadline(60), ParallelReader(path, fields=Fixed(), workers=3, batch_size=7) as reader:
        for _ in range(2):
            got = np.concatenate(list(reader))
            assert got.tobytes() == want.tobytes()


@pytest.mark.skipif("forkserver" not in multiprocessing.get_all_start_methods(), reason="no forkserver")
@pytest.mark.parametrize("iterated", [False, True], ids=["made", "iterated"])
def test_a_reader_made_after_os_fork_starts_its_own_fork_server(tmp_path, iterated):
    """The parent's fork server (booted at construction) is not the forked child's child: the child's
    reader must not fail on multiprocessing's liveness check of it (ChildProcessError), and reads."""
    path = tmp_path / "s.rec"
    recs = payloads(120, seed=5)
    write_rec(path, recs)
    out = _run(tmp_path, f"""
        import os
        import numpy as np
        from parrecio import ParallelReader
        from pipeline_helpers import Fixed, digest_array, payloads
        want = np.stack([digest_array(r) for r in payloads(120, seed=5)]).tobytes()
        r = ParallelReader({str(path)!r}, fields=Fixed(), workers=2, batch_size=10)
        if {iterated!r}:
            assert np.concatenate(list(r)).tobytes() == want
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                with ParallelReader({str(path)!r}, fields=Fixed(), workers=2, batch_size=10) as r2:
                    code = 0 if np.concatenate(list(r2)).tobytes() == want else 2
            except BaseException as exc:
                print("child:", type(exc).__name__, exc, flush=True)
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        print("child exit", os.waitstatus_to_exitcode(status))
        print("parent", np.concatenate(list(r)).tobytes() == want)  # its own server still serves it
        r.close()
    """)
    assert out.split("\n")[-3:] == ["child exit 0", "parent True", ""], out


def test_a_fork_server_that_cannot_start_fails_the_first_pass_not_the_constructor(tmp_path, monkeypatch,
                                                                                    no_leaks):
    from parrecio.pipeline import resources
    path = tmp_path / "s.rec"
    write_rec(path, payloads(30, seed=6))
    calls = []

    def broken(uses):
        calls.append(len(list(uses)))
        raise OSError("too many open files")

    monkeypatch.setattr(resources, "start_forkserver", broken)
    reader = ParallelReader(path, fields=Fixed(), workers=2, tuning=Tuning(start_method="forkserver"))
    assert calls == [2]  # tried at construction: the field and the source
    with deadline(30), pytest.raises(OSError, match="too many open files"):
        iter(reader)
    assert calls == [2, 2]
    with deadline(30), pytest.raises(OSError, match="too many open files"):  # tried again: nothing was read
        iter(reader)
    assert calls == [2, 2, 2]
    monkeypatch.undo()
    with deadline(60):
        assert len(list(reader)) == 30
    reader.close()


def _read_in_a_pool_worker(path: str, workers) -> object:
    """In a daemonic process (a Pool's worker): the samples, or the error's text."""
    try:
        with ParallelReader(path, fields=Fixed(), workers=workers) as reader:
            return [s.tobytes() for s in reader], reader.workers
    except ValueError as exc:
        return str(exc)


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_a_reader_left_mid_pass_at_exit_goes_quietly(tmp_path, method):
    """A script that made a weakref.finalize before multiprocessing was imported (tempfile does) and ends
    with a reader mid-pass, not closed: multiprocessing's exit handler runs before the reader's finalizer
    and stops the decoder processes and the fork server, and the finalizer's end of the pass started
    replacements through the gone fork server -- a 40-line 'Exception ignored in atexit callback'
    traceback (FileNotFoundError) after a run that was right (audit)."""
    path = str(tmp_path / "x.rec")
    write_rec(path, [b'{"i": %d}' % i for i in range(5000)])
    script = tmp_path / "left.py"
    script.write_text(textwrap.dedent(f"""
        import tempfile
        keep = tempfile.TemporaryDirectory()  # a finalizer registered before multiprocessing's handler
        import sys
        sys.path[:0] = [{ROOT!r}]
        from parrecio import ParallelReader, Tuning
        from parrecio.decoders import Json
        if __name__ == "__main__":
            reader = ParallelReader({path!r}, fields=[Json()], workers=2, tuning=Tuning(start_method={method!r}))
            it = iter(reader)
            print([next(it)[0]["i"] for _ in range(3)], flush=True)
    """))
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert (res.returncode, res.stdout.strip(), res.stderr) == (0, "[0, 1, 2]", "")


def test_a_reader_leaves_the_start_method_unchosen(tmp_path):
    """The fork server's and the children's starts asked multiprocessing for its start method, which fixes
    the process's default: a script's set_start_method("spawn") after making a reader (for its own pool,
    DataLoader or torch.multiprocessing.spawn) raised 'context has already been set' (audit)."""
    path = str(tmp_path / "x.rec")
    write_rec(path, [b"%d" % i for i in range(100)])
    out = _run(tmp_path, f"""
        import multiprocessing
        from parrecio import ParallelReader, Tuning
        for method in ("forkserver", "spawn", "fork"):
            with ParallelReader({path!r}, workers=2, tuning=Tuning(start_method=method)) as reader:
                print(method, multiprocessing.get_start_method(allow_none=True), sum(1 for _ in reader))
            print(method, multiprocessing.get_start_method(allow_none=True))
        multiprocessing.set_start_method("spawn")
        print(multiprocessing.get_start_method())
    """)
    assert out.split("\n") == ["forkserver None 100", "forkserver None", "spawn None 100", "spawn None",
                               "fork None 100", "fork None", "spawn", ""]


def test_in_a_daemonic_process(tmp_path, no_leaks):
    """A Pool's or a DataLoader's worker may start no children: workers>0 there failed at the first next()
    with multiprocessing's bare AssertionError (after the ring and the janitor were made).  Now workers
    defaults to 0 there, and workers>0 is refused at once, saying what to do."""
    recs = payloads(50, seed=31)
    path = str(tmp_path / "d.rec")
    write_rec(path, recs)
    with multiprocessing.get_context("fork").Pool(1) as pool:
        got, workers = pool.apply(_read_in_a_pool_worker, (path, None))
        refused = pool.apply(_read_in_a_pool_worker, (path, 2))
    assert workers == 0 and got == [digest_array(r).tobytes() for r in recs]
    assert re.match(r"workers=2 in a daemonic process \(ForkPoolWorker-\d+: a multiprocessing\.Pool or DataLoader "
                    r"worker, say\), which may not start the reader and decoder processes: use workers=0 there",
                    refused), refused  # (Pool workers are numbered across the process's pools)


def _env_value(payload) -> str:
    return os.environ.get("PARRECIO_TEST_SET_LATE", "unset")


def test_decoders_see_the_environment_the_script_set_after_the_fork_server_booted(tmp_path, monkeypatch, no_leaks):
    """The fork server boots with the first reader; its children inherited its environment of then, so a
    variable set after it (an OMP_NUM_THREADS, a decoder's setting) was unset in the decoder processes
    under forkserver, and set under spawn, fork and workers=0."""
    path = str(tmp_path / "e.rec")
    write_rec(path, payloads(6, seed=32))
    with ParallelReader(path, fields=_env_value, workers=1) as first:  # boots the fork server (if not up)
        assert set(first) == {"unset"}
    monkeypatch.setenv("PARRECIO_TEST_SET_LATE", "fast")
    for method in ("forkserver", "spawn"):
        with ParallelReader(path, fields=_env_value, workers=2, tuning=Tuning(start_method=method)) as reader:
            assert list(reader) == ["fast"] * 6, method


MAIN_FILE_SCRIPT = '''\
import os, struct, sys, tempfile, threading

class WhereDecoder:
    """Reads __file__ (to find a file beside the script, a common idiom)."""
    def __call__(self, payload):
        return os.path.basename(__file__)

def main():
    from parrecio import ParallelReader, Tuning
    path = os.path.join(tempfile.mkdtemp(), "t.rec")
    with open(path, "wb") as f:
        for i in range(20):
            p = b"x%d" % i
            f.write(struct.pack("<II", 0xced7230a, len(p)) + p + b"\\0" * (-len(p) % 4))
    for workers, method in ((0, None), (1, "spawn"), (1, "forkserver"), (1, "fork")):
        with ParallelReader(path, WhereDecoder(), workers=workers, tuning=Tuning(start_method=method)) as r:
            print(workers, method, set(r), flush=True)
    # readers started in another thread, while this one reads __file__ again and again
    misses, reads, done = [0], [0], threading.Event()
    def starts():
        for _ in range(6):
            with ParallelReader(path, workers=1, tuning=Tuning(start_method="spawn")) as r:
                list(r)
        done.set()
    t = threading.Thread(target=starts)
    t.start()
    while not done.is_set():
        try:
            __file__
        except NameError:
            misses[0] += 1
        reads[0] += 1
    t.join()
    print("misses", misses[0], reads[0] > 1000, flush=True)

if __name__ == "__main__":
    main()
'''


def test_the_users_main_is_never_touched_while_children_start(tmp_path):
    """Children are started without re-importing ``__main__`` -- by leaving its path out of what
    multiprocessing sends them, for the starting thread only.  It was done by removing ``__main__.__file__``
    for the start: a decoder from the script that reads ``__file__`` failed in every worker (NameError),
    and the script's other threads saw ``__file__`` vanish (2-20% of reads while readers started)."""
    script = tmp_path / "main_file.py"
    script.write_text(MAIN_FILE_SCRIPT)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == [f"{w} {m} {{'main_file.py'}}" for w, m in
                                        ((0, None), (1, "spawn"), (1, "forkserver"), (1, "fork"))] + ["misses 0 True"]


@pytest.mark.skipif("forkserver" not in multiprocessing.get_all_start_methods(), reason="no forkserver")
@pytest.mark.parametrize("child", ["worker", "reader"])
def test_a_start_through_a_dying_fork_server_is_tried_again(tmp_path, monkeypatch, child, no_leaks):
    """A SIGTERM to the whole process group kills the fork server too; a worker replaced meanwhile (a pass
    shutting down after the user's handler raised) met the dying server: EOFError, a traceback instead of
    the user's exception (2 runs in 8 of the CLI's demo).  So did the next pass's reader right after a
    Ctrl-C that killed the server as it booted, caught by the script ("the fork server died while it
    started it").  A start is tried again, with new pipes, while the server is being replaced; under spawn
    an EOFError is not retried."""
    from parrecio.pipeline import pool as pool_module, reader_handle
    module, workers, name = ((pool_module, 2, "parrecio-worker-0") if child == "worker" else
                             (reader_handle, 1, "parrecio-reader"))
    path = tmp_path / "s.rec"
    recs = payloads(60)
    write_rec(path, recs)
    real = module.start
    fails = []

    def eof():
        raise EOFError("unexpected EOF")

    def flaky(proc):  # (through children.start, which says what an EOFError there means)
        if len(fails) < 3:
            fails.append(proc)
            proc.start = eof
        return real(proc)

    monkeypatch.setattr(module, "start", flaky)
    with ParallelReader(str(path), fields=Fixed(), workers=workers) as r:
        got = [digest_array(bytes(p)) for p in recs]
        assert all(np.array_equal(a, b) for a, b in zip(r, got))
        assert len(fails) == 3 and len(set(r.worker_pids)) == workers
    fails.clear()
    with ParallelReader(str(path), fields=Fixed(), workers=workers, tuning=Tuning(start_method="spawn")) as r:
        with pytest.raises(PipelineError, match=f"cannot start the {name} process: the fork server died"):
            list(r)


MASK_HELPER = textwrap.dedent("""\
    import signal

    def report(conn):
        blocked = signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])
        conn.send((blocked, signal.getsignal(signal.SIGINT) == signal.SIG_IGN))
    """)

MASK_SCRIPT = textwrap.dedent("""\
    import multiprocessing, signal, sys
    from parrecio.pipeline.children import child_entry, start
    from mask_helper import report  # (importable in a spawned child: our starts never import __main__)

    if __name__ == "__main__":
        ctx = multiprocessing.get_context(sys.argv[1])
        lifeline_r, lifeline_w = ctx.Pipe(duplex=False)
        for entry in (False, True):  # (the first: this interpreter's first child, its resource tracker's start)
            r, w = ctx.Pipe(duplex=False)
            args = ("parrecio-masktest-", lifeline_r, report, w) if entry else (w,)
            proc = ctx.Process(target=child_entry if entry else report, args=args)
            start(proc)
            print(entry, *r.recv(), flush=True)
            proc.join(30)
        print("here", signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []))
    """)


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_children_start_with_ctrl_c_held_until_they_ignore_it(tmp_path, method):
    """Ctrl-C to the process group while a spawned child still imported and unpickled its target raised
    KeyboardInterrupt there: its traceback (numpy's "Importing the numpy C-extensions failed" among them)
    reached the terminal beside the user's own handling.  A child starts with SIGINT blocked (also the
    first, whose start also starts multiprocessing's resource tracker: that start unblocked SIGINT), and
    child_entry ignores it, then unblocks it; the consumer's mask is as it was."""
    script = tmp_path / "mask.py"
    script.write_text(MASK_SCRIPT)
    (tmp_path / "mask_helper.py").write_text(MASK_HELPER)
    proc = subprocess.run([sys.executable, str(script), method], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path)] + sys.path)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == ["False True False", "True False True", "here False"]


def test_a_process_start_the_fork_server_dies_under_is_a_pipeline_error():
    """The fork server killed while a pass starts its processes: multiprocessing's bare EOFError
    ("unexpected EOF" from forkserver.read_signed) came out of the first next(); it is a PipelineError
    now, which says what happened (the next pass starts a new fork server)."""
    from parrecio.errors import PipelineError
    from parrecio.pipeline.children import start

    class Proc:
        name, pid = "parrecio-reader", None

        def __init__(self, exc):
            self.exc = exc

        def start(self):
            raise self.exc

    with pytest.raises(PipelineError, match=r"^cannot start the parrecio-reader process: the fork server died "
                                            r"while it started it") as info:
        start(Proc(EOFError("unexpected EOF")))
    assert isinstance(info.value.__cause__, EOFError)
    with pytest.raises(PipelineError, match=r"cannot start the parrecio-reader process: the fork server died"):
        start(Proc(ConnectionResetError(104, "Connection reset by peer")))
    with pytest.raises(BlockingIOError):  # (fork() itself failing says what it is)
        start(Proc(BlockingIOError(11, "Resource temporarily unavailable")))
    with pytest.raises(KeyboardInterrupt):
        start(Proc(KeyboardInterrupt()))


def test_a_replacement_that_cannot_start_is_the_error_not_its_closed_pipe(tmp_path, monkeypatch, no_leaks):
    """A decoder died mid-pass and its replacement could not start (here EMFILE; a deleted working
    directory did the same): the dead worker stayed in the pool with its tasks, and the pass's shutdown
    waited on its closed pipe -- "OSError: handle is closed" over the real cause."""
    import signal
    from parrecio.pipeline import pool as pool_module
    path = tmp_path / "s.rec"
    recs = payloads(400)
    write_rec(path, recs)
    real, starts = pool_module.start, []

    def failing(proc):
        starts.append(proc)
        if len(starts) > 2:  # (the two first workers start; their replacement does not)
            raise OSError(24, "Too many open files")
        return real(proc)

    monkeypatch.setattr(pool_module, "start", failing)
    with deadline(60), ParallelReader(str(path), fields=Sleepy(max_ms=20.0), workers=2) as r:
        it = iter(r)
        next(it)
        os.kill(r.worker_pids[0], signal.SIGKILL)
        with pytest.raises(OSError, match="Too many open files") as info:
            for _ in it:
                pass
        assert "handle is closed" not in repr(info.value) and "handle is closed" not in repr(info.value.__context__)
