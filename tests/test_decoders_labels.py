"""BoundingBoxes and ClassLabel on Ground Truth shaped JSON."""

from __future__ import annotations

import numpy as np
import pytest

from image_helpers import gt_boxes_json
from parrecio.decoders import ArraySpec, BoundingBoxes, ClassLabel, Image
from parrecio.decoders.base import write_into
from parrecio.errors import DecodeError

# A label attribute as Ground Truth writes it (bounding box job output), with the metadata attribute that
# sits beside it in the manifest line.
GT_LABEL = b'''{"image_size": [{"width": 500, "height": 375, "depth": 3}],
 "annotations": [{"class_id": 0, "left": 111, "top": 134, "width": 61, "height": 128},
                 {"class_id": 5, "left": 161, "top": 250, "width": 30.5, "height": 30},
                 {"class_id": 3, "left": 20, "top": 20, "width": 460, "height": 335, "extra": "ignored"}],
 "unknown-key": {"nested": [1, 2, 3]}}'''
GT_METADATA = b'''{"objects": [{"confidence": 0.09}, {"confidence": 0.08}, {"confidence": 0.07}],
 "class-map": {"0": "dog", "5": "bone", "3": "sofa"}, "type": "groundtruth/object-detection",
 "human-annotated": "yes", "creation-date": "2018-10-18T22:18:13.527256", "job-name": "identify-dogs"}'''
EXPECTED = np.array([[0, 111, 134, 172, 262], [5, 161, 250, 191.5, 280], [3, 20, 20, 480, 355]], np.float32)


def test_real_shaped_label():
    boxes = BoundingBoxes()(GT_LABEL)
    assert boxes.dtype == np.float32 and boxes.shape == (3, 5)
    assert np.array_equal(boxes, EXPECTED)
    assert BoundingBoxes().output_spec is None


def test_metadata_attribute_is_refused_clearly():
    with pytest.raises(DecodeError, match="-metadata"):
        BoundingBoxes()(GT_METADATA)


@pytest.mark.parametrize("payload", [
    b'{"image_size": [{"width": 500, "height": 375, "depth": 3}]}',
    b'{"image_size": [{"width": 500, "height": 375, "depth": 3}], "annotations": []}',
    b'{"annotations": null}',
    b"{}",
])
def test_no_boxes(payload):
    boxes = BoundingBoxes()(payload)
    assert boxes.shape == (0, 5) and boxes.dtype == np.float32
    padded = BoundingBoxes(max_boxes=4)(payload)
    assert padded.shape == (4, 5) and (padded == -1).all()


def test_normalize():
    boxes = BoundingBoxes(normalize=True)(GT_LABEL)
    expected = EXPECTED.copy()
    expected[:, 1::2] /= 500
    expected[:, 2::2] /= 375
    assert np.allclose(boxes, expected)
    with pytest.raises(DecodeError, match="image_size"):
        BoundingBoxes(normalize=True)(b'{"annotations": [{"class_id": 0, "left": 1, "top": 1, '
                                      b'"width": 2, "height": 2}]}')
    with pytest.raises(DecodeError, match="image_size"):
        BoundingBoxes(normalize=True)(gt_boxes_json([(0, 1, 1, 1, 1)], width=0))


def test_max_boxes_padding_spec_and_decode_into():
    decoder = BoundingBoxes(max_boxes=5)
    assert decoder.output_spec == ArraySpec((5, 5), np.float32)
    out = decoder(GT_LABEL)
    assert np.array_equal(out[:3], EXPECTED) and (out[3:] == -1).all()
    batch = np.full((2, 5, 5), 42, np.float32)
    assert write_into(decoder, GT_LABEL, decoder.output_spec, batch[1]) is None
    assert np.array_equal(batch[1], out) and (batch[0] == 42).all()


