"""ImageRecord: MXNet image records (IRHeader + labels + image bytes) -> (image, label)."""

from __future__ import annotations

import numpy as np
import pytest

from image_helpers import jpeg, png
from parrecio.decoders import ArraySpec, Image, ImageRecord
from parrecio.decoders.base import spec_of, write_into
from parrecio.errors import DecodeError
from parrecio.recordio.irheader import IRHeader, pack

JPEG = jpeg(320, 240)


def test_scalar_label_like_mxnet():
    record = pack(IRHeader(0, 7.0, 42, 0), JPEG)
    image, label = ImageRecord()(record)
    assert isinstance(label, np.ndarray) and label.shape == () and label.dtype == np.float32 and label == 7.0
    assert np.array_equal(image, Image()(JPEG))
    assert ImageRecord().output_spec is None and spec_of(ImageRecord()) is None


@pytest.mark.parametrize("labels", [[1.0, 0.0, 8.0], [0.5], list(range(10))])
def test_multi_label_headers(labels):
    record = pack(IRHeader(0, labels, 1, 0), JPEG)
    image, label = ImageRecord(Image(size=32))(record)
    assert label.dtype == np.float32 and label.tolist() == labels
    assert image.shape == (32, 32, 3)
    fixed = ImageRecord(Image(size=32), label_width=len(labels))
    assert fixed.output_spec == (ArraySpec((32, 32, 3), np.uint8), ArraySpec((len(labels),), np.float32))
    assert fixed(record)[1].tolist() == labels


def test_decode_into_tuple_spec_writes_both_and_returns_nones():
    decoder = ImageRecord(Image(size=(24, 32)), label_width=3)
    record = pack(IRHeader(0, [4, 5, 6], 9, 0), JPEG)
    images = np.full((3, 24, 32, 3), 11, np.uint8)
    labels = np.full((3, 3), -5, np.float32)
    rest = decoder.decode_into(memoryview(record), (images[1], labels[1]))
    assert rest == (None, None)
    assert np.array_equal(images[1], Image(size=(24, 32))(JPEG)) and labels[1].tolist() == [4, 5, 6]
    assert (images[[0, 2]] == 11).all() and (labels[[0, 2]] == -5).all()
    assert write_into(decoder, record, decoder.output_spec, (images[2], labels[2])) == (None, None)
    assert np.array_equal(images[2], images[1])


def test_partial_specs():
    record = pack(IRHeader(0, 3.0, 1, 0), JPEG)
    # image fixed, label free: the label comes back in the returned tuple
    decoder = ImageRecord(Image(size=16))
    assert decoder.output_spec == (ArraySpec((16, 16, 3), np.uint8), None)
    out = np.zeros((16, 16, 3), np.uint8)
    assert decoder.decode_into(record, (out, None)) == (None, 3.0)
    assert out.any()
    # image free, scalar label fixed (label_width=0): the image comes back
    decoder = ImageRecord(label_width=0)
    assert decoder.output_spec == (None, ArraySpec((), np.float32))
    label = np.zeros((), np.float32)
    image, rest = decoder.decode_into(record, (None, label))
    assert rest is None and label == 3.0 and image.shape == (240, 320, 3)
    assert write_into(decoder, record, decoder.output_spec, (None, label))[1] is None


class _Thumb:
    """An image decoder with an output_spec and no decode_into, returning another shape and dtype."""
    output_spec = ArraySpec((2, 3), np.uint8)

    def __call__(self, data):
        return np.array([[300.7, -1.2, 2.5]])


def test_an_image_decoder_without_decode_into_is_held_to_its_spec():
    """Its value was broadcast and cast into the slot (row [300.7, -1.2, 2.5] -> [[44, 255, 2]] twice);
    the same decoder as a field of its own is refused: so is it inside ImageRecord."""
    record = pack(IRHeader(0, 4.0, 1, 0), b"xyz")
    decoder = ImageRecord(image=_Thumb(), label_width=0)
    image, label = np.full((2, 3), 7, np.uint8), np.zeros((), np.float32)
    with pytest.raises(ValueError, match=r"shape \(1, 3\) and dtype float64, but its output_spec says \(2, 3\) uint8"):
        decoder.decode_into(record, (image, label))
    assert (image == 7).all()


def test_label_width_rules():
    scalar = pack(IRHeader(0, 2.0, 1, 0), JPEG)
    two = pack(IRHeader(0, [1, 2], 1, 0), JPEG)
    assert ImageRecord(label_width=1)(scalar)[1].tolist() == [2.0]
    assert ImageRecord(label_width=0)(scalar)[1].shape == ()
    with pytest.raises(DecodeError, match="label_width=3"):
        ImageRecord(label_width=3)(two)
    with pytest.raises(DecodeError, match="scalar label"):
        ImageRecord(label_width=2)(scalar)
    with pytest.raises(DecodeError, match="label_width=0"):
        ImageRecord(label_width=0)(two)
    with pytest.raises(ValueError):
        ImageRecord(label_width=-1)


def test_png_and_bytes_like_payloads():
    record = pack(IRHeader(0, [9], 3, 0), png(64, 48))
    expected = Image()(png(64, 48))
    for form in (record, bytearray(record), memoryview(record), np.frombuffer(record, np.uint8)):
        image, label = ImageRecord()(form)
        assert np.array_equal(image, expected) and label.tolist() == [9.0]


