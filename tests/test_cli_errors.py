"""The ``parrecio`` command line on user mistakes and damaged input: one-line errors (exit 1) or argparse's
usage errors (exit 2), never a traceback; a failed ``pack`` leaves the files it would have replaced as they
were and no temporary files; a RecordIO file with a damaged start is not called "not a RecordIO stream".

Each test runs ``python -m parrecio.cli`` in a subprocess with the ``parrecio`` this process imported, so
the same tests can be pointed at another copy of the code with ``PYTHONPATH``.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import numpy as np
import pytest

import parrecio
from image_helpers import png
from recordio_helpers import frame
from parrecio.errors import SourceError
from parrecio.recordio.framing import MAGIC_BYTES
from parrecio.recordio import IndexedRecordReader, RecordReader, unpack

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(parrecio.__file__)))
MAGIC_ERROR = "bad magic 0x{:08X} (expected 0xCED7230A)"


def cli(*args, cwd=None) -> subprocess.CompletedProcess:
    """Run ``parrecio ARGS`` (never checked: these tests look at failures); stdout/stderr as bytes."""
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "parrecio.cli", *map(str, args)], capture_output=True,
                          env=env, cwd=cwd, timeout=120)


def error_line(proc: subprocess.CompletedProcess) -> str:
    """stderr of a failed run, which must be one line and no traceback."""
    err = proc.stderr.decode()
    assert "Traceback" not in err and err.count("\n") == 1, err
    return err.rstrip("\n")


def snapshot(folder: Path) -> Dict[str, bytes]:
    """Every file under ``folder`` (hidden temporary files included) -> its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def images(tmp_path: Path) -> Path:
    """``tmp_path/imgs/a/1.png``: one class of one image."""
    (tmp_path / "imgs" / "a").mkdir(parents=True)
    (tmp_path / "imgs" / "a" / "1.png").write_bytes(png(16, 16, seed=1))
    return tmp_path / "imgs"


# -- pack protobuf: atomic, like the other packs ------------------------------------------------------

def test_pack_protobuf_that_fails_partway_leaves_the_old_outputs_as_they_were(tmp_path: Path):
    """The last row cannot be an Int32Tensor: the error comes after 999 rows were written, into temporary
    files that are removed; the .rec and .idx of an earlier run stay byte for byte."""
    from parrecio.recordio.protobuf_writer import write_dense
    rows = np.zeros((1000, 3), np.int64)
    rows[-1, 0] = 2 ** 40
    np.save(tmp_path / "x.npy", rows)
    (tmp_path / "o.rec").write_bytes(b"PRECIOUS records")
    (tmp_path / "o.idx").write_bytes(b"0\t0\n")
    before = snapshot(tmp_path)
    proc = cli("pack", "protobuf", "x.npy", "o.rec", cwd=tmp_path)
    assert proc.returncode == 1
    assert error_line(proc) == "parrecio pack: error: x.npy: a value out of the int32 range for an Int32Tensor"
    assert snapshot(tmp_path) == before  # (no .o.rec.tmp-PID either)

    # Labels at fault: the error names the labels' file, not the features' (it named x.npy for all).
    rows[-1, 0] = 7
    np.save(tmp_path / "x.npy", rows)
    for labels, why in ((np.array([True] * 1000), "labels: unsupported dtype bool"),
                        (np.zeros((1000, 1)), "labels must be a vector"),
                        (np.zeros(999), "999 labels for 1000 rows"),
                        (np.full(1000, 2 ** 40), "labels: a value out of the int32 range for an Int32Tensor")):
        np.save(tmp_path / "y.npy", labels)
        line = error_line(cli("pack", "protobuf", "x.npy", "o.rec", "--labels", "y.npy", cwd=tmp_path))
        assert line.startswith(f"parrecio pack: error: y.npy: {why}"), line
    (tmp_path / "y.npy").unlink()
    assert {k: v for k, v in snapshot(tmp_path).items() if k != "x.npy"} == \
        {k: v for k, v in before.items() if k != "x.npy"}

    # A run that succeeds replaces both, with what write_dense writes, and leaves nothing else behind.
    rows[-1, 0] = 7
    np.save(tmp_path / "x.npy", rows)
    assert cli("pack", "protobuf", "x.npy", "o.rec", "--quiet", cwd=tmp_path).returncode == 0
    write_dense(str(tmp_path / "want.rec"), rows, index=str(tmp_path / "want.idx"))
    after = snapshot(tmp_path)
    assert sorted(after) == ["o.idx", "o.rec", "want.idx", "want.rec", "x.npy"]
    assert after["o.rec"] == after["want.rec"] and after["o.idx"] == after["want.idx"]