def test_too_many_boxes():
    with pytest.raises(DecodeError, match="max_boxes=2"):
        BoundingBoxes(max_boxes=2)(GT_LABEL)
    kept = BoundingBoxes(max_boxes=2, truncate=True)(GT_LABEL)
    assert np.array_equal(kept, EXPECTED[:2])
    out = np.zeros((2, 5), np.float32)
    BoundingBoxes(max_boxes=2, truncate=True).decode_into(GT_LABEL, out)
    assert np.array_equal(out, EXPECTED[:2])


@pytest.mark.parametrize("form", [bytes, bytearray, memoryview, lambda b: np.frombuffer(b, np.uint8),
                                  lambda b: b.decode()])
def test_bytes_like_payloads(form):
    assert np.array_equal(BoundingBoxes()(form(GT_LABEL)), EXPECTED)


@pytest.mark.parametrize("payload,words", [
    (b"[1, 2]", "JSON object"),
    (b'{"annotations": {"class_id": 0}}', "must be a list"),
    (b'{"annotations": [{"class_id": 0, "left": 1, "top": 2, "width": 3}]}', "'height'"),
    (b'{"annotations": [{"class_id": "dog", "left": 1, "top": 2, "width": 3, "height": 4}]}', "non-numeric"),
    (b'{"annotations": [{"class_id": true, "left": 1, "top": 2, "width": 3, "height": 4}]}', "non-numeric"),
    (b'{"annotations": [7]}', "annotation 0"),
    (b'{"annotations": [{"class_id": 0, "left": 5, "top": 2, "width": -3, "height": 4}]}', "negative width"),
    (b'{"annotations": [{"class_id": 0, "left": 5, "top": 2, "width": 3, "height": -0.5}]}', "or height"),
    (b'{"image_size": "big", "annotations": []}', "image_size"),
    (b'{"annotations": [', "invalid JSON"),
    (b"\xff\xfe", "invalid JSON"),
])
def test_refusals(payload, words):
    with pytest.raises(DecodeError, match=words):
        BoundingBoxes()(payload)


def test_deeply_nested_json_refused():
    deep = b"[" * 5000 + b"]" * 5000
    for decoder in (BoundingBoxes(), ClassLabel()):
        with pytest.raises(DecodeError, match="JSON"):
            decoder(deep)
    nested = b'{"annotations": [], "x": ' + b"[" * 2000 + b"]" * 2000 + b"}"
    with pytest.raises(DecodeError):
        BoundingBoxes()(nested)


def test_boxes_follow_the_image_geometry():
    label = gt_boxes_json([(1, 0, 0, 500, 375), (2, 100, 50, 100, 100), (3, 0, 0, 50, 375)])
    letterbox = BoundingBoxes(image=Image(size=224, resize="letterbox"))
    assert np.allclose(letterbox(label), [[1, 0, 28, 224, 196], [2, 44.8, 50.4, 89.6, 95.2],
                                          [3, 0, 28, 22.4, 196]])
    shorter = BoundingBoxes(image=Image(size=224, resize="shorter"))
    got = shorter(label)  # crop x 62.5..437.5, scale 224/375: the third box is cropped away
    scale = 224 / 375
    assert got.shape == (2, 5)
    assert np.allclose(got[1], [2, (100 - 62.5) * scale, 50 * scale, (200 - 62.5) * scale, 150 * scale])
    normalized = BoundingBoxes(normalize=True, image=Image(size=(100, 200), resize="letterbox"))(label)
    assert np.allclose(normalized[0], [1, (200 - 133) // 2 / 200, 0, ((200 - 133) // 2 + 133) / 200, 1])
    with pytest.raises(DecodeError, match="image_size"):
        shorter(b'{"annotations": []}')
    with pytest.raises(TypeError):
        BoundingBoxes(image="not a decoder")


# -- ClassLabel ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("payload", [b"3", b'"3"', b"3.0", b" 3\n", b'"3.0"', "3", b"[3]", memoryview(b"3"),
                                     np.frombuffer(b'"3"', np.uint8)])
