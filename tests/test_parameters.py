"""Parameters are checked up front; per-sample faults are DecodeErrors; no output is non-finite.

Three things must hold for every public decoder and ParallelReader's numeric parameters:

- an invalid value -- a float where an int is meant (2.5, 1.9), a bool where a number is meant, NaN or
  inf, zero or negative, an absurd magnitude (std=1e-45, mean=1e300, ratio=(1e-308, 1e308)) -- raises a
  ValueError or TypeError naming the parameter when the decoder (or reader, or Tuning) is made, never a
  numpy warning, a silent truncation or an error in every later decode;
- a payload the decoder cannot turn into a finite output (an image_size of 0.4 or 1e300, a coordinate that
  overflows float32) raises DecodeError, called directly and through the reader;
- a mask stored at another resolution than its image gets the image's relative crop (``resolution=``).
"""

from __future__ import annotations

import dataclasses
import re
import warnings

import numpy as np
import pytest

from image_helpers import encode, gt_boxes_json, jpeg, mask_png
from parrecio import DecodeError, ParallelReader, RecordWriter, Tuning
from parrecio.decoders import BoundingBoxes, CenterCrop, ClassLabel, Image, Mask, RandomResizedCrop
from parrecio.decoders.base import is_random
from parrecio.pipeline.tuning import count

NAN, INF = float("nan"), float("inf")

