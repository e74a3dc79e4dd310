"""``ParallelReader.iter_views()``: raw payloads as read-only memoryviews, zero-copy with decoder-side
processes, and never reused under a view that is still alive.

What is checked, against plain lists of the payloads written: byte-exact samples in stream order in every
mode (workers 0/1/3, a mapped file, a stream read into a small ring that wraps many times, a SageMaker
Pipe-mode FIFO), records from 0 bytes to more than half the ring; views kept for a while (and slices and
numpy arrays made from them) keep their bytes while the ring goes round; views that would pin the whole
ring raise instead of hanging; a view kept past the end of a pass is not overwritten by the next pass;
nothing is left behind after a normal end, an early ``break``, an error.  See docs/ARCHITECTURE.md,
"Raw records as views", and ``parrecio/pipeline/views.py``.
"""

from __future__ import annotations

import gc
import mmap
import random
import subprocess

import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st

from parrecio import ParallelReader, Tuning
from parrecio.decoders import Json, Raw
from parrecio.errors import PipelineError
from parrecio.tools.emulate import write_channel_config
from pipeline_helpers import deadline, write_rec

RING = 256 << 10             # a small ring: the streams below wrap it dozens of times
SMALL = Tuning(ring_bytes=RING)


def _records(n, seed, big_every=0, big=0):
    """``n`` payloads of 0..3000 bytes (some empty), every ``big_every``-th one ``big`` bytes long."""
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        k = big if big_every and i % big_every == big_every - 1 else rnd.choice([0, rnd.randrange(1, 3001)])
        out.append(rnd.randbytes(k) if k else b"")
    return out


def _is_view(v) -> bool:
    return type(v) is memoryview and v.readonly and v.format == "B" and v.ndim == 1


def _in_shared_memory(v) -> bool:
    """Whether view ``v`` is a view of a mapping (the ring, a one-off segment, a mapped file), not of a
    copy the consumer made."""
    base = v.obj
    while isinstance(base, (np.ndarray, memoryview)):
        base = base.base if isinstance(base, np.ndarray) else base.obj
    return isinstance(base, mmap.mmap)


@pytest.fixture(scope="module")
def recs():
    r = _records(2500, 1, big_every=211, big=150_000)  # 150 KB: over half the ring (a one-off segment)
    r[7] = b"\x0a\x23\xd7\xce" * 40  # holds the magic: MXNet's writer splits it (a multipart record)
    assert sum(map(len, r)) > 12 * RING  # the ring wraps a dozen times
    return r


@pytest.mark.parametrize("workers", [0, 1, 3])
@pytest.mark.parametrize("how", ["stream", "mapped"])
def test_views_are_the_payloads_in_every_mode(tmp_path, no_leaks, recs, workers, how):
    path = tmp_path / "v.rec"
    write_rec(path, recs)
    with deadline(120):
        for epoch in range(2):
            f = open(path, "rb") if how == "stream" else None  # a file object is read into the ring
            try:
                with ParallelReader(f if f is not None else str(path), workers=workers, tuning=SMALL) as r:
                    views = []
                    for v in r.iter_views():
                        assert _is_view(v)
                        views.append(bytes(v))
                    assert views == recs
                    assert r.stats.samples == len(recs)
            finally:
                if f is not None:
                    f.close()


def test_views_are_not_copies_with_decoder_processes(tmp_path, no_leaks, recs):
    """workers >= 1: each view lies in shared memory (the ring, a one-off segment) or the file's mapping;
    workers=0: views of copies (the reader refills one buffer in place), with the same bytes."""
    path = tmp_path / "v.rec"
    write_rec(path, recs)
    with open(path, "rb") as f, ParallelReader(f, workers=1, tuning=SMALL) as r:
        assert all(_in_shared_memory(v) for v in r.iter_views())
    with ParallelReader(str(path), workers=1, tuning=SMALL) as r:
        assert all(_in_shared_memory(v) for v in r.iter_views())
    with ParallelReader(str(path), workers=0, tuning=SMALL) as r:
        assert not any(_in_shared_memory(v) for v in r.iter_views())