def test_class_id_forms(payload):
    label = ClassLabel()(payload)
    assert label.shape == () and label.dtype == np.int64 and label == 3


def test_scalar_spec_makes_a_batch_column():
    decoder = ClassLabel(dtype=np.int32)
    assert decoder.output_spec == ArraySpec((), np.int32)
    column = np.full(4, -7, np.int32)
    for i, payload in enumerate([b"0", b'"1"', b"2.0", b"[3]"]):
        assert write_into(decoder, payload, decoder.output_spec, column[i, ...]) is None  # a 0-d view
    assert column.tolist() == [0, 1, 2, 3]
    assert np.stack([decoder(b"5"), decoder(b"6")]).shape == (2,)


def test_float_dtype_accepts_targets():
    assert ClassLabel(dtype=np.float32)(b"0.25") == np.float32(0.25)
    with pytest.raises(DecodeError, match="not an integer"):
        ClassLabel()(b"0.25")


@pytest.mark.parametrize("payload,words", [
    (b"true", "number"), (b'"cat"', "class_names"), (b"cat", "JSON"), (b"[1, 2]", "multi_label"),
    (b"null", "number"), (b'{"class-name": "cat", "confidence": 0.9}', "metadata"), (b'"1e400"', "finite"),
    (b"", "JSON"), (b"70000000000000000000", "does not fit"),
])
def test_class_label_refusals(payload, words):
    with pytest.raises(DecodeError, match=words):
        ClassLabel()(payload)


def test_class_ids_at_the_edges_of_64_bits_are_exact_or_refused():
    """Ids past 2**53 written as strings went through a float and lost digits; int64's and uint64's
    largest ids raised a bare OverflowError; an id below int64's range came back as its minimum."""
    assert ClassLabel()(b'"9007199254740993"') == 9007199254740993
    assert ClassLabel()(b'"123456789012345678"') == 123456789012345678
    assert ClassLabel()(b'"9223372036854775807"') == 2 ** 63 - 1
    assert ClassLabel(dtype="uint64")(b'"18446744073709551615"') == 2 ** 64 - 1
    assert ClassLabel(multi_label=True)(b'["9223372036854775807", -9223372036854775808]').tolist() == \
        [2 ** 63 - 1, -2 ** 63]
    for payload in (b"9223372036854775808", b'"9223372036854775808"', b"[9223372036854775808]"):
        with pytest.raises(DecodeError, match="does not fit int64"):
            ClassLabel(multi_label=payload.startswith(b"["))(payload)
    with pytest.raises(DecodeError, match="too large to be an exact integer"):
        ClassLabel()(b"-9223372036854775809")  # (orjson gives a float: -2**63, its last digit gone)
    for text in ('"3_0"', '"\u0663"', '" 3 0"'):  # (float() and int() take these; JSON numbers do not)
        with pytest.raises(DecodeError, match="neither a number nor a known class name"):
            ClassLabel()(text.encode())


def test_num_classes_range():
    assert ClassLabel(num_classes=4)(b"3") == 3
    for bad in (b"4", b"-1"):
        with pytest.raises(DecodeError, match="out of range"):
            ClassLabel(num_classes=4)(bad)


def test_multi_label_ids_and_multi_hot():
    ids = ClassLabel(multi_label=True)
    assert ids.output_spec is None
    assert ids(b"[1, 0, 8]").tolist() == [1, 0, 8]
    assert ids(b"2").tolist() == [2] and ids(b"[]").shape == (0,)
    hot = ClassLabel(multi_label=True, num_classes=10)
    assert hot.output_spec == ArraySpec((10,), np.float32)
    assert np.array_equal(hot(b"[1, 0, 8]"), [1, 1, 0, 0, 0, 0, 0, 0, 1, 0])
    assert hot(b'["3"]').argmax() == 3 and hot(b"[]").sum() == 0
    with pytest.raises(DecodeError, match="out of range"):
        hot(b"[10]")
    out = np.zeros((2, 10), np.float32)
    hot.decode_into(b"[9]", out[1])
    assert out[1, 9] == 1 and out.sum() == 1


