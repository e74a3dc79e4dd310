"""Path and file parameters refuse bools and ints: ``open(True)`` is standard output, ``open(False)`` stdin.

The bool cases run in a child process (one for all of them): before the check existed, they read or wrote
the child's descriptors 0 and 1 and closed them, which must never happen to the test process itself.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from parrecio.recordio import IndexedRecordReader, RecordReader, RecordWriter, read_index
from parrecio.recordio.paths import check_path_arg
from parrecio.tools import inspect_stream, read_image_list

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PATH_OR_FILE = "must be a path or a binary file object, not"
PATH = "must be a path, not"

# (label, expression, expected TypeError message); evaluated in the child with `d` a scratch folder that
# holds a.rec + a.idx, m.manifest (one line), img/c/x.jpg, and `items` a one-item image list.
CASES = [
    ("writer target True", "RecordWriter(True)", f"path_or_file {PATH_OR_FILE} bool"),
    ("writer target False", "RecordWriter(False)", f"path_or_file {PATH_OR_FILE} bool"),
    ("writer index 1", "RecordWriter(d + '/w1.rec', index=1)", f"index {PATH_OR_FILE} int"),
    ("writer index int64", "RecordWriter(d + '/w2.rec', index=np.int64(1))", f"index {PATH_OR_FILE} int64"),
    ("writer index True on a file object", "RecordWriter(io.BytesIO(), index=True)",
     "index=True puts the index next to the record file, so path_or_file must be a path, not BytesIO; "
     "give index a path or a binary file object"),
    ("reader source True", "RecordReader(True)", f"source {PATH_OR_FILE} bool"),
    ("reader source False", "RecordReader(False)", f"source {PATH_OR_FILE} bool"),
    ("indexed rec_path True", "IndexedRecordReader(True, d + '/a.idx')", f"rec_path {PATH} bool"),
    ("indexed idx_path True", "IndexedRecordReader(d + '/a.rec', True)", f"idx_path {PATH} bool"),
    ("indexed idx_path False", "IndexedRecordReader(d + '/a.rec', False)", f"idx_path {PATH} bool"),
    ("read_index False", "read_index(False)", f"idx_path {PATH} bool"),
    ("inspect_stream False", "inspect_stream(False)", f"source {PATH_OR_FILE} bool"),
    ("read_image_list True", "read_image_list(True)", f"lst_path {PATH} bool"),
    ("write_image_list True", "write_image_list(True, items)", f"path_or_file {PATH_OR_FILE} bool"),
    ("list_image_folder True", "list_image_folder(True)", f"root {PATH} bool"),
    ("output_paths True", "output_paths(True)", f"out_rec {PATH} bool"),
    ("pack_image_list root", "pack_image_list(items, True, d + '/p.rec')", f"root {PATH} bool"),
    ("pack_image_list out_rec", "pack_image_list(items, d + '/img', True)", f"out_rec {PATH} bool"),
    ("pack_image_list idx_path", "pack_image_list(items, d + '/img', d + '/p.rec', idx_path=True)",
     f"idx_path {PATH} bool"),
    ("pack_image_list lst_path", "pack_image_list(items, d + '/img', d + '/p.rec', lst_path=True)",
     f"lst_path {PATH} bool"),
    ("pack_manifest manifest_path", "pack_manifest(True, d + '/o.rec', ['source-ref'])",
     f"manifest_path {PATH} bool"),
    ("pack_manifest out", "pack_manifest(d + '/m.manifest', True, ['source-ref'])", f"out {PATH_OR_FILE} bool"),
]

CHILD = textwrap.dedent("""
    import io, json, os, sys
    import numpy as np
    from parrecio.recordio import IndexedRecordReader, RecordReader, RecordWriter, read_index
    from parrecio.tools import inspect_stream, list_image_folder, pack_image_list, pack_manifest
    from parrecio.tools import read_image_list, write_image_list
    from parrecio.tools.pack import ListItem, output_paths

    d, out, cases = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    items = [ListItem(0, (0.0,), "c/x.jpg")]
    results = {}
    for label, expr in cases:
        try:
            eval(expr)
            results[label] = ["no error", ""]
        except BaseException as exc:
            results[label] = [type(exc).__name__, str(exc)]
    fds = {}
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
            fds[fd] = "open"
        except OSError:
            fds[fd] = "closed"
    with open(out, "w") as f:
        json.dump({"results": results, "fds": fds}, f)
    print("child stdout still works")
