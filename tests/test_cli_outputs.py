"""Where the ``parrecio`` command line writes, and what it does when that goes wrong.

- ``pack`` into an output that is no regular file -- a FIFO, a character device (a copy of ``/dev/null``
  or ``/dev/full``), a link to ``/proc/self/fd/1`` as ``/dev/stdout`` is -- writes into it, leaving the
  node where it is (a temporary file renamed over it would replace the node), and writes no ``.idx`` or
  ``.lst`` beside it;
- ``pack`` refuses an output that is one of its inputs, before anything is written;
- ``pack`` into the file stderr is open on writes no log line among the records;
- ``pack images`` walks each folder once, whatever symbolic links lead back up;
- a write error on stdout: a closed pipe exits quietly (status 0), any other error is one line, status 1;
- SIGTERM stops a ``pack`` or a ``demo`` as Ctrl-C does: its temporary output is removed.

The device nodes these tests write into are made in a temporary folder (``os.mknod``, root only), never
the system's ``/dev`` nodes.  Each test runs ``python -m parrecio.cli`` in a subprocess.
"""

from __future__ import annotations

import glob
import os
import select
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np
import pytest

import parrecio
from image_helpers import jpeg, png
from pipeline_helpers import wait_until
from parrecio.recordio import RecordReader, RecordWriter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(parrecio.__file__)))
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def env(unbuffered: bool = True) -> Dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = ROOT + os.pathsep + e.get("PYTHONPATH", "")
    e.pop("PYTHONUNBUFFERED", None)
    if unbuffered:
        e["PYTHONUNBUFFERED"] = "1"
    return e


def argv(*args) -> List[str]:
    return [sys.executable, "-m", "parrecio.cli", *map(str, args)]


def cli(*args, cwd=None, stdout=subprocess.PIPE, unbuffered: bool = True, timeout: float = 120):
    """Run ``parrecio ARGS`` (not checked); stdout (unless redirected) and stderr as bytes."""
    return subprocess.run(argv(*args), stdout=stdout, stderr=subprocess.PIPE, env=env(unbuffered), cwd=cwd,
                          timeout=timeout)


def one_line(proc) -> str:
    """stderr of a run, which must be one line and no traceback."""
    err = proc.stderr.decode()
    assert "Traceback" not in err and err.count("\n") == 1, err
    return err.rstrip("\n")


def snapshot(folder: Path) -> Dict[str, Tuple[int, bytes]]:
    """Every entry under ``folder`` (hidden ones too) -> (its file type, its bytes when a regular file)."""
    out = {}
    for p in sorted(folder.rglob("*")):
        mode = os.lstat(p).st_mode
        out[str(p.relative_to(folder))] = (stat.S_IFMT(mode), p.read_bytes() if stat.S_ISREG(mode) else b"")
    return out


def mknod(path: Path, major: int, minor: int) -> Path:
    """A character device node like /dev/null (1, 3) or /dev/full (1, 7), made in a test folder."""
    if not IS_ROOT:
        pytest.skip("making a device node needs root")
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(major, minor))
    except OSError as exc:  # (a container without CAP_MKNOD)
        pytest.skip(f"cannot make a device node here: {exc}")
    return path


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """``a.bin`` and a manifest over it; ``photos/cat/1.jpg``, ``photos/dog/2.png``; ``x.npy``."""
    (tmp_path / "a.bin").write_bytes(b"hello, records" * 1000)
    (tmp_path / "m.manifest").write_text('{"source-ref": "a.bin", "label": 1}\n'
                                         '{"source-ref": "a.bin", "label": 2}\n')
    (tmp_path / "photos" / "cat").mkdir(parents=True)
    (tmp_path / "photos" / "dog").mkdir()
    (tmp_path / "photos" / "cat" / "1.jpg").write_bytes(jpeg(48, 32, seed=1))
    (tmp_path / "photos" / "dog" / "2.png").write_bytes(png(40, 30, seed=2))
    np.save(tmp_path / "x.npy", np.arange(12, dtype=np.float32).reshape(4, 3))
    return tmp_path


PACKS = {  # kind -> arguments before OUT, after OUT
    "manifest": (["pack", "manifest", "m.manifest"], ["--attribute-names", "source-ref,label"]),
    "images": (["pack", "images", "photos"], []),
    "protobuf": (["pack", "protobuf", "x.npy"], []),
}


