"""The ``parrecio`` command line end to end: each test runs ``python -m parrecio.cli ...`` in a subprocess
(except one in-process test of bench's wait for a Pipe-mode FIFO).

Data is made on the spot: photo-like JPEG/PNG files in class folders, a Ground Truth augmented manifest
referencing them, and the streams ``parrecio pack`` builds from those.
"""

from __future__ import annotations

import base64
import io
import json
import multiprocessing
import os
import subprocess
import sys
import time

import numpy as np
import orjson
import pytest

from image_helpers import gt_boxes_json, jpeg, png
from pipeline_helpers import Drain, wait_until
from parrecio.recordio import IndexedRecordReader, RecordReader, RecordWriter, read_index, unpack

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUBCOMMANDS = ("demo", "pipe-serve", "inspect", "cat", "extract", "pack", "bench")


def cli(*args, input=None, check=True, cwd=None):
    """Run ``parrecio ARGS``; return the CompletedProcess (stdout/stderr as bytes)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-m", "parrecio.cli", *map(str, args)], input=input,
                          capture_output=True, env=env, cwd=cwd, timeout=120)
    if check and proc.returncode != 0:
        raise AssertionError(f"parrecio {' '.join(map(str, args))} exited {proc.returncode}:\n"
                             f"{proc.stderr.decode(errors='replace')}")
    return proc


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Images in class folders (cat: 3 JPEG, dog: 2 JPEG + 1 PNG) and a manifest over 8 JPEGs with boxes."""
    root = tmp_path_factory.mktemp("cli")
    images = root / "images"
    files = {}
    for cls, specs in (("cat", [("a.jpg", "j", 1), ("b.jpg", "j", 2), ("c.jpeg", "j", 3)]),
                       ("dog", [("x.jpg", "j", 4), ("y.png", "p", 5), ("z.jpg", "j", 6)])):
        (images / cls).mkdir(parents=True)
        for name, kind, seed in specs:
            blob = jpeg(96, 72, seed=seed) if kind == "j" else png(64, 48, seed=seed)
            (images / cls / name).write_bytes(blob)
            files[f"{cls}/{name}"] = blob
    (images / "dog" / "notes.txt").write_text("not an image")

    man_dir = root / "manifest"
    (man_dir / "img").mkdir(parents=True)
    lines, expected = [], []
    for i in range(8):
        blob = jpeg(120 + 8 * i, 90, seed=20 + i)
        (man_dir / "img" / f"{i}.jpg").write_bytes(blob)
        boxes = orjson.loads(gt_boxes_json([(i % 3, 5, 6, 30, 20), (1, 40, 10, 20, 25)], 120 + 8 * i, 90))
        lines.append(orjson.dumps({"source-ref": f"img/{i}.jpg", "bounding-box": boxes,
                                   "bounding-box-metadata": {"class-map": {"0": "a", "1": "b"}}}))
        expected += [blob, orjson.dumps(boxes)]
    manifest = man_dir / "train.manifest"
    manifest.write_bytes(b"\n".join(lines) + b"\n")
    return {"root": root, "images": images, "files": files, "manifest": manifest, "expected": expected}


@pytest.fixture(scope="module")
def manifest_rec(data):
    out = data["root"] / "manifest.rec"
    cli("pack", "manifest", data["manifest"], out, "--attribute-names", "source-ref,bounding-box", "--quiet")
    return out


@pytest.fixture(scope="module")
def images_rec(data):
    out = data["root"] / "out" / "images.rec"
    out.parent.mkdir()
    proc = cli("pack", "images", data["images"], out)
    assert b"2 classes (0=cat, 1=dog)" in proc.stderr
    return out


# -- help and errors -----------------------------------------------------------------------------------

@pytest.mark.parametrize("argv", [[], *([c] for c in SUBCOMMANDS),
                                  ["pack", "images"], ["pack", "list"], ["pack", "manifest"]])
def test_help_exits_0(argv):
    proc = cli(*argv, "--help")
    assert proc.stdout.startswith(b"usage: parrecio")


def test_errors_are_one_line_with_exit_codes(tmp_path):
    proc = cli("inspect", tmp_path / "missing.rec", check=False)
    assert proc.returncode == 1
    assert proc.stderr.decode().strip().count("\n") == 0
    assert proc.stderr.startswith(b"parrecio inspect: error:") and b"missing.rec" in proc.stderr
    assert cli("cat", check=False).returncode == 2  # usage error: FILE missing
    assert cli("extract", tmp_path / "x.rec", check=False).returncode == 2  # --index/--key/--all missing
    proc = cli("bench", tmp_path, "--fields", "image,nonsense", check=False)
    assert proc.returncode == 1


# -- pack ----------------------------------------------------------------------------------------------

def test_pack_manifest_reads_back_as_attribute_records(data, manifest_rec):
    with RecordReader(str(manifest_rec), join="concat") as reader:
        assert [r.payload for r in reader] == data["expected"]
    # Split into multipart records (SageMaker style), then to stdout: same payloads.
    split = cli("pack", "manifest", data["manifest"], "-", "--attribute-names", "source-ref,bounding-box",
                "--split-bytes", 1000, "--quiet").stdout
    assert split != manifest_rec.read_bytes()
    import io
    with RecordReader(io.BytesIO(split), join="concat") as reader:
        assert [r.payload for r in reader] == data["expected"]


