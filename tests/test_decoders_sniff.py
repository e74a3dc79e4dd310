"""sniff() and guess_fields()."""

from __future__ import annotations

import numpy as np
import pytest

from image_helpers import encode, jpeg, photo, png
from parrecio.decoders import guess_fields, sniff
from parrecio.decoders.sniff import KINDS, PREFIX, describe
from parrecio.recordio.irheader import IRHeader, pack

SMALL = np.ascontiguousarray(photo(16, 12))


@pytest.mark.parametrize("payload,kind", [
    (jpeg(16, 12), "jpeg"),
    (png(16, 12), "png"),
    (encode(SMALL, "GIF"), "gif"),
    (encode(SMALL, "BMP"), "bmp"),
    (encode(SMALL, "TIFF"), "tiff"),
    (b"RIFF\x24\x00\x00\x00WEBPVP8 ", "webp"),
    (b'{"image_size": []}', "json"),
    (b"\xef\xbb\xbf  [1, 2]", "json"),
    (b'"3"', "json"), (b"3", "json"), (b"-0.5", "json"), (b"true", "json"), (b"null", "json"),
    (b"\n\t 42 \n", "json"),
    (b"nice day", "text"), (b"3 apples", "text"), (b"{broken", "text"), (b"caf\xc3\xa9", "text"),
    (b"   ", "text"),
    (b"", "empty"),
    (b"\x00\x01\x02", "other"), (b"\xff\xfe{", "other"), (b"abc\x00def", "other"),
    (b"BMW is a car brand", "text"),
    (pack(IRHeader(0, 1.0, 0, 0), jpeg(16, 12)), "other"),
])
def test_sniff(payload, kind):
    assert sniff(payload) == kind
    assert kind in KINDS


def test_sniff_long_payloads_use_the_prefix():
    long_json = b'{"a": "' + b"x" * (2 * PREFIX) + b'"}'
    assert sniff(long_json) == "json"
    assert sniff(b"hello " * PREFIX) == "text"
    # a multi-byte character cut by the prefix boundary is still text
    cut = b"a" * (PREFIX - 1) + "é".encode() + b"b" * 10
    assert sniff(cut) == "text"
    assert sniff(b"a" * (PREFIX - 1) + b"\xc3" + b"(" * 10) == "text"  # cut: cannot tell, benefit of doubt


def test_sniff_bytes_like():
    payload = png(16, 12)
    for form in (bytearray(payload), memoryview(payload), np.frombuffer(payload, np.uint8)):
        assert sniff(form) == "png"


def test_describe_names_kind_and_image_records():
    assert "JSON text" in describe(b'{"a": 1}')
    assert "ImageRecord" in describe(pack(IRHeader(0, [1.0, 2.0], 0, 0), jpeg(16, 12)))
    assert describe(b"") == "an empty payload"


@pytest.mark.parametrize("kinds,expected", [
    (["jpeg", "json"] * 4, ("jpeg", "json")),
    (["jpeg", "json", "json"] * 3, ("jpeg", "json", "json")),
    (["other"] * 5, ("other",)),
    (["jpeg", "json", "png", "json", "jpeg"], ("image", "json")),
    (["jpeg", "json", "jpeg", "text"], ("jpeg", "text")),
    (["jpeg", "json", "png", "empty"], ("image", "json")),
    (["jpeg"], ("jpeg",)),
])
def test_guess_fields(kinds, expected):
    samples = {"jpeg": jpeg(16, 12), "png": png(16, 12), "json": b'{"a": 1}', "text": b"hello",
               "other": b"\x00\x01", "empty": b""}
    assert guess_fields([samples[k] for k in kinds]) == expected


def test_guess_fields_gives_up_clearly():
    payloads = [jpeg(16, 12), b"{}", b"\x00", b"{}", b"{}", b"\x00\x01", jpeg(16, 12)]
    with pytest.raises(ValueError, match="no group size"):
        guess_fields(payloads, max_group=2)
    with pytest.raises(ValueError):
        guess_fields([])