# -- construction: (constructor, kwargs, exception, fragment of the message) -----------------------------------
INVALID = [
    # Image: the normalization table must stay finite in float32 for every pixel value 0..255
    (Image, dict(std=1e-45), ValueError, "overflow float32"),
    (Image, dict(mean=1e300), ValueError, "overflow float32"),
    (Image, dict(mean=(0.5, 0.5, 1e300)), ValueError, "overflow float32"),
    (Image, dict(mean=NAN), ValueError, "mean"),
    (Image, dict(std=INF), ValueError, "std"),
    (Image, dict(std=0), ValueError, "std must be positive"),
    (Image, dict(std=-1), ValueError, "std must be positive"),
    (Image, dict(mean="0.5"), TypeError, "mean"),
    (Image, dict(std=[[0.2, 0.2, 0.2]]), TypeError, "std must be one number or one per channel"),
    (Image, dict(mean=np.full((1, 3), 0.5)), TypeError, "mean must be one number or one per channel"),
    (Image, dict(std=True), TypeError, "std"),
    (Image, dict(mean=(0.5, None, 0.5)), TypeError, "mean"),
    (Image, dict(mean=(0.1, 0.2)), ValueError, "mean"),
    (Image, dict(mode="keep", mean=0.5), ValueError, "mode='keep'"),
    (Image, dict(size=2.5), TypeError, "size"),
    (Image, dict(size=(224, 2.5)), TypeError, "size"),
    (Image, dict(size=True), TypeError, "size"),
    (Image, dict(size=NAN), TypeError, "size"),
    (Image, dict(size="224"), TypeError, "size"),
    (Image, dict(size=(1, 2, 3)), TypeError, "size"),
    (Image, dict(size=0), ValueError, "size"),
    (Image, dict(size=(224, -1)), ValueError, "size"),
    (Image, dict(size=10**9), ValueError, "size"),
    (Image, dict(max_pixels=2.5), TypeError, "max_pixels"),
    (Image, dict(max_pixels=True), TypeError, "max_pixels"),
    (Image, dict(max_pixels=NAN), TypeError, "max_pixels"),
    (Image, dict(max_pixels=0), ValueError, "max_pixels"),
    (Image, dict(fill=2.5), TypeError, "fill"),
    (Image, dict(fill=True), TypeError, "fill"),
    (Image, dict(fill=(1.5, 2, 3)), TypeError, "fill"),
    (Image, dict(fill=256), ValueError, "fill"),
    (Image, dict(fill=-1), ValueError, "fill"),
    (Image, dict(fill="0"), TypeError, "fill"),
    (Image, dict(draft=NAN), ValueError, "draft"),
    (Image, dict(draft=INF), ValueError, "draft"),
    (Image, dict(draft=0.49), ValueError, "draft"),
    (Image, dict(draft="yes"), TypeError, "draft"),
    (Image, dict(reducing_gap=NAN), ValueError, "reducing_gap"),
    (Image, dict(reducing_gap=INF), ValueError, "reducing_gap"),
    (Image, dict(reducing_gap=0.5), ValueError, "reducing_gap"),
    (Image, dict(reducing_gap=True), TypeError, "reducing_gap"),
    (Image, dict(flip=NAN), ValueError, "flip"),
    (Image, dict(flip=1.5), ValueError, "flip"),
    (Image, dict(flip=-0.1), ValueError, "flip"),
    (Image, dict(flip=True), TypeError, "flip"),
    (Image, dict(flip="0.5"), TypeError, "flip"),
    (Image, dict(exif_transpose="no"), TypeError, "exif_transpose"),
    (Image, dict(allow_truncated=1), TypeError, "allow_truncated"),
    (Image, dict(formats="JPEG"), TypeError, "formats"),
    (Image, dict(formats=("NOPE",)), ValueError, "formats"),
    (Image, dict(formats=()), ValueError, "formats"),
    (Image, dict(mode=["RGB"]), ValueError, "mode"),
    (Image, dict(layout=None), ValueError, "layout"),
    (Image, dict(resample=["bilinear"]), ValueError, "resample"),
    (Image, dict(resize=["stretch"]), ValueError, "resize"),
    (Image, dict(backend=None), ValueError, "backend"),
    (Image, dict(crop="random"), TypeError, "crop"),
    (Image, dict(crop=CenterCrop()), ValueError, "needs size="),
    # RandomResizedCrop: sane ranges whose sampling cannot overflow
    (RandomResizedCrop, dict(ratio=(1e-308, 1e308)), ValueError, "ratio"),
    (RandomResizedCrop, dict(ratio=(1e-7, 1.0)), ValueError, "ratio"),
    (RandomResizedCrop, dict(ratio=(1.0, 1e7)), ValueError, "ratio"),
    (RandomResizedCrop, dict(ratio=(0, 1)), ValueError, "ratio"),
    (RandomResizedCrop, dict(ratio=(2, 1)), ValueError, "ratio"),
    (RandomResizedCrop, dict(ratio=(NAN, 1)), ValueError, "ratio"),
    (RandomResizedCrop, dict(ratio=(True, 2)), TypeError, "ratio"),
    (RandomResizedCrop, dict(ratio=("0.5", 2)), TypeError, "ratio"),
    (RandomResizedCrop, dict(ratio=1.0), ValueError, "ratio"),
    (RandomResizedCrop, dict(scale=(0, 1)), ValueError, "scale"),
    (RandomResizedCrop, dict(scale=(0.5, 1.5)), ValueError, "scale"),
    (RandomResizedCrop, dict(scale=(0.5, 0.4)), ValueError, "scale"),
    (RandomResizedCrop, dict(scale=(-0.5, 1)), ValueError, "scale"),
    (RandomResizedCrop, dict(scale=(0.5, INF)), ValueError, "scale"),
    (RandomResizedCrop, dict(scale=(0.5, 1, 2)), ValueError, "scale"),
    # CenterCrop
    (CenterCrop, dict(fraction=0), ValueError, "fraction"),
    (CenterCrop, dict(fraction=1.5), ValueError, "fraction"),
    (CenterCrop, dict(fraction=1e-300), ValueError, "fraction"),  # its scale overflowed float32 boxes
    (CenterCrop, dict(fraction=NAN), ValueError, "fraction"),
    (CenterCrop, dict(fraction=True), TypeError, "fraction"),
    (CenterCrop, dict(fraction="0.5"), TypeError, "fraction"),
    # Mask
    (Mask, dict(fill=2.5), TypeError, "fill"),
    (Mask, dict(fill=True), TypeError, "fill"),
    (Mask, dict(fill=256), ValueError, "fill"),
    (Mask, dict(unknown=2.5), TypeError, "unknown"),
    (Mask, dict(unknown=-1), ValueError, "unknown"),
    (Mask, dict(max_pixels=2.5), TypeError, "max_pixels"),
    (Mask, dict(max_pixels=0), ValueError, "max_pixels"),
    (Mask, dict(size=2.5), TypeError, "size"),
    (Mask, dict(size=10**9), ValueError, "size"),
    (Mask, dict(flip=NAN), ValueError, "flip"),
    (Mask, dict(allow_truncated="no"), TypeError, "allow_truncated"),
    (Mask, dict(formats="PNG"), TypeError, "formats"),
    (Mask, dict(colors="#ff0000"), TypeError, "colors"),
    (Mask, dict(colors=["#zzzzzz"]), ValueError, "colors"),
    (Mask, dict(colors=[(1.5, 2, 3)]), ValueError, "colors"),
    (Mask, dict(colors={2.5: "#000000"}), ValueError, "colors"),
    (Mask, dict(colors={300: "#000000"}), ValueError, "colors"),
    (Mask, dict(colors=["#000000", "#000000"]), ValueError, "colors"),
    (Mask, dict(resolution=0), ValueError, "resolution"),
    (Mask, dict(resolution=NAN), ValueError, "resolution"),
    (Mask, dict(resolution=1e300), ValueError, "resolution"),
    (Mask, dict(resolution=True), TypeError, "resolution"),
    # BoundingBoxes
    (BoundingBoxes, dict(max_boxes=2.5), TypeError, "max_boxes"),
    (BoundingBoxes, dict(max_boxes=True), TypeError, "max_boxes"),
    (BoundingBoxes, dict(max_boxes="3"), TypeError, "max_boxes"),
    (BoundingBoxes, dict(max_boxes=NAN), TypeError, "max_boxes"),
    (BoundingBoxes, dict(max_boxes=-1), ValueError, "max_boxes"),
    (BoundingBoxes, dict(max_boxes=10**12), ValueError, "max_boxes"),
    (BoundingBoxes, dict(normalize="no"), TypeError, "normalize"),
    (BoundingBoxes, dict(truncate=1), TypeError, "truncate"),
    (BoundingBoxes, dict(image="not a decoder"), TypeError, "image"),
    # ClassLabel
    (ClassLabel, dict(num_classes=2.5), TypeError, "num_classes"),
    (ClassLabel, dict(num_classes=True), TypeError, "num_classes"),
    (ClassLabel, dict(num_classes=0), ValueError, "num_classes"),
    (ClassLabel, dict(num_classes=10**12, multi_label=True), ValueError, "num_classes"),
    (ClassLabel, dict(multi_label="yes"), TypeError, "multi_label"),
    (ClassLabel, dict(dtype="not a dtype"), TypeError, "dtype"),
    (ClassLabel, dict(dtype=bool), ValueError, "dtype"),
    (ClassLabel, dict(dtype=np.int8, num_classes=1000), ValueError, "dtype"),
    (ClassLabel, dict(dtype=np.float16, num_classes=10**6), ValueError, "dtype"),
    (ClassLabel, dict(class_names="abc"), TypeError, "class_names"),
    (ClassLabel, dict(class_names=["dog", "dog"]), ValueError, "class_names"),
    (ClassLabel, dict(class_names=[1, 2]), TypeError, "class_names"),
    (ClassLabel, dict(class_names={"dog": 2.5}), TypeError, "class_names"),
    (ClassLabel, dict(class_names={"dog": True}), TypeError, "class_names"),
    (ClassLabel, dict(class_names={"dog": -1}), ValueError, "class_names"),
    (ClassLabel, dict(class_names={"dog": 5}, num_classes=3), ValueError, "class_names"),
    (ClassLabel, dict(class_names={"0": "dog"}), TypeError, "class_names"),  # a class-map, backwards
    # Tuning
    (Tuning, dict(ring_bytes=2.5), TypeError, "ring_bytes"),
    (Tuning, dict(ring_bytes=True), TypeError, "ring_bytes"),
    (Tuning, dict(ring_bytes=1024), ValueError, "ring_bytes"),
    (Tuning, dict(prefetch=0), ValueError, "prefetch"),
    (Tuning, dict(prefetch=1.5), TypeError, "prefetch"),
    (Tuning, dict(chunk_groups=2.0), TypeError, "chunk_groups"),
    (Tuning, dict(slot_samples=0), ValueError, "slot_samples"),
    (Tuning, dict(max_record_bytes=-1), ValueError, "max_record_bytes"),
    (Tuning, dict(task_timeout=NAN), ValueError, "task_timeout"),
    (Tuning, dict(task_timeout=0), ValueError, "task_timeout"),
    (Tuning, dict(task_timeout=True), TypeError, "task_timeout"),
    (Tuning, dict(start_method="thread"), ValueError, "start_method"),
]