# -- pack: an output that is its own .idx or .lst ---------------------------------------------------------

@pytest.mark.parametrize("kind, out, other", [
    ("protobuf", "o.idx", "index"),
    ("images", "p.lst", "list"),
    ("images", "x.idx", "index"),
    ("list", "y.idx", "index"),
])
def test_pack_refuses_an_output_named_like_its_own_index_or_list(tmp_path: Path, images: Path, kind: str,
                                                                 out: str, other: str):
    """Records and index (or list) would be one file: refused before anything is written, an existing file
    of that name kept."""
    np.save(tmp_path / "x.npy", np.zeros((2, 3), np.float32))
    (images / "a.lst").write_text("0\t1\ta/1.png\n")
    source = {"protobuf": "x.npy", "images": "imgs", "list": "imgs/a.lst"}[kind]
    (tmp_path / out).write_bytes(b"kept")
    before = snapshot(tmp_path)
    proc = cli("pack", kind, source, out, cwd=tmp_path)
    assert proc.returncode == 1
    assert error_line(proc) == (f"parrecio pack: error: {out}: the records and the {other} would both be "
                                f"written to this one file; name the output {out[0]}.rec")
    assert snapshot(tmp_path) == before


def test_pack_image_list_refuses_two_outputs_on_one_file(tmp_path: Path, images: Path):
    """The library call: explicit paths that name one file (spelt differently) are refused, by role."""
    from parrecio.tools.pack import ListItem, pack_image_list
    items = [ListItem(0, (1.0,), "a/1.png")]
    (tmp_path / "sub").mkdir()
    rec, idx = str(tmp_path / "a.rec"), str(tmp_path / "sub" / ".." / "a.rec")
    with pytest.raises(SourceError, match=r"a\.rec: the records and the index would both be written to this one "
                                          r"file$"):
        pack_image_list(items, str(images), rec, idx_path=idx)
    with pytest.raises(SourceError, match=r"b\.idx: the index and the list would both be written to this one "
                                          r"file$"):
        pack_image_list(items, str(images), str(tmp_path / "b.rec"), lst_path=str(tmp_path / "b.idx"))
    assert sorted(os.listdir(tmp_path)) == ["imgs", "sub"]


# -- argument values that used to end in a traceback ------------------------------------------------------

@pytest.mark.parametrize("command", [["cat", "--format", "hex"], ["inspect"], ["extract", "--index", "0"]])
@pytest.mark.parametrize("value", ["-1", "0"])
def test_max_record_bytes_below_1_is_a_usage_error(tmp_path: Path, command: List[str], value: str):
    """argparse refuses it (exit 2) in one line, as any bad argument; the reader would take 0, but then every
    non-empty record is "corrupt"."""
    rec = tmp_path / "r.rec"
    rec.write_bytes(frame(b"123456789"))
    proc = cli(command[0], rec, *command[1:], "--max-record-bytes", value)
    err = proc.stderr.decode()
    assert proc.returncode == 2 and "Traceback" not in err
    assert err.splitlines()[-1] == (f"parrecio {command[0]}: error: argument --max-record-bytes: must be at "
                                    f"least 1 byte, not {value}")


