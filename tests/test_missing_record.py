"""A record missing from a group in an intact stream loses one sample, not every later one
(parrecio/pipeline/resync.py, ``Realigner.lead``; parrecio/pipeline/groups.py, ``GroupStream._grouped``).

``[JPEG][label]`` groups counted two by two: once a label is missing, every later group is
``(label, JPEG)`` and every later sample failed to decode.  Where the fields tell a sample's first record
(an image that only the first field reads), a second such record in a group that one opened starts the
next sample.  Checked against a reference written here (the samples whose records are all there, each
image with its own label), with workers 0/1/3, a ring the data wraps many times, shards, a resumed epoch
and an .idx; and that nothing is "realigned" into images paired with another sample's label: not
``fields=`` in another order or size than the stream's (its decode error keeps its hint), not a stream
whose records change order partway (which an extra label looks like: that is not realigned).
"""

from __future__ import annotations

import random

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from parrecio import CorruptRecordError, DecodeError, ParallelReader, RecordWriter, Tuning
from parrecio.decoders import ClassLabel, Image, Json
from image_helpers import jpeg
from pipeline_helpers import read_until_error
from source_helpers import make_jpeg, write_rec

FIELDS = [Image(), ClassLabel()]
SMALL_RING = Tuning(ring_bytes=64 << 10)


def _photo(i: int, big: bool = False) -> bytes:
    """Sample ``i``'s image: small ones, and photo-like ones of 28-46 KB (some more than half a 64 KiB ring)."""
    return jpeg(300 + 40 * (i % 4), 220, seed=i, quality=95) if big else make_jpeg(i, (24 + i % 7, 16))


def _stream(n: int, faults: dict, big=()) -> tuple:
    """Records of ``n`` samples ``[image_i][label i]``, with ``faults[i]`` = "label" (sample i's label
    missing), "image" (its image missing) or "extra" (a second label after it); and the reference for
    missing labels: the ids of the samples whose records are all there, in order."""
    records, whole = [], []
    for i in range(n):
        fault = faults.get(i)
        if fault != "image":
            records.append(_photo(i, i in big))
        if fault != "label":
            records.append(b"%d" % i)
        if fault == "extra":
            records.append(b"%d" % (n + i))
        if fault not in ("label", "image"):
            whole.append(i)
    return records, whole


def _read(path, workers, tuning=Tuning(), **kw):
    with ParallelReader(str(path), fields=FIELDS, workers=workers, tuning=tuning, on_error="skip", **kw) as r:
        got = [(int(label), image) for image, label in r]
        return got, r.stats.skipped


def _check(got, whole, records):
    """Each delivered image is its own sample's, exactly (decoded here from the record)."""
    assert [i for i, _ in got] == whole
    images = {int(rec): prev for prev, rec in zip(records, records[1:]) if rec.isdigit()}
    for i, image in got:
        np.testing.assert_array_equal(image, Image()(images[i]))


@pytest.mark.parametrize("workers", [0, 1, 3])
def test_a_missing_label_loses_one_sample(tmp_path, workers, no_leaks):
    faults = {3: "label", 7: "label", 8: "label", 15: "label", 20: "label", 23: "label"}
    records, whole = _stream(24, faults)
    path = tmp_path / "m.rec"
    write_rec(path, records)
    got, skipped = _read(path, workers)
    _check(got, whole, records)
    assert skipped == len(faults)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_missing_middle_record_of_three(tmp_path, workers, no_leaks):
    """``[Image(), ClassLabel(), Json()]``: a sample without its label, another without its JSON."""
    records, whole = [], []
    for i in range(12):
        records.append(_photo(i))
        if i != 4:
            records.append(b"%d" % i)
        if i != 8:
            records.append(orjson.dumps({"i": i}))
        if i not in (4, 8):
            whole.append(i)
    path = tmp_path / "three.rec"
    write_rec(path, records)
    with ParallelReader(str(path), fields=[Image(), ClassLabel(), Json()], workers=workers, on_error="skip") as r:
        got = [(int(label), meta["i"]) for _, label, meta in r]
        assert (got, r.stats.skipped) == ([(i, i) for i in whole], 2)