def test_pack_images_like_im2rec(data, images_rec):
    files = data["files"]
    listing = sorted(files)  # cat/... then dog/..., names sorted: the unshuffled order
    with IndexedRecordReader(str(images_rec)) as idx:
        assert idx.keys == list(range(len(listing)))
        for key, rel in enumerate(listing):
            header, image = unpack(idx[key])
            assert header.flag == 0 and header.id == key
            assert header.label == (0.0 if rel.startswith("cat/") else 1.0)
            assert bytes(image) == files[rel]
    lst = images_rec.with_suffix(".lst").read_text().splitlines()
    assert lst[0] == "0\t0.000000\tcat/a.jpg" and lst[-1] == "5\t1.000000\tdog/z.jpg"

    shuffled = data["root"] / "out" / "shuffled.rec"
    cli("pack", "images", data["images"], shuffled, "--shuffle", "--seed", 3, "--quiet")
    keys = [k for k, _ in read_index(str(shuffled.with_suffix(".idx")))]
    assert sorted(keys) == list(range(6)) and keys != list(range(6))
    with IndexedRecordReader(str(shuffled)) as idx:  # keys still name the unshuffled listing
        for key in keys:
            header, image = unpack(idx[key])
            assert header.id == key and bytes(image) == files[listing[key]]
    lst = shuffled.with_suffix(".lst").read_text().splitlines()
    assert [int(line.split("\t")[0]) for line in lst] == keys


def test_pack_list_multi_label(data, tmp_path):
    lst = tmp_path / "multi.lst"
    lst.write_text("7\t1.5\t2\t3\tcat/a.jpg\n"
                   "\n"
                   "3\t4.000000\tdog/y.png\n")
    out = tmp_path / "multi.rec"
    cli("pack", "list", lst, out, "--root", data["images"], "--quiet")
    with IndexedRecordReader(str(out)) as idx:
        assert idx.keys == [7, 3]
        header, image = unpack(idx[7])
        assert header.flag == 3 and header.id == 7
        np.testing.assert_array_equal(header.label, np.array([1.5, 2, 3], np.float32))
        assert bytes(image) == data["files"]["cat/a.jpg"]
        header, image = unpack(idx[3])
        assert header.flag == 0 and header.label == 4.0 and bytes(image) == data["files"]["dog/y.png"]
    lst.write_text("1\tcat/a.jpg\n")  # no label: a one-line error naming the line
    proc = cli("pack", "list", lst, out, "--root", data["images"], check=False)
    assert proc.returncode == 1 and b"line 1" in proc.stderr


def test_file_names_that_are_not_utf8(data, images_rec, tmp_path):
    """A file name that is not UTF-8 (bytes, on POSIX): ``pack images`` lists it as its bytes and ``pack
    list`` reads it back; ``inspect --json`` and ``bench --json`` name it with an escape that json.loads
    reads back as the same str.  Each was a traceback (UnicodeEncodeError, orjson's TypeError)."""
    root = tmp_path / "in"
    (root / "cls").mkdir(parents=True)
    (root / "cls" / os.fsdecode(b"x\xff.jpg")).write_bytes(data["files"]["cat/a.jpg"])
    out = tmp_path / "o.rec"
    cli("pack", "images", root, out, "--quiet")
    assert (tmp_path / "o.lst").read_bytes() == b"0\t0.000000\tcls/x\xff.jpg\n"
    again = tmp_path / "again.rec"
    cli("pack", "list", tmp_path / "o.lst", again, "--root", root, "--quiet")
    assert again.read_bytes() == out.read_bytes()
    assert bytes(unpack(next(iter(RecordReader(str(out)))).payload)[1]) == data["files"]["cat/a.jpg"]
    name = str(tmp_path / os.fsdecode(b"n\xffx.rec"))
    with open(name, "wb") as f:
        f.write(images_rec.read_bytes())
    report = json.loads(cli("inspect", name, "--json").stdout)
    assert (report["source"], report["records"]) == (name, 6)
    doc = json.loads(cli("bench", name, "--workers", 0, "--json").stdout)
    assert (doc["channel"], doc["runs"][0]["samples"]) == (name, 6)


# -- inspect -------------------------------------------------------------------------------------------

def test_inspect_manifest_stream(data, manifest_rec):
    report = json.loads(cli("inspect", manifest_rec, "--json", "--join", "concat").stdout)
    assert report["records"] == 16 and report["multipart_records"] == 0
    assert report["group_size"] == 2 and report["groups"] == 8 and report["leftover_records"] == 0
    assert [f["kinds"] for f in report["fields"]] == [{"jpeg": 8}, {"json": 8}]
    sizes = [len(p) for p in data["expected"]]
    assert report["sizes"] == {"min": min(sizes), "mean": sum(sizes) / 16, "max": max(sizes), "total": sum(sizes)}
    assert report["corrupt_regions"] == [] and report["stream_bytes"] == manifest_rec.stat().st_size

    # From stdin, split into multipart records: every JPEG (> 1000 bytes) is multipart.
    split = cli("pack", "manifest", data["manifest"], "-", "--attribute-names", "source-ref,bounding-box",
                "--split-bytes", 1000, "--quiet").stdout
    report = json.loads(cli("inspect", "-", "--json", "--join", "concat", input=split).stdout)
    assert report["records"] == 16 and report["group_size"] == 2
    assert report["multipart_records"] == sum(len(p) > 1000 for p in data["expected"]) == 8
    assert report["sizes"]["total"] == sum(sizes)

    text = cli("inspect", manifest_rec).stdout.decode()
    assert "records:      16 (multipart: 0)" in text
    assert "position 0: jpeg 8" in text and "position 1: json 8" in text and "corrupt:      none" in text


