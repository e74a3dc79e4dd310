"""resolve() for paths: files, directories, globs, lists, FIFOs, and the errors that name what was looked for."""

import os
import pickle
import threading

import pytest

from parrecio.errors import SourceError
from parrecio.sources import FileSource, Source, list_recordio_files, resolve
from source_helpers import make_payloads, read_epoch, records_of, write_rec


@pytest.fixture
def recs(tmp_path):
    """Three .rec files b, a, c (written in that order) with distinct payloads."""
    data = {}
    for i, name in enumerate(["b.rec", "a.rec", "c.rec"]):
        data[name] = write_rec(tmp_path / name, make_payloads(5, seed=i))
    return tmp_path, data


def test_single_file(recs):
    root, data = recs
    path = str(root / "a.rec")
    source = resolve(path)
    assert isinstance(source, FileSource)
    assert source.name == path and source.default_join == "auto" and source.epochs_supported is None
    for epoch in (0, 1, 2):  # a file can be read every epoch
        assert read_epoch(source, epoch) == [(path, data["a.rec"])]
    assert records_of(data["a.rec"]) == make_payloads(5, seed=1)


def test_pathlike_and_bytes_paths(recs):
    root, data = recs
    assert read_epoch(resolve(root / "c.rec"), 0)[0][1] == data["c.rec"]
    assert read_epoch(resolve(os.fsencode(root / "c.rec")), 0)[0][1] == data["c.rec"]


def test_directory_rec_files_in_name_order(recs):
    root, data = recs
    (root / "a.idx").write_text("0\t0\n")
    (root / "notes.txt").write_text("ignored: there are .rec files")
    (root / ".hidden.rec").write_bytes(b"x")
    (root / "sub").mkdir()
    write_rec(root / "sub" / "0.rec", [b"not listed: not recursive"])
    source = resolve(str(root))
    assert [os.path.basename(p) for p in source.paths] == ["a.rec", "b.rec", "c.rec"]
    assert [d for _, d in read_epoch(source, 0)] == [data["a.rec"], data["b.rec"], data["c.rec"]]


def test_directory_without_rec_takes_other_regular_files(tmp_path):
    for name in ["part-2", "part-10", "part-1"]:
        write_rec(tmp_path / name, [name.encode()])
    for name in ["data.idx", "data.lst", ".DS_Store"]:
        (tmp_path / name).write_bytes(b"skip me")
    os.mkfifo(tmp_path / "fifo")  # not a regular file: skipped, never opened
    try:
        assert [os.path.basename(p) for p in resolve(str(tmp_path)).paths] == ["part-1", "part-10", "part-2"]
    finally:
        os.unlink(tmp_path / "fifo")


def test_recursive_listing_is_s3_key_order(tmp_path):
    for rel in ["b.rec", "a/x.rec", "a0.rec", "a/y/z.rec", ".git/h.rec"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"")
    got = [os.path.relpath(p, tmp_path) for p in list_recordio_files(str(tmp_path), recursive=True)]
    assert got == ["a/x.rec", "a/y/z.rec", "a0.rec", "b.rec"]


def test_glob_and_list(recs):
    root, data = recs
    source = resolve(str(root / "[ab].rec"))
    assert [os.path.basename(p) for p in source.paths] == ["a.rec", "b.rec"]
    listed = resolve([str(root / "c.rec"), str(root / "[ab].rec"), root / "c.rec"])
    assert [os.path.basename(p) for p in listed.paths] == ["c.rec", "a.rec", "b.rec", "c.rec"]
    assert [d for _, d in read_epoch(listed, 0)] == [data[n] for n in ["c.rec", "a.rec", "b.rec", "c.rec"]]
    assert resolve(str(root / "**" / "*.rec")).paths == resolve(str(root)).paths  # recursive glob, sorted


def test_existing_path_with_glob_characters_is_literal(tmp_path):
    write_rec(tmp_path / "x[1].rec", [b"literal"])
    write_rec(tmp_path / "x1.rec", [b"glob match"])
    assert resolve(str(tmp_path / "x[1].rec")).paths == (str(tmp_path / "x[1].rec"),)