@pytest.mark.parametrize("fault", ["extra", "image"])
@pytest.mark.parametrize("workers", [0, 2])
def test_a_group_opened_by_a_label_is_not_realigned(tmp_path, fault, workers, no_leaks):
    """An extra label, or a label whose image is missing, opens a group with a label: the kinds cannot tell
    it from records that change order there, so every later sample fails to decode (counted), as before;
    none is delivered with another sample's label."""
    records, _ = _stream(12, {5: fault})
    path = tmp_path / "m.rec"
    write_rec(path, records)
    got, skipped = _read(path, workers)
    _check(got, list(range(5 if fault == "image" else 6)), records)
    assert skipped == 7  # six (label, JPEG) groups to the end, then the last label: a group cut short


@pytest.mark.parametrize("workers", [0, 2])
def test_records_that_change_order_partway_are_never_paired_across_samples(tmp_path, workers, no_leaks):
    """Six ``[JPEG][label]`` samples, then six ``[label][JPEG]`` (two producers' files in one Pipe-mode
    channel, or ``cat a.rec b.rec``): realigned at the first label out of place, each later image came with
    the next sample's label."""
    records = []
    for i in range(12):
        records += [_photo(i), b"%d" % i] if i < 6 else [b"%d" % i, _photo(i)]
    path = tmp_path / "flip.rec"
    write_rec(path, records)
    got, skipped = _read(path, workers)
    _check(got, list(range(6)), records)
    assert skipped == 6


def test_the_error_names_the_sample_that_lost_a_record(tmp_path, no_leaks):
    records, _ = _stream(8, {5: "label"})
    path = tmp_path / "m.rec"
    write_rec(path, records)
    start = sum(8 + -(-len(r) // 4) * 4 for r in records[:10])  # sample 5's image: record 10
    for workers in (0, 2):
        with ParallelReader(str(path), fields=FIELDS, workers=workers) as r:
            got, err = read_until_error(r, take=lambda s: int(s[1]))
        assert got == [0, 1, 2, 3, 4]
        assert isinstance(err, CorruptRecordError)
        assert (err.offset, err.index, err.source) == (start, 5, str(path))
        assert err.reason.startswith(f"the sample whose first record is at byte {start} has 1 of 2 records: "
                                     f"the record at byte {start + 8 + -(-len(records[10]) // 4) * 4} is a "
                                     f"JPEG image (")
        assert "which only field '0' reads, so it starts the next sample -- a record of this one is " \
               "missing" in err.reason


@pytest.mark.parametrize("workers", [0, 3])
def test_at_scale_on_a_ring_the_data_wraps_many_times(tmp_path, workers, no_leaks):
    rng = random.Random(5)
    n = 300
    faults = {i: "label" for i in rng.sample(range(2, n), 30)}
    faults = {i: f for i, f in faults.items() if i - 1 not in faults and i - 2 not in faults}
    big = set(rng.sample(range(n), 40))
    records, whole = _stream(n, faults, big)
    path = tmp_path / "m.rec"
    write_rec(path, records)
    assert sum(map(len, records)) > 20 * (64 << 10) and max(map(len, records)) > 32 << 10
    got, skipped = _read(path, workers, SMALL_RING)
    _check(got, whole, records)
    assert skipped == len(faults)


def test_shards_and_a_resumed_epoch_see_the_same_samples(tmp_path, no_leaks):
    records, whole = _stream(40, {4: "label", 9: "label", 13: "label", 30: "label"})
    path = tmp_path / "m.rec"
    write_rec(path, records)
    ranks = [[i for i, _ in _read(path, 1, num_shards=2, shard_index=k)[0]] for k in (0, 1)]
    assert sorted(ranks[0] + ranks[1]) == whole and not set(ranks[0]) & set(ranks[1])
    assert ranks[0] == whole[0::2] and ranks[1] == whole[1::2]
    with ParallelReader(str(path), fields=FIELDS, workers=1, on_error="skip") as r:
        it = iter(r)
        first = [int(next(it)[1]) for _ in range(12)]
        state = r.state_dict()
        del it
    with ParallelReader(str(path), fields=FIELDS, workers=2, on_error="skip") as r:
        r.load_state_dict(state)
        rest = [int(label) for _, label in r]
    assert first + rest == whole


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.sampled_from([None, None, "label"]), min_size=3, max_size=30))
def test_any_missing_labels_lose_only_their_samples(tmp_path, plan):
    # a missing label needs two whole samples before it (see README): one right after another is not told
    # apart from a stream whose samples have another number of records
    faults = {i: f for i, f in enumerate(plan) if f is not None and i >= 2}
    records, whole = _stream(len(plan), faults)
    path = tmp_path / "h.rec"
    write_rec(path, records)
    got, skipped = _read(path, 0)
    _check(got, whole, records)
    assert skipped == len(faults)