def pack_args(kind: str, out) -> List[str]:
    before, after = PACKS[kind]
    return [*before, str(out), *after]


def reference(work: Path, kind: str) -> bytes:
    """What ``pack KIND`` writes into a regular file."""
    ref = work / "ref" / "ref.rec"
    ref.parent.mkdir(exist_ok=True)
    proc = cli(*pack_args(kind, ref), "--quiet", cwd=work)
    assert proc.returncode == 0, proc.stderr
    return ref.read_bytes()


def drain_fifo(fifo: Path, args: List[str], cwd: Path, timeout: float = 30) -> Tuple[subprocess.CompletedProcess,
                                                                                    bytes]:
    """Run ``parrecio ARGS`` while reading ``fifo`` to its end (opened before, without blocking: a run
    that never opens the FIFO cannot hang the test)."""
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    got = bytearray()
    proc = subprocess.Popen(argv(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env(), cwd=cwd)
    try:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            select.select([fd], [], [], 0.05)
            try:
                chunk = os.read(fd, 1 << 20)
            except BlockingIOError:  # a writer is there, nothing written yet
                continue
            if chunk:
                got += chunk
            elif proc.poll() is not None:  # no writer (yet, or any more): done once the run has ended
                break
            else:
                time.sleep(0.01)
        out, err = proc.communicate(timeout=timeout)
    finally:
        os.close(fd)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), bytes(got)


# -- 1. pack into a FIFO, a device, stdout ---------------------------------------------------------------

@pytest.mark.parametrize("kind", sorted(PACKS))
def test_pack_writes_into_a_fifo_byte_for_byte(work: Path, kind: str):
    """The FIFO gets what a file would hold, stays a FIFO, and nothing is written beside it (an .idx or
    .lst indexes a file that can be read again, which a FIFO's stream is not)."""
    want = reference(work, kind)
    (work / "out").mkdir()
    fifo = work / "out" / "train.rec"
    os.mkfifo(fifo)
    proc, got = drain_fifo(fifo, pack_args(kind, fifo), work)
    assert proc.returncode == 0, proc.stderr
    assert got == want
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert sorted(os.listdir(work / "out")) == ["train.rec"]  # no .idx, .lst, or temporary file
    err = proc.stderr.decode()
    if kind != "manifest":  # (a manifest's stream has no .idx anyway)
        beside = ".idx or .lst" if kind == "images" else ".idx"
        assert err.splitlines()[-2] == f"pack: {fifo} is a FIFO: the records were written into it, and no {beside}"
    assert err.endswith(f"bytes: {fifo}\n")


