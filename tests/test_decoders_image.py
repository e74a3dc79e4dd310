"""Image and Mask decoders: exact equality with Pillow, resize geometry, layouts, decode_into, refusals."""

from __future__ import annotations

import io
import time
import warnings

import numpy as np
import psutil
import pytest
from PIL import Image as PILImage
from PIL import ImageFile, ImageOps

from image_helpers import (encode, jpeg, jpeg_claiming, mask_png, palette_mask, photo, png, png_claiming,
                           with_exif_orientation)
from parrecio.decoders import ArraySpec, Image, Mask
from parrecio.decoders.base import write_into
from parrecio.errors import DecodeError
from parrecio.recordio.irheader import IRHeader, pack

SIZES = [(320, 240), (500, 375)]


def pil(payload: bytes, mode: str = "RGB") -> PILImage.Image:
    return PILImage.open(io.BytesIO(payload)).convert(mode)


def encoded(fmt: str, width: int, height: int) -> bytes:
    return jpeg(width, height) if fmt == "jpeg" else png(width, height)


# -- plain decodes -------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["jpeg", "png"])
@pytest.mark.parametrize("mode", ["RGB", "L"])
@pytest.mark.parametrize("width,height", SIZES)
def test_plain_decode_equals_pillow(fmt, mode, width, height):
    payload = encoded(fmt, width, height)
    got = Image(mode=mode)(payload)
    expected = np.asarray(pil(payload, mode))
    assert got.dtype == np.uint8 and got.shape == expected.shape
    assert np.array_equal(got, expected)
    assert got.flags.writeable and got.flags.c_contiguous


@pytest.mark.parametrize("source_mode", ["L", "RGBA", "P"])
def test_other_source_modes_convert_like_pillow(source_mode):
    payload = png(160, 120, mode=source_mode) if source_mode != "L" else jpeg(160, 120, mode="L")
    for mode in ("RGB", "L"):
        assert np.array_equal(Image(mode=mode)(payload), np.asarray(pil(payload, mode)))


@pytest.mark.parametrize("fmt", ["GIF", "BMP", "TIFF", "PPM"])
def test_whatever_pillow_reads(fmt):
    payload = encode(photo(64, 48), fmt)
    assert np.array_equal(Image()(payload), np.asarray(pil(payload)))


def test_keep_mode_returns_pillow_native_array():
    payload = png(80, 60, mode="RGBA")
    decoder = Image(mode="keep")
    assert decoder.output_spec is None
    got = decoder(payload)
    assert got.shape == (60, 80, 4) and np.array_equal(got, np.asarray(PILImage.open(io.BytesIO(payload))))
    assert Image(size=32, mode="keep").output_spec is None
    assert Image(size=32, mode="keep")(payload).shape == (32, 32, 4)


def test_bytes_like_payloads():
    payload = jpeg(160, 120)
    expected = Image(64)(payload)
    for form in (bytearray(payload), memoryview(payload), np.frombuffer(payload, np.uint8)):
        assert np.array_equal(Image(64)(form), expected)