def test_views_kept_a_while_keep_their_bytes_while_the_ring_goes_round(tmp_path, no_leaks, recs):
    """Each view is kept for the next 40 samples, with a slice and a numpy array made from it (which
    outlive the view itself): every one of them still reads its own payload when it is let go."""
    path = tmp_path / "v.rec"
    write_rec(path, recs)
    with deadline(120), open(path, "rb") as f, ParallelReader(f, workers=1, tuning=SMALL) as r:
        window = []
        for i, v in enumerate(r.iter_views()):
            window.append((i, v[1:], np.frombuffer(v, np.uint8)))
            del v
            if len(window) > 40:
                j, tail, arr = window.pop(0)
                assert bytes(tail) == recs[j][1:]
                assert arr.tobytes() == recs[j]
                assert not arr.flags.writeable
        assert i == len(recs) - 1


def test_views_that_pin_the_whole_ring_raise_instead_of_hanging(tmp_path, no_leaks):
    recs = _records(3000, 3)
    path = tmp_path / "v.rec"
    write_rec(path, recs)
    kept = []
    with deadline(60), open(path, "rb") as f, ParallelReader(f, workers=1, tuning=SMALL) as r:
        with pytest.raises(PipelineError, match=r"iter_views\(\): the reader process waits for input-ring "
                                                r"space that views still in use hold: \d+ delivered chunk\(s\), "
                                                r"0\.\d\d MiB of a 0\.25 MiB ring.*copy what you keep "
                                                r"\(bytes\(view\)\)"):
            for v in r.iter_views():
                kept.append(v)
        assert 0 < len(kept) < len(recs)
        assert sum(map(len, kept)) > RING // 4
    # none of them was overwritten, before or after close(): the mapping lives on under them
    assert [bytes(v) for v in kept] == recs[:len(kept)]
    del kept, v
    gc.collect()


class _Channel:
    """A SageMaker Pipe-mode channel ``train`` under ``tmp_path`` whose FIFOs ``train_0 ..`` are fed the
    file ``path`` by ``cat``, one epoch after another."""

    def __init__(self, tmp_path, path, epochs: int) -> None:
        self.root = tmp_path / "sm"
        write_channel_config(str(self.root), "train",
                             settings={"TrainingInputMode": "Pipe", "RecordWrapperType": "None"})
        data = self.root / "data"
        data.mkdir(exist_ok=True)
        script = ('e=0; while [ $e -lt "$3" ]; do mkfifo "$1/train_$e"; cat "$2" > "$1/train_$e"; '
                  'rm -f "$1/train_$e"; e=$((e + 1)); done')
        self.feeder = subprocess.Popen(["sh", "-c", script, "sh", str(data), str(path), str(epochs)])

    def reader(self, **kw) -> ParallelReader:
        return ParallelReader("train", fields=None, sm_input_dir=str(self.root), tuning=SMALL, **kw)

    def wait(self) -> int:
        """The feeder's exit status once it served every epoch."""
        return self.feeder.wait(timeout=30)

    def stop(self) -> None:
        self.feeder.kill()
        self.feeder.wait()


@pytest.mark.parametrize("second", ["views", "bytes"])
@pytest.mark.parametrize("ending", ["plain", "joined"])
def test_a_view_kept_past_its_pass_is_not_overwritten_by_the_next(tmp_path, no_leaks, recs, second, ending):
    """The loop variable and a slice of a view near the end outlive the pass: the next pass -- views or
    bytes -- writes after what they pin while they live (here, through more than half the ring), and goes
    on through many laps once they are gone; so does a third.  A pass that ends on a multipart record
    (``joined``): joined, it is copied into the ring above the window being framed, past what its chunk
    releases (``ring_end``); the next pass's reader started at the last ``ring_end`` of the views kept,
    and wrote over the kept view of that record at once."""
    stream = recs if ending == "plain" else recs[:300] + [b"\x0a\x23\xd7\xce" * 300]  # (the magic: multipart)
    path = tmp_path / "v.rec"
    write_rec(path, stream)
    k = len(stream) - 6
    ch = _Channel(tmp_path, path, 3)
    try:
        with deadline(120), ch.reader(workers=1) as r:
            for i, v in enumerate(r.iter_views()):
                if i == k:
                    near_end = v[3:]
            last = v
            assert bytes(last) == stream[-1]
            got, seen = [], 0
            for x in (r.iter_views() if second == "views" else r):
                got.append(bytes(x))
                seen += len(x)
                if near_end is not None and seen > RING * 0.6:
                    assert bytes(last) == stream[-1] and bytes(near_end) == stream[k][3:]
                    near_end = last = v = None  # let go: the rest of the pass runs through many laps
            assert got == stream and near_end is None
            del x
            assert [bytes(x) for x in r.iter_views()] == stream
        assert ch.wait() == 0
    finally:
        ch.stop()


