"""``workers=0``: the pass is read and decoded in the consumer's own process, and gives exactly what the
process pipeline gives (``workers=2``): the same values and types, order, batches, errors (type, index,
offset, source, message), skip counts, shuffles and shards -- without any child process or shared
memory, and with decoders that need not be picklable."""

from __future__ import annotations

import io
import os
import threading

import numpy as np
import psutil
import pytest

from parrecio import (CorruptRecordError, DecodeError, ParallelReader, ParrecioError, PipelineError,
                      RecordWriter, Tuning)
from parrecio.decoders import ArraySpec, BoundingBoxes, Image, Json, Raw
from parrecio.pipeline.shm import leftover
from image_helpers import gt_boxes_json, jpeg
from pipeline_helpers import FailOn, Fixed, FixedNoInto, Pair, Ragged, digest_array, payloads, write_rec

MAGIC = (0xCED7230A).to_bytes(4, "little")


# -- decoders defined here (module level: workers=2 must be able to import them) ---------------------------
class Boom:
    """Raises a plain exception (not a DecodeError) on payloads starting with b"boom"; else the length."""

    def __call__(self, payload):
        if bytes(payload[:4]) == b"boom":
            raise RuntimeError(f"boom at {len(payload)} bytes")
        return len(payload)

    def __repr__(self):
        return "Boom()"


class Refuse:
    """Raises a DecodeError (the decoder protocol's own error) on payloads starting with b"no"."""

    def __call__(self, payload):
        if bytes(payload[:2]) == b"no":
            raise DecodeError("refused by Refuse")
        return bytes(payload).upper()

    def __repr__(self):
        return "Refuse()"


class Scalar:
    """A fixed spec of shape ``()``: one int64 per sample (a numpy scalar per sample, as from a slot)."""

    output_spec = ArraySpec((), np.int64)

    def __call__(self, payload):
        return np.int64(len(payload))

    def decode_into(self, payload, out):
        out[...] = len(payload)


class Readonly:
    """What the decoder is given: whether the payload is read-only, and its type."""

    def __call__(self, payload):
        return (memoryview(payload).readonly, type(payload).__name__)


# -- helpers ---------------------------------------------------------------------------------------------
def same(a, b, where="") -> None:
    """Deep equality that also checks types, numpy shapes and dtypes."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        assert type(a) is type(b), f"{where}: {type(a)} != {type(b)}"
        assert a.shape == b.shape and a.dtype == b.dtype, f"{where}: {a.shape} {a.dtype} != {b.shape} {b.dtype}"
        assert np.array_equal(a, b, equal_nan=a.dtype.kind == "f"), f"{where}: values differ"
        return
    assert type(a) is type(b), f"{where}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{where}: length {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{where}[{i}]")
    elif isinstance(a, dict):
        assert list(a) == list(b), f"{where}: keys {list(a)} != {list(b)}"
        for k in a:
            same(a[k], b[k], f"{where}[{k!r}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def same_error(a, b) -> None:
    assert (a is None) == (b is None), f"{a!r} vs {b!r}"
    if a is None:
        return
    assert type(a) is type(b)
    assert (a.index, a.offset, a.source) == (b.index, b.offset, b.source)
    assert str(a) == str(b)


def passes(channel, workers, epochs=1, **kw):
    """``(outputs, errors, stats, reader)``: each pass's items and its ParrecioError (or None)."""
    outs, errs = [], []
    with ParallelReader(channel, workers=workers, **kw) as reader:
        for _ in range(epochs):
            items, err = [], None
            try:
                for x in reader:
                    items.append(x)
            except ParrecioError as exc:
                err = exc
            outs.append(items)
            errs.append(err)
    return outs, errs, reader.stats, reader


def check_equal(channel, epochs=1, **kw):
    """Run ``workers=0`` and ``workers=2`` with the same arguments; assert everything matches; return
    the inline run's ``(outputs, errors, stats, reader)``."""
    inline = passes(channel, 0, epochs, **kw)
    procs = passes(channel, 2, epochs, **kw)
    for e, (a, b) in enumerate(zip(inline[0], procs[0])):
        same(a, b, f"epoch {e}")
    for a, b in zip(inline[1], procs[1]):
        same_error(a, b)
    si, sp = inline[2], procs[2]
    assert (si.epochs, si.samples, si.skipped, si.skipped_records, si.skipped_bytes) == \
        (sp.epochs, sp.samples, sp.skipped, sp.skipped_records, sp.skipped_bytes)
    if all(e is None for e in inline[1]):  # a pass that ended early stops the reader process anywhere
        assert (si.records, si.bytes, si.sharded_out) == (sp.records, sp.bytes, sp.sharded_out)
    assert inline[3].worker_pids == [] and si.workers == 0
    return inline