@pytest.mark.parametrize("make, kwargs, error, fragment", INVALID,
                         ids=[f"{m.__name__}-{'-'.join(f'{k}={v!r}' for k, v in kw.items())}"
                              for m, kw, _, _ in INVALID])
def test_invalid_values_are_refused_at_construction_naming_the_parameter(make, kwargs, error, fragment):
    with _no_warnings(), pytest.raises(error, match=re.escape(fragment)):
        make(**kwargs)


READER_INVALID = [
    (dict(num_shards=2.5), TypeError, "num_shards"),
    (dict(num_shards=True), TypeError, "num_shards"),
    (dict(num_shards=0), ValueError, "num_shards"),
    (dict(num_shards="2"), TypeError, "num_shards"),
    (dict(num_shards=2, shard_index=1.9), TypeError, "shard_index"),
    (dict(num_shards=2, shard_index=True), TypeError, "shard_index"),
    (dict(num_shards=2, shard_index=-1), ValueError, "shard_index"),
    (dict(num_shards=2, shard_index=2), ValueError, "shard_index"),
    (dict(workers=2.5), TypeError, "workers"),
    (dict(workers=True), TypeError, "workers"),
    (dict(workers=-1), ValueError, "workers"),
    (dict(batch_size=2.5), TypeError, "batch_size"),
    (dict(batch_size=True), TypeError, "batch_size"),
    (dict(batch_size=0), ValueError, "batch_size"),
    (dict(seed=1.5), TypeError, "seed"),
    (dict(seed=True), TypeError, "seed"),
    (dict(seed=-1), ValueError, "seed"),
    (dict(shuffle_buffer=0), ValueError, "shuffle_buffer"),
    (dict(shuffle_buffer=10.5), TypeError, "shuffle_buffer"),
    (dict(shuffle_buffer_bytes=0), ValueError, "shuffle_buffer_bytes must be >= 1, not 0"),
    (dict(shuffle_buffer_bytes=1e9), TypeError, "shuffle_buffer_bytes must be an int >= 1, not float"),
    (dict(shuffle="no"), TypeError, "shuffle must be True or False, not 'no'"),  # (it meant True)
    (dict(drop_last=1), TypeError, "drop_last must be True or False"),
    # other loaders' names and typos: named as ParallelReader's, with the one meant (resolve()'s before)
    (dict(num_workers=2), TypeError, r"ParallelReader\(\) got an unexpected keyword argument 'num_workers' "
                                     r"\(did you mean workers=\?\)"),
    (dict(shuffle_seed=3), TypeError, r"'shuffle_seed' \(did you mean seed=\?\)"),
    (dict(batchsize=3), TypeError, r"'batchsize' \(did you mean batch_size=\?\)"),
    (dict(fifo_timout=3), TypeError, r"'fifo_timout' \(did you mean fifo_timeout=\?\)"),
]