def test_inspect_mxnet_rec(images_rec):
    report = json.loads(cli("inspect", images_rec, "--json").stdout)
    assert report["records"] == 6 and report["group_size"] == 1
    assert report["fields"] == [{"position": 0, "kinds": {"imagerecord/jpeg": 5, "imagerecord/png": 1}}]


def test_inspect_corrupt_stream_reports_offsets(tmp_path):
    payloads = [b"record %d " % i * (i + 3) for i in range(10)]
    path = tmp_path / "bad.rec"
    offsets = []
    with RecordWriter(str(path)) as w:
        for p in payloads:
            offsets.append(w.write(p))
    raw = bytearray(path.read_bytes())
    raw[offsets[3]] ^= 0xFF          # bad magic: record 3 is dropped
    raw[offsets[7] + 8:offsets[7] + 12] = b"\xde\xad\xbe\xef"  # payload garbage only: still a record
    path.write_bytes(bytes(raw))
    report = json.loads(cli("inspect", path, "--json").stdout)
    assert report["records"] == 9
    assert report["skipped_records"] == 1
    assert report["corrupt_regions"] == [{"offset": offsets[3], "bytes": offsets[4] - offsets[3]}]
    assert report["multipart_records"] == 0
    text = cli("inspect", path).stdout.decode()
    assert f"offset {offsets[3]}: {offsets[4] - offsets[3]} bytes" in text

    # cat refuses broken framing unless told to skip it.
    proc = cli("cat", path, check=False)
    assert proc.returncode == 1 and str(offsets[3]).encode() in proc.stderr
    got = cli("cat", path, "--skip-corrupt", "--format", "json-lines").stdout.splitlines()
    assert [json.loads(line)["offset"] for line in got] == offsets[:3] + offsets[4:]

    # Not RecordIO at all: one clear line.
    (tmp_path / "pic.jpg").write_bytes(jpeg(32, 32))
    proc = cli("inspect", tmp_path / "pic.jpg", check=False)
    assert proc.returncode == 1 and b"not a RecordIO stream" in proc.stderr and b"JPEG" in proc.stderr


# -- cat / extract -------------------------------------------------------------------------------------

def test_cat_byte_exact(data, manifest_rec):
    expected = data["expected"]
    assert cli("cat", manifest_rec).stdout == b"".join(expected)
    assert cli("cat", "-", "--start", 3, "--count", 4, "--separator", "\\n--\\n",
               input=manifest_rec.read_bytes()).stdout == b"\n--\n".join(expected[3:7])
    lines = [json.loads(line) for line in cli("cat", manifest_rec, "--format", "json-lines", "--count", 2)
             .stdout.splitlines()]
    assert [d["index"] for d in lines] == [0, 1] and lines[0]["offset"] == 0
    assert lines[0]["kind"] == "jpeg" and base64.b64decode(lines[0]["base64"]) == expected[0]
    assert lines[1]["kind"] == "json" and lines[1]["text"].encode() == expected[1]
    hexed = cli("cat", manifest_rec, "--format", "hex", "--start", 15).stdout.decode().split("\t")
    assert hexed[0] == "15" and bytes.fromhex(hexed[2]) == expected[15]


def _cat_peak(path, fmt) -> int:
    """Peak resident bytes of a process that runs ``parrecio cat PATH --format FMT`` into /dev/null."""
    # (VmHWM, the peak of this process image: ru_maxrss keeps the forking parent's peak across exec)
    code = ("import sys; from parrecio.cli.main import main; main(['cat', sys.argv[1], '--format', sys.argv[2]]); "
            "sys.stdout.flush(); print([l for l in open('/proc/self/status') if l.startswith('VmHWM')][0], "
            "file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", code, str(path), fmt], stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, timeout=120, check=True)
    return int(proc.stderr.split()[-2]) * 1024


def test_cat_text_formats_hold_a_big_record_a_few_times_over(tmp_path):
    """A 16 MiB record of NULs: json-lines holds its text (6 bytes a NUL as \\u0000) once plus the line,
    about 8x the record (it was 13.7x: the line copied again for its newline); hex writes 1 MiB pieces,
    about 1x (it was 4.7x: the whole hex text three times)."""
    big, tiny = tmp_path / "nul.rec", tmp_path / "tiny.rec"
    with RecordWriter(str(big)) as w:
        w.write(bytes(16 << 20))
    with RecordWriter(str(tiny)) as w:
        w.write(b"x")
    out = cli("cat", big, "--format", "hex").stdout
    assert out == b"0\t0\t" + b"00" * (16 << 20) + b"\n"
    del out
    for fmt, most in (("json-lines", 10), ("hex", 2.5)):
        grew = (_cat_peak(big, fmt) - _cat_peak(tiny, fmt)) / (16 << 20)
        assert grew < most, (fmt, grew)


