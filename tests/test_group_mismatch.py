"""A decode error says what the payload is, and which group size or field order the records suggest
(parrecio/pipeline/mismatch.py).

The cases a user meets: three fields for samples of two records, two for samples of three, and the fields
in another order than the records, read with workers=0 (the consumer decodes), workers=1 and 2 (decoder
processes), raising and skipping.  The messages are compared in full where they are ours, and each is
checked to name the sample and its offset; a mismatch the kinds do not show (a JSON label of the wrong
shape) gets the payload's description and no suggestion.
"""

from __future__ import annotations

import logging

import orjson
import pytest

from parrecio import DecodeError, ParallelReader
from parrecio.decoders import ClassLabel, Image, Json, Raw
from parrecio.decoders.sniff import describe
from parrecio.pipeline.mismatch import field_note, group_hint
from source_helpers import make_jpeg, write_rec

WORKERS = (0, 1, 2)


def manifest(tmp_path, name: str, per_sample: int, n: int = 12):
    """An augmented-manifest-like file: ``[jpeg][label]`` (``per_sample=2``) or ``[jpeg][label][meta]``
    (3); returns its path and its records."""
    records = []
    for i in range(n):
        records += [make_jpeg(i), orjson.dumps(i % 5), orjson.dumps({"id": i})][:per_sample]
    path = tmp_path / name
    write_rec(path, records)
    return str(path), records


def first_error(path: str, fields, workers: int, **kw) -> DecodeError:
    with ParallelReader(path, fields=fields, workers=workers, **kw) as reader:
        with pytest.raises(DecodeError) as info:
            for _ in reader:
                pass
    return info.value


@pytest.mark.parametrize("workers", WORKERS)
def test_three_fields_for_samples_of_two(tmp_path, workers, no_leaks):
    path, records = manifest(tmp_path, "two.rec", 2)
    fields = [Image(), ClassLabel(), ClassLabel()]
    err = first_error(path, fields, workers)
    assert err.index == 0 and err.offset == 0 and err.source == path
    where = "the first 3 records of " + path if workers == 0 else "the records around it"
    assert err.reason.startswith("field '2' (ClassLabel()): invalid JSON: ")
    assert err.reason.endswith(
        f"; the payload is {describe(records[2])}; {where} look like samples of 2 records (JPEG, JSON), not 3 "
        f"as fields= lists (Image(), ClassLabel(), ClassLabel()): give fields= one decoder per record of a "
        f"sample, in the records' order"), err.reason
    assert str(err) == f"{err.reason} (sample 0, byte offset 0 of {path})"


@pytest.mark.parametrize("workers", WORKERS)
def test_two_fields_for_samples_of_three(tmp_path, workers, no_leaks):
    """Sample 0 ([jpeg][label]) decodes; sample 1 starts with the meta JSON, where Image() is."""
    path, records = manifest(tmp_path, "three.rec", 3)
    err = first_error(path, [Image(), ClassLabel()], workers)
    assert err.index == 1
    where = "the first 4 records of " + path if workers == 0 else "the records around it"
    assert err.reason == (
        f"field '0' (Image()): not an image: the payload is {describe(records[2])}; {where} look like samples "
        f"of 3 records (JPEG, JSON, JSON), not 2 as fields= lists (Image(), ClassLabel()): give fields= one "
        f"decoder per record of a sample, in the records' order"), err.reason


@pytest.mark.parametrize("workers", WORKERS)
def test_fields_in_the_other_order(tmp_path, workers, no_leaks):
    path, records = manifest(tmp_path, "two.rec", 2)
    err = first_error(path, {"label": ClassLabel(), "image": Image()}, workers)
    assert (err.index, err.offset) == (0, 0)
    assert err.reason.startswith("field 'label' (ClassLabel()): invalid JSON: ")
    assert err.reason.endswith(
        f"; the payload is {describe(records[0])}; the sample's records are (JPEG, JSON): fields in the "
        f"records' order would be (Image(), ClassLabel())"), err.reason


@pytest.mark.parametrize("workers", (0, 2))
def test_a_shuffled_read_gets_the_order_check_only(tmp_path, workers, no_leaks):
    """A shuffle buffer's groups are not successive records: no group-size guess from them (workers=2);
    workers=0 still has the stream's first records, which are."""
    path, records = manifest(tmp_path, "three.rec", 3)
    err = first_error(path, [Image(), ClassLabel()], workers, shuffle=True, shuffle_buffer=4, seed=3)
    if workers:
        assert "look like samples" not in err.reason
    else:
        assert "look like samples of 3 records (JPEG, JSON, JSON), not 2" in err.reason


@pytest.mark.parametrize("workers", (0, 2))
def test_a_mismatch_the_kinds_do_not_show_gets_no_suggestion(tmp_path, workers, no_leaks):
    """[jpeg][{"id": i}] read as Image, ClassLabel: the JSON is the right kind, of the wrong shape."""
    records = []
    for i in range(6):
        records += [make_jpeg(i), orjson.dumps({"id": i})]
    path = str(tmp_path / "meta.rec")
    write_rec(path, records)
    err = first_error(path, [Image(), ClassLabel()], workers)
    assert err.reason.startswith("field '1' (ClassLabel()): a JSON object is not a class label")
    assert err.reason.endswith(f"; the payload is {describe(records[1])}"), err.reason


