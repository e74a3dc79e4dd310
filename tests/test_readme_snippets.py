"""Every code block of the README, run as written (#24: the PyTorch and Keras snippets failed on the `.rec`
that the README's own `parrecio pack images` makes).

The blocks are read from README.md by this test, never copied into it.  Each one is keyed by the heading
it stands under and its ordinal there, and each key has a :class:`Case` below: what the block is given
(files in its working folder, names it uses from its surroundings -- a `model`, `jpegs` -- defined by a
prelude run before it), what it needs installed, and what its output must show.  A block without a case
fails :func:`test_every_block_has_a_case`, so a new snippet is run from the day it is written.  A few blocks
are not run here, each with the reason (the set-up commands are what `.ci/run` runs; the benchmarks take
minutes); :data:`NOT_RUN` names them.

Python blocks run as scripts in a subprocess (as a user runs them: `__main__`, no pytest around them),
shell blocks with `bash -e`, each in a folder of its own holding copies of the fixture files: photos in
class folders, `train.rec` (+ `.idx`, `.lst`) from `parrecio pack images`, `demo.rec` from the demo's
writer, an augmented manifest of the photos, and `data/train-*.rec` of `[image][boxes][label]` groups.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import inspect
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
from typing import Callable, Dict, List, Optional, Tuple

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
BIN = os.path.dirname(sys.executable)


# -- the blocks ------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Block:
    heading: str
    ordinal: int      # its place among the blocks under that heading
    lang: str         # "python", "sh", "" (an example of output, a tree)
    line: int         # 1-based line of the opening fence
    code: str

    @property
    def key(self) -> Tuple[str, int]:
        return (self.heading, self.ordinal)


def read_blocks(text: str) -> List[Block]:
    """The fenced blocks of a Markdown text, dedented (blocks inside list items are indented)."""
    blocks, heading, counts = [], "", {}
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
        fence = re.match(r"^(\s*)```(\w*)\s*$", line)
        if fence:
            j = i + 1
            while not re.match(r"^\s*```\s*$", lines[j]):
                j += 1
            n = counts.get(heading, 0)
            counts[heading] = n + 1
            blocks.append(Block(heading, n, fence.group(2), i + 1, textwrap.dedent("\n".join(lines[i + 1:j]))))
            i = j
        i += 1
    return blocks


def blocks() -> List[Block]:
    with open(README, encoding="utf-8") as f:
        return read_blocks(f.read())


# -- what each block is given ----------------------------------------------------------------------------
KERAS_MODEL = """\
import keras
model = keras.Sequential([keras.Input((224, 224, 3)), keras.layers.Rescaling(1 / 255),
                          keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(2)])
model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
"""


# The Keras resume block's surroundings: the reader of the block before it, and a checkpoint callback
# that prints each state it saves (checked by _trained_states).
KERAS_RESUME = """\
from parrecio import ParallelReader
from parrecio.decoders import Image, ImageRecord
from parrecio.integrations.keras import generator, steps_per_epoch
reader = ParallelReader("train.rec", fields=ImageRecord(Image((224, 224)), label_dtype="int64"), batch_size=4)
class MyCheckpoint(keras.callbacks.Callback):
    def __init__(self, trained):
        super().__init__()
        self.trained = trained
    def on_train_batch_end(self, batch, logs=None):
        state = self.trained.state_dict()
        print("saved", state["epoch"], state["position"], flush=True)
