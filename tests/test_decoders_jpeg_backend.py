"""Image(backend=...): the optional simplejpeg JPEG decoder gives Pillow's pixels, errors and refusals."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from PIL import ImageFile

from image_helpers import encode, jpeg, jpeg_claiming, photo, png, with_exif_orientation
from parrecio.decoders import Image
from parrecio.decoders import simplejpeg_backend as backend_module
from parrecio.errors import DecodeError

# JPEG kinds: name -> bytes (500x375 photo-like, as ImageNet; one odd-sized, one large enough for draft).
KINDS = {
    "q90 4:2:0": lambda: jpeg(500, 375, seed=1, quality=90),
    "q90 4:4:4": lambda: jpeg(500, 375, seed=2, quality=90, subsampling=0),
    "q75 4:2:2": lambda: jpeg(333, 217, seed=3, quality=75, subsampling=1),
    "grey": lambda: jpeg(500, 375, seed=4, mode="L"),
    "progressive": lambda: jpeg(500, 375, seed=5, progressive=True),
    "large 4:2:0": lambda: jpeg(1000, 760, seed=6, quality=85),
}


@pytest.fixture
def sj(monkeypatch):
    """simplejpeg, with ``sj.calls`` counting its full decodes (skips when it is not installed)."""
    module = pytest.importorskip("simplejpeg")
    calls = []
    decode = module.decode_jpeg

    def counting(*args, **kwargs):
        calls.append(kwargs.get("colorspace"))
        return decode(*args, **kwargs)

    monkeypatch.setattr(module, "decode_jpeg", counting)
    monkeypatch.setattr(backend_module, "_simplejpeg_module", module)
    return calls


@pytest.fixture
def no_simplejpeg(monkeypatch):
    """As if simplejpeg were not installed (whether or not it is)."""
    monkeypatch.setattr(backend_module, "_simplejpeg_module", False)
    monkeypatch.setattr(backend_module, "_auto_verdict", None)


def both(**kwargs):
    return Image(backend="pillow", **kwargs), Image(backend="simplejpeg", **kwargs)


# -- without simplejpeg --------------------------------------------------------------------------------
def test_backend_is_validated_and_defaults_to_pillow():
    with pytest.raises(ValueError, match="backend must be one of"):
        Image(backend="turbojpeg")
    assert Image().backend == "pillow" and Image().jpeg_backend == "pillow"
    assert Image(backend="auto") != Image() and "backend='auto'" in repr(Image(backend="auto"))


def test_simplejpeg_missing_is_a_construction_error_with_the_pip_command(no_simplejpeg):
    with pytest.raises(ImportError, match=r"pip install 'parrecio\[fast\]'"):
        Image(size=224, backend="simplejpeg")


def test_auto_without_simplejpeg_is_pillow(no_simplejpeg):
    decoder = Image(size=224, backend="auto")
    assert decoder.jpeg_backend == "pillow"
    payload = jpeg(320, 240)
    np.testing.assert_array_equal(decoder(payload), Image(size=224)(payload))
    assert pickle.loads(pickle.dumps(decoder)) == decoder


# -- with simplejpeg: the same pixels ------------------------------------------------------------------
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("resize", ["stretch", "letterbox", "shorter"])
@pytest.mark.parametrize("layout", ["HWC", "CHW"])
def test_same_pixels_as_pillow(sj, kind, resize, layout):
    payload = KINDS[kind]()
    pillow, fast = both(size=(224, 224), resize=resize, layout=layout, fill=(124, 116, 104))
    expected = pillow(payload)
    got = fast(payload)
    assert got.shape == expected.shape == fast.output_spec.shape and got.dtype == np.uint8
    np.testing.assert_array_equal(got, expected)
    assert sj == ["GRAY" if kind == "grey" else "RGBX"]  # decoded by simplejpeg, once


@pytest.mark.parametrize("kind", ["q90 4:2:0", "grey", "large 4:2:0"])
@pytest.mark.parametrize("options", [dict(mode="L"), dict(mode="keep"), dict(size=(56, 56), draft=True),
                                     dict(size=(56, 56), draft=2.0, resize="shorter"),
                                     dict(size=(56, 72), draft=True, mode="L", resize="letterbox"),
                                     dict(size=None, draft=True, mode="L"),
                                     dict(size=(224, 224), reducing_gap=2.0, resample="bicubic"),
                                     dict(size=(900, 900), draft=True, resize="shorter")])  # upscaling: no DCT
def test_same_pixels_with_modes_and_draft(sj, kind, options):
    payload = KINDS[kind]()
    pillow, fast = both(**options)
    np.testing.assert_array_equal(fast(payload), pillow(payload))
    assert len(sj) == 1


def test_draft_scales_like_pillow(sj):
    payload = KINDS["large 4:2:0"]()  # 1000x760 to 56x56: Pillow's draft picks 1/8
    fast = Image(size=56, draft=True, backend="simplejpeg")
    loaded = fast._simplejpeg_load(payload, backend_module._simplejpeg(), None, 1.0)
    assert loaded.image.size == (125, 95) and loaded.factors == (1 / 8, 1 / 8)


@pytest.mark.parametrize("orientation", [3, 6, 8])
def test_exif_transpose_still_works(sj, orientation):
    payload = with_exif_orientation(np.ascontiguousarray(photo(320, 240, seed=9)), orientation, quality=90)
    pillow, fast = both(size=(200, 120), resize="letterbox", exif_transpose=True)
    np.testing.assert_array_equal(fast(payload), pillow(payload))
    assert len(sj) == 1
    np.testing.assert_array_equal(Image(backend="simplejpeg")(payload), Image()(payload))  # EXIF ignored


# -- with simplejpeg: what goes to Pillow, refusals ----------------------------------------------------
def test_non_jpeg_and_cmyk_go_through_pillow(sj):
    pillow, fast = both(size=(224, 224))
    for payload in (png(320, 240), png(320, 240, mode="P"), encode(photo(320, 240), "JPEG", mode="CMYK")):
        np.testing.assert_array_equal(fast(payload), pillow(payload))
    assert sj == []


def test_formats_without_jpeg_refuses_jpeg_as_pillow_does(sj):
    fast = Image(formats=("PNG",), backend="simplejpeg")
    assert fast.jpeg_backend == "pillow"
    with pytest.raises(DecodeError, match="not in formats"):
        fast(jpeg(64, 48))


@pytest.mark.parametrize("claim", [(20000, 20000), (9000, 8000)])
def test_bombs_refused_from_the_header_before_decoding(sj, monkeypatch, claim):
    def no_load(self):
        raise AssertionError("pixels decoded")

    monkeypatch.setattr(ImageFile.ImageFile, "load", no_load)
    with pytest.raises(DecodeError, match="max_pixels=64000000"):
        Image(size=224, backend="simplejpeg")(jpeg_claiming(*claim))
    assert sj == []
    with pytest.raises(DecodeError, match="max_pixels=1000"):
        Image(size=224, backend="simplejpeg", max_pixels=1000)(jpeg(64, 48))


@pytest.mark.parametrize("cut", [0.5, 0.9])
def test_truncated_jpeg_raises_like_pillow(sj, monkeypatch, cut):
    payload = jpeg(320, 240)
    payload = payload[:int(len(payload) * cut)]
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)  # the caller's global does not matter
    with pytest.raises(DecodeError, match="truncated or corrupt JPEG"):
        Image(size=224, backend="simplejpeg")(payload)
    pillow, fast = both(size=224, allow_truncated=True)
    np.testing.assert_array_equal(fast(payload), pillow(payload))


def test_corrupt_header_and_non_images_raise(sj):
    fast = Image(size=224, backend="simplejpeg")
    with pytest.raises(DecodeError):
        fast(b"\xff\xd8\xff\xe0" + b"\x00" * 40)
    with pytest.raises(DecodeError, match="not an image"):
        fast(b'{"a": 1}')


# -- with simplejpeg: the decoder protocol -------------------------------------------------------------
def test_pickles_and_decodes_bytes_like_payloads(sj):
    fast = Image(size=(224, 224), layout="CHW", backend="simplejpeg")
    clone = pickle.loads(pickle.dumps(fast))
    assert clone == fast and clone.backend == "simplejpeg" and "module" not in str(vars(clone))
    payload = KINDS["q90 4:2:0"]()
    expected = Image(size=(224, 224), layout="CHW")(payload)
    for view in (payload, memoryview(payload), np.frombuffer(payload, np.uint8)):
        np.testing.assert_array_equal(clone(view), expected)


@pytest.mark.parametrize("resize", ["stretch", "letterbox"])
@pytest.mark.parametrize("layout", ["HWC", "CHW"])
def test_decode_into_a_slice_writes_nothing_outside(sj, resize, layout):
    fast = Image(size=(96, 128), resize=resize, layout=layout, fill=7, backend="simplejpeg")
    big = np.full((4,) + fast.output_spec.shape, 201, np.uint8)
    payload = KINDS["q90 4:4:4"]()
    fast.decode_into(payload, big[2])
    np.testing.assert_array_equal(big[2], Image(size=(96, 128), resize=resize, layout=layout, fill=7)(payload))
    assert (big[[0, 1, 3]] == 201).all()


def test_auto_uses_simplejpeg_only_when_it_matches_pillow(sj, monkeypatch):
    monkeypatch.setattr(backend_module, "_auto_verdict", None)
    auto = Image(size=224, backend="auto")
    assert backend_module._simplejpeg_matches_pillow()  # measured identical on this build (see docstring)
    assert auto.jpeg_backend == "simplejpeg"
    payload = KINDS["progressive"]()
    np.testing.assert_array_equal(auto(payload), Image(size=224)(payload))
    monkeypatch.setattr(backend_module, "_auto_verdict", False)  # as on a build whose pixels differ
    sj.clear()
    assert auto.jpeg_backend == "pillow"
    auto(payload)
    assert sj == []
