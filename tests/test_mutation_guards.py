"""Guards against mutations the rest of the suite let through: each test pins down exact behaviour
(payloads, order, counts, messages, stats counters) that a plausible wrong change would alter.

1. resuming an unshuffled epoch (state_dict / load_state_dict) yields exactly the samples after the
   saved position;
2. the crash-loop guard of the worker pool: its exact threshold and message;
3. a batch with a skipped sample inside its output slot is not a plain view of the slot;
4. a letterboxed image flipped is the mirror of the unflipped one, pad included;
5. the workers=0 shuffle buffer holds copies, not views of the read buffer (streams > 4 MiB);
6. drop_last with a skipped sample gives the same batches for any number of workers;
7. healthy runs re-run nothing and replace no worker;
8. one slow sample does not make the output-slot pool grow past its documented bound;
9. RandomResizedCrop's exact box (torchvision's get_params, top before left) and pixels.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import random
import signal
import time

import numpy as np
import pytest
from PIL import Image as PILImage

from parrecio import DecodeError, ParallelReader, PipelineError, RecordWriter, Tuning
from parrecio.decoders import Image, Mask, RandomResizedCrop
from parrecio.decoders.augment import sample_rng
from pipeline_helpers import FailOn, Fixed, KillOn, Pair, Ragged, deadline, digest_array, write_rec


# -- decoders (module level: the decoder processes import them by reference) -----------------------------

class Ident:
    """payload -> its bytes (a ragged value: travels back in the result frame)."""

    def __call__(self, payload):
        return bytes(payload)


class FixedFailOn(Fixed):
    """Fixed, but raises on payloads starting with ``marker`` (before writing anything)."""

    def __init__(self, marker: bytes, shape=(4, 3)):
        super().__init__(shape)
        self.marker = marker

    def decode_into(self, payload, out):
        if bytes(payload[:len(self.marker)]) == self.marker:
            raise ValueError(f"refusing {bytes(payload[:16])!r}")
        super().decode_into(payload, out)

    def __call__(self, payload):
        out = np.empty(self.shape, np.uint8)
        self.decode_into(payload, out)
        return out


class SlowOn(Fixed):
    """Fixed, after sleeping ``seconds`` on payloads starting with ``marker`` (one slow sample)."""

    def __init__(self, marker: bytes, seconds: float):
        super().__init__()
        self.marker, self.seconds = marker, seconds

    def decode_into(self, payload, out):
        if bytes(payload[:len(self.marker)]) == self.marker:
            time.sleep(self.seconds)
        super().decode_into(payload, out)


class DieFirst(Fixed):
    """SIGKILLs its own process on each of the first ``k`` payloads it is given, over all the processes
    of a reader (a counter file remembers; one worker at a time), then decodes like Fixed."""

    def __init__(self, k: int, counter_path: str):
        super().__init__()
        self.k, self.counter_path = k, counter_path

    def decode_into(self, payload, out):
        with open(self.counter_path, "a+b") as f:
            f.seek(0)
            died = len(f.read())
            if died < self.k:
                f.write(b"x")
                f.flush()
                os.fsync(f.fileno())
                os.kill(os.getpid(), signal.SIGKILL)
        super().decode_into(payload, out)


def _flat(batches):
    """Samples of a list of batches (arrays, or tuples of columns)."""
    out = []
    for b in batches:
        if isinstance(b, tuple):
            out.extend(zip(*b))
        else:
            out.extend(list(b))
    return out


def _same(a, b) -> bool:
    if isinstance(a, tuple):
        return isinstance(b, tuple) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(np.asarray(a), np.asarray(b)) and np.asarray(a).dtype == np.asarray(b).dtype
    return a == b


def _all_same(got, expected) -> bool:
    return len(got) == len(expected) and all(_same(g, e) for g, e in zip(got, expected))


@contextlib.contextmanager
def _opened(channel):
    """``channel`` itself; closed afterwards when it is a file object."""
    try:
        yield channel
    finally:
        if hasattr(channel, "close"):
            channel.close()


# == 1. resuming an unshuffled epoch ======================================================================

N_RESUME = 40


@pytest.fixture(scope="module")
def resume_data(tmp_path_factory):
    d = tmp_path_factory.mktemp("resume")
    singles = [b"sample-%02d|" % i + bytes(range(i * 3 % 50)) for i in range(N_RESUME)]
    write_rec(d / "single.rec", singles)
    pairs = [r for i in range(N_RESUME) for r in (b"img-%02d" % i + bytes(i), b"lbl-%02d" % i)]
    write_rec(d / "pair.rec", pairs)
    with RecordWriter(str(d / "pair_idx.rec"), index=str(d / "pair_idx.idx")) as w:
        for k, r in enumerate(pairs):
            w.write(r, key=k)
    # every third image holds the RecordIO magic at an aligned offset: written as a multipart record,
    # joined by the reader (such groups are held and copied, not read in place)
    magic = (0xCED7230A).to_bytes(4, "little")
    multi = [r if k % 6 else r[:8] + magic + r[8:] for k, r in enumerate(pairs)]
    write_rec(d / "multi.rec", multi)
    exp = {
        "single": [digest_array(r) for r in singles],
        "pair": [(pairs[2 * i], digest_array(pairs[2 * i + 1])) for i in range(N_RESUME)],
        "multi": [(multi[2 * i], digest_array(multi[2 * i + 1])) for i in range(N_RESUME)],
    }
    return d, exp


def _resume_case(resume_data, source):
    """(channel maker, fields, the uninterrupted epoch 0, whether the channel has more epochs, options)"""
    d, exp = resume_data
    if source == "single":
        return (lambda: d / "single.rec"), Fixed(), exp["single"], True, {}
    if source == "pair":
        return (lambda: d / "pair.rec"), [Ident(), Fixed()], exp["pair"], True, {}
    if source == "pair_idx":  # an .idx beside the file: unshuffled, still one stream
        return (lambda: d / "pair_idx.rec"), [Ident(), Fixed()], exp["pair"], True, {}
    if source == "multipart":
        return (lambda: d / "multi.rec"), [Ident(), Fixed()], exp["multi"], True, {}
    if source == "shuffle_buffer":  # no .idx: the reader's shuffle buffer; order from an uninterrupted run
        opts = dict(shuffle=True, seed=5, shuffle_buffer=8)
        with ParallelReader(d / "pair.rec", fields=[Ident(), Fixed()], workers=0, **opts) as r:
            whole = [(a, b.copy()) for a, b in r]
        assert sorted(a for a, _ in whole) == sorted(a for a, _ in exp["pair"]) and whole != exp["pair"]
        return (lambda: d / "pair.rec"), [Ident(), Fixed()], whole, False, opts
    assert source == "fileobj"  # a stream read into the ring (one epoch only)
    return (lambda: open(d / "pair.rec", "rb")), [Ident(), Fixed()], exp["pair"], False, {}


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("source, batch_size", [
    ("single", None), ("single", 4),   # one record a group: the reader's flat loop, unless resuming
    ("pair", None), ("pair", 4),
    ("pair_idx", 4), ("fileobj", None), ("multipart", 4), ("shuffle_buffer", None)])
def test_resume_yields_exactly_the_rest_of_the_epoch(resume_data, source, workers, batch_size, no_leaks):
    channel, fields, expected, reusable, opts = _resume_case(resume_data, source)
    taken = 13 if batch_size is None else 3  # samples, or batches of 4
    position = 13 if batch_size is None else 12
    first = []
    with deadline(30), _opened(channel()) as src, ParallelReader(src, fields=fields, workers=workers,
                                                                batch_size=batch_size, **opts) as r:
        for i, item in enumerate(r):
            first.append(item)
            if i == taken - 1:
                state = r.state_dict()
                break
    assert (state["epoch"], state["position"]) == (0, position)
    head = first if batch_size is None else _flat(first)
    assert _all_same(head, expected[:position])
    with deadline(30), _opened(channel()) as src, ParallelReader(src, fields=fields, workers=workers,
                                                                batch_size=batch_size, **opts) as r:
        r.load_state_dict(state)
        rest = list(r)
        assert r.stats.samples == N_RESUME - position
        assert r.state_dict()["epoch"] == 1 and r.state_dict()["position"] == 0
        if batch_size is not None:
            assert [len(b[0]) if isinstance(b, tuple) else len(b) for b in rest] == [4] * 7
            rest = _flat(rest)
        assert _all_same(rest, expected[position:])
        if reusable:  # the next pass is the whole next epoch
            again = list(r)
            again = again if batch_size is None else _flat(again)
            assert _all_same(again, expected)


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_at_the_very_end_and_at_the_start(resume_data, workers, no_leaks):
    channel, fields, expected, _, _ = _resume_case(resume_data, "pair")
    with ParallelReader(channel(), fields=fields, workers=workers) as r:
        r.load_state_dict({"epoch": 0, "position": N_RESUME - 1})
        last = list(r)
        assert _all_same(last, expected[-1:])
        r.load_state_dict({"epoch": 0, "position": 0})
        assert _all_same(list(r), expected)


# == 2. the crash-loop guard ==============================================================================

KEEP_DYING = ("decoder processes keep dying without finishing any task (the last: killed by SIGKILL): "
              "something outside kills them (the kernel's OOM killer: see `dmesg`; a job scheduler), or they "
              "crash as they start")


@pytest.fixture(scope="module")
def twenty(tmp_path_factory):
    recs = [b"twenty-%02d" % i for i in range(20)]
    path = tmp_path_factory.mktemp("crash") / "twenty.rec"
    write_rec(path, recs)
    return path, recs


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_decoders_that_always_die_end_the_run_with_the_keep_dying_error(twenty, on_error, no_leaks):
    """Every decode kills its process: not 20 poison records and 22 replacements, but the one clear
    PipelineError once 2 * workers + 3 processes in a row died without a result."""
    path, _ = twenty
    got = []
    with deadline(30), ParallelReader(path, fields=KillOn(b""), workers=2, on_error=on_error) as r:
        with pytest.raises(PipelineError) as ei:
            for s in r:
                got.append(s)
        assert type(ei.value) is PipelineError and not isinstance(ei.value, DecodeError)
        assert str(ei.value) == KEEP_DYING
        assert got == [] and r.stats.skipped == 0 and r.stats.samples == 0
        assert r.stats.workers_replaced <= 2 * 2 + 2


@pytest.mark.parametrize("deaths", [4, 5])
def test_crash_loop_guard_threshold_with_one_worker(twenty, tmp_path, deaths, no_leaks):
    """One worker: the guard allows 2 * 1 + 2 = 4 deaths in a row without a result and stops at the 5th.
    Death 1 orphans the task of all 20 groups (re-run one by one), blaming group 0 alone, which it was
    decoding (the progress board); death 2 is group 0 dying again (poison, skipped); deaths 3 and 4 are
    groups 1 and 2 dying once each (re-run again, after the others); then the decoder works."""
    path, recs = twenty
    dec = DieFirst(deaths, str(tmp_path / "deaths"))
    got = []
    with deadline(30), ParallelReader(path, fields=dec, workers=1, on_error="skip",
                                      tuning=Tuning(chunk_groups=20)) as r:  # one task of 20 groups
        if deaths == 4:
            got = [s.copy() for s in r]
            assert _all_same(got, [digest_array(x) for x in recs[1:]])
            assert (r.stats.skipped, r.stats.samples) == (1, 19)
            assert (r.stats.workers_replaced, r.stats.reruns) == (4, 4)
        else:
            with pytest.raises(PipelineError) as ei:
                for s in r:
                    got.append(s)
            assert str(ei.value) == KEEP_DYING
            assert got == [] and r.stats.samples == 0
            assert r.stats.workers_replaced == 4  # the 5th death raised before its replacement
            # the deaths have stopped: the next pass reads every sample (the dead worker stayed in the
            # pool, and every later pass ended at once with the same error)
            assert _all_same([s.copy() for s in r], [digest_array(x) for x in recs])
            assert r.stats.workers_replaced == 5 and all(p > 0 for p in r.worker_pids)
    assert os.path.getsize(tmp_path / "deaths") == deaths


# == 3. skipped samples inside a batch's slot ===========================================================

@pytest.mark.parametrize("workers", [0, 1, 2])
@pytest.mark.parametrize("n, bad", [(13, [10]), (8, [3]), (21, [2, 17, 19]), (16, [0, 7, 8, 15])])
def test_skipped_samples_inside_batches_give_exactly_the_other_rows(tmp_path, workers, n, bad, no_leaks):
    """Groups [image, label]: the image of the samples in ``bad`` fails (skipped).  Each batch holds
    exactly the next 8 good samples, in order: never the row a skipped sample left unwritten."""
    images = [(b"BAD" if i in bad else b"ok") + b"-%03d" % i for i in range(n)]
    labels = [b"label-%03d" % i for i in range(n)]
    path = tmp_path / "skip.rec"
    write_rec(path, [r for pair in zip(images, labels) for r in pair])
    good = [i for i in range(n) if i not in bad]
    expected = [good[i:i + 8] for i in range(0, len(good), 8)]
    with deadline(30), ParallelReader(path, fields=[FixedFailOn(b"BAD", (2, 5)), Ident()], workers=workers,
                                      batch_size=8, on_error="skip") as r:
        got = [(a.copy(), b) for a, b in r]
        assert r.stats.skipped == len(bad) and r.stats.samples == n - len(bad)
        assert r.stats.reruns == 0
    assert [len(a) for a, _ in got] == [len(e) for e in expected]
    for (a, b), idx in zip(got, expected):
        assert b == [labels[i] for i in idx]
        assert np.array_equal(a, np.stack([digest_array(images[i], (2, 5)) for i in idx]))


# == 4. letterbox + flip ====================================================================================

def _png(width, height, mode="RGB", seed=0) -> bytes:
    rng = np.random.default_rng(seed)
    shape = (height, width, 3) if mode == "RGB" else (height, width)
    buf = io.BytesIO()
    PILImage.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode).save(buf, "PNG")
    return buf.getvalue()


@pytest.mark.parametrize("src, size", [((20, 37), (32, 32)), ((33, 41), (24, 40)), ((11, 30), (16, 21))])
@pytest.mark.parametrize("kw", [dict(), dict(layout="CHW"), dict(mode="L"), dict(mean=0.5, std=0.25),
                                dict(layout="CHW", mean=(0.4, 0.5, 0.6), std=0.2)])
def test_letterbox_flipped_is_the_mirror_of_unflipped_pad_included(src, size, kw):
    width, height = src
    payload = _png(width, height)
    plain = Image(size=size, resize="letterbox", fill=(200, 30, 90) if kw.get("mode") != "L" else 77, **kw)
    flipped = Image(size=size, resize="letterbox", fill=plain.fill, flip=1.0, **kw)
    half = Image(size=size, resize="letterbox", fill=plain.fill, flip=0.5, **kw)
    # the horizontal pad is uneven (left != right): a flip must move the content
    scale, pad_x, _ = plain.letterbox_params(width, height)
    content_w = min(size[1], max(1, round(width * scale)))
    assert size[1] - content_w - pad_x != pad_x
    a = plain(payload)
    axis = 2 if kw.get("layout") == "CHW" else 1  # the width axis
    for key in (None, 0, 12345):
        assert np.array_equal(flipped(payload, key=key), np.flip(a, axis=axis))
    seen = set()
    for key in range(12):
        b = half(payload, key=key)
        is_flipped = half._plan_of(width, height, key).flip
        seen.add(is_flipped)
        assert np.array_equal(b, np.flip(a, axis=axis) if is_flipped else a)
        out = np.empty(half.output_spec.shape, half.output_spec.dtype)
        half.decode_into(payload, out, key=key)
        assert np.array_equal(out, b)
    assert seen == {False, True}


def test_letterboxed_mask_flipped_is_the_mirror_of_unflipped():
    rng = np.random.default_rng(3)
    buf = io.BytesIO()
    PILImage.fromarray(rng.integers(0, 5, (37, 20), dtype=np.uint8), "L").save(buf, "PNG")
    payload = buf.getvalue()
    plain = Mask(size=(32, 32), resize="letterbox", fill=255)
    flipped = Mask(size=(32, 32), resize="letterbox", fill=255, flip=1.0)
    a = plain(payload)
    assert (a[:, :7] == 255).all() and (a[:, 24:] == 255).all() and not (a[:, 7] == 255).all()
    assert np.array_equal(flipped(payload, key=1), a[:, ::-1])


# == 5. the workers=0 shuffle buffer on a stream larger than the read buffer =============================

@pytest.fixture(scope="module")
def big_pairs(tmp_path_factory):
    """~13 MiB, 2200 groups of two records that name their group: far more than the 4 MiB read buffer."""
    n = 2200
    path = tmp_path_factory.mktemp("bigshuffle") / "big.rec"
    with RecordWriter(str(path)) as w:
        for g in range(n):
            w.write((b"G%06d:A;" % g) * 330)   # 3 KiB
            w.write((b"G%06d:B;" % g) * 330)
    assert os.path.getsize(path) > 12 << 20
    return path, n


@pytest.mark.parametrize("fields", ["decoded", "raw"])
def test_shuffle_buffer_keeps_groups_whole_on_a_large_stream(big_pairs, fields, no_leaks):
    from parrecio.decoders import Raw
    path, n = big_pairs
    decs = [Ident(), Ident()] if fields == "decoded" else [Raw(), Raw()]
    orders = {}
    for workers in (0, 2):
        with deadline(60), ParallelReader(path, fields=decs, workers=workers, shuffle=True, seed=4,
                                          shuffle_buffer=700) as r:
            assert r.config.shuffle_mode == "buffer"
            order = []
            for a, b in r:
                g = int(a[1:7])
                assert a == (b"G%06d:A;" % g) * 330 and b == (b"G%06d:B;" % g) * 330, (workers, g)
                order.append(g)
        assert sorted(order) == list(range(n))
        assert order != list(range(n))
        orders[workers] = order
    assert orders[0] == orders[2]


def test_shuffle_buffer_of_a_file_object_keeps_groups_whole(big_pairs):
    path, n = big_pairs
    with open(path, "rb") as f, ParallelReader(f, fields=[Ident(), Ident()], workers=0, shuffle=True,
                                               seed=9, shuffle_buffer=900) as r:
        order = []
        for a, b in r:
            g = int(a[1:7])
            assert a == (b"G%06d:A;" % g) * 330 and b == (b"G%06d:B;" % g) * 330, g
            order.append(g)
    assert sorted(order) == list(range(n))


# == 6. drop_last with a skipped sample ======================================================================

@pytest.mark.parametrize("n, bad, sizes_keep", [
    (14, [3], [8, 5]),          # 13 delivered: the short last batch is dropped with drop_last
    (14, [11], [8, 5]),         # the skipped sample inside the short last batch
    (17, [3, 12], [8, 7]),
    (17, [16], [8, 8]),         # the skipped sample is the last one: 16 = two full batches
    (10, [0, 9], [8]),
])
def test_drop_last_with_skipped_samples_is_the_same_for_every_worker_count(tmp_path, n, bad, sizes_keep,
                                                                        no_leaks):
    """README: ``drop_last=True`` drops a short last batch -- the batches of the samples delivered, after
    the skipped ones left out (workers=0 has always done so).  ``sizes_keep``: the batch sizes with
    ``drop_last=False``."""
    recs = [(b"BAD" if i in bad else b"s") + b"%03d" % i for i in range(n)]
    path = tmp_path / "dl.rec"
    write_rec(path, recs)
    good = [digest_array(r) for i, r in enumerate(recs) if i not in bad]
    for drop_last, workers in [(True, 0), (True, 1), (True, 2), (False, 0), (False, 2)]:
        sizes = [s for s in sizes_keep if s == 8 or not drop_last]
        with deadline(30), ParallelReader(path, fields=FixedFailOn(b"BAD"), workers=workers, batch_size=8,
                                          drop_last=drop_last, on_error="skip") as r:
            got = [b.copy() for b in r]
            assert [len(b) for b in got] == sizes, (workers, drop_last)
            assert all(np.array_equal(b, np.stack(good[8 * i:8 * i + len(b)])) for i, b in enumerate(got))
            assert r.stats.skipped == len(bad), (workers, drop_last)
            assert len(r) == len(sizes)  # known from the complete pass


# == 7. healthy runs re-run nothing ==========================================================================

_HEALTHY = {
    "batched": dict(fields=Fixed(), batch_size=8, tuning=Tuning()),
    "batched_chunk5": dict(fields=Fixed(), batch_size=8, tuning=Tuning(chunk_groups=5)),
    "batched_chunk13": dict(fields=Fixed((2, 2)), batch_size=4, tuning=Tuning(chunk_groups=13, prefetch=3)),
    "unbatched_slot3_chunk7": dict(fields=Fixed(), tuning=Tuning(slot_samples=3, chunk_groups=7)),
    "unbatched_slot1": dict(fields=Fixed(), tuning=Tuning(slot_samples=1, chunk_groups=4)),
    "ragged": dict(fields=Ragged(), tuning=Tuning(chunk_groups=9)),
    "ragged_batched": dict(fields=Ragged(), batch_size=7),
    "tuple_spec": dict(fields=Pair(), batch_size=5, tuning=Tuning(chunk_groups=3)),
    "mixed_pair_slot4": dict(fields=[Fixed(), Ragged()], tuning=Tuning(slot_samples=4, chunk_groups=6)),
    "small_ring_stream": dict(fields=[Fixed(), Ident()], batch_size=6, stream=True,
                              tuning=Tuning(ring_bytes=64 << 10, chunk_groups=11)),
}


@pytest.fixture(scope="module")
def healthy_data(tmp_path_factory):
    rng = np.random.default_rng(11)
    recs = [rng.integers(0, 256, int(rng.integers(0, 3000)), dtype=np.uint8).tobytes() for _ in range(240)]
    path = tmp_path_factory.mktemp("healthy") / "h.rec"
    write_rec(path, recs)
    return path, recs


@pytest.mark.parametrize("case", list(_HEALTHY))
def test_healthy_runs_rerun_nothing_and_replace_no_worker(healthy_data, case, no_leaks):
    path, recs = healthy_data
    cfg = dict(_HEALTHY[case])
    stream = cfg.pop("stream", False)
    fields = cfg["fields"]
    nf = len(fields) if isinstance(fields, list) else 1
    groups = [tuple(recs[i:i + nf]) for i in range(0, len(recs), nf)]
    decs = fields if isinstance(fields, list) else [fields]
    expected = [tuple(d(p) for d, p in zip(decs, g)) for g in groups]
    if not isinstance(fields, list):
        expected = [e[0] for e in expected]
    with deadline(30), _opened(open(path, "rb") if stream else path) as src, \
            ParallelReader(src, workers=2, **cfg) as r:
        for _ in range(1 if stream else 2):  # two epochs on a file
            items = list(r)
            if cfg.get("batch_size"):
                items = _flat(items)
            assert _all_same(items, expected)
        pids = r.worker_pids
        st = r.stats
        assert (st.reruns, st.workers_replaced, st.skipped) == (0, 0, 0), st
        assert len(set(pids)) == 2
        assert sum(st.decoded.values()) == len(groups) * (1 if stream else 2)
        assert set(st.decoded) == set(pids)  # only the first two processes ever decoded


# == 8. the output-slot pool stays bounded while one sample is slow ==========================================

@pytest.fixture(scope="module")
def slow_stream(tmp_path_factory):
    recs = [b"s%05d" % i for i in range(2400)]
    recs[5] = b"SLOW" + recs[5]
    path = tmp_path_factory.mktemp("slow") / "slow.rec"
    write_rec(path, recs)
    return path, recs


@pytest.mark.parametrize("workers, prefetch, chunk", [(2, 2, None), (3, 1, 8)])
def test_one_slow_sample_does_not_grow_the_slot_pool(slow_stream, workers, prefetch, chunk, no_leaks):
    """README "Zero-copy and memory": output slots for ``workers * prefetch`` tasks (two batches each by
    default) plus two; more only when the user holds every slot.  A slow sample holds back delivery:
    chunks behind it wait for slots, they do not get new ones."""
    path, recs = slow_stream
    batch = 8
    task = chunk or 2 * batch
    bound = math.ceil(workers * prefetch * task / batch) + 2
    peak = 0
    got = []
    with deadline(30), ParallelReader(path, fields=SlowOn(b"SLOW", 1.0), workers=workers, batch_size=batch,
                                      tuning=Tuning(prefetch=prefetch, chunk_groups=chunk)) as r:
        for i, b in enumerate(r):
            got.append(b.copy())
            del b
            if i % 10 == 0:
                peak = max(peak, r.telemetry()["queues"]["slots"])
        peak = max(peak, r.telemetry()["queues"]["slots"])
        assert r.stats.reruns == 0
    assert peak <= bound, (peak, bound)
    assert np.array_equal(np.concatenate(got), np.stack([digest_array(x) for x in recs]))


def test_a_pass_ended_by_an_error_frees_its_slots_for_the_next(slow_stream, no_leaks):
    """One sample per slot (``batch_size=1``) and long tasks (``chunk_groups=17``); pass 0 ends with a
    decode error.  The error's traceback held the run's frame, and the frame the delivered chunk's list
    of spans (their leases, 17 slots) in a reference cycle that only the garbage collector breaks: pass
    1 found those slots taken and grew the pool past the bound, 37 slots for 36 (the long differential
    profile).  Now the spans are dropped once delivered."""
    import gc
    path, recs = slow_stream
    workers, prefetch, chunk = 1, 2, 17
    bound = math.ceil(workers * prefetch * chunk / 1) + 2
    gc.disable()  # (the cycle must not be broken by a collection that happens to run)
    try:
        with deadline(60), ParallelReader(path, fields=FailOn(recs[300]), workers=workers, batch_size=1,
                                          tuning=Tuning(prefetch=prefetch, chunk_groups=chunk)) as r:
            got = 0
            with pytest.raises(DecodeError) as info:
                for b in r:
                    got += 1
                    del b
            assert got == 300 and info.value.index == 300
            del info
            peak, got = 0, 0
            with pytest.raises(DecodeError):  # pass 1 ends at the same sample
                for i, b in enumerate(r):
                    assert np.array_equal(b[0], digest_array(recs[i]))
                    got += 1
                    del b
                    peak = max(peak, r.telemetry()["queues"]["slots"])
            assert got == 300
    finally:
        gc.enable()
    assert peak <= bound, (peak, bound)


# == 9. RandomResizedCrop's exact box and pixels =============================================================

def _splitmix_key(seed, epoch, shard, index):
    """decoders/base.py's sample_key, written again: splitmix64 steps over seed, epoch, shard, index."""
    m = (1 << 64) - 1

    def mix(state, value):
        z = (state + (value & m) + 0x9E3779B97F4A7C15) & m
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
        return z ^ (z >> 31)

    return mix(mix(mix(mix(0, seed), epoch), shard), index)