def test_extract_byte_exact(data, manifest_rec, images_rec, tmp_path):
    expected = data["expected"]
    assert cli("extract", manifest_rec, "--index", 5).stdout == expected[5]        # no .idx: scan
    assert cli("extract", "-", "--index", 4, input=manifest_rec.read_bytes()).stdout == expected[4]
    out = tmp_path / "one.jpg"
    cli("extract", manifest_rec, "--index", 0, "--out", out)
    assert out.read_bytes() == expected[0]
    proc = cli("extract", manifest_rec, "--index", 16, check=False)
    assert proc.returncode == 1 and b"16 records" in proc.stderr

    listing = sorted(data["files"])
    with IndexedRecordReader(str(images_rec)) as idx:                               # with .idx
        for i in (0, 4):
            assert cli("extract", images_rec, "--index", i).stdout == idx[i]
            assert cli("extract", images_rec, "--index", i, "--no-index").stdout == idx[i]
    assert cli("extract", images_rec, "--key", 4, "--strip-header").stdout == data["files"][listing[4]]

    folder = tmp_path / "all"
    cli("extract", manifest_rec, "--all", "--out", folder)
    names = sorted(os.listdir(folder))
    assert names[:2] == ["000000.jpg", "000001.json"] and len(names) == 16
    assert [(folder / n).read_bytes() for n in names] == expected
    folder = tmp_path / "images"
    cli("extract", images_rec, "--all", "--strip-header", "--out", folder)
    assert sorted(os.listdir(folder))[4] == "000004.png"
    assert [(folder / n).read_bytes() for n in sorted(os.listdir(folder))] == [data["files"][r] for r in listing]


# -- bench ---------------------------------------------------------------------------------------------

def test_bench_json(data, manifest_rec):
    doc = json.loads(cli("bench", manifest_rec, "--workers", 1, 2, "--batch-size", 4, "--size", 32,
                         "--json").stdout)
    assert doc["fields"] == ["image", "json"] and doc["fields_guessed"]
    assert [r["workers"] for r in doc["runs"]] == [1, 2]
    for r in doc["runs"]:
        assert r["samples"] == 8 and r["records"] == 16 and r["bytes"] == sum(map(len, data["expected"]))
        # 8 samples are start-up and a batch or two: no verdict from such a run
        assert (r["bottleneck"], r["bottleneck_from"]) == ("unknown", "too short")
        assert r["samples_per_s"] > 0 and "wait_workers_time" in r["stages"]


def test_bench_workers_0_beside_workers_1(data, manifest_rec):
    """--workers 0 decodes in the bench process: it has no per-worker decode share (it crashed with a
    ZeroDivisionError before), its decoding shows as consumer CPU, and both runs see every sample."""
    doc = json.loads(cli("bench", manifest_rec, "--workers", 0, 1, "--batch-size", 4, "--size", 32,
                         "--json").stdout)
    inline, one = doc["runs"]
    assert (inline["workers"], one["workers"]) == (0, 1)
    assert inline["samples"] == one["samples"] == 8 and inline["bytes"] == one["bytes"]
    assert inline["decode_cpu_per_worker_percent"] is None and one["decode_cpu_per_worker_percent"] >= 0
    assert inline["cpu_us_per_sample"]["decode"] == 0 and inline["cpu_us_per_sample"]["reader"] == 0
    assert inline["cpu_us_per_sample"]["consumer"] > 0


def test_bench_advice_follows_a_measured_workers_0_run():
    """The CPU-cost guess ("try --workers 0") is for when workers=0 was not measured: it was printed under
    a "best: ... with 2 workers" that a measured, slower workers=0 run had just settled."""
    from parrecio.cli.bench import inline_advice

    def run(workers, rate, reader, consumer, decode):
        return {"workers": workers, "samples_per_s": rate,
                "cpu_us_per_sample": {"reader": reader, "consumer": consumer, "decode": decode}}
    cheap = [run(1, 144972.7, 0.7, 1.3, 1.4), run(2, 176565.0, 0.6, 1.3, 1.5)]  # small JSON records
    assert inline_advice(cheap).endswith("try --workers 0 (decoding in this process)")
    assert inline_advice([run(0, 88343.7, 0.0, 11.0, 0.0)] + cheap) is None
    assert inline_advice([run(0, 200000.0, 0.0, 4.0, 0.0)] + cheap).startswith("workers=0 (decoding in this "
                                                                                 "process, no child processes) "
                                                                                 "was the fastest")


def test_bench_text_with_fields(images_rec):
    proc = cli("bench", images_rec, "--fields", "imagerecord", "--workers", 1, "--batch-size", 2,
               "--size", 16)
    out = proc.stdout.decode()
    assert out.splitlines()[0].split()[:3] == ["workers", "samples", "samples/s"]
    assert out.splitlines()[1].split()[:2] == ["1", "6"] and "bottleneck there:" in out
    assert "scaling: per sample " in out and " decoder processes" in out.split("scaling:")[1]
    assert b"\r" not in proc.stderr  # no progress line when stderr is not a terminal


def _pipe_layout(root, channel="train"):
    """A SageMaker input layout with ``channel`` in Pipe mode (RecordIO wrapper) and no FIFO yet."""
    (root / "config").mkdir(parents=True)
    (root / "data").mkdir()
    settings = {"TrainingInputMode": "Pipe", "RecordWrapperType": "RecordIO", "S3DistributionType": "FullyReplicated"}
    (root / "config" / "inputdataconfig.json").write_text(json.dumps({channel: settings}))