def test_class_names():
    names = ClassLabel(class_names=["dog", "cat", "bird"])
    for payload in (b'"cat"', b"cat", b"cat\n", b'{"class-name": "cat", "confidence": 0.8}', b"1", b'"1"'):
        assert names(payload) == 1
    mapped = ClassLabel(class_names={"dog": 7, "cat": 3}, multi_label=True, num_classes=8)
    assert np.nonzero(mapped(b'["dog", "cat"]'))[0].tolist() == [3, 7]
    with pytest.raises(DecodeError, match="known class name"):
        names(b'"horse"')


def test_boxes_that_follow_a_mask_at_another_resolution_get_the_image_s_crop():
    """BoundingBoxes(image=Mask(..., resolution=2)): the label's image_size is the image's, which the mask's
    geometry read as the mask's own size (an image of half that): the crop was drawn for another size,
    up to 156 px off.  The boxes now land where BoundingBoxes(image=Image(...)) puts them -- the mask gets
    the image's crop -- and where the mask decoder's own geometry puts the same points of its 2x frame."""
    from parrecio.decoders import Mask, RandomResizedCrop
    crop = RandomResizedCrop()
    image, mask = Image(size=64, crop=crop, flip=0.5), Mask(size=64, crop=crop, flip=0.5, resolution=2.0)
    doc = gt_boxes_json([(1, 100, 50, 80, 60), (2, 10, 120, 200, 70)], 300, 200)
    for key in range(200):
        want = BoundingBoxes(image=image)(doc, key=key)
        got = BoundingBoxes(image=mask)(doc, key=key)
        assert got.shape == want.shape and np.allclose(got, want, atol=1e-3), key
        g = mask.geometry(600, 400, key)
        rows = g.apply(np.array([[1, 200, 100, 360, 220], [2, 20, 240, 420, 380]]), dtype=np.float64)
        rows = rows[(rows[:, 3] - rows[:, 1] >= 1e-3) & (rows[:, 4] - rows[:, 2] >= 1e-3)]  # (no area: dropped)
        assert np.allclose(got, rows, atol=1e-3), key


@pytest.mark.parametrize("how", ["shorter", "crop"])
def test_boxes_touching_the_kept_region_from_outside_are_dropped(how):
    """Mapped in float32, an edge on the crop's edge landed a few ulps inside the frame: a box cropped away
    (it ends where the kept region begins, or begins where it ends) came out as a sliver 1e-5 px wide, and
    so did about 15% of such boxes over random crops.  Mapped in float64, they are dropped; a box that
    overlaps the kept region by a pixel is kept, and the boxes inside land where a float64 reference puts
    them."""
    from parrecio.decoders import RandomResizedCrop
    image = Image(size=224, resize="shorter") if how == "shorter" else Image(size=224, crop=RandomResizedCrop())
    for key in range(300 if how == "crop" else 1):
        g = image.geometry(500, 375, key) if how == "crop" else image.geometry(500, 375)
        a0, a1 = sorted(((0 - g.offset_x) / g.scale_x, (g.width - g.offset_x) / g.scale_x))
        b0, b1 = sorted(((0 - g.offset_y) / g.scale_y, (g.height - g.offset_y) / g.scale_y))
        a0, a1, b0, b1 = (round(v, 6) for v in (a0, a1, b0, b1))  # (the kept region, in source pixels)
        boxes = [(1, 0, 0, a0, 375), (2, a1, 0, 500 - a1, 375), (3, 0, 0, 500, b0), (4, 0, b1, 500, 375 - b1),
                 (5, a0 - 1, b0 - 1, 2, 2), (6, 100, 100, 50, 40)]
        boxes = [b for b in boxes if b[3] > 0 and b[4] > 0]
        doc = gt_boxes_json(boxes, 500, 375)
        got = BoundingBoxes(image=image)(doc, key=key) if how == "crop" else BoundingBoxes(image=image)(doc)
        ids = got[:, 0].astype(int).tolist()
        assert not {1, 2, 3, 4} & set(ids), (key, got)
        assert 5 in ids and (got[:, 3] - got[:, 1] > 0.1).all() and (got[:, 4] - got[:, 2] > 0.1).all(), (key, got)
        src = np.array([[c, x, y, x + w, y + h] for c, x, y, w, h in boxes if c in ids], np.float64)
        assert np.allclose(got, g.apply(src, dtype=np.float64), atol=1e-4), key