""")


@pytest.fixture(scope="module")
def child(tmp_path_factory):
    """Run every case of :data:`CASES` in one child process; its results and the state of its fds 0-2."""
    d = tmp_path_factory.mktemp("paths")
    with RecordWriter(str(d / "a.rec"), index=str(d / "a.idx")) as w:
        w.write(b"one")
    (d / "img" / "c").mkdir(parents=True)
    (d / "img" / "c" / "x.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a JPEG")
    (d / "m.manifest").write_text('{"source-ref": "img/c/x.jpg"}\n')
    out = d / "results.json"
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", CHILD, str(d), str(out),
                           json.dumps([(label, expr) for label, expr, _ in CASES])],
                          stdin=subprocess.DEVNULL, capture_output=True, env=env, cwd=str(d), timeout=120)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    doc = json.loads(out.read_text())
    doc["stdout"] = proc.stdout.decode()
    doc["dir"] = d
    return doc


@pytest.mark.parametrize("label, expr, message", CASES, ids=[c[0] for c in CASES])
def test_bool_or_int_is_a_type_error_naming_the_parameter(child, label, expr, message):
    assert child["results"][label] == ["TypeError", message]


def test_no_case_touched_the_standard_descriptors(child):
    assert child["fds"] == {"0": "open", "1": "open", "2": "open"}
    assert child["stdout"] == "child stdout still works\n"
    # nothing was created by the refused calls
    assert not any(name.startswith(("w1", "w2", "p.", "o.")) for name in os.listdir(child["dir"]))


def test_index_true_writes_next_to_the_record_file_in_a_child(tmp_path):
    """The reported bug, end to end: the index lands in data.idx, and the child's stdout survives close()."""
    code = textwrap.dedent("""
        import sys
        from parrecio.recordio import RecordWriter
        with RecordWriter(sys.argv[1], index=True) as w:
            w.write(b"a" * 5)
            w.write(b"b")
        print("stdout still open")
    """)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "data.rec")], capture_output=True,
                          env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    assert proc.stdout == b"stdout still open\n"
    assert (tmp_path / "data.idx").read_bytes() == b"0\t0\n1\t16\n"
    assert IndexedRecordReader(str(tmp_path / "data.rec"))[1] == b"b"


@pytest.mark.parametrize("name, idx", [("data.rec", "data.idx"), ("data", "data.idx"),
                                       ("shard.v2.rec", "shard.v2.idx")])
def test_index_true_replaces_the_suffix(tmp_path, name, idx):
    with RecordWriter(tmp_path / name, index=True) as w:  # a PathLike works too
        w.write(b"x", key="k")
    assert sorted(os.listdir(tmp_path)) == sorted([name, idx])
    assert (tmp_path / idx).read_text() == "k\t0\n"


@pytest.mark.parametrize("index", [False, None])
def test_index_false_or_none_writes_no_index(tmp_path, index):
    with RecordWriter(str(tmp_path / "data.rec"), index=index) as w:
        w.write(b"x")
    assert os.listdir(tmp_path) == ["data.rec"]