def test_max_record_bytes_is_a_whole_number_of_bytes_and_an_inclusive_limit(tmp_path: Path):
    """A record of exactly N bytes is read, one of N + 1 is corrupt; what is no number is a usage error."""
    rec = tmp_path / "r.rec"
    rec.write_bytes(frame(b"123456789"))
    proc = cli("cat", rec, "--max-record-bytes", "9", "--format", "hex")
    assert proc.stdout == b"0\t0\t" + b"123456789".hex().encode() + b"\n"
    proc = cli("cat", rec, "--max-record-bytes", "8", "--format", "hex")
    assert proc.returncode == 1 and "record length 9 bytes exceeds max_record_bytes" in error_line(proc)
    proc = cli("cat", rec, "--max-record-bytes", "x")
    assert proc.returncode == 2 and proc.stderr.decode().splitlines()[-1].endswith(
        "argument --max-record-bytes: expected a number of bytes, not 'x'")
    assert cli("cat", rec, "--max-record-bytes", "0").returncode == 2


@pytest.mark.parametrize("labels, shown", [("1e40", "1e+40"), ("1\t1e40", "1e+40"), ("-3.5e38\t2", "-3.5e+38")])
def test_pack_list_refuses_a_label_beyond_float32(tmp_path: Path, images: Path, labels: str, shown: str):
    """One label (struct.pack's OverflowError) and several (numpy's silent inf) alike: a one-line error
    naming the line, nothing written."""
    lst = images / "l.lst"
    lst.write_text(f"0\t0\ta/1.png\n\n1\t{labels}\ta/1.png\n")
    before = snapshot(tmp_path)
    proc = cli("pack", "list", lst, tmp_path / "o.rec")
    assert proc.returncode == 1
    assert error_line(proc) == (f"parrecio pack: error: {lst} line 3: label {shown} is beyond the float32 "
                                f"range (about +-3.4e38) that labels are stored in")
    assert snapshot(tmp_path) == before


def test_pack_list_takes_float32_extremes_and_uint64_ids(tmp_path: Path, images: Path):
    """The largest float32, inf and the largest id are stored as they are; one past the id range is refused
    with a one-line error naming the line."""
    top = float(np.finfo(np.float32).max)
    lst = images / "l.lst"
    lst.write_text(f"{2 ** 64 - 1}\t{top!r}\ta/1.png\n0\t-inf\t{-top!r}\ta/1.png\n")
    assert cli("pack", "list", lst, tmp_path / "o.rec", "--quiet").returncode == 0
    with IndexedRecordReader(str(tmp_path / "o.rec")) as rec:
        header, _ = unpack(rec[2 ** 64 - 1])
        assert (header.flag, header.label, header.id) == (0, top, 2 ** 64 - 1)
        header, _ = unpack(rec[0])
        assert header.flag == 2 and header.label.tolist() == [-np.inf, -top]
    lst.write_text(f"{2 ** 64}\t1\ta/1.png\n")
    proc = cli("pack", "list", lst, tmp_path / "p.rec")
    assert proc.returncode == 1
    assert error_line(proc) == (f"parrecio pack: error: {lst} line 1: index {2 ** 64} is out of range: a "
                                f"record's id is an unsigned 64-bit number (0 to {2 ** 64 - 1})")
    assert not (tmp_path / "p.rec").exists() and not (tmp_path / "p.idx").exists()


def test_pack_image_list_refuses_items_no_irheader_holds(tmp_path: Path, images: Path):
    """The library call with hand-made items: a SourceError naming the item before anything is written."""
    from parrecio.tools.pack import ListItem, pack_image_list
    out = str(tmp_path / "o.rec")
    for item, why in ((ListItem(0, (1.0, 1e39), "a/1.png"), "label 1e+39 is beyond the float32 range"),
                      (ListItem(-1, (1.0,), "a/1.png"), "index -1 is out of range")):
        with pytest.raises(SourceError) as info:
            pack_image_list([ListItem(1, (0.0,), "a/1.png"), item], str(images), out)
        assert str(info.value).startswith(f"a/1.png: {why}")
    assert sorted(os.listdir(tmp_path)) == ["imgs"]