def test_bench_says_it_waits_for_a_missing_pipe_fifo(tmp_path):
    _pipe_layout(tmp_path)
    env = dict(os.environ, SM_INPUT_DIR=str(tmp_path), PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-m", "parrecio.cli", "bench", "train", "--fields", "raw",
                             "--workers", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            cwd=str(tmp_path))
    stdout, stderr = Drain(proc.stdout), Drain(proc.stderr)
    fifo = tmp_path / "data" / "train_0"
    line = f"waiting for the Pipe-mode FIFO {fifo} to appear (0 s)".encode()
    try:
        wait_until(lambda: line in stderr.data or proc.poll() is not None, timeout=60,
                   what="bench to say it waits for the FIFO")
        assert proc.poll() is None, stderr.data.decode(errors="replace")  # waiting, not failed
        # the behaviour under test: it goes on waiting (2 s more here), it does not give up or fail
        time.sleep(2)
        assert proc.poll() is None, stderr.data.decode(errors="replace")
    finally:
        proc.kill()
        proc.wait(30)
    out, text = stdout.join(), stderr.join().decode()
    assert line.decode() in text, text
    assert "\r" not in text and out == b""
    assert not os.path.exists(fifo)  # nothing was created or opened


def test_bench_waits_for_a_late_pipe_fifo_then_reads_it(tmp_path):
    from parrecio.recordio.wrapper import write_sagemaker_recordio
    from source_helpers import fifo_feeder

    _pipe_layout(tmp_path)
    stream = io.BytesIO()
    write_sagemaker_recordio([b"r%d" % i for i in range(10)], stream)
    env = dict(os.environ, SM_INPUT_DIR=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-m", "parrecio.cli", "bench", "train", "--fields", "raw",
                             "--workers", "1", "--batch-size", "4", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=dict(env, PYTHONPATH=ROOT + os.pathsep + env.get("PYTHONPATH", "")))
    stdout, stderr = Drain(proc.stdout), Drain(proc.stderr)
    line = f"waiting for the Pipe-mode FIFO {tmp_path / 'data' / 'train_0'} to appear (0 s)".encode()
    feeder = None
    try:
        # the FIFO appears once bench says it waits for it (late, however long bench took to start)
        wait_until(lambda: line in stderr.data or proc.poll() is not None, timeout=60,
                   what="bench to say it waits for the FIFO")
        assert proc.poll() is None, stderr.data.decode(errors="replace")
        feeder = multiprocessing.get_context("fork").Process(
            target=fifo_feeder, args=(str(tmp_path / "data"), "train", [stream.getvalue()], 0.0, 7), daemon=True)
        feeder.start()
        returncode = proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        if feeder is not None:
            feeder.join(30)
            if feeder.is_alive():
                feeder.kill()
    out, err = stdout.join(), stderr.join().decode(errors="replace")
    assert returncode == 0, err
    assert line.decode() in err
    [run] = json.loads(out)["runs"]
    assert run["samples"] == 10 and run["records"] == 10


def test_bench_refuses_several_runs_on_a_pipe_channel(tmp_path):
    _pipe_layout(tmp_path)
    env = dict(os.environ, SM_INPUT_DIR=str(tmp_path), PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-m", "parrecio.cli", "bench", "train", "--fields", "raw", "--workers",
                           "1", "2"], capture_output=True, env=env, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.decode() == (
        f"parrecio bench: error: 'train' is a SageMaker Pipe-mode channel: each --workers value is a fresh reader "
        f"that would read other epochs' FIFOs (each served once: {tmp_path / 'data' / 'train_0'}, then the next), "
        f"so the figures would not be of the same data; give one --workers value\n")


def test_bench_fifo_wait_lines_and_timeout(tmp_path, capsys, monkeypatch):
    """In-process: a line every FIFO_WAIT_LINE_EVERY s off a terminal, and the source's own SourceError."""
    from parrecio.cli import bench
    from parrecio.errors import SourceError
    from parrecio.sources import resolve

    _pipe_layout(tmp_path)
    monkeypatch.setattr(bench, "FIFO_WAIT_LINE_EVERY", 0.5)
    source = resolve("train", sm_input_dir=str(tmp_path), fifo_timeout=2.2)
    start = time.monotonic()
    with pytest.raises(SourceError) as info:
        bench.wait_for_fifo(source, 0)
    took = time.monotonic() - start
    assert 2.2 <= took < 15, took  # it gives up at fifo_timeout (later only as late as a loaded machine runs it)
    lines = capsys.readouterr().err.splitlines()
    with pytest.raises(SourceError) as direct:
        source.wait_for_fifo(0)
    assert str(info.value) == str(direct.value) and "did not appear within 2.2 s" in str(info.value)
    # a line at 0 s, then one each time another 0.5 s have passed: at ~0.5, 1.0, 1.5 and 2.0 s.  Checks are
    # at most 0.1 s apart, but a loaded machine may leave out a few (one line stands for every 0.5 s boundary
    # passed since the last): at least one more line is there unless nothing ran for 1.7 s
    prefix = f"waiting for the Pipe-mode FIFO {tmp_path / 'data' / 'train_0'} to appear ("
    assert lines[0] == prefix + "0 s)" and 2 <= len(lines) <= 5, lines
    seconds = [int(line[len(prefix):-len(" s)")]) for line in lines]
    assert all(line.startswith(prefix) and line.endswith(" s)") for line in lines)
    assert seconds == sorted(seconds) and seconds[-1] <= 2


