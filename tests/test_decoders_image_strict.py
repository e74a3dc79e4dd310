"""Image(strict=True): a JPEG that libjpeg reports as corrupt is a DecodeError with libjpeg's message,
instead of pixels with grey or smeared blocks (parrecio/decoders/image.py, "Strictness").

Damage of every kind libjpeg only warns about (a scan cut short before an EOI, bytes of the scan
overwritten, bytes inserted into it: what a wrong multipart join does), with each backend and with a
crop (the region decoder); clean images decode to the very pixels of strict=False; each checker (the C
extension, simplejpeg) gives the same verdicts; a file whose multipart JPEGs are read with the wrong join
gives a DecodeError for exactly the samples that came back damaged.
"""

from __future__ import annotations

import io

import numpy as np
import pytest

from image_helpers import jpeg, png
from parrecio import ParallelReader
from parrecio.decoders import Image, image as image_mod
from parrecio.decoders.augment import RandomResizedCrop
from parrecio.errors import DecodeError
from parrecio.recordio.wrapper import write_sagemaker_recordio

BACKENDS = ["pillow", "simplejpeg", "auto"]


def damaged(payload: bytes) -> dict:
    """Kinds of damage libjpeg decodes past with a warning (each keeps the JPEG's header and its EOI)."""
    mid = len(payload) // 2
    overwritten = bytearray(payload)
    overwritten[mid:mid + 40] = b"\xff\xd9" * 20
    return {
        "cut, ending in EOI": payload[:mid] + b"\xff\xd9",
        "overwritten": bytes(overwritten),
        "magic inserted": payload[:mid] + b"\x0a\x23\xd7\xce" + payload[mid:],  # an mxnet join of concat parts
    }


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["cut, ending in EOI", "overwritten"])
def test_strict_refuses_what_the_default_decodes(backend, kind):
    bad = damaged(jpeg(320, 240, seed=3))[kind]
    lenient = Image((96, 128), backend=backend)(bad)   # the default: pixels, no error
    assert lenient.shape == (96, 128, 3)
    with pytest.raises(DecodeError) as info:
        Image((96, 128), backend=backend, strict=True)(bad)
    message = str(info.value)
    assert message.startswith("corrupt JPEG image of 320x240: libjpeg says '")
    assert message.endswith("'; strict=True refuses it (strict=False decodes what libjpeg can, with grey or "
                            "smeared blocks where the data is damaged)")
    assert "Corrupt JPEG data" in message or "Premature end" in message