# -- a damaged start is not "not a RecordIO stream" -------------------------------------------------------

def _damaged(path: Path, payloads: List[bytes], damage) -> bytes:
    """``payloads`` framed by hand into ``path``, then ``damage(bytearray)`` applied; the intact data."""
    data = bytearray(b"".join(frame(p) for p in payloads))
    damage(data)
    path.write_bytes(bytes(data))
    return bytes(data)


def _flip(data: bytearray) -> None:
    data[0] ^= 1  # one bit of the first magic


def _zero_head(data: bytearray) -> None:
    data[:8] = bytes(8)  # the whole first frame head


@pytest.mark.parametrize("size, damage, magic", [
    (10, _flip, 0xCED7230B),           # small records: the next heads are close by
    (100_000, _flip, 0xCED7230B),      # an image-sized first record: found through its length word
    (100_000, _zero_head, 0),          # length word gone too: found in the first MiB
])
@pytest.mark.parametrize("command, hint", [
    (["cat", "--format", "hex"], "--skip-corrupt reads past it"),
    (["extract", "--index", "0"], "--skip-corrupt reads past it when scanning (--all; --index without an .idx, "
                                  "or --no-index)"),
    (["bench", "--workers", "0", "--quiet"], "--skip-errors reads past it"),
])
def test_a_damaged_first_record_is_not_called_non_recordio(tmp_path: Path, size: int, damage, magic: int,
                                                           command: List[str], hint: str):
    """The reader's error with its offset, that records follow and the option that reads past it."""
    rng = np.random.default_rng(size)
    payloads = [rng.bytes(size) for _ in range(4)]
    rec = tmp_path / "d.rec"
    _damaged(rec, payloads, damage)
    proc = cli(command[0], rec, *command[1:])
    assert proc.returncode == 1
    err = proc.stderr.decode()
    assert "Traceback" not in err and "not a RecordIO stream" not in err, err
    assert err.splitlines()[-1] == (f"parrecio {command[0]}: error: {MAGIC_ERROR.format(magic)} (byte offset 0 of "
                                    f"{rec}): the file's start is damaged, but RecordIO records follow (a frame "
                                    f"head at byte offset {len(frame(payloads[0]))}); {hint}")
    if command[0] == "cat":  # and it does read past it: the other records, byte for byte
        out = cli("cat", rec, "--skip-corrupt").stdout
        assert out == b"".join(payloads[1:])


def test_only_a_chain_of_frame_heads_makes_a_damaged_recordio_file(tmp_path: Path):
    """Binary data with one aligned magic in it is no RecordIO (the old message, what it starts with); the
    same with the next frame head where that one's length word points is a RecordIO file with a damaged
    start.  A magic off the 4-byte grid counts for nothing."""
    junk = bytes(range(7, 71))  # (no magic byte pair in it)
    lone = junk + frame(b"abcd") + junk
    unaligned = junk + b"\0\0" + frame(b"abcd") + frame(b"efgh")
    chained = junk + frame(b"abcd") + frame(b"efgh")
    for name, data in (("lone.bin", lone), ("unaligned.bin", unaligned)):
        (tmp_path / name).write_bytes(data)
        proc = cli("cat", tmp_path / name)
        assert error_line(proc).startswith(f"parrecio cat: error: {tmp_path / name}: not a RecordIO stream "
                                           f"({len(data)} bytes): it starts with binary data")
    (tmp_path / "chained.rec").write_bytes(chained)
    proc = cli("cat", tmp_path / "chained.rec", "--format", "hex")
    assert error_line(proc).endswith(f"(byte offset 0 of {tmp_path / 'chained.rec'}): the file's start is damaged, "
                                     f"but RecordIO records follow (a frame head at byte offset {len(junk)}); "
                                     f"--skip-corrupt reads past it")
    assert cli("cat", tmp_path / "chained.rec", "--skip-corrupt").stdout == b"abcdefgh"


