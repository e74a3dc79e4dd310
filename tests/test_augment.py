"""Augmentations fused with decoding: Image(crop=RandomResizedCrop(), flip=..., mean=..., std=...).

What must hold: the box follows torchvision's rule; without DCT scaling the pixels are exactly
torchvision's PIL path (crop -> resize(BILINEAR) -> flip -> ToTensor + Normalize); the image, its boxes
and its mask draw the same crop and flip; and a sample's pixels depend on (seed, epoch, shard,
position) only: not on the worker, on a worker killed mid-epoch, or on workers=0.
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
import signal

import numpy as np
import pytest
from PIL import Image as PILImage

from image_helpers import encode, gt_boxes_json, jpeg, mask_png, photo
from parrecio import ParallelReader, RecordWriter, Tuning
from parrecio.decoders import (IMAGENET_MEAN, IMAGENET_STD, BoundingBoxes, CenterCrop, Image, ImageRecord, Mask,
                               RandomResizedCrop)
from parrecio.decoders.augment import normalization_lut, sample_rng
from parrecio.decoders.base import sample_key
from parrecio.decoders.image import _Plan, _raw_box, _TRANSPOSE
from parrecio.recordio.irheader import IRHeader, pack
from pipeline_helpers import deadline

MEAN, STD = np.array(IMAGENET_MEAN), np.array(IMAGENET_STD)
KEY_0123 = 0x7632f01967560332


def torchvision_pil(payload: bytes, box, flip: bool, size=(224, 224), normalize=True) -> np.ndarray:
    """torchvision's RandomResizedCrop + RandomHorizontalFlip + ToTensor + Normalize on a PIL image, for a
    given box: ``F.resized_crop`` is ``img.crop((left, top, left + w, top + h)).resize((W, H), BILINEAR)``,
    ``hflip`` is ``transpose(FLIP_LEFT_RIGHT)``, ``ToTensor`` divides by 255 (float64 here, then float32)."""
    x, y, w, h = (int(v) for v in box)
    image = PILImage.open(__import__("io").BytesIO(payload)).convert("RGB")
    image = image.crop((x, y, x + w, y + h)).resize((size[1], size[0]), PILImage.Resampling.BILINEAR)
    if flip:
        image = image.transpose(PILImage.Transpose.FLIP_LEFT_RIGHT)
    arr = np.asarray(image)
    if not normalize:
        return arr
    return ((arr / 255.0 - MEAN) / STD).astype(np.float32).transpose(2, 0, 1)


def draws(decoder, width, height, key):
    """(box, flip) the decoder draws for sample ``key`` of a ``width x height`` image."""
    plan = decoder._plan_of(width, height, key)
    return (plan.box_x, plan.box_y, plan.box_w, plan.box_h), plan.flip


# -- the box ------------------------------------------------------------------------------------------------

def test_random_resized_crop_box_follows_torchvisions_rule():
    crop = RandomResizedCrop()
    fractions, ratios = [], []
    for key in range(3000):
        x, y, w, h = crop.box(500, 375, 224, 224, sample_rng(key))
        assert x == int(x) and y == int(y) and w == int(w) and h == int(h)  # whole pixels, as torchvision
        assert 0 <= x and 0 <= y and 0 < w and 0 < h and x + w <= 500 and y + h <= 375
        fractions.append(w * h / (500 * 375))
        ratios.append(w / h)
    # every try's area is uniform in scale, its log-ratio uniform in log(ratio); rounding to whole
    # pixels moves each by well under 1%
    assert min(fractions) > 0.079 and max(fractions) <= 1.0
    assert min(ratios) > 0.74 and max(ratios) < 1.35
    # the same rule, vectorized: up to 10 tries, the first that fits (boxes too wide or too tall redrawn)
    rng = np.random.default_rng(0)
    area = 500 * 375 * rng.uniform(0.08, 1.0, (20000, 10))
    aspect = np.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3), (20000, 10)))
    w, h = np.round(np.sqrt(area * aspect)), np.round(np.sqrt(area / aspect))
    fits = (w <= 500) & (h <= 375)
    first = fits.argmax(axis=1)
    ok, rows = fits.any(axis=1), np.arange(20000)
    expected = (w * h)[rows, first][ok].mean() / (500 * 375)
    assert abs(np.mean(fractions) - expected) < 0.015  # 3 standard errors
    expected = np.log(w / h)[rows, first][ok].mean()  # wide boxes fit a landscape image more often
    assert abs(np.mean(np.log(ratios)) - expected) < 0.015
    # an image of an extreme shape: no try fits, the fallback is the centred box of the nearest ratio
    assert crop.box(1000, 10, 224, 224, sample_rng(1)) == (493.0, 0.0, 13.0, 10.0)  # 13 = round(10 * 4/3)
    assert crop.box(10, 1000, 224, 224, random.Random(0)) == (0.0, 493.0, 10.0, 13.0)
    assert RandomResizedCrop(scale=(1.0, 1.0), ratio=(500 / 375, 500 / 375)).box(
        500, 375, 0, 0, random.Random(3)) == (0.0, 0.0, 500.0, 375.0)
    # a 1-px side and ratios that round the fallback's other side to 0: a crop of 1 px there, not of none
    # (an all-black image, a mask of class 0, and ZeroDivisionError in the boxes' mapping)
    assert RandomResizedCrop(ratio=(3, 4)).box(1, 5, 0, 0, random.Random(0)) == (0.0, 2.0, 1.0, 1.0)
    assert RandomResizedCrop(ratio=(0.1, 0.3)).box(5, 1, 0, 0, random.Random(0)) == (2.0, 0.0, 1.0, 1.0)
    white = encode(np.full((5, 1, 3), 255, np.uint8), "PNG")
    assert (Image(size=8, crop=RandomResizedCrop(ratio=(3, 4)))(white, key=0) == 255).all()


def test_center_crop_is_resize_then_centre_crop():
    assert CenterCrop().box(500, 375, 224, 224) == pytest.approx((250 - 164.0625, 23.4375, 328.125, 328.125))
    assert CenterCrop(1.0).box(500, 375, 224, 224) == (62.5, 0.0, 375.0, 375.0)  # resize="shorter"
    img = Image(size=224, crop=CenterCrop(1.0))
    payload = jpeg(500, 375)
    assert np.array_equal(img(payload), Image(size=224, resize="shorter")(payload))
    assert not img.random and not CenterCrop().random
    # whole-pixel boxes too (257x193 -> 32x32: x from 32; 640x480 -> 20x40: 240 wide): they were cut out,
    # then resized, up to 29 grey levels away from resize="shorter"
    for w, h, size in [(257, 193, (32, 32)), (640, 480, (40, 20)), (7, 5, (32, 32)), (300, 2, (224, 224))]:
        data = encode(np.random.default_rng(w).integers(0, 256, (h, w, 3), np.uint8), "PNG")
        a = Image(size=size, crop=CenterCrop(1.0))(data)
        assert np.array_equal(a, Image(size=size, resize="shorter")(data)), (w, h, size)


def test_keys_spread_and_depend_on_every_part():
    keys = {sample_key(s, e, r, i) for s in range(3) for e in range(3) for r in range(3) for i in range(50)}
    assert len(keys) == 3 * 3 * 3 * 50 and all(0 <= k < 2 ** 64 for k in keys)
    assert sample_key(0, 1, 2, 3) == KEY_0123  # pinned: a changed key would change every user's crops
    img = Image(size=64, crop=RandomResizedCrop(), flip=0.5)
    boxes = [draws(img, 500, 375, sample_key(0, 0, 0, i)) for i in range(200)]
    assert len(set(boxes)) == 200 and 60 < sum(f for _, f in boxes) < 140


# -- the pixels -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fused_decode_equals_torchvisions_pil_path(seed):
    payload = jpeg(500, 375, seed=seed)
    fused = Image(size=224, crop=RandomResizedCrop(), flip=0.5, mean=IMAGENET_MEAN, std=IMAGENET_STD,
                  layout="CHW")
    plain = dataclasses.replace(fused, mean=None, std=None, layout="HWC")
    flips = set()
    for key in range(seed * 10, seed * 10 + 10):
        box, flip = draws(fused, 500, 375, key)
        flips.add(flip)
        out = np.empty((3, 224, 224), np.float32)
        fused.decode_into(payload, out, key=key)
        assert np.array_equal(out, torchvision_pil(payload, box, flip))
        assert np.array_equal(plain(payload, key=key), torchvision_pil(payload, box, flip, normalize=False))
    assert flips == {False, True}


def test_draft_speeds_up_within_two_grey_levels_on_average():
    """With draft=True libjpeg decodes at 1/2, 1/4 or 1/8 scale where the crop stays >= the output."""
    fused = Image(size=112, crop=RandomResizedCrop(scale=(0.5, 1.0)), draft=True)
    exact = dataclasses.replace(fused, draft=False)
    payload = encode(photo(900, 700, seed=4), quality=92)
    diffs = [np.abs(fused(payload, key=k).astype(int) - exact(payload, key=k)).mean() for k in range(12)]
    assert max(diffs) < 2.0 and max(diffs) > 0  # the DCT-scaled decode is not the same decode


def test_flip_mirrors_the_whole_frame_and_normalizes_the_fill():
    payload = jpeg(90, 40)
    base = Image(size=(40, 60), resize="letterbox", fill=(10, 200, 30), mean=0.5, std=0.25)
    mirrored = dataclasses.replace(base, flip=1.0)
    a, b = base(payload), mirrored(payload, key=7)
    assert a.dtype == np.float32 and np.array_equal(b, a[:, ::-1])
    lut = normalization_lut(0.5, 0.25, 3)
    assert np.array_equal(a[0, 0], [lut[0, 10], lut[1, 200], lut[2, 30]])  # the pad, normalized
    grey = Image(size=16, mode="L", layout="CHW", mean=0.5, std=0.5)
    assert grey(payload).shape == (1, 16, 16) and grey.output_spec.dtype == np.float32
    luma = Image(size=16, mode="L")(payload)
    assert np.array_equal(grey(payload)[0], normalization_lut(0.5, 0.5, 1)[0][luma])
    assert np.allclose(grey(payload)[0], (luma / 255 - 0.5) / 0.5, atol=1e-6)


def test_exif_box_mapping_inverts_every_orientation():
    rng = np.random.default_rng(0)
    upright = rng.integers(0, 255, (7, 11), dtype=np.uint8)
    inverse = {2: 2, 3: 3, 4: 4, 5: 5, 6: 8, 7: 7, 8: 6}  # the transpose that undoes each one
    for orientation, undo in inverse.items():
        raw = np.asarray(PILImage.fromarray(upright).transpose(_TRANSPOSE[undo]))
        assert np.array_equal(np.asarray(PILImage.fromarray(raw).transpose(_TRANSPOSE[orientation])), upright)
        for x, y, w, h in ((0, 0, 11, 7), (2, 1, 5, 3), (6, 4, 5, 3)):
            rx, ry, rw, rh = (int(v) for v in _raw_box(orientation, raw.shape[1], raw.shape[0],
                                                        _Plan(x, y, w, h, 0, 0, 0, 0)))
            cut = PILImage.fromarray(raw[ry:ry + rh, rx:rx + rw]).transpose(_TRANSPOSE[orientation])
            assert np.array_equal(np.asarray(cut), upright[y:y + h, x:x + w]), (orientation, x, y)


# -- the fields of a sample follow the same crop -------------------------------------------------------------

def _square_scene(width=400, height=300, box=(150, 90, 80, 60)):
    """A black image with one white rectangle, its Ground Truth label, and its mask (id 1 inside)."""
    x, y, w, h = box
    arr = np.zeros((height, width, 3), np.uint8)
    arr[y:y + h, x:x + w] = 255
    ids = np.zeros((height, width), np.uint8)
    ids[y:y + h, x:x + w] = 1
    return encode(arr, "PNG"), gt_boxes_json([(3, x, y, w, h)], width=width, height=height), mask_png(ids)


def test_boxes_and_mask_follow_the_images_crop_and_flip():
    image_png, label, mask = _square_scene()
    crop = RandomResizedCrop(scale=(0.3, 1.0))
    img = Image(size=(96, 128), crop=crop, flip=0.5)
    boxes = BoundingBoxes(image=img, max_boxes=2)
    masks = Mask(size=(96, 128), crop=crop, flip=0.5)
    assert img.random and boxes.random and masks.random
    seen = 0
    for key in range(40):
        pixels, found, ids = img(image_png, key=key), boxes(label, key=key), masks(mask, key=key)
        ys, xs = np.nonzero(ids)
        if found[0, 0] < 0:  # the rectangle was cropped away: from the boxes and from the mask
            assert found[0].tolist() == [-1] * 5 and len(xs) == 0 and pixels.max() < 128
            continue
        seen += 1
        cls, x0, y0, x1, y1 = found[0]
        assert cls == 3 and found[1].tolist() == [-1] * 5
        assert (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1) == pytest.approx((x0, y0, x1, y1), abs=1.0)
        inner = pixels[int(y0) + 1:int(math.ceil(y1)) - 1, int(x0) + 1:int(math.ceil(x1)) - 1]
        if inner.size:
            assert inner.min() > 200  # white inside the mapped box ...
        outer = pixels.copy()
        outer[max(0, int(y0) - 1):int(math.ceil(y1)) + 1, max(0, int(x0) - 1):int(math.ceil(x1)) + 1] = 0
        assert outer.max() < 60  # ... and black outside it
    assert seen > 20


def test_imagerecord_passes_the_key_on():
    img = Image(size=32, crop=RandomResizedCrop(), flip=0.5)
    record = ImageRecord(img, label_width=0)
    payload = pack(IRHeader(0, 4.0, 0, 0), jpeg(120, 90))
    assert record.random
    for key in (1, 2):
        image, label = record(payload, key=key)
        assert np.array_equal(image, img(jpeg(120, 90), key=key)) and label == 4.0


# -- the pipeline gives every sample its key ------------------------------------------------------------------

@pytest.fixture(scope="module")
def scenes(tmp_path_factory):
    """[JPEG][boxes JSON] samples, 24 of them."""
    path = tmp_path_factory.mktemp("aug") / "aug.rec"
    with RecordWriter(str(path)) as writer:
        for i in range(24):
            writer.write(jpeg(160 + 4 * i, 120 + 2 * i, seed=i))
            writer.write(gt_boxes_json([(i % 3, 10 + i, 12, 40, 30)], width=160 + 4 * i, height=120 + 2 * i))
    return path


def _fields():
    img = Image(size=48, crop=RandomResizedCrop(), flip=0.5, mean=IMAGENET_MEAN, std=IMAGENET_STD, layout="CHW")
    return [img, BoundingBoxes(image=img, max_boxes=2)]


def _epoch(path, workers=2, seed=0, epoch=0, kill_at=None, **options):
    images, boxes, replaced = [], [], 0
    with deadline(120):
        with ParallelReader(path, fields=_fields(), workers=workers, batch_size=4, seed=seed,
                            tuning=Tuning(chunk_groups=1), **options) as reader:
            reader.set_epoch(epoch)
            for i, (im, bx) in enumerate(reader):
                images.append(im.copy())
                boxes.append(bx.copy())
                if kill_at is not None and i == kill_at:
                    os.kill(reader.worker_pids[0], signal.SIGKILL)
            replaced = reader.stats.workers_replaced
    return np.concatenate(images), np.concatenate(boxes), replaced


def test_a_samples_pixels_depend_on_seed_epoch_and_position_only(scenes, no_leaks):
    images, boxes, _ = _epoch(scenes)
    assert images.shape == (24, 3, 48, 48) and images.dtype == np.float32 and boxes.shape == (24, 2, 5)
    again, again_boxes, _ = _epoch(scenes)
    assert np.array_equal(images, again) and np.array_equal(boxes, again_boxes)
    inline, inline_boxes, _ = _epoch(scenes, workers=0)  # decoded in this process: the same
    assert np.array_equal(images, inline) and np.array_equal(boxes, inline_boxes)
    killed, killed_boxes, replaced = _epoch(scenes, kill_at=2)  # a worker dies mid-epoch: re-runs agree
    assert replaced == 1 and np.array_equal(images, killed) and np.array_equal(boxes, killed_boxes)
    img, box = _fields()
    for i in (0, 5, 23):  # each sample is its decoders called with its key
        key = sample_key(0, 0, 0, i)
        jpeg_i = jpeg(160 + 4 * i, 120 + 2 * i, seed=i)
        assert np.array_equal(images[i], img(jpeg_i, key=key))
        label = gt_boxes_json([(i % 3, 10 + i, 12, 40, 30)], width=160 + 4 * i, height=120 + 2 * i)
        assert np.array_equal(boxes[i], box(label, key=key))
    other_epoch, _, _ = _epoch(scenes, epoch=1)
    other_seed, _, _ = _epoch(scenes, seed=1)
    assert not any(np.array_equal(images[i], other_epoch[i]) for i in range(24))
    assert not any(np.array_equal(images[i], other_seed[i]) for i in range(24))


@pytest.mark.parametrize("workers", [2, 0])
def test_a_resumed_epoch_draws_the_crops_of_an_uninterrupted_one(scenes, workers, no_leaks):
    """state_dict mid-epoch, a new reader, load_state_dict: the rest of the epoch is the same pixels."""
    whole, _, _ = _epoch(scenes, epoch=1, shuffle=True)
    with ParallelReader(scenes, fields=_fields(), workers=workers, batch_size=4, shuffle=True) as reader:
        reader.set_epoch(1)
        for i, _ in enumerate(reader):
            if i == 2:  # three batches delivered
                state = reader.state_dict()
                break
    with ParallelReader(scenes, fields=_fields(), workers=workers, batch_size=4, shuffle=True) as reader:
        reader.load_state_dict(state)
        rest = np.concatenate([im for im, _ in reader])
    assert state["epoch"] == 1 and state["position"] == 12
    assert rest.shape[0] == 12 and np.array_equal(rest, whole[12:])


def test_shards_draw_their_own_crops(scenes, no_leaks):
    first, _, _ = _epoch(scenes, num_shards=2, shard_index=0)
    second, _, _ = _epoch(scenes, num_shards=2, shard_index=1)
    img, _ = _fields()
    assert np.array_equal(second[0], img(jpeg(164, 122, seed=1), key=sample_key(0, 0, 1, 0)))
    assert np.array_equal(first[0], img(jpeg(160, 120, seed=0), key=sample_key(0, 0, 0, 0)))
    box0, _ = draws(img, 160, 120, sample_key(0, 0, 0, 0))
    box1, _ = draws(img, 160, 120, sample_key(0, 0, 1, 0))
    assert box0 != box1  # position 0 of each shard: not the same crop


# -- validation ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, error, message", [
    (dict(crop=RandomResizedCrop()), ValueError, "needs size="),
    (dict(size=8, resize="letterbox", crop=CenterCrop()), ValueError, "leave resize='stretch'"),
    (dict(size=8, crop="random"), TypeError, "crop must be None, RandomResizedCrop"),
    (dict(size=8, flip=1.5), ValueError, "flip must be a probability"),
    (dict(size=8, mode="keep", mean=0.5), ValueError, "not with mode='keep'"),
    (dict(size=8, std=0), ValueError, "std must be positive"),
    (dict(size=8, mean=(0.1, 0.2)), ValueError, "one per channel \\(3\\)"),
])
def test_bad_augmentations_are_refused(kwargs, error, message):
    with pytest.raises(error, match=message):
        Image(**kwargs)


def test_bad_crop_policies_are_refused():
    with pytest.raises(ValueError, match="high must be <= 1"):
        RandomResizedCrop(scale=(0.5, 2.0))
    with pytest.raises(ValueError, match="0 < low <= high"):
        RandomResizedCrop(ratio=(2.0, 1.0))
    with pytest.raises(ValueError, match="fraction must be in"):
        CenterCrop(0)
    with pytest.raises(ValueError, match="needs size="):
        Mask(crop=CenterCrop())


def test_augmenting_decoders_are_values():
    img = Image(size=224, crop=RandomResizedCrop(scale=[0.25, 1]), flip=0.5, mean=list(IMAGENET_MEAN))
    assert img == Image(size=(224, 224), crop=RandomResizedCrop(scale=(0.25, 1.0)), flip=0.5, mean=IMAGENET_MEAN)
    assert repr(img) == ("Image(size=(224, 224), crop=RandomResizedCrop(scale=(0.25, 1.0)), flip=0.5, "
                         "mean=(0.485, 0.456, 0.406))")
    assert eval(repr(img), {"Image": Image, "RandomResizedCrop": RandomResizedCrop}) == img
    assert hash(img) == hash(dataclasses.replace(img))


# -- decoding only the region a crop reads (parrecio/decoders/_jpegregion.c) ----------------------------------

# An optional extension (setup.py builds it where libjpeg's headers are): without it only these tests are
# skipped, not the whole file (Image(crop=...) then decodes whole images, which the tests above cover).
try:
    from parrecio.decoders import _jpegregion as jpegregion
except ImportError:
    if os.environ.get("CI"):  # CI builds it: its absence is a failure there
        raise
    jpegregion = None
needs_region = pytest.mark.skipif(jpegregion is None, reason="the optional C extension parrecio.decoders."
                                  "_jpegregion is not built (setup.py builds it where libjpeg's headers are)")


def _variants():
    """JPEGs as cameras and tools write them: 4:2:0, 4:2:2, 4:4:4, progressive, grey, restart markers."""
    arr = photo(347, 261, seed=9)
    return {"420": encode(arr, quality=90, subsampling=2), "422": encode(arr, quality=85, subsampling=1),
            "444": encode(arr, quality=95, subsampling=0), "progressive": encode(arr, quality=88, progressive=True),
            "grey": jpeg(301, 203, seed=3, mode="L"), "restarts": encode(arr, quality=90, restart_marker_blocks=4),
            "cmyk": encode(np.asarray(PILImage.fromarray(arr).convert("CMYK")), mode="CMYK")}


@needs_region
def test_decode_region_gives_a_whole_decodes_pixels_away_from_its_side_edges():
    rng = random.Random(5)
    for name, payload in _variants().items():
        whole = PILImage.open(__import__("io").BytesIO(payload))
        if whole.mode == "CMYK":
            assert jpegregion.decode_region(payload, 0, 0, 10, 10, 1, False) is None  # Pillow's conversions
            continue
        ref, grey = np.asarray(whole), whole.mode == "L"
        width, height = whole.size
        for _ in range(40):
            w, h = rng.randint(1, width), rng.randint(1, height)
            x, y = rng.randint(0, width - w), rng.randint(0, height - h)
            x_req = max(0, x - 2)
            buf, x0, got_w = jpegregion.decode_region(payload, x_req, y, min(width, x + w + 2) - x_req, h, 1, grey)
            assert x0 <= x_req and x0 % 8 == 0 and got_w >= min(width, x + w + 2) - x_req
            region = np.frombuffer(buf, np.uint8).reshape((h, got_w) if grey else (h, got_w, 4))
            got = region[:, x - x0:x - x0 + w] if grey else region[:, x - x0:x - x0 + w, :3]
            assert np.array_equal(got, ref[y:y + h, x:x + w]), (name, x, y, w, h)
    assert jpegregion.decode_region(_variants()["420"], 340, 0, 20, 5, 1, False) is None  # outside the image
    assert jpegregion.decode_region(b"\xff\xd8\xff\xe0 not a jpeg", 0, 0, 4, 4, 1, False) is None


@needs_region
@pytest.mark.parametrize("draft", [False, True])
@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_fused_decoder_reads_only_the_region_with_the_same_pixels(monkeypatch, draft, mode):
    import parrecio.decoders.image as image_module
    calls = []
    real = image_module._jpegregion

    class Counting:
        @staticmethod
        def decode_region(*args):
            calls.append(args[1:])
            return real.decode_region(*args)

    for size in (224, 48):
        fused = Image(size=size, mode=mode, crop=RandomResizedCrop(), flip=0.5, draft=draft)
        for name, payload in _variants().items():
            for key in range(6):
                monkeypatch.setattr(image_module, "_jpegregion", Counting)
                got = fused(payload, key=key)
                monkeypatch.setattr(image_module, "_jpegregion", None)
                assert np.array_equal(got, fused(payload, key=key)), (name, key, size)
    assert len(calls) == 2 * 6 * 6  # every variant but CMYK, which Pillow opens as CMYK: decoded whole
    if draft:
        assert any(scale > 1 for *_, scale, _ in calls)  # the small output let libjpeg scale the DCT


def test_a_truncated_jpeg_is_refused_as_without_region_decoding():
    from parrecio import DecodeError
    payload = encode(photo(320, 240, seed=2), quality=90)
    cut = payload[:len(payload) // 2]
    if jpegregion is not None:  # the rest holds with or without the extension
        assert jpegregion.decode_region(cut, 0, 200, 100, 30, 1, False) is None  # libjpeg warned: Pillow judges
    with pytest.raises(DecodeError, match="truncated or corrupt JPEG"):
        Image(size=64, crop=CenterCrop(0.9))(cut)
    assert Image(size=64, crop=CenterCrop(0.9), allow_truncated=True)(cut).shape == (64, 64, 3)


@needs_region
def test_damaged_jpegs_fail_or_decode_alike_with_and_without_region_decoding(monkeypatch):
    """Bit flips and cuts (fuzzing the C extension's error paths): the region path gives the whole-decode
    path's array, or the same error."""
    import parrecio.decoders.image as image_module
    from parrecio import DecodeError
    region = image_module._jpegregion
    good = encode(photo(200, 150, seed=6), quality=85)
    rng = random.Random(11)
    fused = Image(size=48, crop=RandomResizedCrop(), flip=0.5)
    outcomes = set()
    for trial in range(120):
        data = bytearray(good)
        if trial % 3 == 0:
            data = data[:rng.randint(2, len(data) - 1)]
        else:
            for _ in range(rng.randint(1, 6)):
                data[rng.randrange(20, len(data))] ^= 1 << rng.randrange(8)
        results = []
        for module in (region, None):
            monkeypatch.setattr(image_module, "_jpegregion", module)
            try:
                results.append(fused(bytes(data), key=trial))
            except DecodeError as exc:
                results.append(type(exc))
        if isinstance(results[0], np.ndarray) and isinstance(results[1], np.ndarray):
            assert np.array_equal(results[0], results[1]), trial
            outcomes.add("decoded")
        else:
            assert results[0] == results[1], (trial, results)
            outcomes.add("refused")
    assert outcomes == {"decoded", "refused"}


def test_a_cut_jpeg_with_an_exif_thumbnail_is_still_seen_as_cut():
    """The thumbnail in the EXIF header ends in FF D9 too: only the main image's end marker counts."""
    from parrecio import DecodeError
    from parrecio.decoders.image import _ends_in_eoi
    thumb = PILImage.fromarray(photo(64, 48, seed=1))
    main = PILImage.fromarray(photo(320, 240, seed=2))
    exif = main.getexif()
    buf = __import__("io").BytesIO()
    thumb.save(buf, "JPEG")
    app1 = b"Exif\0\0" + exif.tobytes()  # a header segment that carries a whole JPEG, as cameras write
    segment = b"\xff\xe1" + (len(app1) + 2 + len(buf.getvalue())).to_bytes(2, "big") + app1 + buf.getvalue()
    payload = encode(np.asarray(main), quality=90)
    payload = payload[:2] + segment + payload[2:]
    assert _ends_in_eoi(payload) and _ends_in_eoi(payload + b"\0\0trailing")
    cut = payload[:len(payload) * 2 // 3]
    assert b"\xff\xd9" in cut and not _ends_in_eoi(cut)
    assert Image(size=32)(payload).shape == (32, 32, 3)
    with pytest.raises(DecodeError, match="truncated"):
        Image(size=32, crop=CenterCrop(0.2))(cut)  # the centre is decoded before the cut: still refused