def test_palette_png_with_transparency_converts_without_warning():
    image = PILImage.fromarray(photo(64, 48)).quantize(16)
    buf = io.BytesIO()
    image.save(buf, "PNG", transparency=bytes(range(16)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = Image()(buf.getvalue())
    assert got.shape == (48, 64, 3)


# -- resize modes --------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["jpeg", "png"])
@pytest.mark.parametrize("mode", ["RGB", "L"])
@pytest.mark.parametrize("resample", ["bilinear", "bicubic", "lanczos"])
def test_stretch_equals_pillow_resize(fmt, mode, resample):
    payload = encoded(fmt, 500, 375)
    filters = {"bilinear": PILImage.BILINEAR, "bicubic": PILImage.BICUBIC, "lanczos": PILImage.LANCZOS}
    expected = np.asarray(pil(payload, mode).resize((200, 100), filters[resample]))
    got = Image(size=(100, 200), mode=mode, resample=resample)(payload)
    assert np.array_equal(got, expected)


def test_default_resample_is_bilinear():
    payload = jpeg(500, 375)
    assert np.array_equal(Image(224)(payload), np.asarray(pil(payload).resize((224, 224), PILImage.BILINEAR)))


@pytest.mark.parametrize("width,height,size,box", [
    # landscape to a square: height kept, width cropped around the centre: 375 * 224/224 = 375 wide
    (500, 375, (224, 224), (62.5, 0, 437.5, 375)),
    # portrait to a square
    (240, 320, (112, 112), (0, 40, 240, 280)),
    # landscape to a wide frame (h=100, w=224): width kept (scale 0.7), height 100/0.7 around the centre
    (320, 240, (100, 224), (0, (240 - 100 * 320 / 224) / 2, 320, (240 + 100 * 320 / 224) / 2)),
])
def test_shorter_is_one_resize_of_the_centre_box(width, height, size, box):
    payload = jpeg(width, height)
    decoder = Image(size=size, resize="shorter")
    expected = np.asarray(pil(payload).resize((size[1], size[0]), PILImage.BILINEAR, box=box))
    assert np.array_equal(decoder(payload), expected)
    geo = decoder.geometry(width, height)
    scale = max(size[1] / width, size[0] / height)
    assert geo.scale_x == pytest.approx(scale) and geo.scale_y == pytest.approx(scale)
    assert geo.offset_x == pytest.approx(-box[0] * scale) and geo.offset_y == pytest.approx(-box[1] * scale)


def test_shorter_matches_resize_then_crop_closely():
    """The one-pass crop equals resize-whole-then-crop when the crop offset is a whole pixel."""
    payload = jpeg(320, 240)  # to 120x90 (scale 0.375): crop 90x90 at x = 15 exactly
    full = pil(payload).resize((120, 90), PILImage.BILINEAR)
    expected = np.asarray(full)[:, 15:105]
    got = Image(size=90, resize="shorter")(payload)
    assert np.abs(got.astype(int) - expected).max() <= 1


@pytest.mark.parametrize("layout", ["HWC", "CHW"])
def test_letterbox_offsets_scale_and_fill(layout):
    payload = jpeg(500, 375)
    decoder = Image(size=224, resize="letterbox", fill=(1, 2, 3), layout=layout)
    # scale = min(224/500, 224/375) = 0.448 -> 224 x 168, pad_y = (224 - 168) // 2 = 28
    assert decoder.letterbox_params(500, 375) == (pytest.approx(0.448), 0, 28)
    got = decoder(payload)
    if layout == "CHW":
        got = got.transpose(1, 2, 0)
    expected = np.asarray(pil(payload).resize((224, 168), PILImage.BILINEAR))
    assert np.array_equal(got[28:196], expected)
    assert (got[:28] == (1, 2, 3)).all() and (got[196:] == (1, 2, 3)).all()
    geo = decoder.geometry(500, 375)
    assert (geo.scale_x, geo.scale_y, geo.offset_x, geo.offset_y) == (0.448, 0.448, 0, 28)


def test_letterbox_portrait_into_non_square_frame():
    payload = png(240, 320)  # portrait into h=300, w=200: scale min(200/240, 300/320) = 0.8333 -> 200x267
    decoder = Image(size=(300, 200), resize="letterbox", fill=9, mode="L")
    scale, pad_x, pad_y = decoder.letterbox_params(240, 320)
    assert scale == pytest.approx(200 / 240) and (pad_x, pad_y) == (0, (300 - 267) // 2)
    got = decoder(payload)
    expected = np.asarray(pil(payload, "L").resize((200, 267), PILImage.BILINEAR))
    assert np.array_equal(got[16:283], expected)
    assert (got[:16] == 9).all() and (got[283:] == 9).all()


def test_letterbox_upscales_small_images():
    payload = png(40, 20)
    decoder = Image(size=(100, 100), resize="letterbox")
    assert decoder.letterbox_params(40, 20) == (2.5, 0, 25)
    got = decoder(payload)
    assert np.array_equal(got[25:75], np.asarray(pil(payload).resize((100, 50), PILImage.BILINEAR)))


def test_geometry_maps_a_marked_pixel():
    """A bright square in the source lands where geometry() says, in every resize mode."""
    arr = np.zeros((300, 400, 3), np.uint8)
    arr[100:140, 250:290] = 255  # x 250..290, y 100..140
    payload = encode(arr, "PNG")
    for resize in ("stretch", "letterbox", "shorter"):
        decoder = Image(size=(128, 160), resize=resize, mode="L")
        out = decoder(payload)
        geo = decoder.geometry(400, 300)
        ys, xs = np.nonzero(out > 128)
        cx, cy = (xs.min() + xs.max() + 1) / 2, (ys.min() + ys.max() + 1) / 2
        assert cx == pytest.approx(270 * geo.scale_x + geo.offset_x, abs=1)
        assert cy == pytest.approx(120 * geo.scale_y + geo.offset_y, abs=1)


def test_geometry_apply_maps_and_clips_boxes():
    geo = Image(size=224, resize="letterbox").geometry(500, 375)
    boxes = np.array([[3, 0, 0, 500, 375], [-1, -1, -1, -1, -1]], np.float32)
    mapped = geo.apply(boxes)
    assert mapped[0].tolist() == pytest.approx([3, 0, 28, 224, 196])
    assert mapped[1].tolist() == [-1] * 5


def test_same_size_is_not_resized():
    payload = png(64, 48)
    assert np.array_equal(Image(size=(48, 64))(payload), np.asarray(pil(payload)))


# -- layout and decode_into ----------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_chw_is_hwc_transposed(mode):
    payload = jpeg(320, 240)
    hwc = Image(size=(96, 128), mode=mode)(payload)
    chw = Image(size=(96, 128), mode=mode, layout="CHW")(payload)
    assert chw.shape == ((3, 96, 128) if mode == "RGB" else (1, 96, 128))
    assert np.array_equal(chw, hwc.transpose(2, 0, 1) if mode == "RGB" else hwc[None])
    assert chw.flags.c_contiguous
    assert Image(mode=mode, layout="CHW")(payload).shape[1:] == (240, 320)


@pytest.mark.parametrize("resize", ["stretch", "letterbox", "shorter"])
@pytest.mark.parametrize("layout", ["HWC", "CHW"])
def test_decode_into_slice_writes_nothing_outside(resize, layout):
    payload = jpeg(500, 375)
    decoder = Image(size=(64, 96), resize=resize, layout=layout, fill=5)
    spec = decoder.output_spec
    assert spec == ArraySpec((64, 96, 3) if layout == "HWC" else (3, 64, 96), np.uint8)
    batch = np.full((3,) + spec.shape, 77, np.uint8)
    guard = np.full((3,) + spec.shape, 77, np.uint8)
    assert decoder.decode_into(payload, batch[1]) is None
    assert np.array_equal(batch[1], decoder(payload))
    assert np.array_equal(batch[[0, 2]], guard[[0, 2]])
    assert write_into(decoder, payload, spec, batch[2]) is None
    assert np.array_equal(batch[2], batch[1])


def test_decode_into_a_strided_view():
    payload = jpeg(320, 240)
    decoder = Image(size=(32, 48), mode="L")
    big = np.zeros((64, 96), np.uint8)
    decoder.decode_into(payload, big[::2, ::2])
    assert np.array_equal(big[::2, ::2], decoder(payload))
    assert not big[1::2].any() and not big[:, 1::2].any()


# -- draft, reducing_gap, EXIF -------------------------------------------------------------------------
def test_draft_is_pillow_draft_plus_the_same_box():
    payload = jpeg(1000, 750, quality=90)
    got = Image(size=224, draft=True)(payload)
    image = PILImage.open(io.BytesIO(payload))
    _, box = image.draft("RGB", (224, 224))  # min(1000 // 224, 750 // 224) = 3 -> 1/2 scale
    assert image.size == (500, 375) and box == (0, 0, 500.0, 375.0)
    expected = np.asarray(image.convert("RGB").resize((224, 224), PILImage.BILINEAR, box=box))
    assert np.array_equal(got, expected)
    exact = Image(size=224)(payload)
    assert np.abs(got.astype(int) - exact).mean() < 2.0


def test_draft_gap_and_small_images_stay_exact():
    small = jpeg(320, 240)
    assert np.array_equal(Image(size=224, draft=True)(small), Image(size=224)(small))
    big = jpeg(1000, 750)
    # gap 2: needs >= 448 px at 1/2 scale: 1000x750 / 2 = 500x375 is not enough -> no DCT scaling
    assert np.array_equal(Image(size=224, draft=2.0)(big), Image(size=224)(big))
    with pytest.raises(ValueError):
        Image(size=224, draft=0.49)


@pytest.mark.parametrize("crop", [False, True])
def test_draft_below_one_decodes_at_half_scale_and_enlarges(crop, monkeypatch):
    """``draft=0.75``: a 490x390 JPEG at 224 px decodes at 1/2 (245x195: at least 0.75 x 224 per side) and
    the resize enlarges it a little; the pixels are Pillow's own ``draft`` + ``resize`` of that scale,
    written here as a plain reference, and DCT scaling is still refused where even 1/2 falls below the
    gap (a 300 px side: 150 < 168).  With a crop, the region decoder (C) picks the scale Pillow's draft
    picks: the same pixels as the Pillow path."""
    import parrecio.decoders.image as image_module
    from parrecio.decoders import CenterCrop
    data = jpeg(490, 390)
    if crop:
        if image_module._jpegregion is None:
            pytest.skip("the C extension is not built")
        region = Image(size=224, draft=0.75, crop=CenterCrop(1.0))(data)
        exact = Image(size=224, crop=CenterCrop(1.0))(data)
        monkeypatch.setattr(image_module, "_jpegregion", None)
        assert np.array_equal(region, Image(size=224, draft=0.75, crop=CenterCrop(1.0))(data))
        assert not np.array_equal(region, exact) and np.abs(region.astype(int) - exact).mean() < 3
        return
    im = PILImage.open(io.BytesIO(data))
    got = im.draft("RGB", (168, 168))
    assert got is not None and im.size == (245, 195)
    want = np.asarray(im.convert("RGB").resize((224, 224), PILImage.BILINEAR, box=(0, 0, 245, 195)))
    out = Image(size=224, draft=0.75)(data)
    assert np.array_equal(out, want)
    assert not np.array_equal(out, Image(size=224)(data))
    assert np.abs(out.astype(int) - Image(size=224)(data)).mean() < 3  # close to the exact path
    narrow = jpeg(300, 400)  # its 300 px side at 1/2 is 150 < 0.75 * 224: no DCT scaling
    assert np.array_equal(Image(size=224, draft=0.75)(narrow), Image(size=224)(narrow))


def test_draft_keeps_letterbox_and_shorter_geometry():
    arr = np.zeros((800, 1200, 3), np.uint8)
    arr[300:420, 900:1020] = 255
    payload = encode(arr, "JPEG", quality=95)
    for resize in ("letterbox", "shorter"):
        exact = Image(size=(100, 120), resize=resize, mode="L")(payload).astype(int)
        fast = Image(size=(100, 120), resize=resize, mode="L", draft=True)(payload).astype(int)
        assert np.abs(exact - fast).max() <= 40 and np.abs(exact - fast).mean() < 1.5


def test_draft_grey_decodes_luma_only_and_stays_close():
    payload = jpeg(320, 240)
    exact = Image(mode="L")(payload).astype(int)
    luma = Image(mode="L", draft=True)(payload).astype(int)
    image = PILImage.open(io.BytesIO(payload))
    image.draft("L", None)
    assert np.array_equal(luma, np.asarray(image))
    assert np.abs(exact - luma).mean() < 0.1 and np.abs(exact - luma).max() <= 32


def test_reducing_gap_is_pillow_reducing_gap():
    payload = jpeg(1000, 750)
    got = Image(size=112, reducing_gap=2.0)(payload)
    expected = np.asarray(pil(payload).resize((112, 112), PILImage.BILINEAR, reducing_gap=2.0))
    assert np.array_equal(got, expected)


def test_exif_orientation_ignored_by_default_and_applied_on_request():
    arr = np.ascontiguousarray(photo(160, 120))
    payload = with_exif_orientation(arr, 6)  # rotate 90 degrees clockwise to show upright
    raw = np.asarray(pil(payload))
    assert np.array_equal(Image()(payload), raw)
    upright = np.asarray(ImageOps.exif_transpose(PILImage.open(io.BytesIO(payload))).convert("RGB"))
    got = Image(exif_transpose=True)(payload)
    assert got.shape == (160, 120, 3) and np.array_equal(got, upright)
    # with a resize: done in the stored frame, then transposed; within rounding of the other order
    resized = Image(size=(80, 60), exif_transpose=True)(payload)
    expected = np.asarray(PILImage.fromarray(upright).resize((60, 80), PILImage.BILINEAR))
    assert resized.shape == (80, 60, 3) and np.abs(resized.astype(int) - expected).max() <= 2


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientations_with_letterbox(orientation):
    arr = np.ascontiguousarray(photo(120, 80))
    payload = with_exif_orientation(arr, orientation)
    upright = ImageOps.exif_transpose(PILImage.open(io.BytesIO(payload))).convert("RGB")
    decoder = Image(size=64, resize="letterbox", exif_transpose=True)
    scale, pad_x, pad_y = decoder.letterbox_params(*upright.size)
    got = decoder(payload)
    w, h = round(upright.width * scale), round(upright.height * scale)
    expected = np.asarray(upright.resize((w, h), PILImage.BILINEAR))
    assert np.abs(got[pad_y:pad_y + h, pad_x:pad_x + w].astype(int) - expected).max() <= 3


@pytest.mark.parametrize("orientation", [3, 6])
def test_a_tiff_is_turned_upright_once(orientation):
    """Pillow turns a TIFF upright by its orientation tag itself (at load, and it reports the upright size):
    exif_transpose=True turned it a second time."""
    arr = np.ascontiguousarray(photo(60, 40))
    exif = PILImage.Exif()
    exif[0x0112] = orientation
    out = io.BytesIO()
    PILImage.fromarray(arr).save(out, "TIFF", exif=exif.tobytes())
    payload = out.getvalue()
    upright = np.asarray(ImageOps.exif_transpose(PILImage.open(io.BytesIO(payload))).convert("RGB"))
    assert upright.shape != arr.shape or not np.array_equal(upright, arr)  # the tag does turn it
    for transpose in (False, True):  # as PIL.Image.open gives it, whatever the option says
        assert np.array_equal(Image(exif_transpose=transpose)(payload), upright)
        expected = np.asarray(PILImage.fromarray(upright).resize((30, 20), PILImage.BILINEAR))
        assert np.array_equal(Image((20, 30), exif_transpose=transpose)(payload), expected)


# -- refusals ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("payload,words", [
    (b'{"image_size": [{"width": 5}]}', "JSON text"),
    (b"hello world, not an image", "text"),
    (b"", "empty"),
    (bytes(range(256)) * 4, "binary data"),
    (b"RIFF\x24\x00\x00\x00WEBPVP8 " + bytes(24), "WEBP"),
])
def test_non_images_are_refused_naming_what_they_look_like(payload, words):
    with pytest.raises(DecodeError, match=words):
        Image()(payload)


def test_an_image_record_given_to_image_says_so():
    record = pack(IRHeader(0, 1.0, 7, 0), jpeg(32, 32))
    with pytest.raises(DecodeError, match="ImageRecord"):
        Image()(record)


@pytest.mark.parametrize("cut", [0.5, 0.9, -2])
def test_truncated_jpeg_raises(cut):
    payload = jpeg(320, 240)
    end = int(len(payload) * cut) if cut > 0 else len(payload) + cut
    with pytest.raises(DecodeError, match="truncated"):
        Image()(payload[:end])


def test_truncated_jpeg_raises_even_with_pillows_global_flag(monkeypatch):
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    payload = jpeg(320, 240)[:6000]
    with pytest.raises(DecodeError):
        Image(size=64)(payload)
    assert ImageFile.LOAD_TRUNCATED_IMAGES is True  # restored
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", False)
    assert Image(size=64, allow_truncated=True)(payload).shape == (64, 64, 3)
    assert ImageFile.LOAD_TRUNCATED_IMAGES is False


def test_threads_decoding_at_once_keep_pillows_globals_and_their_own_rules():
    """Pillow's LOAD_TRUNCATED_IMAGES and MAX_IMAGE_PIXELS are process globals that a decode sets around
    its call: eight threads decoding strictly, leniently and plainly at once (a thread pool, or workers=0
    readers in two threads) undid each other's setting -- a strict decode accepted a truncated JPEG, a
    lenient one refused it, and the process kept MAX_IMAGE_PIXELS = None (pillow_globals.py)."""
    from concurrent.futures import ThreadPoolExecutor
    cut, good = jpeg(320, 240)[:6000], jpeg(64, 48)
    strict, lenient = Image(size=32), Image(size=32, allow_truncated=True)
    limit = PILImage.MAX_IMAGE_PIXELS

    def job(k):
        if k % 3 == 0:
            try:
                strict(cut)
            except DecodeError:
                return "refused"
            return "strict accepted a truncated image"
        if k % 3 == 1:
            try:
                return "accepted" if lenient(cut).shape == (32, 32, 3) else "wrong shape"
            except DecodeError as exc:
                return f"allow_truncated refused: {exc}"
        return "good" if Image()(good).shape == (48, 64, 3) else "wrong shape"

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(job, range(1500)))
    assert {x: got.count(x) for x in set(got)} == {"refused": 500, "accepted": 500, "good": 500}
    assert ImageFile.LOAD_TRUNCATED_IMAGES is False and PILImage.MAX_IMAGE_PIXELS == limit