def test_a_damaged_multipart_first_record_points_at_its_next_part(tmp_path: Path):
    """Only the magic of a first part (cflag 1) is damaged: its length word leads to the last part (cflag
    3), which the skip then drops with it; the record after them is read."""
    rec = tmp_path / "m.rec"
    first, last = b"p" * 50_000, b"q" * 40
    data = bytearray(frame(first, 1) + frame(last, 3) + frame(b"whole"))
    data[:4] = struct.pack("<I", 0xCED7230B)
    rec.write_bytes(bytes(data))
    proc = cli("cat", rec, "--join", "concat")
    assert error_line(proc).endswith(f"RecordIO records follow (a frame head at byte offset {8 + 50_000}); "
                                     f"--skip-corrupt reads past it")
    with RecordReader(str(rec), join="concat", on_corrupt="skip") as reader:
        assert [r.payload for r in reader] == [b"whole"]


def test_extract_by_key_from_stdin_and_bench_of_no_samples_are_refused(tmp_path: Path):
    """``extract - --key K`` said it needs "an index file next to - (-.idx)"; ``bench --samples 0`` ran a
    whole batch."""
    rec = tmp_path / "k.rec"
    rec.write_bytes(b"".join(frame(b"x%d" % i) for i in range(3)))
    (tmp_path / "k.idx").write_text("0\t0\n1\t12\n2\t24\n")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-m", "parrecio.cli", "extract", "-", "--key", "1"],
                          input=rec.read_bytes(), capture_output=True, env=env, timeout=120)
    assert proc.returncode == 1 and error_line(proc) == (
        "parrecio extract: error: --key needs the .rec file's index: it cannot be used with stdin (give the "
        "file's path, or --index N for the N-th record)")
    assert cli("extract", rec, "--key", "1").stdout == b"x1"
    proc = cli("bench", rec, "--samples", "0")
    assert proc.returncode == 2 and proc.stderr.decode().splitlines()[-1].endswith(
        "argument --samples: must be at least 1 sample, not 0")


# -- audit round 13: other damage at byte 0, stale indexes, closed stdin, odd outputs ---------------------

@pytest.mark.parametrize("command", [["inspect"], ["bench", "--workers", "0", "--quiet"]])
def test_a_file_of_frame_heads_without_an_intact_record_is_not_called_non_recordio(tmp_path: Path,
                                                                                     command: List[str]):
    """A download cut short inside its only record, or records over --max-record-bytes, start with the
    RecordIO magic: inspect and bench said "not a RecordIO stream ... not with the RecordIO magic"; now
    they say what cat says, the reader's error at byte 0."""
    cut = tmp_path / "cut.rec"
    cut.write_bytes(frame(bytes(range(256)) * 400)[:50_000])
    proc = cli(command[0], cut, *command[1:])
    assert proc.returncode == 1
    assert error_line(proc) == (f"parrecio {command[0]}: error: truncated payload: frame declares 102400 bytes "
                                f"(+0 padding) but the stream ends after 49992 (byte offset 0 of {cut})")
    if command[0] == "bench":  # (it has no --max-record-bytes)
        return
    big = tmp_path / "big.rec"
    big.write_bytes(frame(b"x" * 100) + frame(b"y" * 200))
    proc = cli(command[0], big, "--max-record-bytes", "50", *command[1:])
    assert error_line(proc).startswith(f"parrecio {command[0]}: error: record length 100 bytes exceeds "
                                       f"max_record_bytes (50) (byte offset 0 of {big})")
    assert "not a RecordIO stream" not in error_line(proc)


