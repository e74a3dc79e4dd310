"""Decoders from a notebook, ``python -c`` or a piped script, and lambdas, reach the decoder processes by
value (cloudpickle) under every start method; a decoder that does not load there ends the run at once
with a clear error; one that nothing can pickle is refused up front."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time

import pytest

from parrecio import ParallelReader, PipelineError
from parrecio.pipeline.shipping import Shipped, ship, unship
from pipeline_helpers import payloads, write_rec

SCRIPT = textwrap.dedent("""\
    import os, sys, tempfile
    import numpy as np
    from parrecio import ParallelReader, RecordWriter, Tuning
    from parrecio.decoders import ArraySpec

    class Length:                          # defined in __main__, which the children cannot import
        output_spec = ArraySpec((), np.int64)
        def __call__(self, payload):
            return np.int64(len(payload))

    def head(payload):
        return bytes(payload[:2])

    d = tempfile.mkdtemp()
    path = os.path.join(d, "x.rec")
    with RecordWriter(path) as w:
        for i in range(300):
            w.write(b"%03d" % i + b"x" * (i % 7))
    with ParallelReader(path, fields=[Length()], workers=2, batch_size=32, tuning=Tuning(start_method=METHOD)) as r:
        total = sum(int(b[0].sum()) for b in r)
    with ParallelReader(path, fields={"h": head, "n": lambda p: len(p)}, workers=2, tuning=Tuning(start_method=METHOD)) as r:
        got = list(r)
    print("ok", total, got[7]["h"].decode(), got[149]["n"], os.getpid())
    """)


def _expected():
    return sum(3 + i % 7 for i in range(300))


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
@pytest.mark.parametrize("how", ["-c", "stdin"])
def test_main_defined_decoders_and_lambdas_under_spawn_and_forkserver(how, method):
    code = SCRIPT.replace("METHOD", repr(method))
    if how == "-c":
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    else:
        proc = subprocess.run([sys.executable, "-"], input=code, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    words = proc.stdout.split()
    assert words[:4] == ["ok", str(_expected()), "01", "8"], proc.stdout


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
@pytest.mark.parametrize("how", ["script", "-m"])
def test_a_script_without_a_main_guard_runs_once(tmp_path, how, method):
    """The README's first snippet saved as train.py, no ``if __name__ == "__main__":``: the children do
    not re-import it (it would start a reader in each of them), so its top level runs once."""
    code = "print('top level ran', flush=True)\n" + SCRIPT.replace("METHOD", repr(method))
    (tmp_path / "train_script.py").write_text(code)
    argv = [str(tmp_path / "train_script.py")] if how == "script" else ["-m", "train_script"]
    proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("top level ran") == 1, proc.stdout
    assert proc.stdout.split()[3:7] == ["ok", str(_expected()), "01", "8"], proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]


def _in_a_function(code: str) -> str:
    """``code`` (SCRIPT) as the body of ``main()`` -- its class and functions local to it moved out, to
    the script's top level, so that they stay defined in the script's module."""
    head, _, rest = code.partition("\nd = tempfile.mkdtemp()")
    return head + "\ndef main():\n" + textwrap.indent("d = tempfile.mkdtemp()" + rest, "    ")


@pytest.mark.parametrize("how", ["spawn-child", "forkserver-child", "run_path", "pdb"])
def test_script_decoders_where_the_script_is_not_main(tmp_path, how):
    """Decoders defined in the script, the script run where its module is not ``__main__``:
    - in a child that spawn or forkserver started (``torch.multiprocessing.spawn``, the DDP launcher):
      the module is ``__mp_main__``, which the decoder processes do not import either.  Those decoders
      went by reference and every decoder process failed to load them ("Can't get attribute 'Length'
      on <module '__main__' (built-in)>");
    - ``runpy.run_path("train.py")``: the module is ``<run_path>`` (no spec): "No module named
      '<run_path>'";
    - ``python -m pdb train.py``: ``__main__`` has no ``__spec__``, and starting the fork server and
      the reader failed with AttributeError in multiprocessing itself.
    Now each runs as when the script is run directly, under both start methods."""
    code = _in_a_function(SCRIPT.replace("METHOD", "method"))
    script = tmp_path / "train_script.py"
    stdin = None
    if how.endswith("-child"):
        ctx = how.split("-")[0]
        script.write_text(code.replace("def main():", "def main(method):") + textwrap.dedent(f"""
            if __name__ == "__main__":
                import multiprocessing
                for method in ("forkserver", "spawn"):
                    p = multiprocessing.get_context({ctx!r}).Process(target=main, args=(method,))
                    p.start()
                    p.join()
                    assert p.exitcode == 0, p.exitcode
            """))
        argv = [str(script)]
    else:
        script.write_text(code.replace("def main():", "def main(method):")
                          + "\nfor method in ('forkserver', 'spawn'):\n    main(method)\n")
        if how == "run_path":
            argv = ["-c", f"import runpy; runpy.run_path({str(script)!r})"]
        else:
            argv, stdin = ["-m", "pdb", str(script)], "c\nq\n"
    proc = subprocess.run([sys.executable, *argv], input=stdin, capture_output=True, text=True, timeout=240,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line.replace("(Pdb) ", "", 1).split() for line in proc.stdout.splitlines()]
    runs = [words[:4] for words in lines if words[:1] == ["ok"]]
    assert runs == [["ok", str(_expected()), "01", "8"]] * 2, proc.stdout + proc.stderr[-3000:]
    assert "Error" not in proc.stderr, proc.stderr[-3000:]


def test_a_real_notebook(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    body = SCRIPT.replace("METHOD", "None").split("\n\n")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(cell) for cell in body]  # a class in one cell, the reader in another
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    out = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))
    assert out.split()[:4] == ["ok", str(_expected()), "01", "8"], out


NOT_LOADING = textwrap.dedent("""\
    import os, tempfile, time
    from parrecio import ParallelReader, RecordWriter, Tuning

    class LoadsOnlyHere:                   # pickles fine, refuses to be unpickled in another process
        def __init__(self):
            self.pid = os.getpid()
        def __call__(self, payload):
            return bytes(payload)
        def __setstate__(self, state):
            if state["pid"] != os.getpid():
                raise RuntimeError("this decoder loads only where it was made")
            self.__dict__.update(state)

    d = tempfile.mkdtemp()
    path = os.path.join(d, "x.rec")
    with RecordWriter(path) as w:
        for i in range(50):
            w.write(b"%03d" % i)
    t0 = time.monotonic()
    with ParallelReader(path, fields=LoadsOnlyHere(), workers=2, tuning=Tuning(start_method=METHOD)) as r:
        try:
            list(r)
        except Exception as exc:
            print(type(exc).__name__, "|", exc, "|", r.stats.workers_replaced, "|", round(time.monotonic() - t0))
    """)


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_decoder_that_does_not_load_in_a_child_ends_the_run_at_once(method):
    """Shipped by value from ``python -c``, it fails to load in every decoder process: one clear
    PipelineError at once, not ten respawns and a vague one."""
    proc = subprocess.run([sys.executable, "-c", NOT_LOADING.replace("METHOD", repr(method))],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    kind, message, replaced, took = [x.strip() for x in proc.stdout.split("|")]
    assert kind == "PipelineError"
    assert message.startswith("decoder process ") and ("cannot load the decoders it was sent: RuntimeError: "
                                                       "this decoder loads only where it was made") in message
    assert replaced == "0" and int(took) < 20


def test_decoder_nothing_can_pickle_is_refused_up_front(tmp_path):
    path = tmp_path / "s.rec"
    write_rec(path, payloads(6))
    lock = threading.Lock()
    with pytest.raises(TypeError, match=r"field '1'.*cannot be pickled, not even by value \(cloudpickle\)"):
        ParallelReader(path, fields=[bytes, lambda p: (lock, p)], workers=1)
    with ParallelReader(path, fields=[bytes, lambda p: (lock, p)], workers=0) as r:  # no pickling needed
        assert len(list(r)) == 3


def test_ship_keeps_importable_decoders_by_reference():
    from parrecio.decoders import Json
    d = Json()
    s = ship([d], ["0"], "spawn")
    assert isinstance(s, Shipped) and not s.by_value and b"cloudpickle" not in s.blob
    assert unship(s) == (d,)
    s = ship([d, lambda p: 1], ["0", "1"], "spawn")
    assert isinstance(s, Shipped) and s.by_value
    got = unship(s)
    assert got[0] == d and got[1](b"") == 1


SHARED = textwrap.dedent("""\
    import os, sys, tempfile
    from parrecio import ParallelReader, RecordWriter, Tuning

    SEEN = {}                              # one dict of __main__ that both fields use

    def remember(payload):                 # field 0 stores the group's key...
        SEEN["last"] = bytes(payload)
        return bytes(payload)

    def pair(payload):                     # ...field 1 reads it back: right only if the dict is shared
        return SEEN.get("last") == bytes(payload).replace(b"b", b"a")

    d = tempfile.mkdtemp()
    path = os.path.join(d, "x.rec")
    with RecordWriter(path) as w:
        for i in range(60):
            w.write(b"a%03d" % i)
            w.write(b"b%03d" % i)
    with ParallelReader(path, fields=[remember, pair], workers=WORKERS, tuning=Tuning(start_method=METHOD)) as r:
        got = list(r)
    print(len(got), sum(1 for _, ok in got if ok), [k for k, _ in got] == [b"a%03d" % i for i in range(60)])
    """)


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
@pytest.mark.parametrize("workers", [0, 2])
def test_fields_share_main_state_as_in_one_process(method, workers):
    """Two ``__main__`` decoders of one reader share a module-level dict: shipped together, they share
    it in the decoder process too (shipped apart, each got a copy: 0 of 60 right with workers)."""
    code = SHARED.replace("METHOD", repr(method)).replace("WORKERS", str(workers))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["60", "60", "True"], proc.stdout


MAIN_VALUES = textwrap.dedent("""\
    import os, tempfile
    from dataclasses import dataclass
    from parrecio import DecodeError, ParallelReader, RecordWriter, Tuning

    @dataclass
    class Sample:                          # a value of a class of the script
        n: int
        text: str

    class Refused(Exception):              # an exception of a class of the script
        pass

    def decode(payload):
        n = int(bytes(payload))
        if n == 7:
            raise Refused(f"no {n}")
        return Sample(n, str(n))

    d = tempfile.mkdtemp()
    path = os.path.join(d, "x.rec")
    with RecordWriter(path) as w:
        for i in range(40):
            w.write(b"%d" % i)
    kw = dict(fields=decode, workers=WORKERS, tuning=Tuning(start_method=METHOD))
    with ParallelReader(path, on_error="skip", **kw) as r:
        got = list(r)
        ok = all(type(g) is Sample for g in got) and [g.n for g in got] == [i for i in range(40) if i != 7]
        print(ok, r.stats.skipped)
    with ParallelReader(path, **kw) as r:
        try:
            list(r)
        except DecodeError as exc:
            print(type(exc.__cause__) is Refused, exc.index)
    """)


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
@pytest.mark.parametrize("workers", [0, 2])
def test_values_and_exceptions_of_the_scripts_classes_travel_back(method, workers):
    """A decoder of the script returns a dataclass of the script and raises an exception class of the
    script: they come back as those classes, as with workers=0.  Under forkserver and spawn every value
    failed to pickle in the decoder process (a DecodeError per sample: all 40 skipped), and the exception
    came back as a bare remote traceback."""
    code = MAIN_VALUES.replace("METHOD", repr(method)).replace("WORKERS", str(workers))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["True", "1", "True", "7"], proc.stdout


MAIN_NESTED = textwrap.dedent("""\
    import os, tempfile
    from dataclasses import dataclass
    from parrecio import DecodeError, ParallelReader, RecordWriter, Tuning

    @dataclass
    class Meta:                            # top-level, the same name as the nested one
        n: int

    class Image:
        @dataclass
        class Meta:                        # Image.Meta
            n: int

        class Refused(Exception):          # Image.Refused
            pass

    def decode(payload):
        n = int(bytes(payload))
        if n == 7:
            raise Image.Refused(f"no {n}")
        return Image.Meta(n)

    d = tempfile.mkdtemp()
    path = os.path.join(d, "x.rec")
    with RecordWriter(path) as w:
        for i in range(40):
            w.write(b"%d" % i)
    kw = dict(fields=decode, workers=2, tuning=Tuning(start_method=METHOD))
    with ParallelReader(path, on_error="skip", **kw) as r:
        got = list(r)
        print(all(type(g) is Image.Meta for g in got) and [g.n for g in got] == [i for i in range(40) if i != 7])
    with ParallelReader(path, **kw) as r:
        try:
            list(r)
        except DecodeError as exc:
            print(type(exc.__cause__) is Image.Refused, exc.index)
    """)


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_values_and_exceptions_of_classes_nested_in_the_scripts_classes_travel_back(method):
    """A dataclass and an exception class nested in a class of the script (``Image.Meta``), beside a
    top-level class of the same name (``Meta``): cloudpickle rebuilt a nested class with its bare name,
    so its values pickled as ``__main__.Meta`` in the decoder process -- the consumer made the top-level
    ``Meta`` of them, silently (or failed where there was none) -- and the exception came back as a bare
    remote traceback.  Rebuilt with their qualified names, they come back as themselves."""
    proc = subprocess.run([sys.executable, "-c", MAIN_NESTED.replace("METHOD", repr(method))],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["True", "True", "7"], proc.stdout


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_values_of_a_run_path_scripts_classes_travel_back(tmp_path, method):
    """The same script run by ``runpy.run_path``: its module is ``<run_path>``, which no decoder process
    can import; its dataclass values failed to pickle there ("import of module '<run_path>' failed": all
    40 skipped) and its exception came back as a remote traceback.  They are bound there now, as the
    ``__main__`` script's are."""
    script = tmp_path / "train_values.py"
    script.write_text(MAIN_VALUES.replace("METHOD", repr(method)).replace("WORKERS", "2"))
    proc = subprocess.run([sys.executable, "-c", f"import runpy; runpy.run_path({str(script)!r})"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["True", "1", "True", "7"], proc.stdout


LATE_STATE = textwrap.dedent("""\
    import json, os, tempfile
    from parrecio import ParallelReader, RecordWriter, Tuning

    CLASSES = {}                           # filled after the reader is made, before its first pass

    def label(payload):
        return CLASSES.get(json.loads(bytes(payload))["name"], -1)

    d = tempfile.mkdtemp()
    path = os.path.join(d, "x.rec")
    with RecordWriter(path) as w:
        for name in ["cat", "dog", "cat", "bird"]:
            w.write(json.dumps({"name": name}).encode())
    reader = ParallelReader(path, fields=label, workers=WORKERS, tuning=Tuning(start_method=METHOD))
    CLASSES.update({"cat": 0, "dog": 1})
    print(list(reader))
    reader.close()
    """)


@pytest.mark.parametrize("method,workers", [("forkserver", 2), ("spawn", 2), ("fork", 2), ("forkserver", 0)])
def test_main_state_is_taken_when_the_processes_start(method, workers):
    """A ``__main__`` decoder's module state is what it is when the decoder processes start (README: "a
    copy per decoder process, made when it starts"), as under ``fork`` and with ``workers=0``: it was
    pickled when the reader was made, and a class table filled between that and the first pass was
    empty in the workers (every label -1)."""
    code = LATE_STATE.replace("METHOD", repr(method)).replace("WORKERS", str(workers))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split("\n")[0] == "[0, 1, 0, -1]", proc.stdout


UNIMPORTABLE = textwrap.dedent("""\
    import json, os, sys, time
    from parrecio import ParallelReader, RecordWriter, Tuning

    os.chdir(BASE)
    sys.path.insert(0, "")                 # as in a notebook or python -c: the directory it started in
    import helpers_elsewhere               # found through "" ...
    os.makedirs("data", exist_ok=True)
    os.chdir("data")                       # ... and no longer from here, where the children start
    with RecordWriter("x.rec") as w:
        for i in range(20):
            w.write(json.dumps({"i": i}).encode())
    t0 = time.monotonic()
    with ParallelReader("x.rec", fields=helpers_elsewhere.decode, workers=2,
                        tuning=Tuning(start_method=METHOD)) as r:
        try:
            list(r)
        except Exception as exc:
            print(type(exc).__name__, "|", exc, "|", r.stats.workers_replaced, "|", round(time.monotonic() - t0))
    """)


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_decoder_from_a_module_the_children_cannot_import(tmp_path, method):
    """A decoder pickled by reference whose module the decoder processes cannot import: one PipelineError
    naming the ModuleNotFoundError, as for one shipped by value.  It used to be unpickled by
    multiprocessing's own start-up, in the reader process as well: "the reader process died (exit code
    1)", the cause only in tracebacks on stderr, decoder processes respawned."""
    (tmp_path / "helpers_elsewhere.py").write_text("import json\ndef decode(p):\n    return json.loads(bytes(p))['i']\n")
    code = UNIMPORTABLE.replace("BASE", repr(str(tmp_path))).replace("METHOD", repr(method))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    kind, message, replaced, took = [x.strip() for x in proc.stdout.split("|")]
    assert kind == "PipelineError", proc.stdout
    assert message.startswith("decoder process ") and ("cannot load the decoders it was sent: ModuleNotFoundError: "
                                                       "No module named 'helpers_elsewhere'") in message, message
    assert replaced == "0" and int(took) < 20
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]


RUN_TIME_MODULE = '''
class Dec:
    def __init__(self, tag): self.tag = tag
    def __call__(self, b): return b
    def __reduce__(self):
        gate = __import__("builtins").__dict__.get("_PARRECIO_GATES", {}).get(self.tag)
        if gate is not None:
            gate["calls"] += 1
            if gate["calls"] == gate["at"]:
                gate["entered"].set()
                gate["go"].wait(10)
        return (Dec, (self.tag,))
'''


def _loads_in_a_new_process(blob: bytes) -> str:
    proc = subprocess.run([sys.executable, "-c", "import pickle, sys; pickle.loads(sys.stdin.buffer.read())"],
                          input=blob, capture_output=True, timeout=120)
    return "ok" if proc.returncode == 0 else proc.stderr.decode().strip().splitlines()[-1]


def test_decoders_of_a_run_time_module_shipped_from_two_threads_at_once(monkeypatch):
    """Two readers' decoders of one module made at run time (a DDP worker's ``__mp_main__`` is one), shipped
    from two threads at once: the first ship unregistered the module from cloudpickle's by-value registry
    while the second pickled, and the second's decoders went by reference to a module no decoder process
    can import (ModuleNotFoundError there).  Shipping by value is one thread at a time now."""
    import builtins
    import types
    dyn = types.ModuleType("parrecio_test_dyn_decoders")  # no __spec__, no file: a child cannot import it
    exec(RUN_TIME_MODULE, dyn.__dict__)
    monkeypatch.setitem(sys.modules, dyn.__name__, dyn)
    gates = {t: dict(calls=0, at=3, entered=threading.Event(), go=threading.Event()) for t in "AB"}
    monkeypatch.setattr(builtins, "_PARRECIO_GATES", gates, raising=False)
    out = {}
    ta = threading.Thread(target=lambda: out.setdefault("A", ship([dyn.Dec("A")], ["a"], "forkserver")))
    tb = threading.Thread(target=lambda: out.setdefault("B", ship([dyn.Dec("B")], ["b"], "forkserver")))
    ta.start()
    assert gates["A"]["entered"].wait(10)  # A is pickling by value (its 3rd pickle of the decoder)
    tb.start()
    gates["B"]["entered"].wait(1)  # B pickles meanwhile -- or, as now, waits for A to be done
    gates["A"]["go"].set()
    ta.join(10)
    gates["B"]["go"].set()
    tb.join(10)
    assert out["A"].by_value and out["B"].by_value
    assert [_loads_in_a_new_process(out[t].blob) for t in "AB"] == ["ok", "ok"]
    import cloudpickle
    assert dyn.__name__ not in cloudpickle.list_registry_pickle_by_value()


def test_importable_c_functions_and_types_go_by_reference():
    """Only the modules that define the decoders' classes and Python functions are looked at: C functions
    and the types of plain objects live in modules made at run time inside importable packages
    (``torch._C._nn``, Cython's ``_cython_3_x``), which shipped such decoders by value (through cloudpickle,
    which could not pickle some: a torch enum was refused)."""
    import functools
    import numpy as np
    for decoders in ([functools.partial(np.frombuffer, dtype=np.uint8)], [np.add], [np.float32(1.5)]):
        shipped = ship(decoders, ["x"] * len(decoders), "forkserver")
        assert not shipped.by_value, decoders
    torch = pytest.importorskip("torch")
    for decoders in ([torch._C._nn.gelu], [torch.fft.rfft]):
        shipped = ship(decoders, ["x"], "forkserver")
        assert not shipped.by_value, decoders
        assert _loads_in_a_new_process(shipped.blob) == "ok"