def _torchvision_box(width, height, key, scale, ratio):
    """torchvision ``RandomResizedCrop.get_params`` (returns top i, left j, h, w; draws: area, log-ratio,
    then ``i`` in [0, height - h], then ``j`` in [0, width - w]) with ``random.Random(key)`` for torch's
    generator.  As ``(x, y, w, h)`` = ``(j, i, w, h)``."""
    rng = random.Random(key)
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect_ratio = math.exp(rng.uniform(log_ratio[0], log_ratio[1]))
        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < w <= width and 0 < h <= height:
            i = rng.randint(0, height - h)
            j = rng.randint(0, width - w)
            return j, i, w, h
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        h, w = height, int(round(height * max(ratio)))
    else:
        w, h = width, height
    return (width - w) // 2, (height - h) // 2, w, h


def _coordinate_png(width, height) -> bytes:
    """R = x, G = y (mod 256), B = x // 256 * 16 + y // 256: every pixel says where it is."""
    y, x = np.mgrid[0:height, 0:width]
    arr = np.stack([x % 256, y % 256, (x // 256) * 16 + y // 256], axis=-1).astype(np.uint8)
    buf = io.BytesIO()
    PILImage.fromarray(arr, "RGB").save(buf, "PNG")
    return buf.getvalue()


@pytest.mark.parametrize("width, height, scale, ratio", [
    (300, 120, (0.08, 1.0), (3 / 4, 4 / 3)),
    (90, 400, (0.02, 0.3), (0.5, 2.0)),
    (257, 191, (0.05, 0.5), (3 / 4, 4 / 3)),
])
def test_random_resized_crop_box_is_torchvisions_draw_for_draw(width, height, scale, ratio):
    crop = RandomResizedCrop(scale=scale, ratio=ratio)
    differ = 0
    for index in range(200):
        key = _splitmix_key(7, 1, 0, index)
        ref = _torchvision_box(width, height, key, scale, ratio)
        assert crop.box(width, height, 24, 24, sample_rng(key)) == tuple(float(v) for v in ref), index
        differ += ref[0] != ref[1]
    assert differ > 150


def test_random_resized_crop_fallback_is_the_centred_box():
    crop = RandomResizedCrop(scale=(0.9, 1.0), ratio=(3.0, 4.0))  # never fits a tall image: the fallback
    for key in range(20):
        assert crop.box(100, 400, 8, 8, sample_rng(key)) == (0.0, (400 - 33) // 2, 100.0, 33.0)
    assert crop.box(100, 400, 8, 8, sample_rng(0)) == tuple(float(v) for v in
                                                            _torchvision_box(100, 400, 0, (0.9, 1.0), (3.0, 4.0)))


@pytest.mark.parametrize("workers", [0, 2])
def test_random_resized_crop_pixels_are_the_reference_crop(tmp_path, workers, no_leaks):
    """Through the pipeline: sample p of epoch e gets key sample_key(seed, e, 0, p); its pixels are
    PIL's crop of the reference box, resized with BILINEAR (torchvision's resized_crop), then the flip
    drawn after the box."""
    sizes = [(300, 120), (120, 300), (211, 150), (64, 200)] * 3
    payloads = [_coordinate_png(w, h) for w, h in sizes]
    path = tmp_path / "crops.rec"
    write_rec(path, payloads)
    dec = Image(size=(20, 28), crop=RandomResizedCrop(scale=(0.1, 0.6)), flip=0.5)
    with deadline(30), ParallelReader(path, fields=dec, workers=workers, seed=3) as r:
        r.set_epoch(2)
        got = [a.copy() for a in r]
    flips = 0
    for p, ((w, h), payload, a) in enumerate(zip(sizes, payloads, got)):
        key = _splitmix_key(3, 2, 0, p)
        x, y, bw, bh = _torchvision_box(w, h, key, (0.1, 0.6), (3 / 4, 4 / 3))
        rng = random.Random(key)
        _torchvision_box_draws(rng, w, h, (0.1, 0.6), (3 / 4, 4 / 3))
        flip = rng.random() < 0.5
        flips += flip
        image = PILImage.open(io.BytesIO(payload)).convert("RGB")
        ref = image.crop((x, y, x + bw, y + bh)).resize((28, 20), PILImage.Resampling.BILINEAR)
        if flip:
            ref = ref.transpose(PILImage.Transpose.FLIP_LEFT_RIGHT)
        assert np.array_equal(a, np.asarray(ref)), p
    assert 0 < flips < len(sizes)


def _torchvision_box_draws(rng, width, height, scale, ratio):
    """Advance ``rng`` past get_params' draws (what comes after is the flip's)."""
    area = height * width
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect_ratio = math.exp(rng.uniform(math.log(ratio[0]), math.log(ratio[1])))
        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < w <= width and 0 < h <= height:
            rng.randint(0, height - h)
            rng.randint(0, width - w)
            return