@pytest.mark.parametrize("damage, reason", [
    (lambda d: d.__setitem__(slice(4, 8), struct.pack("<I", (1 << 29) - 1)),
     "record length 536870911 bytes exceeds max_record_bytes (67108864)"),
    (lambda d: d.__setitem__(slice(4, 8), struct.pack("<I", (3 << 29) | 10)),
     "continuation part (cflag 3) without a first part (cflag 1)"),
])
def test_a_damaged_first_length_word_points_at_the_records_after_it(tmp_path: Path, damage, reason: str):
    """Only a damaged magic at byte 0 said that records follow and how to read past them; a damaged
    length word (a huge length, a continuation flag) at byte 0 now says so too."""
    payloads = [b"0123456789", b"abcdefghij", b"klmnopqrst"]
    rec = tmp_path / "l.rec"
    _damaged(rec, payloads, damage)
    proc = cli("cat", rec, "--format", "hex")
    line = error_line(proc)
    follow = f"RecordIO records follow (a frame head at byte offset {len(frame(payloads[0]))})"
    if "max_record_bytes" in reason:  # (a record that large is no damage: the option that reads it too)
        assert line == (f"parrecio cat: error: {reason} (byte offset 0 of {rec}): {follow}: the first record is "
                        f"that large, or its length word is damaged; --skip-corrupt reads past it, or "
                        f"--max-record-bytes N reads it whole"), line
        err = cli("bench", rec, "--workers", "0", "--quiet").stderr.decode()  # (no --max-record-bytes there)
        assert err.rstrip("\n").endswith("its length word is damaged; --skip-errors reads past it"), err
    else:
        assert line == (f"parrecio cat: error: {reason} (byte offset 0 of {rec}): the file's start is damaged, "
                        f"but {follow}; --skip-corrupt reads past it"), line
    assert cli("cat", rec, "--skip-corrupt").stdout == b"".join(payloads[1:])


def test_extract_by_index_refuses_a_stale_index(tmp_path: Path):
    """extract --index I through an .idx took the I-th listed offset on trust: an index missing a line gave
    the next record (status 0), one of the file before records were appended said there was no record I,
    one with an offset past the end was not noticed.  Each is an error naming the index now; --no-index
    reads the record."""
    payloads = [b"record-%d" % i for i in range(12)]
    rec = tmp_path / "t.rec"
    rec.write_bytes(b"".join(frame(p) for p in payloads))
    offsets = np.cumsum([0] + [len(frame(p)) for p in payloads])[:-1].tolist()
    idx = tmp_path / "t.idx"

    def listing(offs):
        idx.write_text("".join(f"{i}\t{o}\n" for i, o in enumerate(offs)))

    listing(offsets)
    assert [cli("extract", rec, "--index", i).stdout for i in (0, 4, 11)] == [payloads[0], payloads[4], payloads[11]]
    listing(offsets[:4] + offsets[5:])      # a line missing: before the record asked for, anywhere
    for i in (4, 5, 9):
        line = error_line(cli("extract", rec, "--index", i))
        assert line.startswith("parrecio extract: error: the record ends at byte") and \
            line.endswith(f"(byte offset {offsets[3]} of {rec}); --no-index counts the file's records instead"), line
        assert cli("extract", rec, "--index", i, "--no-index").stdout == payloads[i]
    assert cli("extract", rec, "--index", 2).stdout == payloads[2]  # (the records before it are listed right)
    listing(offsets[:10])                   # the file grew after the index was written
    assert "another record follows it there" in error_line(cli("extract", rec, "--index", 10))
    listing(offsets[:2] + [offsets[-1] + 64])  # an offset past the end
    assert "at or past the end of the file" in error_line(cli("extract", rec, "--index", 1))
    listing(offsets[:4] + offsets[5:])
    assert cli("extract", rec, "--key", 2).stdout == payloads[2]  # (its own record ends where the next is listed)
    line = error_line(cli("extract", rec, "--key", 3))
    assert "the index is not this file's" in line and "damaged" not in line, line
    listing(offsets[:1] + offsets[2:])  # (a line missing at the start: the file's start is not damaged)
    line = error_line(cli("extract", rec, "--key", 5))
    assert line.endswith(f"(byte offset 0 of {rec}); --index N with --no-index counts the file's records instead"), line