def flatten(batches):
    return [x for b in batches for x in b]


@pytest.fixture(scope="module")
def stream(tmp_path_factory):
    """400 records of 0..200 random bytes; a few contain the RecordIO magic (multipart records)."""
    recs = payloads(400, seed=3)
    for i in (5, 77, 201):
        recs[i] = b"head" + MAGIC + recs[i] + MAGIC + b"tail"
    path = tmp_path_factory.mktemp("inline") / "s.rec"
    offsets = write_rec(path, recs)
    return path, recs, offsets


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """30 groups (JPEG of varied size, Ground Truth box JSON); the JPEG of group 13 is corrupt."""
    path = tmp_path_factory.mktemp("images") / "img.rec"
    recs = []
    for i in range(30):
        img = jpeg(24 + 3 * i, 20 + 2 * (i % 7), seed=i)
        if i == 13:
            img = img[:2] + b"this is no JPEG at all" + img[40:60]
        boxes = [(i % 5, 1 + j, 2, 5 + i % 4, 6) for j in range(i % 4)]
        recs += [img, gt_boxes_json(boxes, width=24 + 3 * i, height=20 + 2 * (i % 7))]
    offsets = write_rec(path, recs)
    return path, recs, offsets


# -- values, order, fields, batches -------------------------------------------------------------------------
@pytest.mark.parametrize("fields", [None, Fixed(), FixedNoInto(), Ragged(), Scalar(), Readonly(), Pair()],
                         ids=["none", "fixed", "fixed-no-into", "ragged", "scalar", "readonly", "pair"])
@pytest.mark.parametrize("batch_size", [None, 1, 7, 64])
def test_single_field_equals_the_process_pipeline(stream, fields, batch_size, no_leaks):
    path, recs, _ = stream
    (out,), (err,), st, _ = check_equal(path, fields=fields, batch_size=batch_size)
    assert err is None and st.samples == len(recs) and st.records == len(recs)
    if batch_size is None:
        assert len(out) == len(recs)
    else:
        assert [len(b[0] if isinstance(b, tuple) else b) for b in out] == \
            [min(batch_size, len(recs) - i) for i in range(0, len(recs), batch_size)]
    if fields is None:
        assert (out if batch_size is None else flatten(out)) == recs
    if isinstance(fields, Readonly) and batch_size is None:  # decoders get read-only payloads in both modes
        assert all(r == (True, "memoryview") for r in out)
    if isinstance(fields, Scalar) and batch_size is None:
        assert type(out[0]) is np.int64 and out[0] == len(recs[0])


@pytest.mark.parametrize("group", [2, 3])
@pytest.mark.parametrize("batch_size", [None, 5])
@pytest.mark.parametrize("as_dict", [False, True], ids=["tuple", "dict"])
def test_groups_of_several_fields(stream, group, batch_size, as_dict, no_leaks):
    path, recs, _ = stream
    decs = [Raw(), Fixed(), Pair()] if group == 3 else [Ragged(), Fixed()]
    fields = {f"f{i}": d for i, d in enumerate(decs)} if as_dict else decs
    (out,), (err,), st, _ = check_equal(path, fields=fields, batch_size=batch_size, on_error="skip")
    n = len(recs) // group
    assert err is None and st.samples == n and st.skipped == (1 if len(recs) % group else 0)
    if batch_size is None:
        assert len(out) == n
        for j in (0, 1, n - 1):
            same(out[j]["f1"] if as_dict else out[j][1], digest_array(recs[j * group + 1]))
    else:
        assert [len(b["f1"] if as_dict else b[1]) for b in out] == \
            [min(batch_size, n - i) for i in range(0, n, batch_size)]


