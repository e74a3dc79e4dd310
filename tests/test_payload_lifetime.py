"""A decoder's value never points into memory the pipeline reuses.

A payload is a read-only view of the reader's buffer, the ring or a mapped file, valid during the call
(docs/ARCHITECTURE.md).  ``np.frombuffer(payload)`` -- the usual decoder of raw numeric records -- holds
that view without an export that ``memoryview.release()`` would notice: with ``workers=0`` a third of the
samples were silently other samples' bytes (the reader's buffer had moved on), and a value over a group's
earlier record (a ``bytes`` object freed with the group) pointed at freed memory.  Such a field is now
decoded from a ``bytes`` copy, which its value keeps alive."""

from __future__ import annotations

import io

import numpy as np
import pytest

from parrecio import ParallelReader, Tuning
from parrecio.pipeline.decode import DecodePlan
from pipeline_helpers import write_rec


def as_array(payload):
    return np.frombuffer(payload, np.uint8)


def tail(payload):
    return np.frombuffer(payload, np.uint8)[1:].reshape(-1, 1)  # an array over an array over the view


def record(payload):
    return {"head": bytes(payload[:1]), "body": np.frombuffer(payload[1:], np.uint8)}


class _Box:
    def __init__(self, x):
        self.x = x


# Values that hold the payload's memory in other ways, each -> the bytes it shows
HOLDERS = {
    "ndarray(buffer=)": (lambda p: np.ndarray((len(p),), np.uint8, buffer=p), lambda v: v.tobytes()),
    "stride_tricks": (lambda p: np.lib.stride_tricks.sliding_window_view(np.frombuffer(p, np.uint8), 1)[:, 0],
                      lambda v: v.tobytes()),
    "nested": (lambda p: {"meta": {"n": len(p)}, "arrays": {"x": np.frombuffer(p, np.uint8)}},
               lambda v: v["arrays"]["x"].tobytes()),
    "many": (lambda p: [np.frombuffer(p, np.uint8)] + [np.zeros(1)] * 80, lambda v: v[0].tobytes()),
    "attribute": (lambda p: _Box(np.frombuffer(p, np.uint8)), lambda v: v.x.tobytes()),
    "memoryview methods": (lambda p: (p[:1].tobytes(), np.frombuffer(p.cast("B")[1:], np.uint8)),
                           lambda v: v[0] + v[1].tobytes()),
    "the view itself": (lambda p: p, lambda v: v.tobytes()),
    "the view in a dict": (lambda p: {"v": p, "n": len(p)}, lambda v: v["v"].tobytes()[:v["n"]]),
    "a slice of the view": (lambda p: (p[:1], p[1:]), lambda v: v[0].tobytes() + v[1].tobytes()),
}


@pytest.mark.parametrize("workers", [0, 1])
@pytest.mark.parametrize("holder", sorted(HOLDERS))
def test_values_that_hold_the_payload_in_other_ways(tmp_path, holder, workers):
    """A value over the payload at any depth, or through an array's base that is no array, was not
    noticed (233 of 3000 samples other samples' bytes with workers=0); a field given copies got ``bytes``,
    on which a decoder's memoryview methods (``.tobytes()``, ``.cast()``) fail.  With workers, a value that
    is or holds the payload's memoryview failed to pickle (a DecodeError per sample); it comes back as a
    read-only memoryview of its bytes, as with workers=0."""
    recs = _records(3000)
    path = tmp_path / "h.rec"
    write_rec(path, recs)
    dec, shows = HOLDERS[holder]
    with ParallelReader(path, fields=dec, workers=workers) as r:
        values = list(r)
    assert [shows(v) for v in values] == recs
    views = {"the view itself": lambda v: [v], "the view in a dict": lambda v: [v["v"]],
             "a slice of the view": list}.get(holder, lambda v: [])
    assert all(type(m) is memoryview and m.readonly and m.format == "B" for v in values for m in views(v))


def _records(n: int):
    rng = np.random.default_rng(5)
    return [rng.integers(0, 256, int(rng.integers(1, 3000)), dtype=np.uint8).tobytes() for _ in range(n)]


@pytest.mark.parametrize("workers", [0, 1])
@pytest.mark.parametrize("source", ["file", "stream"])
def test_arrays_over_the_payload_are_the_records_bytes(tmp_path, workers, source):
    recs = _records(1500)
    path = tmp_path / "a.rec"
    write_rec(path, recs)
    channel = path if source == "file" else io.BytesIO(path.read_bytes())
    tuning = Tuning(ring_bytes=1 << 20)  # the ring wraps many times
    with ParallelReader(channel, fields=[as_array, tail], workers=workers, tuning=tuning) as r:
        got = list(r)
    assert len(got) == len(recs) // 2
    for i, (a, b) in enumerate(got):
        assert a.tobytes() == recs[2 * i], i  # the group's first record: a bytes object freed with it
        assert b.shape == (len(recs[2 * i + 1]) - 1, 1) and b.tobytes() == recs[2 * i + 1][1:], i


@pytest.mark.parametrize("workers", [0, 1])
@pytest.mark.parametrize("source", ["file", "stream"])
@pytest.mark.parametrize("batch_size", [None, 7])
def test_one_field_of_arrays_over_the_payload(tmp_path, workers, source, batch_size):
    """One ragged field, unbatched: ``workers=0`` hands each value out as the reader steps on (its
    fast path for tiny records); batched, the values wait for their batch."""
    recs = _records(3000)
    path = tmp_path / "a.rec"
    write_rec(path, recs)
    channel = path if source == "file" else io.BytesIO(path.read_bytes())
    with ParallelReader(channel, fields=as_array, workers=workers, batch_size=batch_size) as r:
        got = [a for item in r for a in (item if batch_size else [item])]
    assert [a.tobytes() for a in got] == recs


@pytest.mark.parametrize("workers", [0, 2])
def test_arrays_in_a_record_of_values(tmp_path, workers):
    recs = _records(800)
    path = tmp_path / "d.rec"
    write_rec(path, recs)
    with ParallelReader(path, fields=record, workers=workers, batch_size=None) as r:
        got = list(r)
    assert [g["head"] + g["body"].tobytes() for g in got] == recs


def test_only_a_field_whose_value_holds_its_payload_gets_copies():
    calls = []

    def counted(dec):
        def call(p):
            assert isinstance(p, memoryview) and p.readonly
            calls.append(type(p.obj).__name__)  # a view of the payload, or of a bytes copy
            return dec(p)
        return call

    plan = DecodePlan([counted(bytes), counted(as_array)], [None, None], [False, False])
    vals = plan.decode([memoryview(b"ab"), memoryview(b"cd")], [], None)
    assert vals[0] == b"ab" and vals[1].tobytes() == b"cd"
    # the second decoder ran twice: on the view, then on a copy its value keeps
    assert calls == ["ndarray", "ndarray", "bytes"] and plan.copies == [False, True]
    buf = bytearray(b"ef")
    vals = plan.decode([memoryview(b"gh"), memoryview(buf)], [], None)
    buf[:] = b"zz"
    assert vals[1].tobytes() == b"ef" and calls[3:] == ["ndarray", "bytes"]