@pytest.mark.parametrize("kwargs, error, fragment", READER_INVALID,
                         ids=["-".join(f"{k}={v!r}" for k, v in kw.items()) for kw, _, _ in READER_INVALID])
def test_reader_parameters_are_refused_naming_them(tmp_path, kwargs, error, fragment):
    path = _rec(tmp_path, [b"{}"])
    with pytest.raises(error, match=fragment):
        ParallelReader(path, fields=[BoundingBoxes()], **kwargs)


def test_shards_from_the_environment_are_still_read(tmp_path, monkeypatch):
    path = _rec(tmp_path, [b"{}"] * 4)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    with ParallelReader(path, fields=[BoundingBoxes()], workers=0, num_shards="env") as reader:
        assert reader.config.num_shards == 2 and reader.config.shard_index == 1
        assert len(list(reader)) == 2


def test_count_has_an_upper_bound_when_asked():
    assert count("seed", 2**64 - 1, minimum=0, maximum=2**64 - 1) == 2**64 - 1
    with pytest.raises(ValueError, match="seed must be <= "):
        count("seed", 2**64, minimum=0, maximum=2**64 - 1)
    with pytest.raises(TypeError, match="num_shards must be an int >= 1"):
        count("num_shards", 2.5)


# -- what stays accepted -----------------------------------------------------------------------------------------