def test_views_held_across_a_pass_for_too_long_raise(tmp_path, no_leaks, recs):
    """A view of pass 1 kept through pass 2 pins the ring there as it would inside pass 1: a clear error
    once the reader has nowhere to go, the kept view intact."""
    path = tmp_path / "v.rec"
    write_rec(path, recs)
    ch = _Channel(tmp_path, path, 3)
    try:
        with deadline(120), ch.reader(workers=1) as r:
            for v in r.iter_views():
                pass
            with pytest.raises(PipelineError, match="^iter_views\\(\\): the reader process waits for input-ring "
                                                    "space that views still in use hold"):
                for x in r.iter_views():
                    pass
            assert bytes(v) == recs[-1]
            # a pass of bytes is held up the same way: the error says by what (it named iter_views())
            with pytest.raises(PipelineError, match=r"^the reader process waits for input-ring space that views "
                                                    r"kept from an earlier iter_views\(\) pass hold \(its last "
                                                    r"loop variable too: del it\)"):
                for x in r:
                    pass
            assert bytes(v) == recs[-1]
    finally:
        ch.stop()


def test_pipe_mode_channel_views(tmp_path, no_leaks, recs):
    """A SageMaker Pipe-mode channel (FIFOs fed by cat), raw passthrough as views, two epochs."""
    path = tmp_path / "v.rec"
    write_rec(path, recs)
    ch = _Channel(tmp_path, path, 2)
    try:
        with deadline(120), ch.reader(workers=1) as r:
            for epoch in range(2):
                views = r.iter_views()
                first = next(views)
                assert _is_view(first) and _in_shared_memory(first)
                got = [bytes(first)]
                del first  # (kept, it would pin the ring: see the tests above)
                assert got + [bytes(v) for v in views] == recs
        assert ch.wait() == 0
    finally:
        ch.stop()


@pytest.mark.parametrize("workers", [0, 2])
def test_mixed_fields_views_beside_decoded_values(tmp_path, no_leaks, workers):
    """``[Raw(), Json()]`` and ``{"raw": Raw(), "label": Json()}``: the raw field as views (of shared
    memory with decoder processes), the decoded one as usual."""
    rnd = random.Random(5)
    recs = []
    for i in range(1500):
        recs += [rnd.randbytes(rnd.randrange(0, 4000)), b'{"i": %d}' % i]
    path = tmp_path / "m.rec"
    write_rec(path, recs)
    with deadline(120):
        for fields in ([Raw(), Json()], {"raw": Raw(), "label": Json()}):
            with open(path, "rb") as f, ParallelReader(f, fields=fields, workers=workers, tuning=SMALL) as r:
                got = []
                for s in r.iter_views():
                    raw, label = (s["raw"], s["label"]) if isinstance(fields, dict) else s
                    assert _is_view(raw) and _in_shared_memory(raw) == (workers > 0)
                    got.append((bytes(raw), label))
                assert got == [(recs[2 * i], {"i": i}) for i in range(1500)]


def test_iter_views_refuses_batches_and_readers_without_raw_fields(tmp_path, no_leaks):
    path = tmp_path / "r.rec"
    write_rec(path, [b'{"a": 1}'] * 10)
    with ParallelReader(str(path), workers=1, batch_size=4) as r:
        with pytest.raises(ValueError, match=r"iter_views\(\) hands out samples one at a time: make the "
                                             r"ParallelReader with batch_size=None \(it has batch_size=4\)"):
            r.iter_views()
    with ParallelReader(str(path), fields=Json(), workers=1) as r:
        with pytest.raises(ValueError, match=r"no field is raw"):
            r.iter_views()