def test_refusals():
    with pytest.raises(DecodeError, match="24-byte"):
        ImageRecord()(b"\x00" * 10)
    with pytest.raises(DecodeError, match="labels"):
        ImageRecord()(pack(IRHeader(0, [1, 2, 3], 0, 0), b"")[:30])
    with pytest.raises(DecodeError, match="JSON"):
        ImageRecord()(pack(IRHeader(0, 1.0, 0, 0), b'{"not": "an image"}'))
    with pytest.raises(DecodeError, match="truncated"):
        ImageRecord()(pack(IRHeader(0, 1.0, 0, 0), JPEG[:5000]))


def test_default_labels_batch_into_one_array(tmp_path):
    """ImageRecord() without label_width: a batch of scalar labels is one float32 array (once a list of
    Python floats, whose .shape failed)."""
    from parrecio import ParallelReader, RecordWriter
    path = tmp_path / "l.rec"
    with RecordWriter(str(path)) as w:
        for i in range(10):
            w.write(pack(IRHeader(0, float(i % 3), i, 0), JPEG))
    with ParallelReader(path, fields=ImageRecord(Image(size=16)), batch_size=4, workers=0) as r:
        labels = [lab for _, lab in r]
    assert [lab.shape for lab in labels] == [(4,), (4,), (2,)]
    assert labels[0].dtype == np.float32 and np.concatenate(labels).tolist() == [i % 3 for i in range(10)]


@pytest.mark.parametrize("label_width", [None, 0, 1])
@pytest.mark.parametrize("dtype", ["int64", np.int32, np.uint8, "float64"])
def test_label_dtype_gives_class_ids(label_width, dtype):
    """#24: im2rec's labels are float32 where a loss wants int64 class ids; label_dtype says which."""
    decoder = ImageRecord(Image(size=16), label_width=label_width, label_dtype=dtype)
    image, label = decoder(pack(IRHeader(0, 7.0, 3, 0), JPEG))
    assert label.dtype == np.dtype(dtype) and label.tolist() == ([7] if label_width == 1 else 7)
    assert np.array_equal(image, Image(size=16)(JPEG))
    if label_width is not None:  # a fixed spec carries the dtype into shared memory
        assert decoder.output_spec[1] == ArraySpec((1,) if label_width else (), np.dtype(dtype))
    many = ImageRecord(label_dtype=dtype)(pack(IRHeader(0, [1.0, 0.0, 8.0], 3, 0), JPEG))[1]
    assert many.dtype == np.dtype(dtype) and many.tolist() == [1, 0, 8]


def test_label_dtype_refuses_what_it_cannot_hold():
    # (the top of each integer range too: as a float, int32's and int64's largest values round up to
    # 2**31 and 2**63, which the check let through and the cast wrapped to the minimum)
    for label, dtype in ((2.5, "int64"), (-1.0, "uint8"), (300.0, "uint8"), (float("nan"), "int64"),
                         ([1.0, 0.5], "int64"), (2.0 ** 31, "int32"), (2.0 ** 63, "int64"),
                         (2.0 ** 32, "uint32"), (2.0 ** 64, "uint64"), ([1.0, 2.0 ** 31], "int32"),
                         (-2.0 ** 31 - 256, "int32")):
        with pytest.raises(DecodeError, match=rf"image record \(id 4\) has the label .* which "
                                              rf"label_dtype={np.dtype(dtype).name} cannot hold exactly"):
            ImageRecord(label_dtype=dtype)(pack(IRHeader(0, label, 4, 0), JPEG))
    assert ImageRecord(label_dtype="float64")(pack(IRHeader(0, 2.5, 4, 0), JPEG))[1].tolist() == 2.5
    assert ImageRecord(label_dtype="int32")(pack(IRHeader(0, -2.0 ** 31, 4, 0), JPEG))[1].tolist() == -2 ** 31
    assert ImageRecord(label_dtype="uint8")(pack(IRHeader(0, 255.0, 4, 0), JPEG))[1].tolist() == 255
    with pytest.raises(TypeError, match="label_dtype must be None or a numpy integer or float dtype"):
        ImageRecord(label_dtype="no such dtype")
    with pytest.raises(ValueError, match="label_dtype must be an integer or float dtype, got bool"):
        ImageRecord(label_dtype=bool)


def test_label_dtype_is_part_of_the_value():
    import dataclasses
    import pickle
    d = ImageRecord(Image(size=16), label_dtype=np.int64)
    assert repr(d) == "ImageRecord(image=Image(size=(16, 16)), label_dtype='int64')"
    assert repr(ImageRecord()) == "ImageRecord()" and ImageRecord(label_dtype=None).label_dtype is None
    assert d == ImageRecord(Image(size=16), label_dtype="int64") != ImageRecord(Image(size=16))
    assert pickle.loads(pickle.dumps(d)) == d and hash(d) == hash(ImageRecord(Image(size=16), label_dtype="int64"))
    assert dataclasses.replace(d, label_width=0).output_spec[1] == ArraySpec((), np.int64)


@pytest.mark.parametrize("workers", [0, 2])
def test_int64_labels_through_the_pipeline(tmp_path, workers, no_leaks):
    from parrecio import ParallelReader, RecordWriter
    path = tmp_path / "l.rec"
    with RecordWriter(str(path)) as w:
        for i in range(10):
            w.write(pack(IRHeader(0, float(i % 3), i, 0), JPEG))
    for width in (None, 0):
        with ParallelReader(path, fields=ImageRecord(Image(size=16), label_width=width, label_dtype="int64"),
                            batch_size=4, workers=workers) as r:
            labels = [lab for _, lab in r]
        assert [(lab.shape, lab.dtype) for lab in labels] == [((4,), np.int64)] * 2 + [((2,), np.int64)]
        assert np.concatenate(labels).tolist() == [i % 3 for i in range(10)]