@pytest.mark.parametrize("kind", sorted(PACKS))
def test_pack_into_a_null_device_leaves_the_device(work: Path, kind: str):
    """A copy of /dev/null as OUT: the run succeeds (a dry run: pack images still lists what it leaves
    out), the node stays a character device, and no .idx/.lst appears beside it."""
    (work / "dev").mkdir()
    null = mknod(work / "dev" / "null", 1, 3)
    proc = cli(*pack_args(kind, null), cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert stat.S_ISCHR(os.lstat(null).st_mode) and os.stat(null).st_rdev == os.makedev(1, 3)
    assert sorted(os.listdir(work / "dev")) == ["null"]


def test_pack_into_a_full_device_fails_in_one_line(work: Path):
    """A copy of /dev/full: ENOSPC said in one line, exit 1, the node left as it was."""
    (work / "dev").mkdir()
    full = mknod(work / "dev" / "full", 1, 7)
    proc = cli(*pack_args("manifest", full), cwd=work)
    assert proc.returncode == 1
    assert one_line(proc) == f"parrecio pack: error: {full}: No space left on device"
    assert stat.S_ISCHR(os.lstat(full).st_mode)
    assert sorted(os.listdir(work / "dev")) == ["full"]


@pytest.mark.parametrize("target", ["/proc/self/fd/1", "/dev/fd/1"])
@pytest.mark.parametrize("kind", sorted(PACKS))
def test_pack_into_a_link_to_its_stdout_writes_stdout(work: Path, kind: str, target: str):
    """OUT a link to /proc/self/fd/1 (what /dev/stdout is) or /dev/fd/1: the bytes come out on stdout
    (here a pipe) and the link stays a link."""
    want = reference(work, kind)
    (work / "out").mkdir()
    link = work / "out" / "stdout"
    os.symlink(target, link)
    proc = cli(*pack_args(kind, link), cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == want
    assert os.readlink(link) == target
    assert sorted(os.listdir(work / "out")) == ["stdout"]


def test_pack_into_dev_stdout_redirected_to_a_file_writes_through_the_redirection(work: Path):
    """``pack ... /dev/stdout >> log``: stdout is a regular file opened for appending; the records go
    after what it held (the shell's open file is written, not a new one made or truncated), and the link
    is not replaced by a regular file (as root, a rename over /dev/stdout would replace the system's)."""
    want = reference(work, "manifest")
    (work / "out").mkdir()
    link = work / "out" / "stdout"
    os.symlink("/proc/self/fd/1", link)
    log = work / "log"
    log.write_bytes(b"earlier lines\n")
    with open(log, "ab") as f:
        proc = cli(*pack_args("manifest", link), cwd=work, stdout=f)
    assert proc.returncode == 0, proc.stderr
    assert log.read_bytes() == b"earlier lines\n" + want
    assert os.readlink(link) == "/proc/self/fd/1"
    assert sorted(os.listdir(work / "out")) == ["stdout"]


@pytest.mark.parametrize("kind", sorted(PACKS))
def test_pack_into_its_own_stderr_keeps_its_log_lines_out_of_the_records(work: Path, kind: str):
    """``pack ... /dev/stderr 2> out.rec`` (here a link to /proc/self/fd/2): the records are the whole
    file -- pack's log lines (and progress bar) would land in it, so it writes none.  They were mixed in."""
    want = reference(work, kind)
    link = work / "stderr-link"
    os.symlink("/proc/self/fd/2", link)
    out = work / "out.rec"
    with open(out, "wb") as f:
        proc = subprocess.run(argv(*pack_args(kind, link)), stdout=subprocess.PIPE, stderr=f, env=env(), cwd=work,
                              timeout=120)
    assert proc.returncode == 0 and proc.stdout == b""
    assert out.read_bytes() == want


def test_pack_to_stdout_shared_with_stderr_keeps_its_log_lines_out_of_the_records(work: Path):
    """``pack manifest M - > out.rec 2>&1``: stdout and stderr are one file, so no log line is written
    into the stream; with stderr elsewhere the summary line is still there."""
    want = reference(work, "manifest")
    out = work / "out.rec"
    with open(out, "wb") as f:
        proc = subprocess.run(argv(*pack_args("manifest", "-")), stdout=f, stderr=subprocess.STDOUT, env=env(),
                              cwd=work, timeout=120)
    assert proc.returncode == 0
    assert out.read_bytes() == want
    with open(out, "wb") as f:
        proc = cli(*pack_args("manifest", "-"), cwd=work, stdout=f)
    assert proc.returncode == 0 and out.read_bytes() == want
    assert proc.stderr.decode().startswith("pack: "), proc.stderr


def test_pack_refuses_a_folder_as_output_before_writing(work: Path):
    (work / "out.rec").mkdir()
    before = snapshot(work)
    proc = cli(*pack_args("manifest", "out.rec"), cwd=work)
    assert proc.returncode == 1
    assert one_line(proc) == "parrecio pack: error: out.rec: is a folder; give an output file name"
    assert snapshot(work) == before


def _sigterm_once(proc: subprocess.Popen, ready, what: str, timeout: float) -> bytes:
    """Once ``ready()``, SIGTERM to ``proc``; its stderr when it has ended (killed if it does not)."""
    try:
        wait_until(ready, timeout=timeout, what=what)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return err


def test_sigterm_stops_a_pack_waiting_for_its_fifo_reader(work: Path):
    """A FIFO nobody reads: pack waits in open(); SIGTERM ends it as Ctrl-C does, the FIFO left."""
    fifo = work / "train.rec"
    os.mkfifo(fifo)
    proc = subprocess.Popen(argv(*pack_args("manifest", fifo)), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env(), cwd=work)
    err = _sigterm_once(proc, lambda: _blocked_in_open(proc.pid) or proc.poll() is not None,
                        "pack to wait in the FIFO's open", 30)
    assert proc.returncode == 130 and err == b"parrecio pack: interrupted\n"
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert not glob.glob(str(work / ".train.rec.tmp-*"))


def _blocked_in_open(pid: int) -> bool:
    """Whether the process sleeps in a FIFO's open (its wchan names the FIFO's wait)."""
    try:
        with open(f"/proc/{pid}/wchan") as f:
            wchan = f.read()
        return wchan == "wait_for_partner" or "fifo" in wchan
    except OSError:
        return False


# -- 2. an output that is its own input ---------------------------------------------------------------

@pytest.mark.parametrize("args, shown, message", [
    (["pack", "manifest", "m.manifest", "m.manifest", "--attribute-names", "source-ref,label"], "m.manifest",
     "the records would replace the manifest being read"),
    (["pack", "manifest", "link.manifest", "m.manifest", "--attribute-names", "source-ref,label"],
     "m.manifest", "the records would replace the manifest being read (link.manifest)"),
    (["pack", "manifest", "m.manifest", "a.bin", "--attribute-names", "source-ref,label"], "a.bin",
     "the records would replace the referenced file being read ({work}/a.bin)"),  # (it was replaced: an audit)
    (["pack", "manifest", "m.manifest", "./a.bin", "--attribute-names", "source-ref,label"], "./a.bin",
     "the records would replace the referenced file being read ({work}/a.bin)"),
    (["pack", "list", "photos/a.lst", "photos/a.lst"], "photos/a.lst", "the records would replace the list being read"),
    (["pack", "list", "photos/a.lst", "photos/cat/1.jpg"], "photos/cat/1.jpg",
     "the records would replace the image being read"),
    (["pack", "protobuf", "x.npy", "x.npy"], "x.npy", "the records would replace the features being read"),
    (["pack", "protobuf", "x.npy", "x.rec", "--labels", "x.idx"], "x.idx",
     "the index would replace the labels being read"),
])
def test_pack_refuses_an_output_that_is_its_input(work: Path, args: List[str], shown: str, message: str):
    """Refused before anything is written: the input and everything beside it stay as they were."""
    (work / "photos" / "a.lst").write_text("0\t1\tcat/1.jpg\n")
    np.save(work / "x.idx.npy", np.zeros(4, np.float32))
    os.rename(work / "x.idx.npy", work / "x.idx")  # (a labels file with an unlucky name)
    os.symlink("m.manifest", work / "link.manifest")
    before = snapshot(work)
    proc = cli(*args, cwd=work)
    assert proc.returncode == 1
    message = message.format(work=work)
    assert one_line(proc) == f"parrecio pack: error: {shown}: {message}; give another output file"
    assert snapshot(work) == before


# -- 3. pack images and links back up --------------------------------------------------------------------

@pytest.mark.parametrize("ups", [1, 2])
def test_pack_images_walks_each_folder_once(work: Path, ups: int):
    """Links back up (``up -> ..``: two of them made the walk exponential, a hang) and a second way into a
    folder (``cat/dogs -> ../dog``): each folder is walked once, under the name its parent folder listed
    first (``dog`` at the top, so its images stay class dog), each image packed once."""
    photos = work / "photos"
    for i in range(ups):
        os.symlink("..", photos / "cat" / f"up{i}")
    os.symlink("../dog", photos / "cat" / "dogs")
    proc = cli("pack", "images", photos, work / "o.rec", cwd=work, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert (work / "o.lst").read_text() == "0\t0.000000\tcat/1.jpg\n1\t1.000000\tdog/2.png\n"
    with RecordReader(str(work / "o.rec")) as reader:
        assert len(list(reader)) == 2
    assert b"2 classes (0=cat, 1=dog)" in proc.stderr


def test_class_folders_that_are_one_folder_stay_classes(work: Path):
    """Two class folders that are links to one folder (or bind mounts of one) are two classes, as im2rec
    has them; de-duplicating folders at the top level too dropped the second, and every later class's
    label moved down by one."""
    shared = work / "shared"
    shared.mkdir()
    (shared / "x.png").write_bytes(png(40, 30, seed=3))
    os.symlink(shared, work / "photos" / "a_cat")
    os.symlink(shared, work / "photos" / "b_kitten")
    proc = cli("pack", "images", work / "photos", work / "o.rec", cwd=work, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert (work / "o.lst").read_text() == ("0\t0.000000\ta_cat/x.png\n1\t1.000000\tb_kitten/x.png\n"
                                            "2\t2.000000\tcat/1.jpg\n3\t3.000000\tdog/2.png\n")


@pytest.mark.parametrize("kind", ["manifest", "images"])
def test_pack_into_a_link_to_its_stdout_whose_reader_has_gone(work: Path, kind: str):
    """``pack ... /dev/stdout | head -c0`` (here a link to /proc/self/fd/1): a quiet exit 0, as with ``-``;
    a small manifest's records (under the write buffer) failed only at the close, and said
    'error: /dev/stdout: Broken pipe', status 1."""
    out = work / "out-link"
    os.symlink("/proc/self/fd/1", out)
    (work / "b.bin").write_bytes(b"tiny")  # records under the write buffer: written out only at the close
    (work / "small.manifest").write_text('{"source-ref": "b.bin", "label": 1}\n')
    args = (["pack", "manifest", work / "small.manifest", out, "--attribute-names", "source-ref,label"]
            if kind == "manifest" else ["pack", "images", work / "photos", out])
    r, w = os.pipe()
    os.close(r)
    try:
        proc = cli(*args, stdout=w, cwd=work)
    finally:
        os.close(w)
    err = proc.stderr.decode()
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "Broken pipe" not in err, err
    assert os.path.islink(out)


# -- 4. write errors on stdout ---------------------------------------------------------------------------

REC_COMMANDS = {
    "cat": ["cat", "{rec}", "--format", "hex"],
    "cat-raw": ["cat", "{rec}"],
    "inspect": ["inspect", "{rec}"],
    "inspect-json": ["inspect", "{rec}", "--json"],
    "extract": ["extract", "{rec}", "--index", "0"],
    "bench": ["bench", "{rec}", "--workers", "0", "--fields", "raw", "--json"],
    "demo": ["demo", "--samples", "8", "--workers", "0", "--size", "32"],
    "pack": ["pack", "manifest", "{manifest}", "-", "--attribute-names", "source-ref,label", "--quiet"],
}


@pytest.fixture
def small_rec(work: Path) -> Dict[str, str]:
    rec = work / "small.rec"
    with RecordWriter(str(rec)) as w:
        for i in range(10):
            w.write(b"x" * 16 + bytes([i]))
    return {"rec": str(rec), "manifest": str(work / "m.manifest")}


def _args(name: str, paths: Dict[str, str]) -> List[str]:
    return [a.format(**paths) for a in REC_COMMANDS[name]]


@pytest.mark.parametrize("unbuffered", [True, False], ids=["unbuffered", "buffered"])
@pytest.mark.parametrize("name", sorted(REC_COMMANDS))
def test_a_closed_stdout_pipe_ends_a_command_quietly(small_rec, name: str, unbuffered: bool):
    """``parrecio ... | head -c0``: exit status 0 and nothing on stderr but what the command says anyway
    (no traceback, no 'Exception ignored' at exit), buffered (a pipe) or not (PYTHONUNBUFFERED)."""
    r, w = os.pipe()
    os.close(r)
    try:
        proc = cli(*_args(name, small_rec), stdout=w, unbuffered=unbuffered)
    finally:
        os.close(w)
    err = proc.stderr.decode()
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "Exception ignored" not in err and "Broken pipe" not in err, err


@pytest.mark.parametrize("unbuffered", [True, False], ids=["unbuffered", "buffered"])
@pytest.mark.parametrize("name", sorted(REC_COMMANDS))
def test_a_full_stdout_is_one_error_line(small_rec, tmp_path: Path, name: str, unbuffered: bool):
    """stdout on a copy of /dev/full (ENOSPC, as a full disk): 'parrecio CMD: error: stdout: No space left
    on device', exit status 1, nothing else on stderr."""
    full = mknod(tmp_path / "full", 1, 7)
    with open(full, "wb") as f:
        proc = cli(*_args(name, small_rec), stdout=f, unbuffered=unbuffered)
    assert proc.returncode == 1, proc.stderr
    command = REC_COMMANDS[name][0]
    assert one_line(proc) == f"parrecio {command}: error: stdout: No space left on device"


@pytest.mark.parametrize("name", ["cat", "inspect", "extract", "pack"])
def test_a_closed_stdout_is_one_error_line(small_rec, work: Path, name: str):
    """Started with stdout closed (``>&-``): a command that writes stdout says so in one line, exit status 1
    (it used to be an AttributeError traceback on ``None``); one that does not write it runs as ever."""
    proc = subprocess.run(argv(*_args(name, small_rec)), stderr=subprocess.PIPE, env=env(),
                          preexec_fn=lambda: os.close(1), timeout=120)
    assert proc.returncode == 1
    assert one_line(proc) == f"parrecio {name}: error: stdout: Bad file descriptor (stdout is closed)"
    proc = subprocess.run(argv(*pack_args("manifest", "o.rec"), "--quiet"), stderr=subprocess.PIPE, env=env(),
                          cwd=work, preexec_fn=lambda: os.close(1), timeout=120)
    assert proc.returncode == 0 and proc.stderr == b""
    assert (work / "o.rec").read_bytes() == reference(work, "manifest")


# -- 5. SIGTERM --------------------------------------------------------------------------------------------

def test_sigterm_stops_pack_as_ctrl_c_does(work: Path):
    """SIGTERM (``timeout``, ``kill``, a container stop) mid-pack: exit status 130, 'interrupted', the
    temporary output removed, the earlier OUT as it was."""
    (work / "big.bin").write_bytes(os.urandom(4 << 20))
    (work / "big.manifest").write_text('{"source-ref": "big.bin"}\n' * 20)
    (work / "out.rec").write_bytes(b"earlier output")
    proc = subprocess.Popen(argv("pack", "manifest", "big.manifest", "out.rec", "--attribute-names", "source-ref",
                                 "--split-bytes", "3"), stderr=subprocess.PIPE, env=env(), cwd=work)

    def grown() -> Optional[str]:
        tmp = glob.glob(str(work / ".out.rec.tmp-*"))
        return tmp[0] if tmp and os.path.getsize(tmp[0]) > 1 << 20 else None
    err = _sigterm_once(proc, grown, "the temporary output to grow", 60)
    assert proc.returncode == 130
    assert err.decode().endswith("parrecio pack: interrupted\n") and "Traceback" not in err.decode()
    assert not glob.glob(str(work / ".out.rec.tmp-*"))
    assert (work / "out.rec").read_bytes() == b"earlier output"


@pytest.mark.parametrize("group", [False, True], ids=["the-process", "its-process-group"])
def test_sigterm_stops_a_demo_and_removes_its_temporary_stream(tmp_path: Path, group: bool):
    """SIGTERM while the demo's pipeline runs ends it as Ctrl-C does: its temporary stream is removed, and
    no process or shared-memory segment of it is left -- sent to the demo alone, or to its whole process
    group (a container stop, ``timeout``), which kills the reader's processes too."""
    from parrecio.pipeline.shm import leftover
    from pipeline_helpers import our_children
    temp = tmp_path / "tmp"
    temp.mkdir()
    e = env()
    e["TMPDIR"] = str(temp)
    proc = subprocess.Popen(argv("demo", "--samples", 3000, "--workers", 1, "--batch-size", 8, "--size", 64),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=e, start_new_session=True)
    streams = lambda: glob.glob(str(temp / "parrecio-demo-*" / "demo.*"))  # noqa: E731
    running = lambda: proc.poll() is not None or any(  # noqa: E731
        f"parrecio-{proc.pid}-" in name for name in leftover(f"parrecio-{proc.pid}-"))
    try:
        wait_until(running, timeout=120, what="the demo's pipeline to start")
        assert proc.poll() is None and len(streams()) == 2  # demo.rec and demo.idx, while it decodes
        if group:
            os.killpg(proc.pid, signal.SIGTERM)
        else:
            proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130 and err.endswith(b"parrecio demo: interrupted\n"), (proc.returncode, err)
    assert os.listdir(temp) == []  # (it was left behind before)
    wait_until(lambda: not leftover(f"parrecio-{proc.pid}-") and not our_children(), timeout=10,
               what="the demo's segments and processes to be gone")