@pytest.mark.parametrize("workers", [0, 1])
def test_early_break_and_close_leave_kept_views_valid(tmp_path, no_leaks, recs, workers):
    path = tmp_path / "v.rec"
    write_rec(path, recs)
    with open(path, "rb") as f:
        r = ParallelReader(f, workers=workers, tuning=SMALL)
        kept = []
        try:
            for i, v in enumerate(r.iter_views()):
                if i in (690, 695, 699):
                    kept.append(v)
                if i == 700:
                    break
        finally:
            r.close()
    assert [bytes(v) for v in kept] == [recs[690], recs[695], recs[699]]
    assert bytes(v) == recs[700]
    del kept, v


@settings(max_examples=12, deadline=None)
@given(sizes=st.lists(st.sampled_from([0, 1, 3, 64, 1000, 9000, 40_000, 70_000, 140_000]), min_size=1,
                      max_size=120),
       keep=st.integers(0, 6), workers=st.sampled_from([0, 1]))
def test_views_against_a_plain_list(tmp_path_factory, sizes, keep, workers):
    """Any record sizes (up to over half the ring), each view kept for the next ``keep`` samples: the
    views read as the plain list of payloads, while kept and after."""
    rnd = random.Random(len(sizes) * 7 + keep)
    recs = [rnd.randbytes(k) for k in sizes * 4]
    path = tmp_path_factory.mktemp("hyp") / "h.rec"
    write_rec(path, recs)
    with deadline(60), open(path, "rb") as f, ParallelReader(f, workers=workers, tuning=SMALL) as r:
        held = []
        n = 0
        for v in r.iter_views():
            held.append((n, v))
            n += 1
            while len(held) > keep:
                j, old = held.pop(0)
                assert bytes(old) == recs[j]
        assert n == len(recs)
        assert all(bytes(old) == recs[j] for j, old in held)


def test_spawn_start_method_and_a_slow_fifo_with_views_kept(tmp_path, no_leaks):
    """Under ``spawn`` (the reader's job travels by pickle), from a FIFO whose writer is slow: a reader
    waiting for data is not a reader stuck behind the user's views -- five views kept at a time, no
    error, every byte as written."""
    import os
    from pipeline_helpers import feed_fifo
    recs = _records(600, 9)
    path = tmp_path / "v.rec"
    write_rec(path, recs)
    fifo = tmp_path / "slow.fifo"
    os.mkfifo(fifo)
    writer = feed_fifo(path, fifo, 16 << 10, 0.002)
    try:
        with deadline(120), ParallelReader(str(fifo), fields=None, workers=1,
                                           tuning=Tuning(ring_bytes=RING, start_method="spawn")) as r:
            held, got = [], []
            for v in r.iter_views():
                held.append(v)
                got.append(bytes(v))
                if len(held) > 5:
                    old = held.pop(0)
                    assert bytes(old) == recs[len(got) - 6]
            assert got == recs
        assert writer.wait(timeout=30) == 0
    finally:
        writer.kill()
        writer.wait()