def test_equal_spellings_and_extremes_that_stay_finite_are_accepted():
    assert Image(size=224.0) == Image(size=224) and BoundingBoxes(max_boxes=np.int64(3)) == BoundingBoxes(max_boxes=3)
    assert Image(fill=np.uint8(7)).fill == 7 and Image(draft=np.bool_(True)).draft is True
    assert Image(formats=["jpeg"]).formats == ("jpeg",)
    assert ClassLabel(num_classes=np.int32(4), multi_label=True).output_spec.shape == (4,)
    # the largest std ratio whose table still fits float32: 0.5 / 1e-36 = 5e35
    decoder = Image(size=8, mean=0.5, std=1e-36)
    out = decoder(jpeg(16, 12))
    assert out.dtype == np.float32 and np.isfinite(out).all()
    assert np.isfinite(Image(size=8, std=1e300)(jpeg(16, 12))).all()  # tiny, not inf


@pytest.mark.parametrize("ratio", [(1e-6, 1e-6), (1e6, 1e6), (1e-6, 1e6)])
def test_crop_ratios_at_the_limits_decode(ratio):
    decoder = Image(size=16, crop=RandomResizedCrop(scale=(0.08, 1.0), ratio=ratio))
    for key in range(20):
        assert decoder(jpeg(40, 30), key=key).shape == (16, 16, 3)


def test_dataclasses_replace_keeps_normalized_colors_and_class_names():
    mask = Mask(colors=["#000000", "#ff0000"])
    assert dataclasses.replace(mask, fill=3) == Mask(colors=["#000000", "#ff0000"], fill=3)
    label = ClassLabel(class_names=["dog", "cat"])
    again = dataclasses.replace(label, num_classes=5)
    assert again == ClassLabel(class_names={"dog": 0, "cat": 1}, num_classes=5) and again(b'"cat"') == 1
    with pytest.raises(ValueError, match="class_names"):
        dataclasses.replace(label, num_classes=1)  # "cat" is id 1


# -- per-sample faults: DecodeError, called directly and through the reader -------------------------------------

def _label(width=500, height=375, boxes=((0, 10, 20, 30, 40),)):
    return gt_boxes_json(list(boxes), width=width, height=height)


BOX_FAULTS = [
    (BoundingBoxes(image=Image(size=32)), _label(width=0.4), "image_size"),
    (BoundingBoxes(normalize=True), _label(width=0.4), "image_size"),
    (BoundingBoxes(normalize=True), _label(height=0), "image_size"),
    (BoundingBoxes(normalize=True), _label(width=-10), "image_size"),
    (BoundingBoxes(image=Image(size=32)), _label(width=1e300), "image_size"),
    (BoundingBoxes(normalize=True), _label(height=1e300), "image_size"),
    (BoundingBoxes(image=Image(size=32, crop=RandomResizedCrop())), _label(width=1e300, height=1e300),
     "image_size"),
    (BoundingBoxes(normalize=True), b'{"image_size": [{"width": "640", "height": 480}], "annotations": []}',
     "image_size"),
    (BoundingBoxes(normalize=True), b'{"image_size": [{"width": NaN, "height": 480}], "annotations": []}',
     "JSON"),
    (BoundingBoxes(normalize=True), _label(boxes=[(0, 1e300, 0, 1, 1)]), "float32"),
    (BoundingBoxes(), _label(boxes=[(0, 1e300, 0, 1, 1)]), "float32"),
    (BoundingBoxes(max_boxes=2), _label(boxes=[(0, 3e38, 0, 3e38, 1)]), "float32"),  # x1 = 6e38
    (BoundingBoxes(image=Image(size=32)), _label(boxes=[(0, 0, 0, 1e300, 1)]), "float32"),
    (BoundingBoxes(), _label(boxes=[(1e300, 0, 0, 1, 1)]), "class_id"),
    (BoundingBoxes(), _label(boxes=[(-1, 0, 0, 1, 1)]), "class_id"),
    (BoundingBoxes(), _label(boxes=[(2.5, 0, 0, 1, 1)]), "class_id"),
    (BoundingBoxes(), _label(boxes=[("dog", 0, 0, 1, 1)]), "non-numeric"),
    (BoundingBoxes(), _label(boxes=[(0, None, 0, 1, 1)]), "non-numeric"),
    (ClassLabel(dtype=np.float16), b"100000", "float16"),
    (ClassLabel(dtype=np.float32), b'"1e400"', "not finite"),
    (ClassLabel(num_classes=4, multi_label=True), b"[1, 2.5]", "not an integer"),
    (ClassLabel(dtype=np.uint8), b"300", "uint8"),
]