def test_extract_by_index_refuses_an_index_that_lists_a_multipart_records_part(tmp_path: Path):
    """An .idx with a line per frame (a writer that indexed every part): the part of record 3, listed as a
    record, ends where the walk stopped (the part's own frame), so --index 4 and on gave the record before
    them, status 0.  The walk goes on past a listed offset inside a record now: an error naming the index."""
    payloads = [b"rec%d" % i for i in range(7)]
    payloads[3] = b"AAAA" + MAGIC_BYTES + b"BBBBBB"  # MXNet's writer splits it at the aligned magic
    blob, starts = b"", []
    for i, p in enumerate(payloads):
        starts.append(len(blob))
        if i == 3:
            blob += frame(b"AAAA", 1)
            starts.append(len(blob))
            blob += frame(b"BBBBBB", 3)
        else:
            blob += frame(p)
    rec = tmp_path / "t.rec"
    rec.write_bytes(blob)
    (tmp_path / "t.idx").write_text("".join(f"{i}\t{o}\n" for i, o in enumerate(starts)))
    for i in (3, 4, 5, 7):
        line = error_line(cli("extract", rec, "--index", i))
        assert line.startswith(f"parrecio extract: error: the record ends at byte {starts[5]}, where another "
                               f"record starts, but {tmp_path / 't.idx'} lists the next record at byte "
                               f"{starts[4]}"), line
        assert cli("extract", rec, "--index", min(i, 6), "--no-index").stdout == payloads[min(i, 6)]
    assert [cli("extract", rec, "--index", i).stdout for i in (0, 2)] == [payloads[0], payloads[2]]