@pytest.mark.parametrize("workers", [0, 1, 3])
@pytest.mark.parametrize("how", ["stream", "mapped"])
def test_damage_in_a_group_with_views(tmp_path, no_leaks, workers, how):
    """``[Raw(), Json()]`` groups with the magic of one record zeroed, in the ring-wrapping stream: skipped,
    the views are those of the other groups, paired as written; raised, after the views before it."""
    rnd = random.Random(8)
    recs = []
    for i in range(1200):
        recs += [rnd.randbytes(rnd.randrange(0, 3000)), b'{"i": %d}' % i]
    path = tmp_path / "d.rec"
    offsets = write_rec(path, recs)
    data = bytearray(path.read_bytes())
    data[offsets[2 * 700 + 1]:offsets[2 * 700 + 1] + 4] = b"\0\0\0\0"  # the label of group 700
    path.write_bytes(bytes(data))
    want = [(recs[2 * i], {"i": i}) for i in range(1200) if i != 700]
    with deadline(120):
        for on_error in ("skip", "raise"):
            f = open(path, "rb") if how == "stream" else None
            try:
                with ParallelReader(f if f is not None else str(path), fields=[Raw(), Json()], workers=workers,
                                    on_error=on_error, tuning=SMALL) as r:
                    got = []
                    if on_error == "skip":
                        got = [(bytes(raw), label) for raw, label in r.iter_views()]
                        assert got == want
                    else:
                        with pytest.raises(Exception, match=f"offset {offsets[2 * 700 + 1]}"):
                            for raw, label in r.iter_views():
                                got.append((bytes(raw), label))
                        assert got == want[:700]
            finally:
                if f is not None:
                    f.close()


def test_a_view_kept_for_good_of_a_file_read_in_place_holds_nothing_back(tmp_path, no_leaks):
    """One view kept from the first pass of a regular file: every later chunk was queued behind it, with a
    weak reference per payload (~88 B a record read, for as long as the view lived: ~110 MB an epoch of
    ImageNet).  A file read in place pins no ring space: nothing is queued, and every payload is still
    exact."""
    recs = [bytes([i % 256]) * (50 + i % 70) for i in range(3000)]
    path = tmp_path / "kept.rec"
    write_rec(path, recs)
    with ParallelReader(path, fields=None, workers=1) as r:
        first = list(r.iter_views())
        kept = first[1234]
        del first
        for _ in range(5):
            assert [bytes(v) for v in r.iter_views()] == recs
            held = r._res.pinned
            assert held is None or len(held) <= 1, len(held)
        assert bytes(kept) == recs[1234]


@pytest.mark.parametrize("damage", ["garbage", "oversized"])
@pytest.mark.parametrize("keep", [True, False])
def test_views_through_damage_longer_than_the_ring(tmp_path, no_leaks, damage, keep):
    """Under on_error="skip", a stream's damage (twice the ring of garbage; a record over
    max_record_bytes) was scanned for the next frame head in ring windows, released only behind the
    view in use: the loop variable -- and, once the user deleted it, the reader's own last item -- held
    the reader up ("views still in use hold ..."), 2 of 4 samples.  The scan reads into a buffer of its
    own now."""
    import io
    import struct
    rnd = random.Random(0)
    small = [bytes([i]) * 100 for i in range(4)]
    ring = 64 << 10
    noise = rnd.randbytes(2 * ring).replace(b"\x0a\x23\xd7\xce", b"XXXX")

    def frame(p):
        return struct.pack("<II", 0xCED7230A, len(p)) + p + b"\0" * (-len(p) % 4)

    bad = noise if damage == "garbage" else frame(noise[:ring + 4096])
    data = frame(small[0]) + frame(small[1]) + bad + frame(small[2]) + frame(small[3])
    limit = 64 << 20 if damage == "garbage" else ring
    with deadline(60), ParallelReader(io.BytesIO(data), None, workers=1, on_error="skip",
                                      tuning=Tuning(ring_bytes=ring, max_record_bytes=limit)) as r:
        got = []
        for v in r.iter_views():
            got.append(bytes(v))
            if not keep:
                del v
        assert got == small and r.stats.skipped_records == 1


