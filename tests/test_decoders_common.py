"""What every decoder of parrecio.decoders must do: pickle, compare, repr, keep its spec honest."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from image_helpers import gt_boxes_json, jpeg, mask_png, palette_mask
from parrecio.decoders import (BoundingBoxes, ClassLabel, Image, ImageRecord, Json, Mask, Raw, guess_fields,
                               sniff)
from parrecio.decoders.base import ArraySpec, spec_of, write_into
from parrecio.recordio.irheader import IRHeader, pack

JPEG = jpeg(160, 120)
CASES = [
    (Image(), JPEG),
    (Image(size=(32, 48), resize="letterbox", fill=(1, 2, 3), layout="CHW", draft=2.0), JPEG),
    (Image(size=40, mode="L", resize="shorter", resample="lanczos", reducing_gap=2.0, exif_transpose=True), JPEG),
    (Image(size=40, mode="keep", formats=["JPEG"]), JPEG),
    (Mask(), mask_png(palette_mask(40, 30))),
    (Mask(size=20, resize="letterbox", fill=255, colors=["#000000", "#ff0000"], unknown=9),
     mask_png(palette_mask(40, 30))),
    (BoundingBoxes(), gt_boxes_json([(1, 2, 3, 4, 5)])),
    (BoundingBoxes(normalize=True, max_boxes=4, truncate=True, image=Image(size=32, resize="letterbox")),
     gt_boxes_json([(1, 2, 3, 4, 5)])),
    (ClassLabel(), b"3"),
    (ClassLabel(dtype=np.float32, num_classes=5, multi_label=True, class_names=["a", "b", "c", "d", "e"]),
     b'["a", 3]'),
    (ClassLabel(multi_label=True), b"[1, 2]"),
    (ImageRecord(), pack(IRHeader(0, 1.0, 0, 0), JPEG)),
    (ImageRecord(Image(size=16), label_width=2), pack(IRHeader(0, [1, 2], 0, 0), JPEG)),
]


def same(a, b) -> bool:
    if isinstance(a, tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    return a == b


@pytest.mark.parametrize("decoder,payload", CASES, ids=[repr(c[0]) for c in CASES])
def test_pickle_round_trip_equality_and_repr(decoder, payload):
    clone = pickle.loads(pickle.dumps(decoder))
    assert clone == decoder and hash(clone) == hash(decoder)
    assert repr(clone) == repr(decoder) and repr(decoder).startswith(type(decoder).__name__ + "(")
    assert same(clone(payload), decoder(payload))
    assert spec_of(clone) == spec_of(decoder)


@pytest.mark.parametrize("decoder,payload", CASES, ids=[repr(c[0]) for c in CASES])
def test_values_match_output_spec(decoder, payload):
    spec = spec_of(decoder)
    value = decoder(payload)
    if spec is None:
        return
    if isinstance(spec, ArraySpec):
        assert value.shape == spec.shape and value.dtype == spec.dtype
        out = np.empty(spec.shape, spec.dtype)
        assert write_into(decoder, payload, spec, out) is None
        assert same(out, value)
        return
    outs = tuple(None if s is None else np.empty(s.shape, s.dtype) for s in spec)
    rest = write_into(decoder, payload, spec, outs)
    for s, v, o, r in zip(spec, value, outs, rest):
        if s is None:
            assert same(r, v)
        else:
            assert r is None and v.shape == s.shape and v.dtype == s.dtype and same(o, np.asarray(v))


def test_inequality_and_exports():
    assert Image() != Image(size=3) and Image() != Mask() and BoundingBoxes() != BoundingBoxes(max_boxes=1)
    assert ClassLabel() != ClassLabel(num_classes=3) and ImageRecord() != ImageRecord(label_width=1)
    assert Raw() == Raw() and Json() == Json()
    assert callable(sniff) and callable(guess_fields)


@pytest.mark.parametrize("decoder,payload", CASES, ids=[repr(c[0]) for c in CASES])
def test_decoders_are_frozen_dataclasses_whose_repr_rebuilds_them(decoder, payload):
    import dataclasses

    namespace = {"Image": Image, "Mask": Mask, "BoundingBoxes": BoundingBoxes, "ClassLabel": ClassLabel,
                 "ImageRecord": ImageRecord}
    rebuilt = eval(repr(decoder), namespace)
    assert rebuilt == decoder and hash(rebuilt) == hash(decoder) and same(rebuilt(payload), decoder(payload))
    assert dataclasses.is_dataclass(decoder)
    name = dataclasses.fields(decoder)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(decoder, name, getattr(decoder, name))


def test_repr_names_only_what_differs_from_the_defaults():
    assert repr(Image()) == "Image()" and repr(Raw()) == "Raw()" and repr(Json()) == "Json()"
    assert repr(Image(size=224, fill=[1, 2, 3])) == "Image(size=(224, 224), fill=(1, 2, 3))"
    assert repr(ImageRecord(image=None)) == "ImageRecord()"
    assert repr(ImageRecord(Image(size=8), 0)) == "ImageRecord(image=Image(size=(8, 8)), label_width=0)"
    assert repr(ClassLabel()) == "ClassLabel()" and repr(ClassLabel(np.int32)) == "ClassLabel(dtype='int32')"
    assert repr(ClassLabel(class_names=["dog", "cat"])) == "ClassLabel(class_names={'cat': 1, 'dog': 0})"
    assert repr(Mask(colors=["#000000", (255, 0, 0)])) == "Mask(colors={0: '#000000', 1: '#ff0000'})"
    assert repr(BoundingBoxes(max_boxes=16)) == "BoundingBoxes(max_boxes=16)"


def test_equal_parameters_in_other_spellings_are_equal_decoders():
    assert Image(size=224, formats=["JPEG"]) == Image(size=(224, 224), formats=("JPEG",))
    assert hash(Image(size=224, formats=["JPEG"])) == hash(Image(size=(224, 224), formats=("JPEG",)))
    assert ClassLabel(class_names=["dog", "cat"]) == ClassLabel(class_names={"cat": 1, "dog": 0})
    assert Mask(colors=["#000000", "#ff0000"]) == Mask(colors={"1": {"hex-color": "#ff0000"}, 0: (0, 0, 0)})
    assert ImageRecord(image=None) == ImageRecord() and BoundingBoxes(max_boxes=2.0) == BoundingBoxes(max_boxes=2)
    assert len({Image(), Image(), Json(), Json(), Raw()}) == 3


def test_dataclasses_replace_validates_again():
    import dataclasses

    small = dataclasses.replace(Image(size=(224, 224), layout="CHW"), size=64)
    assert small == Image(size=64, layout="CHW") and spec_of(small) == ArraySpec((3, 64, 64), np.uint8)
    with pytest.raises(ValueError, match="layout must be 'HWC' or 'CHW'"):
        dataclasses.replace(small, layout="NHWC")
    assert spec_of(dataclasses.replace(ClassLabel(), multi_label=True, num_classes=4)) == \
        ArraySpec((4,), np.float32)
    with pytest.raises(ValueError, match="max_pixels must be positive"):
        Mask(max_pixels=0)


def test_json_takes_any_bytes_like_payload():
    """Json() refused a numpy uint8 buffer ("Input must be bytes...") where the other JSON decoders took it."""
    from parrecio.decoders import Json
    for payload in (b'{"a": [1, 2]}', bytearray(b'{"a": [1, 2]}'), memoryview(b'{"a": [1, 2]}'),
                    np.frombuffer(b'{"a": [1, 2]}', np.uint8), np.frombuffer(b'{"a": [1, 2]}   ', np.uint32)):
        assert Json()(payload) == {"a": [1, 2]}


def test_json_with_a_byte_order_mark():
    """Some Windows tools write a UTF-8 BOM before JSON: sniff() called it JSON, but every JSON decoder refused
    it (orjson does not skip it; RFC 8259 lets a reader)."""
    from parrecio.decoders import BoundingBoxes, ClassLabel, Json
    from parrecio.errors import DecodeError
    bom = b"\xef\xbb\xbf"
    for payload in (bom + b'{"a": [1, 2]}', memoryview(bom + b'{"a": [1, 2]}'), (bom + b'{"a": [1, 2]}').decode(),
                    np.frombuffer(bom + b'{"a": [1, 2]}', np.uint8)):
        assert Json()(payload) == {"a": [1, 2]}
    assert ClassLabel()(bom + b"7") == 7
    label = b'{"annotations": [{"class_id": 2, "left": 1, "top": 2, "width": 3, "height": 4}]}'
    assert np.array_equal(BoundingBoxes()(bom + label), BoundingBoxes()(label))
    with pytest.raises(DecodeError, match="invalid JSON"):
        Json()(bom + bom + b"{}")  # one mark, once


class _ShortInto:
    """A tuple output_spec of two, whose decode_into returns a tuple of one (or a list)."""
    output_spec = (ArraySpec((2,), np.uint8), None)

    def __init__(self, rest):
        self.rest = rest

    def __call__(self, payload):
        return np.zeros(2, np.uint8), b"x"

    def decode_into(self, payload, out):
        out[0][...] = 7
        return self.rest


@pytest.mark.parametrize("rest, said", [((None,), "tuple of 1"), ((None, b"x", 3), "tuple of 3"),
                                        ([None, b"x"], "list")])
def test_decode_into_that_returns_the_wrong_tuple_is_a_clear_error(rest, said):
    """A tuple of another length (or no tuple) from decode_into was cut to fit by zip, or crashed the
    batching later with a bare IndexError (the workers=0 pass then delivered none of the samples before)."""
    dec = _ShortInto(rest)
    outs = (np.zeros(2, np.uint8), None)
    with pytest.raises(ValueError, match=f"decode_into returned {said}, but its output_spec is a tuple of 2"):
        write_into(dec, b"p", dec.output_spec, outs)
    assert write_into(_ShortInto((None, b"y")), b"p", dec.output_spec, outs) == (None, b"y")


def test_array_spec_refuses_negative_dimensions_and_object_dtypes():
    """Both reached the shared-memory slots: numpy's own error with workers=0, and decoder processes that
    died at their start with workers ('a decoder that cannot be unpickled or imported')."""
    with pytest.raises(ValueError, match=r"shape \(4, -1\): a dimension below 0"):
        ArraySpec((4, -1), np.float32)
    with pytest.raises(ValueError, match="holds Python objects"):
        ArraySpec((3,), object)
    with pytest.raises(ValueError, match="holds Python objects"):
        ArraySpec((3,), np.dtype([("a", np.int32), ("b", object)]))
    assert ArraySpec((0, 3), np.int16).nbytes == 0 and ArraySpec((2,), "U4").nbytes == 32
    # a dimension that is no int: int() made 2.5 a 2, silently (numpy ints are ints)
    with pytest.raises(TypeError, match=r"ArraySpec shape \(2\.5,\): dimensions are ints"):
        ArraySpec((2.5,), np.uint8)
    assert ArraySpec((np.int64(2), np.uint8(3)), np.uint8).shape == (2, 3)