@pytest.mark.parametrize("bad, words", [
    ("missing.rec", ["missing.rec", "SageMaker"]),  # a bare name: also tried as a channel
    ("nowhere/missing.rec", ["no such file", "nowhere/missing.rec"]),
    ("nowhere/*.rec", ["nowhere/*.rec", "matches no file"]),
])
def test_missing_paths_name_what_was_looked_for(tmp_path, monkeypatch, bad, words):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SM_INPUT_DIR", str(tmp_path / "no-sagemaker"))
    with pytest.raises(SourceError) as info:
        resolve(bad)
    for word in words:
        assert word in str(info.value)


def test_empty_directory_and_list_errors(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "x.idx").write_text("")
    with pytest.raises(SourceError, match=r"has no RecordIO files \(looked for \*\.rec"):
        resolve(str(tmp_path / "empty"))
    with pytest.raises(SourceError, match="empty channel list"):
        resolve([])
    with pytest.raises(SourceError, match="unsupported channel 42"):
        resolve(42)
    with pytest.raises(SourceError, match="expected a path"):
        resolve([str(tmp_path / "empty" / "x.idx"), 3])


def test_file_vanished_after_resolve_is_a_source_error(tmp_path):
    write_rec(tmp_path / "gone.rec", [b"x"])
    source = resolve(str(tmp_path / "gone.rec"))
    os.unlink(tmp_path / "gone.rec")
    with pytest.raises(SourceError, match="cannot open .*gone.rec"):
        read_epoch(source, 0)


def test_source_passthrough_pickle_and_repr(recs):
    root, _ = recs
    source = resolve(str(root))
    assert resolve(source) is source
    clone = pickle.loads(pickle.dumps(source))
    assert clone.paths == source.paths and isinstance(clone, Source)
    assert "files" in repr(source)
    with pytest.raises(SourceError, match="epoch must be >= 0"):
        next(source.streams(-1))


def test_fifo_path_is_opened_by_the_reader_only(tmp_path):
    fifo = tmp_path / "in.fifo"
    os.mkfifo(fifo)
    payload = write_rec(tmp_path / "src.rec", make_payloads(50, seed=9))
    source = resolve(str(fifo))  # resolving does not open (it would block: no writer yet)
    assert source.paths == (str(fifo),)

    def writer():
        with open(fifo, "wb") as f:
            for i in range(0, len(payload), 100):
                f.write(payload[i:i + 100])
                f.flush()

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        [(name, data)] = read_epoch(source, 0)
    finally:
        thread.join(10)
        os.unlink(fifo)
    assert name == str(fifo) and data == payload


@pytest.mark.parametrize("workers", [0, 1])
def test_a_relative_path_is_the_file_it_named_when_the_reader_was_made(tmp_path, monkeypatch, workers):
    """Each pass opened the path by name, relative to the directory of that moment: after an
    os.chdir a reader silently read another directory's file of the same name."""
    from parrecio import ParallelReader, RecordWriter
    for run in ("run1", "run2"):
        (tmp_path / run).mkdir()
        with RecordWriter(str(tmp_path / run / "data.rec")) as w:
            for i in range(5):
                w.write(b"%s %d" % (run.encode(), i))
    monkeypatch.chdir(tmp_path / "run1")
    with ParallelReader("data.rec", workers=workers) as r:
        first = list(r)
        os.chdir(tmp_path / "run2")
        second = list(r)
    assert first == second == [b"run1 %d" % i for i in range(5)]
    assert r.state_dict()["source"] == "data.rec"  # (its name stays the one given: a state resumes elsewhere)