@pytest.mark.parametrize("group", [2, 3])
def test_stream_ending_inside_a_group(stream, group, no_leaks):
    path, recs, offsets = stream
    n = len(recs) // group * group
    (out,), (err,), _, _ = check_equal(path, fields=[Raw()] * group)
    if n == len(recs):
        assert err is None
    else:
        assert isinstance(err, CorruptRecordError) and "inside a group" in str(err)
        assert (err.index, err.offset, err.source) == (n // group, offsets[n], str(path))
    assert out == [tuple(recs[i:i + group]) for i in range(0, n, group)]
    (out,), (err,), st, _ = check_equal(path, fields=[Raw()] * group, batch_size=32)
    assert [r for b in out for r in zip(*b)] == [tuple(recs[i:i + group]) for i in range(0, n, group)]


@pytest.mark.parametrize("drop_last", [False, True])
def test_batches_and_drop_last(stream, drop_last, no_leaks):
    path, recs, _ = stream
    (out,), _, _, reader = check_equal(path, fields={"raw": Raw(), "img": Fixed()}, batch_size=48,
                                       drop_last=drop_last)
    sizes = [len(b["raw"]) for b in out]
    assert sizes == ([48] * 4 if drop_last else [48] * 4 + [8])
    assert all(b["img"].shape == (n, 4, 3) and b["img"].dtype == np.uint8 for b, n in zip(out, sizes))
    assert np.array_equal(out[1]["img"][3], digest_array(recs[2 * 48 + 2 * 3 + 1]))
    assert len(reader) == len(out)


def test_images_and_bounding_boxes(images, no_leaks):
    path, recs, offsets = images
    fields = {"image": Image(size=(32, 32)), "boxes": BoundingBoxes()}
    (out,), (err,), _, _ = check_equal(path, fields=fields, on_error="skip")
    assert err is None and len(out) == 29
    assert out[0]["image"].shape == (32, 32, 3) and out[0]["boxes"].shape == (0, 5)
    assert out[5]["boxes"].shape == (1, 5)
    (out,), _, st, _ = check_equal(path, fields=fields, batch_size=8, on_error="skip")
    assert st.skipped == 1 and [len(b["image"]) for b in out] == [8, 8, 8, 5]
    assert isinstance(out[0]["boxes"], list)  # ragged
    fixed = {"image": Image(size=(32, 32)), "boxes": BoundingBoxes(max_boxes=4)}
    (out,), _, _, _ = check_equal(path, fields=fixed, batch_size=8, on_error="skip")
    assert out[0]["boxes"].shape == (8, 4, 5)


@pytest.mark.parametrize("batch_size", [None, 4])
def test_decode_error_is_raised_at_its_position(images, batch_size, no_leaks):
    path, _, offsets = images
    fields = [Image(size=(32, 32)), BoundingBoxes()]
    (out,), (err,), _, _ = check_equal(path, fields=fields, batch_size=batch_size)
    assert isinstance(err, DecodeError)
    assert (err.index, err.offset, err.source) == (13, offsets[26], str(path))
    assert str(err).startswith("field '0' (Image(")
    if batch_size is None:
        assert len(out) == 13
    else:
        assert [len(b[0]) for b in out] == [4, 4, 4, 1]  # a short batch before the error


def test_decoders_defined_here_that_raise(tmp_path, no_leaks):
    recs = [b"fine-%d" % i for i in range(60)]
    recs[17], recs[40] = b"boom!", b"no thanks"
    path = tmp_path / "r.rec"
    offsets = write_rec(path, recs)
    (out,), (err,), _, _ = check_equal(path, fields=Boom())
    assert isinstance(err, DecodeError) and (err.index, err.offset) == (17, offsets[17])
    assert str(err).startswith("field '0' (Boom()): RuntimeError: boom at 5 bytes")
    assert out == [len(r) for r in recs[:17]]
    (_,), (err,), _, _ = passes(path, 0, fields=Boom())
    assert isinstance(err.__cause__, RuntimeError)
    (out,), (err,), _, _ = check_equal(path, fields={"x": Refuse()})
    assert (err.index, err.offset) == (40, offsets[40]) and "field 'x' (Refuse()): refused by Refuse" in str(err)
    (out,), (err,), st, _ = check_equal(path, fields=[Refuse(), Boom()], on_error="skip")
    assert err is None and st.skipped == 2 and len(out) == 28


def test_json_errors_name_the_field(tmp_path, no_leaks):
    recs = [b'{"a": %d}' % i for i in range(50)]
    recs[21] = b"{not json"
    path = tmp_path / "j.rec"
    offsets = write_rec(path, recs)
    (out,), (err,), _, _ = check_equal(path, fields=Json())
    assert out == [{"a": i} for i in range(21)]
    assert (err.index, err.offset) == (21, offsets[21])
    assert "field '0' (Json()): invalid JSON" in str(err)
    (out,), (err,), st, _ = check_equal(path, fields=Json(), on_error="skip")
    assert err is None and len(out) == 49 and st.skipped == 1


# -- framing errors ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("batch_size", [None, 16])
def test_corrupt_framing_in_both_modes(stream, tmp_path, batch_size, no_leaks):
    _, recs, offsets = stream
    data = bytearray((stream[0]).read_bytes())
    hit = offsets[150]
    data[hit:hit + 8] = b"\x13\x37" * 4  # the head of record 150: bad magic
    path = tmp_path / "bad.rec"
    path.write_bytes(bytes(data))
    for fields in (None, Fixed(), [Raw(), Ragged()]):
        (out,), (err,), _, _ = check_equal(path, fields=fields, batch_size=batch_size)
        assert isinstance(err, CorruptRecordError) and err.offset == hit and err.source == str(path)
        n = 150 // (2 if isinstance(fields, list) else 1)
        assert err.index == n
        assert (len(out) if batch_size is None else sum(len(b[0] if isinstance(b, tuple) else b) for b in out)) == n
        (out,), (err,), st, _ = check_equal(path, fields=fields, batch_size=batch_size, on_error="skip")
        if isinstance(fields, list):  # groups of two records whose kinds do not tell them apart: the
            # damage leaves the next group's start unknown, and skipping on would pair records of two
            # samples (parrecio/pipeline/resync.py): the run stops at the damage, in skip mode too
            assert isinstance(err, CorruptRecordError) and err.offset == hit and err.index == n
            assert "cannot tell which record starts the next sample after the corrupt region" in str(err)
            continue
        assert err is None and st.skipped_records == 1 and st.skipped_bytes > 0


def _fds_on(path) -> int:
    """This process's file descriptors open on ``path``."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}") == str(path)
        except OSError:
            pass
    return n


@pytest.mark.parametrize("damage", ["framing", "decode"])
def test_error_raised_closes_the_stream_while_it_is_held(stream, tmp_path, damage, no_leaks):
    """The per-record path of workers=0 (one field, nothing planned) ends with an error: the stream's file
    is closed when the error comes out, not when its traceback goes (a FIFO kept open by a saved error
    would leave the next reader of it waiting for this process: found by the long differential profile)."""
    _, recs, offsets = stream
    data = bytearray(stream[0].read_bytes())
    if damage == "framing":
        data[offsets[40]:offsets[40] + 4] = b"\x13\x37\x13\x37"
    path = tmp_path / "held.rec"
    path.write_bytes(bytes(data))
    marker = recs[40][:16]

    def fail_on_40(payload):  # ragged (no output_spec): the per-record path
        if bytes(payload[:16]) == marker:
            raise ValueError("sample 40")
        return bytes(payload)
    fields = Raw() if damage == "framing" else fail_on_40
    with ParallelReader(str(path), fields=fields, workers=0) as reader:
        got = []
        with pytest.raises((CorruptRecordError, DecodeError)) as info:
            for value in reader:
                got.append(value)
                assert _fds_on(path) == 1  # (the pass has it open while it reads)
        assert len(got) == 40 and info.value.index == 40
        assert _fds_on(path) == 0  # the error (and its traceback's frames) still held here


# -- shards and shuffles ----------------------------------------------------------------------------------
def test_shards_partition_the_stream(stream, no_leaks):
    path, recs, _ = stream
    union = []
    for k in range(3):
        (out,), _, st, _ = check_equal(path, fields=[Raw(), Fixed()], num_shards=3, shard_index=k)
        union += [(i * 3 + k) for i in range(len(out))]
        assert [a for a, _ in out] == recs[0::2][k::3]
        assert st.sharded_out == len(recs) // 2 - len(out)
    assert sorted(union) == list(range(len(recs) // 2))


def _write_groups(path, n, index):
    with RecordWriter(str(path), index=index) as w:
        for i in range(n):
            w.write(b"img-%d" % i)
            w.write(b"lbl-%d" % i)


@pytest.mark.parametrize("index", [False, True], ids=["buffer", "index"])
@pytest.mark.parametrize("num_shards", [1, 3])
def test_shuffles_are_those_of_the_process_pipeline(tmp_path, index, num_shards, no_leaks):
    a, b = tmp_path / "a.rec", tmp_path / "b.rec"
    _write_groups(a, 130, index)
    _write_groups(b, 75, index)
    if index:
        assert a.with_suffix(".idx").exists()
    everything = [(b"img-%d" % i, b"lbl-%d" % i) for i in list(range(130)) + list(range(75))]
    epochs = ([], [])
    for k in range(num_shards):
        (e0, e1), _, _, reader = check_equal([str(a), str(b)], epochs=2, fields=[Raw(), Raw()], shuffle=True,
                                             seed=11, shuffle_buffer=32, num_shards=num_shards, shard_index=k)
        assert reader._res.cfg.shuffle_mode == ("index" if index else "buffer")
        assert all(x[4:] == y[4:] for x, y in e0)  # groups stay together
        in_order = everything[k::num_shards]
        assert e0 != in_order and e0 != e1
        if index:  # a global permutation, then the shard's slice: another part every epoch
            assert num_shards == 1 or sorted(e0) != sorted(e1)
        else:      # streams: the shard's part of the stream, through the shuffle buffer
            assert sorted(e0) == sorted(e1) == sorted(in_order)
        epochs[0].extend(e0)
        epochs[1].extend(e1)
    assert sorted(epochs[0]) == sorted(epochs[1]) == sorted(everything)  # together: each group once


def test_shuffle_with_batches_and_a_buffer_of_one(tmp_path, no_leaks):
    path = tmp_path / "s.rec"
    _write_groups(path, 100, False)
    check_equal(path, epochs=2, fields={"i": Raw(), "l": Raw()}, shuffle=True, shuffle_buffer=7, batch_size=9)
    (e0,), _, _, _ = check_equal(path, fields=[Raw(), Raw()], shuffle=True, shuffle_buffer=1)
    assert e0 == [(b"img-%d" % i, b"lbl-%d" % i) for i in range(100)]


# -- sources ----------------------------------------------------------------------------------------------
def test_file_object_directory_and_glob(stream, tmp_path, no_leaks):
    path, recs, _ = stream
    with ParallelReader(io.BytesIO(path.read_bytes()), fields=Fixed(), workers=0) as reader:
        got = list(reader)
    assert all(np.array_equal(a, digest_array(r)) for a, r in zip(got, recs)) and len(got) == len(recs)
    d = tmp_path / "dir"
    d.mkdir()
    write_rec(d / "1.rec", recs[:150])
    write_rec(d / "2.rec", recs[150:])
    (out,), _, _, _ = check_equal(str(d), fields=None)
    assert out == recs
    (out,), _, _, _ = check_equal(str(d / "*.rec"), fields=[Raw(), Raw()], batch_size=10)


# -- lifecycle: no processes, no shared memory, passes, close ----------------------------------------------
def _children():
    return sorted(p.pid for p in psutil.Process().children(recursive=True))


def test_nothing_is_started(stream, no_leaks):
    path, recs, _ = stream
    before_children = _children()
    shm_before = set(leftover(f"parrecio-{os.getpid()}-"))
    with ParallelReader(path, fields=Fixed(), workers=0, batch_size=10) as reader:
        assert reader.worker_pids == []
        it = iter(reader)
        next(it)
        assert _children() == before_children  # mid-pass
        assert set(leftover(f"parrecio-{os.getpid()}-")) == shm_before
        assert reader.telemetry()["processes"]["reader"]["pid"] == os.getpid()
        rest = list(it)
        assert len(rest) == 39 and len(reader) == 40
        assert reader.worker_pids == []
        assert reader._res.ring is None and reader._res.slots is None and reader._res.pool is None
    assert _children() == before_children
    assert set(leftover(f"parrecio-{os.getpid()}-")) == shm_before


def test_len_from_the_index_and_after_a_pass(tmp_path, no_leaks):
    indexed, plain = tmp_path / "i.rec", tmp_path / "p.rec"
    _write_groups(indexed, 101, True)
    _write_groups(plain, 101, False)
    assert len(ParallelReader(str(indexed), fields=[Raw(), Raw()], workers=0, batch_size=10)) == 11
    with ParallelReader(str(plain), fields=[Raw(), Raw()], workers=0, batch_size=25) as reader:
        with pytest.raises(TypeError, match="not known"):
            len(reader)
        n = sum(1 for _ in reader)
        assert len(reader) == n == 5
        assert reader.stats.epochs == 1 and reader.stats.samples == 101


def test_early_break_then_new_passes(stream, no_leaks):
    path, recs, _ = stream
    with ParallelReader(path, fields=None, workers=0) as reader:
        for i, r in enumerate(reader):
            if i == 10:
                break
        assert reader.state.value == "idle"
        with pytest.raises(TypeError):
            len(reader)  # the pass was not complete
        assert list(reader) == recs
        assert list(reader) == recs
        assert reader.stats.epochs == 3 and len(reader) == len(recs)


def test_a_new_iteration_ends_the_unfinished_one_and_close_mid_pass(stream, no_leaks):
    path, recs, _ = stream
    with ParallelReader(path, workers=0) as reader:
        first = iter(reader)
        assert next(first) == recs[0]
        second = iter(reader)
        assert list(second) == recs
        with pytest.raises(PipelineError, match="ended by close"):
            next(first)
        third = iter(reader)
        assert next(third) == recs[0]
    assert reader.state.value == "closed"
    with pytest.raises(PipelineError, match="ended by close"):
        next(third)
    with pytest.raises(PipelineError, match="closed"):
        iter(reader)
    reader = ParallelReader(path, fields=Fixed(), workers=0, batch_size=8)
    got = []
    with pytest.raises(PipelineError, match="ended by close"):
        for b in reader:
            got.append(b)
            if len(got) == 3:
                reader.close()
    assert len(got) == 3 and np.array_equal(got[2][0], digest_array(recs[16]))


def test_another_thread_is_refused_while_a_pass_runs(stream, no_leaks):
    path, recs, _ = stream
    with ParallelReader(path, workers=0) as reader:
        it = iter(reader)
        next(it)
        errors = []

        def other():
            try:
                iter(reader)
            except PipelineError as exc:
                errors.append(exc)

        t = threading.Thread(target=other)
        t.start()
        t.join()
        assert len(errors) == 1 and "another thread" in str(errors[0])
        assert len(list(it)) == len(recs) - 1


def test_close_from_another_thread(stream, no_leaks):
    path, recs, _ = stream
    reader = ParallelReader(path, fields=Fixed(), workers=0)
    it = iter(reader)
    next(it)
    t = threading.Thread(target=reader.close)
    t.start()
    t.join(10)
    assert not t.is_alive()
    with pytest.raises(PipelineError, match="ended by close"):
        next(it)


def test_lambda_and_local_decoders_need_no_pickling(stream, no_leaks):
    path, recs, _ = stream
    with ParallelReader(path, fields=lambda p: len(p), workers=2, tuning=Tuning(start_method="spawn")) as reader:
        assert list(reader) == [len(x) for x in recs]  # by value (cloudpickle) to the workers

    def local(p):
        return bytes(p)[:3]

    with ParallelReader(path, fields={"n": lambda p: len(p), "h": local}, workers=0, on_error="skip") as reader:
        out = list(reader)
    assert out == [{"n": len(recs[i]), "h": recs[i + 1][:3]} for i in range(0, len(recs), 2)]


def test_workers_argument(stream):
    path, _, _ = stream
    with pytest.raises(ValueError, match="workers must be >= 0"):
        ParallelReader(path, workers=-1)
    reader = ParallelReader(path, workers=0)
    assert reader.workers == 0 and "workers=0" in repr(reader)
    reader.close()


def test_errors_keep_the_decoder_frame_for_post_mortem(tmp_path, no_leaks):
    recs = [b"ok", b"boom-now"]
    path = tmp_path / "b.rec"
    write_rec(path, recs)
    with ParallelReader(path, fields=Boom(), workers=0) as reader:
        with pytest.raises(DecodeError) as ei:
            list(reader)
    tb = ei.value.__traceback__
    names = []
    while tb is not None:
        names.append(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    assert names[-1] == "__call__"  # pdb.post_mortem() stops inside Boom.__call__


def test_failon_with_batches_skip_and_raise(tmp_path, no_leaks):
    recs = [b"ok%d" % i for i in range(100)]
    recs[37] = b"BAD-record"
    path = tmp_path / "e.rec"
    offsets = write_rec(path, recs)
    (out,), (err,), _, _ = check_equal(path, fields=FailOn(b"BAD"), batch_size=10)
    assert [len(b) for b in out] == [10, 10, 10, 7]
    assert (err.index, err.offset) == (37, offsets[37])
    (out,), (err,), st, _ = check_equal(path, fields=FailOn(b"BAD"), batch_size=10, on_error="skip")
    assert err is None and st.skipped == 1 and [len(b) for b in out] == [10] * 9 + [9]


@pytest.mark.parametrize("shuffle", [False, True])
def test_payloads_are_read_only_views_released_after_the_call(stream, shuffle, no_leaks):
    path, recs, offsets = stream
    (out,), _, _, _ = check_equal(path, fields=[Readonly(), Readonly(), Readonly()], shuffle=shuffle,
                                  on_error="skip")
    assert len(out) == len(recs) // 3 and set(out) == {((True, "memoryview"),) * 3}
    # A decoder that keeps its payload (np.frombuffer) breaks the decoder protocol; numpy 2 takes a new
    # view of the buffer, so release() cannot catch it: no check here, the protocol says "must not".


class _Counting:
    """Counts its calls (in this process: workers=0); refuses payloads starting with b"bad"."""

    def __init__(self):
        self.calls = 0

    def __call__(self, payload):
        self.calls += 1
        if bytes(payload[:3]) == b"bad":
            raise ValueError("bad payload")
        return len(payload)


@pytest.mark.parametrize("batch_size", [None, 4])
def test_each_payload_is_decoded_once_even_when_it_fails(tmp_path, batch_size):
    """A decoder runs once per record in workers=0, a failing one too (its error is not fetched by
    running it again): a decoder with side effects sees each sample once."""
    records = [b"bad%d" % i if i % 3 == 0 else b"ok%d" % i for i in range(10)]
    write_rec(tmp_path / "c.rec", records)
    dec = _Counting()
    with ParallelReader(tmp_path / "c.rec", dec, workers=0, on_error="skip", batch_size=batch_size) as r:
        got = list(r)
        assert r.stats.skipped == 4
    assert dec.calls == len(records)
    values = got if batch_size is None else [v for b in got for v in b]
    assert values == [len(x) for x in records if not x.startswith(b"bad")]


@pytest.mark.parametrize("fixed", [False, True], ids=["listed", "with-a-slot"])
@pytest.mark.parametrize("batch_size", [None, 3])
def test_a_span_of_big_payloads_ends_at_the_chunk_byte_cap(tmp_path, fixed, batch_size, no_leaks):
    """workers=0 holds the values of a span until it is taken: a span ended only at slot_size samples, so
    256 payloads of 32 MiB were all read and copied (8 GiB) before the first sample came.  It now also
    ends once its payloads reach the chunk byte cap (1 MiB here): the first sample comes after a few
    decodes, and the pass is exact, batched or not, beside a fixed-shape field too (rows stay in one slot).
    (Batched, a span ends at the slot of batch_size samples anyway.)"""
    recs = payloads(2 * 40, seed=5, max_len=60_000)
    recs = [r + bytes(70_000) for r in recs]  # 70-130 KB records
    path = tmp_path / "big.rec"
    write_rec(path, recs)
    calls = []

    def counted(payload):
        calls.append(len(payload))
        return bytes(payload)

    fields = [counted, Fixed()] if fixed else [counted, Raw()]
    groups = [len(recs[2 * i]) + len(recs[2 * i + 1]) for i in range(40)]
    need = next(k for k in range(1, 41) if sum(groups[:k]) >= 1 << 20)  # the cap: max(1 MiB, ring / 8)
    assert need <= 6
    tuning = Tuning(ring_bytes=4 << 20)  # (chunk_bytes: max(1 MiB, ring_bytes / 8))
    with ParallelReader(path, fields=fields, workers=0, batch_size=batch_size, tuning=tuning) as reader:
        it = iter(reader)
        first = next(it)
        assert len(calls) <= need + (batch_size or 0), len(calls)  # (was 40: the whole stream)
        got = [first] + list(it)
    if batch_size is None:
        samples = got
    else:
        assert [len(b[0]) for b in got] == [3] * 13 + [1]
        samples = [tuple(col[i] for col in b) for b in got for i in range(len(b[0]))]
    assert len(samples) == 40
    for i, (a, b) in enumerate(samples):
        assert a == recs[2 * i]
        if fixed:
            assert np.array_equal(b, digest_array(recs[2 * i + 1]))
        else:
            assert b == recs[2 * i + 1]