def test_closed_stdin_demo_out_idx_npz_labels_and_dash_outputs_are_one_line_errors(tmp_path: Path, images: Path):
    """stdin closed (``<&-``): a traceback (sys.stdin is None); ``demo --out d.idx``: records and index lines
    interleaved in d.idx; ``pack protobuf --labels L.npz``: "5 labels for 20 rows" (it counted the
    archive's arrays); ``pack images DIR -``: files named "-", "-.idx" and "-.lst"."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for command in (["cat", "-"], ["inspect", "-"], ["extract", "-", "--index", "0"]):
        proc = subprocess.run([sys.executable, "-m", "parrecio.cli", *command], stdin=subprocess.DEVNULL,
                              capture_output=True, env=env, timeout=120, preexec_fn=lambda: os.close(0))
        assert proc.returncode == 1 and error_line(proc) == (
            f"parrecio {command[0]}: error: cannot use stdin ('-'): it is closed")
    (tmp_path / "d.idx").write_text("old\n")
    proc = cli("demo", "--out", tmp_path / "d.idx", "--samples", "4")
    assert proc.returncode != 0 and proc.stderr.decode().strip() == (
        f"parrecio demo: --out '{tmp_path / 'd.idx'}': the records and their index would both be written to "
        f"this one file; name it {tmp_path / 'd'}.rec")
    assert (tmp_path / "d.idx").read_text() == "old\n"
    np.save(tmp_path / "x.npy", np.ones((20, 3), np.float32))
    np.savez(tmp_path / "y.npz", a=np.ones(20), b=np.ones(20))
    proc = cli("pack", "protobuf", tmp_path / "x.npy", tmp_path / "o.rec", "--labels", tmp_path / "y.npz")
    assert error_line(proc) == (f"parrecio pack: error: {tmp_path / 'y.npz'}: an .npz archive of 2 array(s) "
                                f"['a', 'b'], not a .npy array: save the one array with numpy.save")
    proc = cli("pack", "images", images, "-", cwd=tmp_path)
    assert error_line(proc) == ("parrecio pack: error: OUT '-' (standard output) is for pack manifest; pack images "
                                "writes a .rec and its index: give a file name (or /dev/stdout for the records "
                                "alone)")
    assert not (tmp_path / "-").exists() and not (tmp_path / "o.rec").exists()


def test_an_ambiguous_join_names_the_command_line_option(tmp_path: Path):
    """AmbiguousJoin's advice is worded for the Python API (join='mxnet'); on the command line it names
    --join, which reads the file."""
    import io
    from parrecio import RecordWriter
    payload = b"x" * 8 + b"\x0a\x23\xd7\xce" + b"y" * 4  # MXNet's cut: parts of 8 and 4 bytes, or a fixed split
    buf = io.BytesIO()
    with RecordWriter(buf) as w:
        w.write(b"abc")
        w.write(payload)
    rec = tmp_path / "a.rec"
    rec.write_bytes(buf.getvalue())
    line = error_line(cli("cat", rec))
    assert line.endswith("pass --join mxnet or --join concat") and "join='" not in line, line
    assert "(cut at an aligned magic, --join mxnet)" in line and "MXNet's writer" in line
    assert cli("cat", rec, "--join", "mxnet").stdout == b"abc" + payload


@pytest.mark.parametrize("command", [["cat"], ["inspect"]])
def test_cat_and_inspect_of_a_fifo_without_a_writer_say_that_they_wait(tmp_path: Path, command: List[str]):
    """cat and inspect opened a FIFO with a plain open(): with no writer they blocked silently for ever.
    They open it as ParallelReader does now: after 2 s a line says what they wait for, then they read."""
    import time
    from parrecio import RecordWriter
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-m", "parrecio.cli", *command, str(fifo)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
    try:
        time.sleep(3.5)
        assert proc.poll() is None
        with RecordWriter(str(fifo)) as w:
            w.write(b"hello")
            w.write(b"world")
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert f"still waiting for {fifo} after 2 s: it exists, but no process has opened it for writing yet" \
        in err.decode()
    assert (out == b"helloworld") if command == ["cat"] else (b"records:      2" in out), out


def test_skip_corrupt_on_a_file_with_no_record_is_not_an_empty_success(tmp_path: Path):
    """cat/extract --skip-corrupt skipped every byte of an image and exited 0 with nothing written (bench
    --skip-errors and ParallelReader(on_error="skip") refuse it); an empty file is an empty stream still."""
    photo = tmp_path / "photo.png"
    photo.write_bytes(png(40, 30, seed=1))
    binary = tmp_path / "noise.bin"
    binary.write_bytes(bytes(range(7, 71)) * 40)
    for path, what in ((photo, "a PNG image"), (binary, "binary data")):
        start = f"{path}: not a RecordIO stream ({path.stat().st_size} bytes): it starts with {what}"
        proc = cli("cat", path, "--skip-corrupt", "--format", "hex")
        assert proc.returncode == 1 and proc.stdout == b""
        assert error_line(proc).startswith(f"parrecio cat: error: {start}")
        proc = cli("extract", path, "--all", "--skip-corrupt", "--out", tmp_path / "out")
        assert proc.returncode == 1 and error_line(proc).startswith(f"parrecio extract: error: {start}")
        assert os.listdir(tmp_path / "out") == []
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with open(photo, "rb") as f:
        proc = subprocess.run([sys.executable, "-m", "parrecio.cli", "cat", "-", "--skip-corrupt"], stdin=f,
                              capture_output=True, env=env, timeout=120)
    assert proc.returncode == 1 and "bad magic" in error_line(proc) and "not a RecordIO stream?" in error_line(proc)
    (tmp_path / "empty.rec").write_bytes(b"")
    proc = cli("cat", tmp_path / "empty.rec", "--skip-corrupt")
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, b"", b"")