@pytest.mark.parametrize("decoder, payload, fragment", BOX_FAULTS,
                         ids=[f"{type(d).__name__}-{i}" for i, (d, _, _) in enumerate(BOX_FAULTS)])
def test_per_sample_faults_are_decode_errors_called_directly(decoder, payload, fragment):
    kw = {"key": 7} if is_random(decoder) else {}
    with _no_warnings(), pytest.raises(DecodeError, match=fragment):
        decoder(payload, **kw)
    if decoder.output_spec is not None:
        out = np.zeros(decoder.output_spec.shape, decoder.output_spec.dtype)
        with _no_warnings(), pytest.raises(DecodeError, match=fragment):
            decoder.decode_into(payload, out, **kw)


@pytest.mark.parametrize("decoder, payload, fragment", BOX_FAULTS,
                         ids=[f"{type(d).__name__}-{i}" for i, (d, _, _) in enumerate(BOX_FAULTS)])
def test_per_sample_faults_are_decode_errors_through_the_reader(tmp_path, decoder, payload, fragment):
    path = _rec(tmp_path, [_label(), payload] if not isinstance(decoder, ClassLabel) else [b"1", payload])
    with ParallelReader(path, fields=[decoder], workers=0) as reader:
        it = iter(reader)
        next(it)
        with pytest.raises(DecodeError, match=fragment) as caught:
            next(it)
    assert caught.value.index == 1
    with ParallelReader(path, fields=[decoder], workers=0, on_error="skip") as reader:
        assert len(list(reader)) == 1


def test_per_sample_fault_through_a_decoder_process(tmp_path, no_leaks):
    decoder, payload, fragment = BoundingBoxes(normalize=True), _label(boxes=[(0, 1e300, 0, 1, 1)]), "float32"
    path = _rec(tmp_path, [_label(), payload, _label()])
    with ParallelReader(path, fields=[decoder], workers=1) as reader:
        with pytest.raises(DecodeError, match=fragment) as caught:
            list(reader)
    assert caught.value.index == 1


def test_box_outputs_are_finite_for_finite_labels():
    big = _label(width=2**31 - 1, height=1, boxes=[(0, 2e38, 0, 1e38, 1), (2**24, 0, 0, 2**31 - 1, 1)])
    for decoder in (BoundingBoxes(), BoundingBoxes(normalize=True), BoundingBoxes(image=Image(size=32)),
                    BoundingBoxes(image=Image(size=32, crop=RandomResizedCrop(), flip=0.5), normalize=True)):
        with _no_warnings():
            out = decoder(big, key=3) if is_random(decoder) else decoder(big)
        assert np.isfinite(out).all()


# -- a mask at twice its image's resolution gets the image's relative crop -------------------------------------