@pytest.mark.parametrize("workers", WORKERS)
def test_one_odd_payload_in_a_stream_grouped_right_gets_no_suggestion(tmp_path, workers, no_leaks):
    """An S3 error body saved as sample 4's image: fields= is right.  Its own record, odd among the
    records around it, made samples of 8 records "fit" them, and the error said to change fields=."""
    path, records = manifest(tmp_path, "odd.rec", 2)
    records[8] = b"<?xml version='1.0'?><Error><Code>AccessDenied</Code></Error>"
    write_rec(path, records)
    err = first_error(path, [Image(), ClassLabel()], workers)
    assert err.index == 4
    assert err.reason == f"field '0' (Image()): not an image: the payload is {describe(records[8])}"
    assert group_hint([Image(), ClassLabel()], ["text", "json"], ["jpeg", "json"] * 3 + ["text", "json"]
                      + ["jpeg", "json"] * 3).startswith("the records around it look like samples of 8")
    assert group_hint([Image(), ClassLabel()], ["text", "json"], ["jpeg", "json"] * 3 + ["text", "json"]
                      + ["jpeg", "json"] * 3, group_at=6) == ""  # its own records: any kind


@pytest.mark.parametrize("workers", (0, 2))
def test_skipped_samples_are_logged_with_the_hint(tmp_path, workers, caplog, no_leaks):
    path, records = manifest(tmp_path, "two.rec", 2)
    with caplog.at_level(logging.WARNING, logger="parrecio"):
        with ParallelReader(path, fields=[ClassLabel(), Image()], workers=workers, on_error="skip") as reader:
            got = list(reader)
            assert reader.stats.skipped == 12
    assert got == []
    skips = [r.getMessage() for r in caplog.records if r.getMessage().startswith("parrecio: skipped ")]
    assert len(skips) == 12
    assert all("fields in the records' order would be (Image(), ClassLabel())" in m for m in skips)


@pytest.mark.parametrize("workers", (0, 2))
def test_a_skipped_samples_log_line_is_cut_and_its_error_kept_whole(tmp_path, workers, caplog, no_leaks):
    """A decoder whose message holds its payload (here 200 KB of hex) logged it whole for every skipped
    sample (63 MB of log for three 20 MB samples); the line is cut to 2000 characters and says how long
    the message is.  A caught DecodeError (on_error="raise") still holds all of it."""
    from pipeline_helpers import Verbose, write_rec
    path = tmp_path / "v.rec"
    write_rec(path, [b"ok", b"BAD" + b"\x01" * 100_000, b"fine", b"BAD" + b"\x02" * 100_000])
    with caplog.at_level(logging.WARNING, logger="parrecio"):
        with ParallelReader(path, fields=Verbose(), workers=workers, on_error="skip") as reader:
            assert list(reader) == [2, 4] and reader.stats.skipped == 2
    skips = [r.getMessage() for r in caplog.records if r.getMessage().startswith("parrecio: skipped ")]
    assert len(skips) == 2 and all(2000 < len(m) < 2200 for m in skips), [len(m) for m in skips]
    assert all(m.startswith("parrecio: skipped field '0' (") and "cannot read 424144" in m and
               m.endswith("characters; the DecodeError holds them all)") for m in skips), skips[0][-200:]
    with ParallelReader(path, fields=Verbose(), workers=workers) as reader:
        with pytest.raises(DecodeError) as err:
            list(reader)
    assert ("424144" + "01" * 100_000) in str(err.value)


def test_a_decoder_without_payload_kinds_reads_anything():
    """User callables and Raw declare no kinds: a group they fail on gets no suggestion."""
    jpeg, js = make_jpeg(1), orjson.dumps(3)
    assert group_hint([lambda p: p, Raw()], ["json", "jpeg"], ["json", "jpeg"] * 4) == ""
    assert group_hint([Image(), Raw()], ["jpeg", "json"], None) == ""          # Image reads the JPEG
    assert group_hint([Json(), Raw()], ["jpeg", "json"], None) == (
        "the sample's records are (JPEG, JSON): fields in the records' order would be (Raw(), Json())")
    note = field_note("boom", [Json(), Raw()], [jpeg, js], 0)
    assert note == f"; the payload is {describe(jpeg)}; the sample's records are (JPEG, JSON): fields in the " \
                   f"records' order would be (Raw(), Json())"


def test_payload_named_once():
    """A decoder that already describes the payload (Image) is not told it again."""
    js = orjson.dumps({"a": 1})
    assert field_note(f"not an image: the payload is {describe(js)}", [Image()], [js], 0) == ""
    assert field_note("bad", [Image()], [b""], 0) == "; the payload is an empty payload"


def test_one_sample_seen_is_not_enough_for_a_size_guess():
    """(JSON, JPEG) alone fits samples of two: no size guess, the order check answers."""
    assert group_hint([Image(), Json()], ["json", "jpeg"], ["json", "jpeg"]) == (
        "the sample's records are (JSON, JPEG): fields in the records' order would be (Json(), Image())")
    assert group_hint([Image(), Json()], ["json", "jpeg"], ["jpeg", "json", "json", "jpeg"]).startswith(
        "the records around it look like samples of 3 records (JPEG, JSON, JSON), not 2")