@pytest.mark.parametrize("options", [{}, {"size": 64}, {"size": 64, "crop": "center"}])
def test_truncated_png_raises_with_exif_transpose_and_pillows_global_flag(monkeypatch, options):
    """Pillow's getexif() loads a PNG to look for an eXIf chunk after its pixels -- under the global
    LOAD_TRUNCATED_IMAGES: with exif_transpose=True a PNG cut in half was accepted (grey below the cut)."""
    from parrecio.decoders import CenterCrop
    if options.get("crop") == "center":
        options = dict(options, crop=CenterCrop(0.8))
    rng = np.random.default_rng(0)
    buf = io.BytesIO()
    PILImage.fromarray(rng.integers(0, 256, (200, 300, 3), dtype=np.uint8)).save(buf, "PNG")
    payload = buf.getvalue()[:len(buf.getvalue()) // 2]
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    for exif_transpose in (False, True):
        with pytest.raises(DecodeError, match="truncated or corrupt PNG image of 300x200"):
            Image(exif_transpose=exif_transpose, **options)(payload)
    assert ImageFile.LOAD_TRUNCATED_IMAGES is True


@pytest.mark.parametrize("fmt", ["PNG", "TIFF"])
def test_16_bit_grey_becomes_8_bit_by_its_high_byte(fmt):
    """Pillow's convert("L") of a 16-bit grey image (I;16) clips at 255: a 0..65535 ramp came out all
    white but its first pixel, silently.  Its high byte is taken, as OpenCV and MXNet's imdecode do; the
    same picture stored as 16-bit RGB was right already."""
    ramp = (np.arange(256, dtype=np.uint16) * 257).reshape(16, 16)
    buf = io.BytesIO()
    PILImage.fromarray(ramp).save(buf, fmt)  # (uint16: I;16)
    payload = buf.getvalue()
    want = (ramp >> 8).astype(np.uint8)
    assert np.array_equal(Image(mode="L")(payload), want)
    assert np.array_equal(Image(mode="RGB")(payload), np.repeat(want[:, :, None], 3, axis=2))
    assert np.array_equal(Image(mode="L", size=(8, 8))(payload),
                          np.asarray(PILImage.fromarray(want).resize((8, 8), PILImage.BILINEAR)))
    kept = Image(mode="keep")(payload)
    assert kept.dtype == np.uint16 and np.array_equal(kept, ramp)


def test_jpeg_cut_mid_scan_but_ending_in_eoi_decodes_unless_strict():
    """libjpeg only warns on a scan cut short before an EOI marker, and Pillow drops its warnings: the
    default decodes it (grey lower half), strict=True refuses it (tests/test_decoders_image_strict.py)."""
    payload = jpeg(320, 240)
    cut = payload[:len(payload) // 2] + b"\xff\xd9"
    assert np.array_equal(Image()(cut), np.asarray(pil(cut)))
    with pytest.raises(DecodeError, match="libjpeg says"):
        Image(strict=True)(cut)


def test_truncated_and_corrupt_png_raise():
    payload = png(320, 240)
    with pytest.raises(DecodeError, match="truncated|corrupt"):
        Image()(payload[:len(payload) // 2])
    broken = bytearray(payload)
    broken[len(broken) // 2:len(broken) // 2 + 64] = bytes(64)
    with pytest.raises(DecodeError):
        Image()(bytes(broken))
    with pytest.raises(DecodeError, match="cannot read this PNG image"):
        Image()(payload[:30])
    for names in (("png",), ("PNG",)):  # the names in any case, as Pillow takes them
        with pytest.raises(DecodeError, match=r"^cannot read this PNG image \(corrupt header\)"):
            Image(formats=names)(payload[:30])
    with pytest.raises(DecodeError, match=r"^cannot read this PNG image \(PNG is not in formats=\('jpeg',\)\)"):
        Image(formats=("jpeg",))(payload[:30])


@pytest.mark.parametrize("payload,max_pixels", [
    (png_claiming(20000, 20000), 64_000_000),   # 400 Mpx: beyond Pillow's own bomb error too
    (png_claiming(9000, 8000), 64_000_000),     # 72 Mpx: under Pillow's limits, over ours
    (jpeg_claiming(10000, 9500), 64_000_000),   # 95 Mpx: Pillow would only warn
    (jpeg_claiming(20000, 20000), 300_000_000),  # over a max_pixels above Pillow's own limit
    (png(320, 240), 1000),
])
def test_decompression_bombs_refused_before_allocation(payload, max_pixels, monkeypatch):
    def no_load(self):
        raise AssertionError("load() reached: pixel memory would have been allocated")

    monkeypatch.setattr(ImageFile.ImageFile, "load", no_load)
    rss = psutil.Process().memory_info().rss
    start = time.perf_counter()
    for decoder in (Image(max_pixels=max_pixels), Image(size=224, max_pixels=max_pixels),
                    Mask(max_pixels=max_pixels)):
        with pytest.raises(DecodeError, match="bomb"):
            decoder(payload)
    assert time.perf_counter() - start < 1.0
    assert psutil.Process().memory_info().rss - rss < 50 * 2**20


def test_max_pixels_is_the_one_limit(monkeypatch):
    """A max_pixels above Pillow's MAX_IMAGE_PIXELS (89 Mpx) is honoured: Pillow's bomb warning refused
    every image over 89 Mpx whatever max_pixels said.  Pillow's setting is left as it was."""
    payload = png(320, 240)
    expected = np.asarray(pil(payload).resize((32, 24), PILImage.BILINEAR))
    monkeypatch.setattr(PILImage, "MAX_IMAGE_PIXELS", 1000)  # stands for 89 Mpx: 320x240 is over it
    assert np.array_equal(Image((24, 32), max_pixels=320 * 240)(payload), expected)
    assert np.array_equal(Image((24, 32), max_pixels=320 * 240, backend="simplejpeg")(jpeg(320, 240)),
                          Image((24, 32), backend="pillow")(jpeg(320, 240)))
    assert PILImage.MAX_IMAGE_PIXELS == 1000
    with pytest.raises(DecodeError, match=r"76800 pixels refused: more than max_pixels=76799"):
        Image(max_pixels=320 * 240 - 1)(payload)


def test_bad_parameters():
    for kwargs in (dict(mode="RGBA"), dict(layout="WHC"), dict(resize="crop"), dict(resample="cubic"),
                   dict(size=(0, 5)), dict(reducing_gap=0.5), dict(fill=300), dict(fill=(1, 2)),
                   dict(max_pixels=0)):
        with pytest.raises(ValueError):
            Image(**kwargs)
    with pytest.raises(ValueError):
        Image(size=10).letterbox_params(5, 5)


def test_output_specs():
    assert Image().output_spec is None
    assert Image(size=(10, 20)).output_spec == ArraySpec((10, 20, 3), np.uint8)
    assert Image(size=(10, 20), mode="L").output_spec == ArraySpec((10, 20), np.uint8)
    assert Image(size=(10, 20), mode="L", layout="CHW").output_spec == ArraySpec((1, 10, 20), np.uint8)


# -- Mask ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["P", "L"])
def test_mask_ids_as_stored(mode):
    ids = palette_mask(200, 150)
    got = Mask()(mask_png(ids, mode))
    assert got.dtype == np.uint8 and np.array_equal(got, ids)


@pytest.mark.parametrize("colors", [[], {}, ()])
def test_mask_with_an_empty_colour_table_is_refused_when_made(colors):
    """An empty table was taken, and every RGB mask then raised IndexError (the lookup's last entry)."""
    with pytest.raises(ValueError, match="^colors is empty: give the colour of each class$"):
        Mask(colors=colors)


def test_mask_rgb_needs_colors():
    ids = palette_mask(120, 90, classes=3)
    colors = [(255, 255, 255), (255, 0, 0), (0, 128, 255)]
    payload = mask_png(ids, "RGB", colors)
    with pytest.raises(DecodeError, match="colors"):
        Mask()(payload)
    assert np.array_equal(Mask(colors=colors)(payload), ids)
    assert np.array_equal(Mask(colors=["#ffffff", "#ff0000", "#0080ff"])(payload), ids)
    internal_color_map = {"0": {"class-name": "BACKGROUND", "hex-color": "#ffffff", "confidence": 0.9},
                          "1": {"class-name": "car", "hex-color": "#ff0000"},
                          "2": {"class-name": "sky", "hex-color": "#0080ff"}}
    assert np.array_equal(Mask(colors=internal_color_map)(payload), ids)
    with pytest.raises(DecodeError, match="#0080ff"):
        Mask(colors=colors[:2])(payload)
    assert set(np.unique(Mask(colors=colors[:2], unknown=255)(payload))) == {0, 1, 255}


@pytest.mark.parametrize("resize", ["stretch", "letterbox", "shorter"])
def test_mask_resize_is_nearest_with_image_geometry(resize):
    ids = palette_mask(400, 300, classes=6)
    payload = mask_png(ids, "P")
    decoder = Mask(size=(96, 128), resize=resize, fill=255)
    assert decoder.output_spec == ArraySpec((96, 128), np.uint8)
    got = decoder(payload)
    assert set(np.unique(got)) <= set(range(6)) | {255}
    assert decoder.geometry(400, 300) == Image(size=(96, 128), resize=resize).geometry(400, 300)
    plan_box = {"stretch": (0, 0, 400, 300), "letterbox": (0, 0, 400, 300),
                "shorter": (0, (300 - 96 * 400 / 128) / 2, 400, (300 + 96 * 400 / 128) / 2)}[resize]
    expected = np.asarray(PILImage.open(io.BytesIO(payload)).resize((128, 96), PILImage.NEAREST, box=plan_box))
    assert np.array_equal(got, expected)
    batch = np.full((2, 96, 128), 7, np.uint8)
    decoder.decode_into(payload, batch[0])
    assert np.array_equal(batch[0], got) and (batch[1] == 7).all()


def test_mask_letterbox_pads_with_fill():
    ids = palette_mask(400, 200, classes=4)
    got = Mask(size=100, resize="letterbox", fill=255)(mask_png(ids, "L"))
    assert (got[:25] == 255).all() and (got[75:] == 255).all() and (got[25:75] < 4).all()


def test_mask_sixteen_bit_and_refusals():
    ids = palette_mask(64, 48).astype(np.uint16)
    buf = io.BytesIO()
    PILImage.fromarray(ids).save(buf, "PNG")
    assert np.array_equal(Mask()(buf.getvalue()), ids)
    ids[0, 0] = 300
    buf = io.BytesIO()
    PILImage.fromarray(ids).save(buf, "PNG")
    with pytest.raises(DecodeError, match="0..255"):
        Mask()(buf.getvalue())
    with pytest.raises(DecodeError, match="JSON"):
        Mask()(b'{"a": 1}')
    with pytest.raises(ValueError):
        Mask(colors=["#fff"])