"""


def _trained_states(out: str, folder: str) -> None:
    """Each save is the state after exactly the batches trained: epoch e, 4 samples a batch."""
    from parrecio import RecordReader
    with RecordReader(os.path.join(folder, "train.rec")) as r:
        n = sum(1 for _ in r)
    steps = -(-n // 4)
    saved = [(int(e), int(p)) for e, p in re.findall(r"saved (\d+) (\d+)\n", out)]  # (amid Keras's progress bar)
    assert len(saved) == 10 * steps, out
    for i, (epoch, position) in enumerate(saved):
        assert (epoch, position) == (i // steps, min(n, (i % steps + 1) * 4)), (i, saved)


@dataclasses.dataclass(frozen=True)
class Case:
    given: str = ""                          # a prelude: the names the block takes from its surroundings
    needs: Tuple[str, ...] = ()              # modules that must be importable, else the case is skipped
    env: Tuple[Tuple[str, str], ...] = ()
    stdin: Optional[str] = None              # a fixture file fed to standard input
    check: Optional[Callable[[str, str], None]] = None   # (stdout, folder) -> asserts
    timeout: float = 300


def _moto_output(out: str, folder: str) -> None:
    lines = out.strip().splitlines()
    assert lines[0] == "0 3 b'part 0 record 0' b'part 2 record 99'", out
    assert lines[1] == "1 3 b'part 0 record 0' b'part 2 record 99'", out
    assert re.fullmatch(r"index 300 b'part \d record \d+'", lines[2]), out


def _pipe_serve_output(out: str, folder: str) -> None:
    assert out.strip().splitlines()[-1] == "epochs read: [40, 40, 40]", out


def _views_output(out: str, folder: str) -> None:
    from parrecio import RecordReader
    with RecordReader(os.path.join(folder, "demo.rec")) as r:
        total = sum(len(rec.payload) for rec in r)
    assert out.strip().splitlines()[-1] == f"{total} payload bytes seen, none copied", out


def _packed(out: str, folder: str) -> None:
    from parrecio import RecordReader
    with RecordReader(os.path.join(folder, "train.rec")) as r:  # the last command: pack manifest
        kinds = [rec.payload[:2] for rec in r]
    assert len(kinds) == 80 and set(kinds[0::2]) == {b"\xff\xd8"} and set(kinds[1::2]) == {b"{\""}
    assert os.path.exists(os.path.join(folder, "train.lst"))


def _protobuf_output(out: str, folder: str) -> None:
    assert out.strip().splitlines() == ["(232, 784) float32 int32", "csr_matrix (256, 50000)"], out


def _bench_output(out: str, folder: str) -> None:
    rows = [line.split() for line in out.splitlines() if re.match(r"\s+\d+\s+\d+\s", line)]
    assert [(r[0], r[1]) for r in rows] == [("1", "40"), ("2", "40"), ("4", "40")], out  # workers, samples
    assert re.search(r"^best: [\d.]+ samples/s with \d workers", out, flags=re.M), out


CASES: Dict[Tuple[str, int], Case] = {
    ("parrecio", 0): Case(),                                                     # demo.rec, 8 workers
    ("Distributed training", 0): Case(given="start_epoch, epochs = 0, 2\n",
                                      env=(("WORLD_SIZE", "2"), ("RANK", "1"))),
    ("Frameworks", 0): Case(given="import torch\nmodel = torch.nn.Sequential(torch.nn.Flatten(), "
                                  "torch.nn.Linear(3 * 224 * 224, 2))\n", needs=("torch",)),
    ("Frameworks", 1): Case(given=KERAS_MODEL, needs=("tensorflow", "keras")),
    ("Frameworks", 2): Case(given=KERAS_MODEL, needs=("tensorflow", "keras")),
    ("Frameworks", 3): Case(given=KERAS_MODEL + KERAS_RESUME, needs=("tensorflow", "keras"), check=_trained_states),
    ("Frameworks", 4): Case(needs=("ray", "torch"), timeout=600),
    ("S3", 0): Case(needs=("boto3", "moto"), check=_moto_output),
    ("SageMaker built-in algorithm data (RecordIO-protobuf)", 0): Case(needs=("scipy",), check=_protobuf_output),
    ("Zero-copy and memory", 0): Case(check=_views_output),
    ("Decoders", 0): Case(),
    ("Training augmentations", 0): Case(),
    ("RecordIO", 0): Case(given="from fixtures import photo_jpegs\njpegs = photo_jpegs() * 2\n"
                                "labels = [i % 2 for i in range(len(jpegs))]\n", stdin="train.rec"),
    ("Testing a Pipe-mode script locally", 0): Case(check=_pipe_serve_output, timeout=120),
    ("Command line", 1): Case(check=_packed),
    ("Command line", 2): Case(check=_bench_output),
}

#: Blocks run elsewhere or checked another way, with the reason; every other block has a case.
NOT_RUN = {
    ("Set-up", 0): "the set-up commands: .ci/run runs command 2 verbatim on a clean checkout; each makes a "
                   "venv and builds Pillow-SIMD (minutes)",
    ("Distributed training", 1): "torchrun over examples/ddp_train.py: run by tests/test_integrations_torch.py"
                                 "::test_torchrun_ddp_two_ranks_gloo_equal_steps; checked below to be that "
                                 "script with those flags",
    ("Benchmarks", 0): "builds bench/data from the peers' venvs and runs for minutes (bench/README.md)",
    ("The serial stages, and what they allow on large hosts", 0): "a benchmark that runs for about a minute",
    ("The serial stages, and what they allow on large hosts", 1): "the consumer's benchmark, minutes with "
                                                                  "bench/data; a smoke run of boxes16 with "
                                                                  "--repeat: tests/test_bench_stages.py",
    ("The serial stages, and what they allow on large hosts", 2): "the per-pass benchmark against an older "
                                                                  "checkout, a minute with 98 KB photos; a "
                                                                  "smoke run: tests/test_bench_pass_cost.py",
    ("Performance round 3 in one run", 0): "every benchmark of the round against a checkout from before it "
                                           "(~12 min); its parts have smoke runs (tests/test_bench_stages.py, "
                                           "tests/test_bench_pass_cost.py)",
    ("ParallelReader", 0): "a signature: compared with the real ones by test_the_signatures_are_the_real_ones",
    ("Command line", 0): "an example of inspect's output: its lines checked by test_inspect_prints_what_the_"
                         "readme_shows",
    ("Layout", 0): "the tree: checked by test_the_layout_names_what_exists",
}


# -- the fixture files -----------------------------------------------------------------------------------
FIXTURES_PY = '''\
"""The photos the README snippets' fixtures are made of (a helper the RecordIO case imports)."""
import io, os