def test_index_to_a_binary_file_object_is_left_open(tmp_path):
    idx = io.BytesIO()
    rec = io.BytesIO()
    with RecordWriter(rec, index=idx) as w:
        w.write(b"abc")
        w.write(b"de", key=7)
    assert not idx.closed and idx.getvalue() == b"0\t0\n7\t12\n"
    with RecordWriter(str(tmp_path / "x.rec"), index=str(tmp_path / "x.idx")) as w:
        w.write(b"abc")
        w.write(b"de", key=7)
    assert (tmp_path / "x.idx").read_bytes() == idx.getvalue()
    assert (tmp_path / "x.rec").read_bytes() == rec.getvalue()


def test_a_real_descriptor_is_not_taken_either(tmp_path):
    """An int that is an open descriptor of ours: refused, and left open (not written, not closed)."""
    fd = os.open(tmp_path / "victim", os.O_RDWR | os.O_CREAT)
    try:
        with pytest.raises(TypeError, match=f"^path_or_file {PATH_OR_FILE} int$"):
            RecordWriter(fd)
        with pytest.raises(TypeError, match=f"^source {PATH_OR_FILE} int$"):
            RecordReader(fd)
        with pytest.raises(TypeError, match=f"^lst_path {PATH} int$"):
            read_image_list(fd)
        with pytest.raises(TypeError, match=f"^idx_path {PATH} int$"):
            read_index(fd)
        with pytest.raises(TypeError, match=f"^source {PATH_OR_FILE} int$"):
            inspect_stream(fd)
        os.fstat(fd)  # still open
        assert os.path.getsize(tmp_path / "victim") == 0
    finally:
        os.close(fd)


def test_check_path_arg():
    for ok in ("p", b"p", io.BytesIO(), None):
        assert check_path_arg(ok, "x") is ok
    with pytest.raises(TypeError, match="^x must be a path, not int$"):
        check_path_arg(3, "x", file_ok=False)
    assert check_path_arg(3, "x", fd_ok=True) == 3
    with pytest.raises(TypeError, match="^x must be a path or a binary file object or a file descriptor, not bool$"):
        check_path_arg(True, "x", fd_ok=True)
    with pytest.raises(TypeError, match="^x must be a path or a binary file object, not uint8$"):
        check_path_arg(np.uint8(1), "x")


def test_an_index_of_many_records_is_held_in_little_memory_and_keys_stay_as_written(tmp_path):
    """The reader process of a shuffled read holds the file's IndexedRecordReader: it kept the keys, the
    offsets, a key -> offset dict and (key, offset) tuples, 123 B a record held and 230 B at its peak
    (1M records: 230 MiB in the reader process).  Keys 0..n-1 are a range now, the dict is made at the
    first look-up by key: under 64 B held.  Keys that are no ints all stay str, as written ("007")."""
    import tracemalloc
    n = 200_000
    rec, idx = tmp_path / "a.rec", tmp_path / "a.idx"
    rec.write_bytes(b"".join(np.array([0xCED7230A, 4], "<u4").tobytes() + b"%04d" % (i % 10_000) for i in range(n)))
    idx.write_text("".join(f"{i}\t{12 * i}\n" for i in range(n)))
    tracemalloc.start()
    try:
        reader = IndexedRecordReader(rec, idx)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    with reader:
        assert held / n < 64, held / n
        assert len(reader) == n and reader.keys[:3] == [0, 1, 2] and list(reader)[-1] == n - 1
        assert reader[n - 1] == b"%04d" % ((n - 1) % 10_000) and 5 in reader and n not in reader
        assert reader.offsets[:3] == [0, 12, 24]
    rec.write_bytes(rec.read_bytes()[:36])  # three records, for the indexes below
    idx.write_text("007\t0\n8\t12\nx\t24\n")
    with IndexedRecordReader(rec, idx) as reader:
        assert reader.keys == ["007", "8", "x"] and reader["007"] == b"0000" and reader["x"] == b"0002"
    assert read_index(idx) == [("007", 0), ("8", 12), ("x", 24)]
    idx.write_text("3\t0\n1\t12\n2\t24\n")
    with IndexedRecordReader(rec, idx) as reader:
        assert reader.keys == [3, 1, 2] and reader[1] == b"0001"