# -- demo ------------------------------------------------------------------------------------------------
def test_demo_out_keeps_the_file_and_says_how_to_read_it(tmp_path):
    out = tmp_path / "demo.rec"
    proc = cli("demo", "--samples", 40, "--workers", 1, "--batch-size", 8, "--size", 64, "--out", out)
    text = proc.stdout.decode()
    assert f"{out} and its index {tmp_path / 'demo.idx'} (kept)" in text
    assert f"read it yourself: ParallelReader({str(out)!r}" in text
    from parrecio import IndexedRecordReader, ParallelReader, RecordReader
    from parrecio.decoders import BoundingBoxes, Image
    # #24: the .idx is written, so len() is known before a pass and shuffle=True is a global permutation
    with RecordReader(out) as plain, IndexedRecordReader(out) as indexed:
        payloads = [rec.payload for rec in plain]
        assert len(payloads) == 80 and [indexed[i] for i in range(80)] == payloads
    with ParallelReader(out, fields=[Image(size=(224, 224)), BoundingBoxes(max_boxes=8)], batch_size=32,
                        workers=0, shuffle=True) as r:
        assert len(r) == 2 and r.config.shuffle_mode == "index"
        assert [len(images) for images, _ in r] == [32, 8]
    proc = cli("demo", "--samples", 8, "--out", tmp_path, check=False)
    assert proc.returncode != 0 and b"is a folder; give a file name" in proc.stderr
    assert "fields=[Image(size=(64, 64)), BoundingBoxes(max_boxes=8)], batch_size=8)" in text  # as run


@pytest.mark.parametrize("args,message", [
    (("--samples", 0), "--samples must be >= 1, not 0"), (("--size", 0), "--size must be >= 1, not 0"),
    (("--batch-size", 0), "--batch-size must be >= 1, not 0"), (("--workers", -1), "--workers must be >= 0"),
    (("--out", "/nonexistent-folder/d.rec"), "the folder '/nonexistent-folder' does not exist")])
def test_demo_refuses_bad_arguments_in_one_line(args, message):
    proc = cli("demo", *args, check=False)
    err = proc.stderr.decode()
    assert proc.returncode != 0 and message in err and "Traceback" not in err


def test_demo_with_no_workers_decodes_in_this_process():
    proc = cli("demo", "--samples", 24, "--workers", 0, "--batch-size", 8, "--size", 32)
    assert "ParallelReader, 0 workers" in proc.stdout.decode()  # (it ran with the CPU count before)


def test_pack_protobuf_refuses_what_is_no_npy_file_in_one_line(tmp_path):
    import numpy as np
    (tmp_path / "text.txt").write_text("hello world")
    np.save(tmp_path / "x.npy", np.zeros((10, 3), np.float32))
    (tmp_path / "cut.npy").write_bytes((tmp_path / "x.npy").read_bytes()[:100])
    for args, message in ((("text.txt",), "text.txt: not a numpy .npy array file (it starts with b'hello wo')"),
                          (("cut.npy",), "cut.npy: cannot be read as a numpy .npy array"),
                          (("x.npy", "--labels", "text.txt"), "text.txt: not a numpy .npy array file")):
        proc = cli("pack", "protobuf", *args[:1], tmp_path / "o.rec", *args[1:], check=False, cwd=tmp_path)
        err = proc.stderr.decode()
        assert proc.returncode == 1 and message in err and "Traceback" not in err, err
    text = cli("demo", "--samples", 16, "--workers", 1, "--batch-size", 8, "--size", 32).stdout.decode()
    assert "(temporary, removed at the end; --out FILE.rec keeps it)" in text


# -- input that is no RecordIO at all ----------------------------------------------------------------------
def test_every_subcommand_says_the_same_of_non_recordio_input(tmp_path, images_rec):
    """inspect, cat, extract and bench: one message naming what the file is, with a hint for images."""
    from PIL import Image as PILImage
    png, txt = tmp_path / "some.png", tmp_path / "notes.txt"
    PILImage.new("RGB", (8, 8)).save(png)
    txt.write_text("hello world, these are notes\n")
    for args in (["inspect", png], ["cat", png], ["extract", png, "--index", 0], ["bench", png, "--workers", 1]):
        err = cli(*args, check=False).stderr.decode()
        assert f"error: {png}: not a RecordIO stream ({png.stat().st_size} bytes): it starts with a PNG image" in err
        assert err.strip().endswith("to pack images into RecordIO: parrecio pack images DIR out.rec"), err
    for args in (["inspect", txt], ["cat", txt]):
        err = cli(*args, check=False).stderr.decode()
        assert f"error: {txt}: not a RecordIO stream (29 bytes): it starts with text" in err, err
        assert "pack manifest" not in err
    # a manifest's first line is longer than the 64 bytes looked at (it sniffs as text): the hint still comes
    manifest = tmp_path / "train.manifest"
    manifest.write_text(json.dumps({"source-ref": "s3://bucket/images/0001.jpg", "bounding-box": {}}) + "\n")
    for args in (["inspect", manifest], ["cat", manifest]):
        err = cli(*args, check=False).stderr.decode()
        assert err.strip().endswith("to pack a manifest's records: parrecio pack manifest FILE out.rec"), err