def test_symlink_loops_and_links_back_up_list_each_file_once(tmp_path):
    """A looping file symlink in a directory was a bare OSError (ELOOP) out of the listing; a glob
    ``**/*.rec`` over a tree with a link back up (``up -> ..``) listed each file 41 times, and a recursive
    walk (a SageMaker File-mode channel) went round such a loop."""
    from parrecio.sources.files import expand_patterns, list_recordio_files
    root = tmp_path / "data"
    (root / "sub").mkdir(parents=True)
    (root / "a.rec").write_bytes(b"")
    (root / "sub" / "b.rec").write_bytes(b"")
    os.symlink("y.rec", root / "x.rec")
    os.symlink("x.rec", root / "y.rec")                   # x -> y -> x: a loop, skipped as a dangling link
    assert list_recordio_files(str(root)) == [str(root / "a.rec")]
    os.unlink(root / "x.rec")                             # (a glob that matches a broken link names it)
    os.unlink(root / "y.rec")
    os.symlink("..", root / "sub" / "up")                 # back up
    assert expand_patterns([str(root / "**" / "*.rec")]) == [str(root / "a.rec"), str(root / "sub" / "b.rec")]
    assert expand_patterns([str(root / "a.rec"), str(root / "a.rec")]) == [str(root / "a.rec")] * 2  # as given
    # (Python's glob follows every link under **: two ways round, as below, make 2**40 paths, which no
    # dedupe afterwards helps -- the walk of a directory, recursive, takes each directory once)
    os.symlink(str(root / "sub"), root / "again")         # the same directory twice
    assert list_recordio_files(str(root), recursive=True) == [str(root / "a.rec"), str(root / "again" / "b.rec")]


@pytest.mark.parametrize("workers", [0, 1])
def test_dotdot_after_a_linked_folder_is_the_kernels_dotdot(tmp_path, monkeypatch, workers):
    """``data/../train.rec`` where ``data`` links to ``storage/sets/imagenet``: open() reads
    storage/sets/train.rec, and the reader read ./train.rec (os.path.abspath drops ``x/..`` as text): a
    silently other file (audit)."""
    from parrecio import ParallelReader, RecordWriter
    for where, what in (("storage/sets", b"REAL"), (".", b"WRONG")):
        os.makedirs(tmp_path / where, exist_ok=True)
        with RecordWriter(str(tmp_path / where / "train.rec")) as w:
            w.write(what)
    (tmp_path / "storage" / "sets" / "imagenet").mkdir()
    os.symlink(tmp_path / "storage" / "sets" / "imagenet", tmp_path / "data")
    monkeypatch.chdir(tmp_path)
    with ParallelReader("data/../train.rec", workers=workers) as r, \
            ParallelReader(["./data/../train.rec"], workers=workers) as listed:
        assert list(r) == list(listed) == [b"REAL"]


def test_a_glob_over_a_link_back_up_skips_matches_too_deep_to_resolve(tmp_path):
    """With ``s/up -> ..`` and a file link ``z.rec -> a.rec``, ``**/*.rec`` matched
    ``s/up/s/up/.../z.rec`` some 40 links deep, which the kernel does not resolve (ELOOP): a SourceError
    where the README says a glob names each file once (audit).  And a glob of a list that matched only
    empty folders was passed over when an earlier item had files."""
    from parrecio.sources.files import expand_patterns
    root = tmp_path / "t"
    (root / "s").mkdir(parents=True)
    for name in ("a.rec", "s/b.rec"):
        (root / name).write_bytes(b"")
    os.symlink("..", root / "s" / "up")
    os.symlink("a.rec", root / "z.rec")
    assert expand_patterns([str(root / "**" / "*.rec")]) == [str(root / "a.rec"), str(root / "s" / "b.rec")]
    (root / "val-1").mkdir()
    with pytest.raises(SourceError, match=r"glob pattern '.*val-\*' matches only directories without files"):
        expand_patterns([str(root / "a.rec"), str(root / "val-*")])


def test_a_path_this_user_cannot_search_says_permission_denied(tmp_path, monkeypatch):
    """Run as a user who may not search a folder on the path, lexists() is False: the error said 'no such
    file or directory' (audit, as nobody).  Root may search any folder: the denial is stood in for."""
    from parrecio.sources.files import expand_patterns
    target = str(tmp_path / "nodir" / "x.rec")
    real = os.lstat

    def lstat(path, *a, **kw):
        if os.fspath(path) == target:
            raise PermissionError(13, "Permission denied", target)
        return real(path, *a, **kw)
    monkeypatch.setattr(os, "lstat", lstat)
    with pytest.raises(SourceError, match=r"cannot use '.*nodir/x\.rec': Permission denied \(a folder on its "
                                          r"path cannot be searched by this user\)"):
        expand_patterns([target])