def _swapped(tmp_path, n=8):
    """``[label][JPEG]`` records: the fields' order reversed."""
    records = []
    for i in range(n):
        records += [b"%d" % i, make_jpeg(i)]
    path = tmp_path / "swapped.rec"
    write_rec(path, records)
    return path


@pytest.mark.parametrize("workers", [0, 2])
def test_fields_in_another_order_are_not_realigned_into_other_samples_labels(tmp_path, workers, no_leaks):
    # realigned at the first JPEG, [label][JPEG] read as [Image(), ClassLabel()] would give every image
    # the next sample's label: every sample fails instead, and the error says the order
    path = _swapped(tmp_path)
    got, skipped = _read(path, workers)
    assert (got, skipped) == ([], 8)
    with ParallelReader(str(path), fields=FIELDS, workers=workers) as r:
        items, err = read_until_error(r)
    assert items == [] and isinstance(err, DecodeError) and err.index == 0
    assert "fields in the records' order would be (ClassLabel(), Image())" in str(err)


@pytest.mark.parametrize("workers", [0, 2])
def test_fields_for_fewer_records_than_a_sample_has_keep_their_hint(tmp_path, workers, no_leaks):
    # [JPEG][label][JSON] read with two fields: one whole group starts the stream, and then no two in
    # a row -- the records' group size is not the fields', and the hint says so
    records = []
    for i in range(10):
        records += [make_jpeg(i), b"%d" % i, orjson.dumps({"i": i})]
    path = tmp_path / "three.rec"
    write_rec(path, records)
    with ParallelReader(str(path), fields=[Image(), Json()], workers=workers) as r:
        items, err = read_until_error(r)
    assert len(items) == 1 and isinstance(err, DecodeError) and err.index == 1
    assert "look like samples of 3 records (JPEG, JSON, JSON), not 2 as fields= lists" in str(err)


@pytest.mark.parametrize("workers", [0, 2])
def test_damage_after_a_missing_label_is_realigned_by_kinds_not_by_the_idx(tmp_path, workers, no_leaks):
    """With an .idx beside the file (it lists every record), damage after a missing label: the groups go on
    from the realigned record, not at the index's every other record, and its check that the last whole
    group starts at a listed group start blamed the index ("IndexMismatch: ... the index does not fit this
    stream")."""
    records, whole = _stream(24, {5: "label"})
    path = tmp_path / "i.rec"
    with RecordWriter(str(path), index=True) as w:
        for r in records:
            w.write(r)
    at = sum(8 + -(-len(r) // 4) * 4 for r in records[:29])  # sample 15's image (record 29): magic broken
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(b"\0\0\0\0")
    got, skipped = _read(path, workers)
    _check(got, [i for i in whole if i != 15], records)
    assert skipped == 2