def test_strict_with_a_crop_refuses_damage_outside_the_crop():
    """The region decoder reads only the crop's rows; strict judges the whole file."""
    bad = damaged(jpeg(320, 240, seed=4))["cut, ending in EOI"]  # the damage is in the lower half
    top = RandomResizedCrop(scale=(0.05, 0.05), ratio=(1.0, 1.0))
    Image((32, 32), crop=top)(bad, key=1)
    with pytest.raises(DecodeError, match="^corrupt JPEG image of 320x240: libjpeg says"):
        Image((32, 32), crop=top, strict=True)(bad, key=1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_clean_images_decode_to_the_same_pixels(backend):
    for seed, (w, h) in enumerate([(320, 240), (33, 17), (640, 480)]):
        payload = jpeg(w, h, seed=seed)
        for kw in (dict(), dict(size=(64, 48)), dict(size=(24, 24), crop=RandomResizedCrop())):
            a = Image(backend=backend, **kw)(payload, key=seed) if "crop" in kw else Image(backend=backend, **kw)(payload)
            strict = Image(backend=backend, strict=True, **kw)
            b = strict(payload, key=seed) if "crop" in kw else strict(payload)
            assert np.array_equal(a, b)
    grey = jpeg(50, 40, mode="L")
    assert np.array_equal(Image(strict=True, backend=backend)(grey), Image(backend=backend)(grey))
    p = png(60, 40)
    assert np.array_equal(Image(strict=True)(p), Image()(p))  # other formats: as before


def mpo_and_its_first_picture(width: int, height: int, seed: int) -> tuple:
    """A two-picture MPO (a JPEG with an MPF segment, as phones write with a gain or depth map) and the
    plain JPEG of its first picture: the same encoder, so the same scan data."""
    from PIL import Image as PILImage
    first = PILImage.open(io.BytesIO(jpeg(width, height, seed=seed))).convert("RGB")
    second = first.resize((width // 2, height // 2))
    out = io.BytesIO()
    first.save(out, "MPO", save_all=True, append_images=[second], quality=90)
    plain = io.BytesIO()
    first.save(plain, "JPEG", quality=90)
    assert PILImage.open(io.BytesIO(out.getvalue())).format == "MPO"
    return out.getvalue(), plain.getvalue()


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_mpo_is_read_as_the_jpeg_it_starts_with(backend):
    """Pillow names a JPEG with an MPF segment "MPO": strict, draft and the region decoder apply to it as to
    any JPEG (they were skipped: a damaged MPO passed strict=True, and draft= decoded it whole)."""
    mpo, plain = mpo_and_its_first_picture(320, 240, seed=5)
    for kw in (dict(size=(40, 30), draft=True), dict(size=(24, 24), crop=RandomResizedCrop()),
               dict(size=(64, 48), strict=True), dict(strict=True)):
        decoder = Image(backend=backend, **kw)
        assert np.array_equal(decoder(mpo, key=7), decoder(plain, key=7)), kw
    assert not np.array_equal(Image((40, 30), draft=True)(mpo), Image((40, 30))(mpo))  # draft did scale
    bad = damaged(mpo)["overwritten"]
    Image(backend=backend)(bad)
    with pytest.raises(DecodeError, match="^corrupt JPEG image of 320x240: libjpeg says"):
        Image(backend=backend, strict=True)(bad)


def metadata_warned(payload: bytes) -> dict:
    """Intact JPEGs that libjpeg warns about for their metadata alone: a JFIF 2.01 header, and an Adobe
    marker with an unknown colour transform code (libjpeg keeps its default, YCbCr, as Pillow does)."""
    i = payload.index(b"JFIF\0") + 5
    assert payload[2:4] == b"\xff\xe0"  # the JFIF segment, which the Adobe one replaces (JFIF would win)
    after_jfif = 4 + int.from_bytes(payload[4:6], "big")
    adobe = b"\xff\xee\x00\x0eAdobe\x00\x64\x00\x00\x00\x00\x07"
    return {"JFIF 2.01": payload[:i] + b"\x02" + payload[i + 1:],
            "Adobe transform 7": payload[:2] + adobe + payload[after_jfif:]}


@pytest.mark.skipif(image_mod._jpegregion is None, reason="the C extension's checker (simplejpeg stops there)")
@pytest.mark.parametrize("kind", ["JFIF 2.01", "Adobe transform 7"])
def test_strict_accepts_warnings_about_metadata_alone(kind):
    """They were refused as "corrupt JPEG"; damage after such a warning is still found."""
    payload = jpeg(320, 240, seed=6)
    odd = metadata_warned(payload)[kind]
    assert np.array_equal(Image()(odd), Image()(payload))
    assert np.array_equal(Image(strict=True)(odd), Image()(payload))
    with pytest.raises(DecodeError, match="Corrupt JPEG data"):
        Image(strict=True)(damaged(odd)["overwritten"])


def test_both_checkers_give_the_same_verdicts(monkeypatch):
    payloads = [jpeg(200, 150, seed=s) for s in range(3)]
    cases = payloads + [b for p in payloads for b in damaged(p).values()]
    c_verdicts = [image_mod._jpeg_verifier()(p) for p in cases]
    assert image_mod._jpeg_verifier() is image_mod._jpegregion.verify
    monkeypatch.setattr(image_mod, "_jpegregion", None)
    simple = image_mod._jpeg_verifier()
    assert simple is not None
    s_verdicts = [simple(p) for p in cases]
    assert c_verdicts[:3] == s_verdicts[:3] == [None] * 3
    assert all(v is not None for v in c_verdicts[3:]) and all(v is not None for v in s_verdicts[3:])
    with pytest.raises(DecodeError, match="libjpeg says"):
        Image(strict=True)(cases[3])


def test_without_a_checker_strict_is_an_import_error(monkeypatch):
    monkeypatch.setattr(image_mod, "_jpegregion", None)
    monkeypatch.setattr(image_mod, "_simplejpeg", lambda: None)
    with pytest.raises(ImportError, match=r"Image\(strict=True\) checks JPEGs with parrecio's C extension"):
        Image(strict=True)
    Image()  # the default needs neither


def test_strict_and_allow_truncated_contradict():
    with pytest.raises(ValueError, match="strict=True refuses the truncated JPEGs that allow_truncated=True accepts"):
        Image(strict=True, allow_truncated=True)
    with pytest.raises(TypeError, match="strict"):
        Image(strict="yes")
    assert repr(Image(strict=True)) == "Image(strict=True)"


@pytest.mark.parametrize("workers", [0, 2])
def test_a_wrong_join_is_refused_sample_by_sample(tmp_path, workers, no_leaks):
    """Concat-split multipart JPEGs (pack manifest --split-bytes, SageMaker's wrapper) read with
    join='mxnet' come back with the magic inside each join.  The default decodes nearly all of them
    without a word; strict=True refuses those libjpeg notices (here >= 90%: a 4-byte insertion into the
    entropy-coded data can go unnoticed, which is why join='auto' decides the join), never a sample that
    came back whole, and keeps the rest in order."""
    images = [jpeg(320, 240, seed=s) if s % 4 else jpeg(40, 30, seed=s) for s in range(40)]  # 10 whole
    path = tmp_path / "split.rec"
    with open(path, "wb") as f:
        write_sagemaker_recordio(images, f, 4096)
    with ParallelReader(str(path), fields=None, workers=0, join="mxnet") as r:
        read = [bytes(x) for x in r]
    bad = {i for i, (got, want) in enumerate(zip(read, images)) if got != want}
    assert bad == {i for i in range(40) if i % 4}  # every image of more than 4096 bytes
    with ParallelReader(str(path), fields=Image(), workers=workers, join="mxnet", on_error="skip") as r:
        lenient = len(list(r))
    refused = {i for i, p in enumerate(read) if image_mod._jpeg_verifier()(p) is not None}
    assert refused <= bad and len(refused) >= 0.9 * len(bad)
    assert lenient >= 40 - len(bad) // 4  # the default: nearly all decoded, damaged or not
    kept_ids = [i for i in range(40) if i not in refused]
    with ParallelReader(str(path), fields=Image(strict=True), workers=workers, join="mxnet",
                        on_error="skip") as r:
        kept = list(r)
        assert r.stats.skipped == len(refused)
    assert len(kept) == len(kept_ids) >= 10
    assert all(np.array_equal(a, Image()(read[i])) for a, i in zip(kept, kept_ids))
    with ParallelReader(str(path), fields=Image(strict=True), workers=workers, join="mxnet") as r:
        with pytest.raises(DecodeError) as info:
            list(r)
    assert info.value.index == min(refused)
    assert "libjpeg says 'Corrupt JPEG data" in str(info.value)
    with ParallelReader(str(path), fields=Image(strict=True), workers=workers) as r:  # join='auto': right
        assert all(np.array_equal(a, Image()(b)) for a, b in zip(r, images))
        assert r.stats.samples == 40