def test_compressed_and_empty_inputs_are_named(tmp_path):
    """A .rec shipped gzipped or xz-ed: say so and how to read it; an empty file: nothing to bench."""
    import gzip
    import lzma
    from parrecio import RecordWriter
    rec = tmp_path / "r.rec"
    with RecordWriter(str(rec)) as writer:
        writer.write(b"payload")
    gz, xz, empty = tmp_path / "r.rec.gz", tmp_path / "r.rec.xz", tmp_path / "empty.rec"
    gz.write_bytes(gzip.compress(rec.read_bytes()))
    xz.write_bytes(lzma.compress(rec.read_bytes()))
    empty.write_bytes(b"")
    for path, kind, command in ((gz, "gzip", "gzip -dc"), (xz, "xz", "xz -dc")):
        for args in (["inspect", path], ["cat", path], ["extract", path, "--index", 0], ["bench", path]):
            err = cli(*args, check=False).stderr.decode()
            assert f"error: {path}: not a RecordIO stream ({path.stat().st_size} bytes): it is " \
                   f"{kind}-compressed; decompress it first, e.g. {command} {path} | parrecio cat -" in err, err
    assert cli("bench", empty, check=False).stderr.decode().endswith(f"error: {empty}: empty, no records to bench\n")
    assert cli("cat", empty).stdout == b""  # an empty stream is a valid one, of 0 records
    folder = tmp_path / "folder"  # the first file empty, the next one not: bench guesses from the next
    folder.mkdir()
    (folder / "a.rec").write_bytes(b"")
    (folder / "b.rec").write_bytes(rec.read_bytes())
    from parrecio.cli.bench import peek
    assert peek(str(folder), None) == (["raw"], 7.0)


def test_the_library_says_what_a_non_recordio_file_starts_with(tmp_path):
    """A file, or a folder of JPEGs, given as the channel: the CLI's message, when the reader is made; a
    stream (a file object) that is no RecordIO: at its first record, with its first bytes."""
    import io
    from PIL import Image as PILImage
    from parrecio import ParallelReader
    from parrecio.errors import CorruptRecordError, SourceError
    png = tmp_path / "some.png"
    PILImage.new("RGB", (8, 8)).save(png)
    with pytest.raises(SourceError, match=r"some.png: not a RecordIO stream \(\d+ bytes\): it starts with a PNG "
                                          r"image .*to pack images into RecordIO: parrecio pack images DIR out.rec"):
        ParallelReader(str(png), workers=0)
    folder = tmp_path / "photos"
    folder.mkdir()
    for i in range(3):
        PILImage.new("RGB", (8, 8), (i, 0, 0)).save(folder / f"{i}.jpg")
    with pytest.raises(SourceError, match=r"0.jpg: not a RecordIO stream .* it starts with a JPEG image .*"
                                          r"parrecio pack images DIR out.rec"):
        ParallelReader(str(folder), workers=2)
    with pytest.raises(CorruptRecordError) as info:
        list(ParallelReader(io.BytesIO(png.read_bytes()), workers=0))
    assert "bad magic 0x474E5089 (expected 0xCED7230A); not a RecordIO stream? it starts with " \
           "b'\\x89PNG\\r\\n\\x1a\\n'" in str(info.value) and info.value.offset == 0


def test_cat_and_inspect_agree_on_image_records(images_rec):
    lines = [json.loads(x) for x in cli("cat", images_rec, "--format", "json-lines").stdout.splitlines()]
    report = json.loads(cli("inspect", images_rec, "--json").stdout)
    kinds = {x["kind"] for x in lines}
    assert kinds == {"imagerecord/jpeg", "imagerecord/png"}  # the fixture's dog folder has a PNG
    assert all(k in json.dumps(report) for k in kinds)