def test_class_labels_of_any_length_and_a_bom_before_a_bare_name():
    """A numeric string of 310 digits raised OverflowError (math.isfinite of an int), one past Python's
    4300-digit limit a ValueError, not a DecodeError; a bare class name after a UTF-8 BOM was no known
    name ('\ufeffcat'), though the quoted one was.  A float dtype takes a long number as a target, and
    refuses a long integer id it cannot hold exactly."""
    for text, digits, why in ((b'"1' + b"0" * 309 + b'"', 310, "does not fit int64"),
                              (b'"' + b"9" * 5000 + b'"', 5000, "is out of range")):
        with pytest.raises(DecodeError, match=rf"^class label {text[1:13].decode()}\.\.\.{text[-5:-1].decode()} "
                                              rf"\({digits} digits\) {why}$"):
            ClassLabel()(text)
    assert float(ClassLabel(dtype="float64")(b'"1e100"')) == 1e100
    with pytest.raises(DecodeError, match=r"^class id 100000000000\.\.\.0000 \(101 digits\) is not exact in float64"):
        ClassLabel(dtype="float64")(b'"1' + b"0" * 100 + b'"')
    names = ClassLabel(class_names=["dog", "cat"])
    assert [int(names(p)) for p in (b"cat", b'\xef\xbb\xbf"cat"', b"\xef\xbb\xbfcat", "\ufeffcat", b"\xef\xbb\xbf dog\n")] \
        == [1, 1, 1, 1, 0]


def test_a_huge_class_label_is_shown_short_in_its_error():
    """1e308 read as an id printed all its 309 digits in the DecodeError (a 340-character message)."""
    with pytest.raises(DecodeError, match=r"^class label 100000000000\.\.\.8336 \(309 digits\) does not fit int64$"):
        ClassLabel()(b"1e308")
    with pytest.raises(DecodeError, match=r"^class label 300 does not fit uint8$"):
        ClassLabel(dtype="uint8")(b"300")


@pytest.mark.parametrize("dtype, exact, not_exact", [("float16", 2048, 2049), ("float32", 2 ** 24, 2 ** 24 + 1),
                                                     ("float64", 2 ** 53, 2 ** 53 + 1)])
def test_a_class_id_a_float_dtype_cannot_hold_exactly_is_an_error(dtype, exact, not_exact):
    """16777217 in float32 came out as 16777216: two ids, one label, silently."""
    decode = ClassLabel(dtype=dtype)
    assert decode(b"%d" % exact) == exact and decode(b'"%d"' % exact) == exact
    bits = {"float16": 11, "float32": 24, "float64": 53}[dtype]
    for payload in (b"%d" % not_exact, b'"%d"' % not_exact, b"[%d]" % not_exact):
        with pytest.raises(DecodeError, match=rf"^class id {not_exact} is not exact in {dtype} \(its integers are "
                                              rf"exact up to 2\*\*{bits}\): use an integer dtype$"):
            ClassLabel(dtype=dtype, multi_label=payload.startswith(b"["))(payload)
    assert decode(b"%d.5" % 1000) == 1000.5  # a float value is a target, rounded as floats are