def test_the_loop_variable_alone_never_stops_a_ring_that_wraps_early(tmp_path, no_leaks):
    """Past 16 MiB into the ring the reader wraps early to the ring's start when that is free; the bytes
    it skipped fell into the next chunk's span, and with views that chunk's view pinned them too: 61 of
    64 MiB for the loop variable alone, and the pass stopped after 8-23 records of 1-5 MiB in two parts
    (held groups, copied into the ring) from a FIFO.  Those bytes are a chunk of their own now."""
    import hashlib
    import os
    import struct
    from pipeline_helpers import feed_fifo
    path, want = tmp_path / "big.rec", []
    with open(path, "wb") as f:
        for i in range(30):
            rec = struct.pack("<Q", i) * (((1 + i % 5) << 20) // 8)
            want.append(hashlib.sha1(rec).hexdigest())
            h = len(rec) // 2 + 1
            for flag, part in ((1, rec[:h]), (3, rec[h:])):  # concat parts (SageMaker's wrapper)
                f.write(struct.pack("<II", 0xCED7230A, flag << 29 | len(part)) + part + b"\0" * (-len(part) % 4))
    fifo = tmp_path / "big.fifo"
    os.mkfifo(fifo)
    feeder = feed_fifo(path, fifo, 1 << 20, 0.0)
    try:
        with deadline(120), ParallelReader(str(fifo), None, workers=2, join="concat") as r:  # the default 64 MiB ring
            got = [hashlib.sha1(v).hexdigest() for v in r.iter_views()]
        assert got == want
    finally:
        feeder.kill()
        feeder.wait()


def _views_stream(seed, window, multipart):
    """300 records of sizes about a views pass's window (1/16 of the ring), half of one, two, and small
    ones, in a random order: most windows end with a record that does not fit.  ``multipart``: every
    third record in two parts (SageMaker's concat: joined, so its group is copied into the ring)."""
    import struct
    rnd = random.Random(seed)
    sizes = [rnd.choice([0, 100, 3000, window // 2 + 8, window - 64, window - 8, window + 8, 2 * window - 64,
                         2 * window - 8]) for _ in range(300)]
    recs = [bytes([i % 251]) * n for i, n in enumerate(sizes)]

    def frame(p, flag=0):
        return struct.pack("<II", 0xCED7230A, flag << 29 | len(p)) + p + b"\0" * (-len(p) % 4)

    return recs, b"".join(frame(p[:len(p) // 2 + 1], 1) + frame(p[len(p) // 2 + 1:], 3)
                          if multipart and i % 3 == 0 and p else frame(p) for i, p in enumerate(recs))


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 1 << 20), multipart=st.booleans(), ring=st.sampled_from([256 << 10, 4 << 20]))
@example(seed=0, multipart=False, ring=4 << 20)
@example(seed=3, multipart=True, ring=4 << 20)
def test_no_chunk_of_views_spans_a_stretch_of_garbage(seed, multipart, ring):
    """A view pins its chunk's whole ring span: from the chunk before's ring_end to its own.  A stretch of
    bytes that holds no group -- a window's end left when the next record did not fit, a window whose
    records were all copied out, the bytes skipped at a lap's end or by an early wrap -- lay inside the
    next chunk's span, so a chunk of one ~1/8-ring record spanned up to 3/8 of a small ring (0.5-0.9 MiB
    of garbage in one chunk of a 4 MiB ring here), and a few views kept stopped the pass.  Such a stretch
    of 1/8 of a window or more is now a chunk of its own, which no view pins: what a chunk spans beyond
    its payloads is frame heads and alignment (72 bytes a record at most) and less than 1/8 of a window."""
    import io
    from unittest import mock
    from parrecio.pipeline.messages import IN_RING
    from parrecio.pipeline.ring_windows import window_bytes
    from parrecio.pipeline.run import Run
    window = window_bytes(ring, 16)
    recs, data = _views_stream(seed, window, multipart)
    chunks = []
    give_back = Run._give_back_later

    def spy(self, c, refs):
        if c.place == IN_RING:
            chunks.append((c.ring_end, sum(c.lens), c.n))
        give_back(self, c, refs)

    with mock.patch.object(Run, "_give_back_later", spy), deadline(120), \
            ParallelReader(io.BytesIO(data), None, workers=2, join="concat", tuning=Tuning(ring_bytes=ring)) as r:
        got = [bytes(v) for v in r.iter_views()]
    assert got == recs
    # (in the ring: every record up to a window, and most up to two, the span a group may take)
    assert sum(n for _, _, n in chunks) >= len(recs) - 20
    prev, extra = 0, []
    for end, payload, n in chunks:
        if n:
            extra.append(end - prev - payload - 72 * n)
        prev = max(prev, end)
    assert max(extra) < window // 8, sorted(extra)[-5:]