def test_pack_images_of_a_folder_where_no_file_is_an_image_fails_and_writes_nothing(tmp_path):
    """Every file left out (none opens as an image): an empty .rec and status 0 read as packed."""
    root = tmp_path / "imgs"
    (root / "cat").mkdir(parents=True)
    (root / "cat" / "a.jpg").write_text("this is not a JPEG at all\n")
    (root / "cat" / "b.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    out = tmp_path / "o.rec"
    proc = cli("pack", "images", root, out, check=False)
    err = proc.stderr.decode()
    assert proc.returncode == 1, err
    assert f"error: none of the 2 files opened as an image (the first, {root / 'cat' / 'a.jpg'}: not an image " \
           f"Pillow can open: text (26 bytes" in err, err
    assert err.strip().endswith("nothing was written"), err
    assert "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["imgs"]


def test_pack_images_leaves_out_and_lists_files_that_are_no_images(tmp_path, data):
    import shutil
    root = tmp_path / "imgs"
    shutil.copytree(data["images"], root)
    (root / "cat" / "broken.jpg").write_text("this is not a JPEG at all\n")
    jpeg = (root / "cat").glob("*.jpg").__next__().read_bytes()
    (root / "cat" / "cut.jpg").write_bytes(jpeg[:200])  # a JPEG header, then nothing
    # cut inside its scan: Pillow's verify() passes it (it does not decode), Image() refused it in training
    (root / "cat" / "half.jpg").write_bytes(jpeg[:len(jpeg) // 2])
    out = tmp_path / "o.rec"
    proc = cli("pack", "images", root, out)
    err = proc.stderr.decode()
    from parrecio.decoders.sniff import describe
    what = describe(b"this is not a JPEG at all\n")
    assert what.startswith("text (26 bytes")
    assert f"skipped {root / 'cat' / 'broken.jpg'}: not an image Pillow can open: {what}\n" in err
    assert f"skipped {root / 'cat' / 'cut.jpg'}: a JPEG image (200 bytes) that does not open: OSError: Truncated File Read\n" in err
    assert (f"skipped {root / 'cat' / 'half.jpg'}: a JPEG image ({len(jpeg) // 2} bytes) cut short: no "
            f"end-of-image marker after its last scan\n") in err
    assert "BytesIO" not in err and " at 0x" not in err  # #24: the message named Pillow's file object
    assert "6 records" in err  # the 6 images of the fixture, not the text file
    lst = (tmp_path / "o.lst").read_text()
    assert "broken.jpg" not in lst and len(lst.splitlines()) == 6
    from parrecio import RecordReader
    assert sum(1 for _ in RecordReader(out)) == 6
    cli("pack", "images", root, tmp_path / "all.rec", "--no-verify")
    assert sum(1 for _ in RecordReader(tmp_path / "all.rec")) == 9


def test_pack_images_of_a_flat_folder_says_so(tmp_path, data):
    import shutil
    flat = tmp_path / "flat"
    flat.mkdir()
    for p in sorted((data["images"] / "cat").iterdir()):
        shutil.copy(p, flat / p.name)
    err = cli("pack", "images", flat, tmp_path / "f.rec").stderr.decode()
    assert "no class sub-folders: one class, every image has label 0" in err and "0=." not in err


def test_bench_starts_the_forkserver_before_timing():
    import multiprocessing.forkserver as fs
    from parrecio.cli.bench import warm_up
    warm_up(None)
    assert fs._forkserver._forkserver_pid is not None  # the first timed run finds it running


def test_extract_all_draws_a_progress_bar_on_a_terminal_only(tmp_path):
    """On a terminal: a bar with the total from the .idx, the rate and an ETA; elsewhere only the summary."""
    import fcntl
    import pty
    import struct
    import termios
    from parrecio import RecordWriter
    rec = tmp_path / "b.rec"
    with RecordWriter(str(rec), index=str(tmp_path / "b.idx")) as w:
        for i in range(300):
            w.write(b"%d" % i, key=i)
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-m", "parrecio.cli", "extract", str(rec), "--all", "--out",
                             str(tmp_path / "t")], stdout=subprocess.DEVNULL, stderr=slave, env=env)
    os.close(slave)
    seen = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
    assert proc.wait(timeout=60) == 0
    os.close(master)
    text = seen.decode(errors="replace")
    assert "extract:" in text and "/300" in text and "records/s" in text
    plain = cli("extract", rec, "--all", "--out", tmp_path / "p").stderr.decode()
    assert plain == f"extract: 300 records written to {tmp_path / 'p'}\n"


def test_pack_images_takes_a_jpeg_followed_by_other_bytes_and_refuses_one_cut_short():
    """A Motion Photo is a JPEG with a video after its end-of-image marker: the check for a JPEG cut
    short searched the whole file for its last scan, found FF DA in the video, and left the photo out.
    Its end marker is looked for after its first scan begins, as the region decoder does (baseline and
    progressive, restart markers)."""
    import io
    import numpy as np
    from PIL import Image as PILImage
    from parrecio.tools.pack import _not_an_image
    rng = np.random.default_rng(0)
    pixels = PILImage.fromarray(rng.integers(0, 256, (40, 56, 3), dtype=np.uint8))
    for options in ({}, {"progressive": True}, {"restart_marker_blocks": 1}):
        buf = io.BytesIO()
        pixels.save(buf, "JPEG", quality=90, **options)
        jpeg = buf.getvalue()
        assert _not_an_image(jpeg) is None
        trailer = b"ftypmp42" + b"\xff\xda\x00\x08" + bytes(rng.integers(0, 256, 3000, dtype=np.uint8))
        assert _not_an_image(jpeg + trailer) is None
        for cut in (len(jpeg) - 2, len(jpeg) * 2 // 3, len(jpeg) // 3):
            assert _not_an_image(jpeg[:cut]) is not None, (options, cut)


@pytest.mark.parametrize("name", ["b/3\tx.png", "b/a\nb.png", "b/ lead.png", "trail /y.png"])
def test_pack_images_refuses_a_name_an_im2rec_list_cannot_hold(tmp_path, name):
    """An im2rec .lst has no escape: "x.png" and "3<TAB>x.png" in one folder gave the line
    "0<TAB>0.000000<TAB>3<TAB>x.png", which pack list read back as x.png with labels 0 and 3 (silently);
    a line break gave a list it refused; spaces at a field's ends are stripped by both readers."""
    from parrecio.errors import SourceError
    from parrecio.tools.pack import list_image_folder
    root = tmp_path / "imgs"
    (root / "b").mkdir(parents=True)
    (root / "b" / "x.png").write_bytes(b"png")
    (root / name).parent.mkdir(exist_ok=True)
    (root / name).write_bytes(b"png")
    with pytest.raises(SourceError, match=r"a name with a tab, a line break, or spaces at its start or end "
                                          r"cannot be written to an im2rec list \(.lst\), which has no escape"):
        list_image_folder(str(root))