def photo_jpegs():
    out = []
    for cls in sorted(os.listdir("photos")):
        for name in sorted(os.listdir(os.path.join("photos", cls))):
            with open(os.path.join("photos", cls, name), "rb") as f:
                out.append(f.read())
    return out
'''

TRAIN_PY = '''\
from parrecio import ParallelReader
from parrecio.decoders import BoundingBoxes, Image

with ParallelReader("train", fields=[Image(size=(64, 64)), BoundingBoxes()], workers=1) as reader:
    counts = [sum(1 for _ in reader) for epoch in range(3)]
print("epochs read:", counts)
'''


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory):
    """The files every case's folder starts with (copied, so that a snippet may overwrite them)."""
    from PIL import Image as PILImage

    from parrecio import RecordWriter
    from parrecio.tools.demo import build_demo_stream, photo

    root = tmp_path_factory.mktemp("readme")
    entries = []
    for k in range(40):  # 2 classes of 20 photo-like JPEGs of varied sizes
        cls = ("cat", "dog")[k % 2]
        os.makedirs(root / "photos" / cls, exist_ok=True)
        w, h = 160 + 8 * (k % 5), 120 + 6 * (k % 4)
        path = root / "photos" / cls / f"{k:03d}.jpg"
        PILImage.fromarray(photo(w, h, seed=k)).save(path, "JPEG", quality=85)
        box = {"class_id": k % 2, "left": 10, "top": 12, "width": w // 3, "height": h // 4}
        entries.append({"source-ref": f"photos/{cls}/{k:03d}.jpg",
                        "bounding-box": {"image_size": [{"width": w, "height": h, "depth": 3}],
                                         "annotations": [box]}})
    (root / "train.manifest").write_text("".join(json.dumps(e) + "\n" for e in entries))
    subprocess.run([os.path.join(BIN, "parrecio"), "pack", "images", "photos", "train.rec"], cwd=root,
                   check=True, capture_output=True)
    build_demo_stream(str(root / "demo.rec"), n=128)
    os.makedirs(root / "data")
    for part in range(2):
        with RecordWriter(str(root / "data" / f"train-{part}.rec"), index=str(root / "data" / f"train-{part}.idx")) as w:
            for k, e in enumerate(entries[part::2]):
                w.write((root / e["source-ref"]).read_bytes())
                w.write(json.dumps(e["bounding-box"]).encode())
                w.write(str((k + part) % 2).encode())
    (root / "fixtures.py").write_text(FIXTURES_PY)
    (root / "train.py").write_text(TRAIN_PY)
    return root


def _folder(fixtures, tmp_path) -> str:
    folder = tmp_path / "case"
    shutil.copytree(fixtures, folder)
    return str(folder)


def run_block(block: Block, case: Case, folder: str) -> subprocess.CompletedProcess:
    """Run ``block`` as written in ``folder``, after ``case.given``; the finished process."""
    env = dict(os.environ, PATH=BIN + os.pathsep + os.environ.get("PATH", ""), PYTHONPATH=folder,
               TF_CPP_MIN_LOG_LEVEL="3", **dict(case.env))
    env.pop("PYTEST_CURRENT_TEST", None)
    if block.lang == "python":
        script = os.path.join(folder, "snippet.py")
        with open(script, "w") as f:
            f.write(case.given + "\n# --- README.md line %d ---\n" % (block.line + 1) + block.code + "\n")
        argv = [sys.executable, script]
    else:
        argv = ["bash", "-e", "-c", block.code]
    stdin = open(os.path.join(folder, case.stdin), "rb") if case.stdin else subprocess.DEVNULL
    # output to files, not pipes: a shell block's background process (pipe-serve &) would hold a pipe open
    with open(os.path.join(folder, ".stdout"), "w+b") as out, open(os.path.join(folder, ".stderr"), "w+b") as err:
        proc = subprocess.Popen(argv, cwd=folder, env=env, stdin=stdin, stdout=out, stderr=err,
                                start_new_session=True)
        timed_out = False
        try:
            proc.wait(timeout=case.timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            err.write(b"\n[test: timed out after %d s]" % case.timeout)
        finally:
            try:  # what is left running: the block itself after a timeout, or its background processes
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
            if case.stdin:
                stdin.close()
        out.seek(0)
        err.seek(0)
        out, err = out.read(), err.read()
    return subprocess.CompletedProcess(argv, -1 if timed_out else proc.returncode,
                                       out.decode(errors="replace"), err.decode(errors="replace"))


def _missing(case: Case) -> List[str]:
    return [m for m in case.needs if importlib.util.find_spec(m) is None]


# -- the tests -------------------------------------------------------------------------------------------
def test_every_block_has_a_case():
    found = blocks()
    keys = [b.key for b in found]
    assert len(keys) == len(set(keys))
    uncovered = [f"line {b.line}: {b.key}" for b in found if b.key not in CASES and b.key not in NOT_RUN]
    assert not uncovered, f"README blocks with no case in {__file__}: {uncovered}"
    stale = [k for k in list(CASES) + list(NOT_RUN) if k not in keys]
    assert not stale, f"cases for blocks the README no longer has: {stale}"
    assert set(CASES).isdisjoint(NOT_RUN)
    # 13 and 20 in the closing note of #24; + RecordIO-protobuf (#26), iter_views, bench.stages boxes16,
    # bench.pass_cost and bench.round3 (#27), Keras's TrainedState
    assert len(CASES) == 16 and len(found) == 26


@pytest.mark.parametrize("key", list(CASES), ids=[f"{h}-{n}" for h, n in CASES])
def test_readme_block_runs_as_written(key, fixtures, tmp_path):
    case = CASES[key]
    missing = _missing(case)
    if missing:
        pytest.skip(f"needs {', '.join(missing)}")
    if key == ("Testing a Pipe-mode script locally", 0):
        shutil.rmtree("/tmp/sm", ignore_errors=True)  # the README's --root
    block = next(b for b in blocks() if b.key == key)
    folder = _folder(fixtures, tmp_path)
    proc = run_block(block, case, folder)
    assert proc.returncode == 0, (f"README.md line {block.line} ({key}) failed with exit code "
                                  f"{proc.returncode}:\n{proc.stderr[-4000:]}")
    if case.check is not None:
        case.check(proc.stdout, folder)


def test_a_broken_snippet_fails(fixtures, tmp_path):
    """The runner is not a rubber stamp: the PyTorch snippet as it was before #24 (an `Image, ClassLabel`
    pair on `pack images` output) and the current one without `label_dtype` both fail."""
    if _missing(CASES[("Frameworks", 0)]):
        pytest.skip("needs torch")
    block = next(b for b in blocks() if b.key == ("Frameworks", 0))
    folder = _folder(fixtures, tmp_path)
    float_labels = dataclasses.replace(block, code=block.code.replace(', label_dtype="int64"', ""))
    assert float_labels.code != block.code
    proc = run_block(float_labels, CASES[block.key], folder)
    assert proc.returncode != 0, proc.stdout
    assert re.search(r"expected scalar type Long|Long but (found|got) Float|Long or Byte, but got Float",
                     proc.stderr), proc.stderr[-2000:]
    old = dataclasses.replace(block, code=block.code.replace(
        'ImageRecord(Image((224, 224), layout="CHW"), label_dtype="int64")',
        '[Image((224, 224), layout="CHW"), ClassLabel()]').replace(
        "import Image, ImageRecord", "import ClassLabel, Image, ImageRecord"))
    proc = run_block(old, CASES[block.key], folder)
    assert proc.returncode != 0 and "decode it with ImageRecord" in proc.stderr, proc.stderr[-2000:]


def _signature_of(text: str) -> inspect.Signature:
    """The signature a README block shows as ``Name(params)``, parsed (defaults evaluated)."""
    name = text.split("(", 1)[0]
    tree = ast.parse(f"def {name}{text[len(name):]}: pass")
    namespace: dict = {}
    from parrecio import Tuning
    exec(compile(tree, "README", "exec"), {"Tuning": Tuning}, namespace)
    return inspect.signature(namespace[name])


def test_the_signatures_are_the_real_ones():
    from parrecio import ParallelReader, Tuning
    block = next(b for b in blocks() if b.key == ("ParallelReader", 0))
    shown = [part.strip() for part in re.split(r"\n(?=\w)", block.code.strip())]
    assert [s.split("(")[0] for s in shown] == ["ParallelReader", "Tuning"]
    for text, real in zip(shown, (ParallelReader, Tuning)):
        doc, code = _signature_of(" ".join(text.split())), inspect.signature(real)
        assert list(doc.parameters) == list(code.parameters), text
        for name, p in doc.parameters.items():
            q = code.parameters[name]
            assert p.kind == q.kind, name
            default = None if (name == "tuning" and p.default == Tuning()) else p.default  # None means Tuning()
            assert default == q.default, f"{real.__name__}({name}=...): README {p.default!r}, code {q.default!r}"


def test_the_torchrun_command_is_the_one_tested():
    block = next(b for b in blocks() if b.key == ("Distributed training", 1))
    assert block.code.strip() == "torchrun --standalone --nproc_per_node 2 examples/ddp_train.py --data /tmp/ddp-demo"
    assert os.path.isfile(os.path.join(ROOT, "examples", "ddp_train.py"))
    with open(os.path.join(ROOT, "tests", "test_integrations_torch.py")) as f:
        tested = " ".join(f.read().split())
    assert ('"torch.distributed.run", "--standalone", "--nproc_per_node", "2", os.path.join(root, "examples", '
            '"ddp_train.py"), "--data",') in tested


def test_inspect_prints_what_the_readme_shows(fixtures, tmp_path):
    """The example's lines (records, groups, positions, corrupt regions and their offsets) are what
    ``parrecio inspect`` prints for such a file: the same labels, in the same order."""
    block = next(b for b in blocks() if b.key == ("Command line", 0))
    from parrecio import RecordWriter
    path = str(tmp_path / "train.rec")
    jpeg = (fixtures / "photos" / "cat" / "000.jpg").read_bytes()
    parts = []
    for first, last in ((0, 11), (11, 64)):
        part = str(tmp_path / f"part{first}.rec")
        with RecordWriter(part) as w:
            for i in range(first, last):
                w.write(jpeg)
                w.write(b'{"class": %d}' % i)
        with open(part, "rb") as f:
            parts.append(f.read())
    with open(path, "wb") as f:  # 2 KiB of garbage between two groups: one corrupt region
        f.write(parts[0] + b"\0" * 2048 + parts[1])
    out = subprocess.run([os.path.join(BIN, "parrecio"), "inspect", path], capture_output=True, text=True,
                         check=True).stdout

    def labels(text):
        return [re.match(r"\s*([a-z]+(?: \d+)?)[: ]", line).group(1) for line in text.splitlines()
                if line.strip() and not line.startswith("$")]

    want = [re.sub(r"offset \d+", "offset", x) for x in labels(block.code)]
    got = [re.sub(r"offset \d+", "offset", x) for x in labels(out)]
    assert got == want, out


def test_the_layout_names_what_exists():
    block = next(b for b in blocks() if b.key == ("Layout", 0))
    top = re.findall(r"^(\S+)", block.code, flags=re.M)
    assert {"parrecio/", "docs/", "bench/", "setup.py", "examples/", "tests/"} <= set(top)
    for name in top:
        assert os.path.exists(os.path.join(ROOT, name)), name
    inside = re.findall(r"^  (\S+)", block.code, flags=re.M)  # the package's modules and folders
    assert len(inside) >= 7 and "pipeline/" in inside
    for name in inside:
        assert os.path.exists(os.path.join(ROOT, "parrecio", name)), name