def _scene(image_scale, mask_scale):
    """A black PNG with a white rectangle and its mask (id 1 inside): a 200x150 scene, the image at
    ``image_scale`` times that size, the mask at ``mask_scale`` times."""
    def paint(scale, value, channels):
        x, y, w, h = (v * scale for v in (70, 40, 50, 35))
        arr = np.zeros((150 * scale, 200 * scale) + channels, np.uint8)
        arr[y:y + h, x:x + w] = value
        return arr
    return encode(paint(image_scale, 255, (3,)), "PNG"), mask_png(paint(mask_scale, 1, ()))


def _agreement(image_decoder, mask_decoder, image_png, mask, keys=range(40)):
    """The worst intersection over union, over ``keys``, of the white pixels and the mask's id-1 pixels."""
    worst = 1.0
    for key in keys:
        white = image_decoder(image_png, key=key)[..., 0] > 127
        ones = mask_decoder(mask, key=key) == 1
        if white.any() or ones.any():
            worst = min(worst, (white & ones).sum() / (white | ones).sum())
    return worst


def test_a_mask_twice_the_images_size_gets_the_same_relative_crop():
    crop = RandomResizedCrop(scale=(0.3, 1.0))
    image = Image(size=(48, 64), crop=crop, flip=0.5, resample="nearest")
    double = Mask(size=(48, 64), crop=crop, flip=0.5, resolution=2)
    assert _agreement(image, double, *_scene(1, 2)) == 1.0
    # the same size needs nothing; without resolution= a larger mask's box is drawn for its own size
    plain = Mask(size=(48, 64), crop=crop, flip=0.5)
    assert _agreement(image, plain, *_scene(1, 1)) == 1.0
    assert _agreement(image, plain, *_scene(1, 2)) < 0.5
    # a mask at half the resolution: the box drawn for the image, scaled down (exact here: even sizes)
    assert _agreement(image, Mask(size=(48, 64), crop=crop, flip=0.5, resolution=0.5), *_scene(2, 1)) == 1.0


def test_boxes_following_a_scaled_mask_use_its_geometry():
    crop = RandomResizedCrop(scale=(0.3, 1.0))
    mask = Mask(size=(48, 64), crop=crop, flip=0.5, resolution=2)
    image = Image(size=(48, 64), crop=crop, flip=0.5)
    for key in range(10):
        sx, sy, ox, oy, w, h = image.geometry(200, 150, key)
        assert mask.geometry(400, 300, key) == pytest.approx((sx / 2, sy / 2, ox, oy, w, h), rel=1e-9)
    assert mask == eval(repr(mask)) and "resolution=2.0" in repr(mask)


# -- helpers ----------------------------------------------------------------------------------------------------

class _no_warnings:
    """Warnings (numpy's overflow in a cast, say) are errors inside the block."""

    def __enter__(self):
        self._catch = warnings.catch_warnings()
        self._catch.__enter__()
        warnings.simplefilter("error")
        return self

    def __exit__(self, *exc):
        return self._catch.__exit__(*exc)


def _rec(tmp_path, payloads):
    path = tmp_path / "p.rec"
    with RecordWriter(str(path)) as writer:
        for payload in payloads:
            writer.write(payload)
    return str(path)


def test_a_decoder_class_for_its_instance_is_refused(tmp_path):
    """fields=[Image, BoundingBoxes]: each payload was given to the class, every sample failed (and was
    skipped without a word with on_error="skip").  Plain callables that are classes (bytes) still work."""
    path = _rec(tmp_path, [b"{}"] * 3)
    for fields in ([Image, BoundingBoxes()], {"boxes": BoundingBoxes}, ClassLabel):
        with pytest.raises(TypeError, match=r"field '\w+' is the class \w+, not a decoder: give an instance, "
                                            r"e.g. \w+\(\)"):
            ParallelReader(path, fields=fields, on_error="skip")
    with ParallelReader(path, fields=bytes, workers=0) as reader:
        assert list(reader) == [b"{}"] * 3


def test_a_reader_says_it_cannot_be_pickled_and_what_to_do(tmp_path):
    import pickle
    path = _rec(tmp_path, [b"{}"])
    with ParallelReader(path, workers=0) as reader:
        with pytest.raises(TypeError, match="a ParallelReader cannot be pickled .* make one where it is used"):
            pickle.dumps(reader)
