"""The JPEG region decoder (parrecio/decoders/_jpegregion.c) against the whole decode, for every sampling
factor libjpeg decodes and at every DCT scale.

What must hold: where ``Image(crop=...)`` decodes only a crop's region, the output is the whole decode's
to the last bit (the whole-decode path is ``parrecio.decoders.image._jpegregion = None``), for luma
sampling h x v in 1x1, 2x1, 1x2, 2x2, 4x1, 1x4, 4x2 and 2x4 (chroma 1x1) and grey, baseline and
progressive, at DCT scales 1, 1/2, 1/4 and 1/8, with fractional crop boxes and every resampling filter;
and a damaged JPEG gets the whole decode's verdict whatever the crop (all keys refused, or all decoded
alike), where the damage lies below the crop too.

The JPEGs are written here by a small numpy encoder (:func:`write_jpeg`: Pillow writes only 4:4:4, 4:2:2
and 4:2:0), plus libjpeg's own (Pillow's) for those three, baseline and progressive.  Only this module is
skipped when the C extension is not built (in CI, where it is built, its absence is a failure).
"""

from __future__ import annotations

import io
import os
import random
from functools import lru_cache
from typing import List, Optional, Tuple

import numpy as np
import pytest
from PIL import Image as PILImage

import parrecio.decoders.image as image_module
from image_helpers import encode, photo
from parrecio import DecodeError
from parrecio.decoders import CenterCrop, Image, RandomResizedCrop
from parrecio.decoders.image import RESAMPLING

jpegregion = pytest.importorskip("parrecio.decoders._jpegregion") if not os.environ.get("CI") else \
    __import__("parrecio.decoders._jpegregion", fromlist=["_"])  # CI builds it: its absence is a failure there

WIDTH, HEIGHT = 251, 187  # not a multiple of any MCU: partial MCUs on the right and at the bottom
SAMPLINGS = [(1, 1), (2, 1), (1, 2), (2, 2), (4, 1), (1, 4), (4, 2), (2, 4)]
SCALES = (1, 2, 4, 8)


# -- a small JPEG writer: any luma sampling factors, baseline or progressive ---------------------------

_LUMA_Q = [16, 11, 10, 16, 24, 40, 51, 61, 12, 12, 14, 19, 26, 58, 60, 55, 14, 13, 16, 24, 40, 57, 69, 56,
           14, 17, 22, 29, 51, 87, 80, 62, 18, 22, 37, 56, 68, 109, 103, 77, 24, 35, 55, 64, 81, 104, 113, 92,
           49, 64, 78, 87, 103, 121, 120, 101, 72, 92, 95, 98, 112, 100, 103, 99]  # ITU T.81 K.1
_CHROMA_Q = ([17, 18, 24, 47] + [99] * 4 + [18, 21, 26, 66] + [99] * 4 + [24, 26, 56] + [99] * 5 + [47, 66]
             + [99] * 38)
_ZIGZAG = np.array([y * 8 + x for y, x in sorted(((y, x) for y in range(8) for x in range(8)),
                                                  key=lambda p: (p[0] + p[1], p[(p[0] + p[1] + 1) % 2]))])
_DCT = np.array([[(np.sqrt(0.5) if u == 0 else 1.0) / 2 * np.cos((2 * x + 1) * u * np.pi / 16) for x in range(8)]
                 for u in range(8)])
# Fixed-length Huffman codes (valid tables; compression does not matter here): DC sizes 0..11 in 4 bits,
# the 162 AC symbols (EOB, ZRL, run/size) in 8 bits.  Progressive scans here use spectral selection
# only (Ah = Al = 0), whose symbols are the baseline ones (EOB0 is 0x00).
_DC_SYMBOLS = list(range(12))
_AC_SYMBOLS = [0x00, 0xF0] + [(r << 4) | s for r in range(16) for s in range(1, 11)]
_DC_CODE = {s: i for i, s in enumerate(_DC_SYMBOLS)}
_AC_CODE = {s: i for i, s in enumerate(_AC_SYMBOLS)}


def _segment(marker: int, payload: bytes) -> bytes:
    return bytes([0xFF, marker]) + (len(payload) + 2).to_bytes(2, "big") + payload


def write_jpeg(pixels: np.ndarray, sampling: Tuple[int, int] = (2, 2), quality: int = 90,
               progressive: bool = False, restart: int = 0) -> bytes:
    """A JFIF JPEG of ``pixels`` (``(h, w, 3)`` RGB or ``(h, w)`` grey) with luma sampling ``sampling``
    (h, v) and chroma 1x1; progressive: a DC scan then AC 1-5 and 6-63 per component."""
    pixels = np.asarray(pixels, np.float64)
    height, width = pixels.shape[:2]
    if pixels.ndim == 2:
        planes, factors, tables = [pixels], [(1, 1)], [0]
    else:
        r, g, b = pixels[..., 0], pixels[..., 1], pixels[..., 2]
        planes = [0.299 * r + 0.587 * g + 0.114 * b, -0.168736 * r - 0.331264 * g + 0.5 * b + 128,
                  0.5 * r - 0.418688 * g - 0.081312 * b + 128]
        factors, tables = [tuple(sampling), (1, 1), (1, 1)], [0, 1, 1]
    hmax, vmax = max(f[0] for f in factors), max(f[1] for f in factors)
    mcus_x, mcus_y = -(-width // (8 * hmax)), -(-height // (8 * vmax))
    scale = 5000 // quality if quality < 50 else 200 - 2 * quality
    qtables = [np.clip((np.array(base) * scale + 50) // 100, 1, 255) for base in (_LUMA_Q, _CHROMA_Q)]
    comps = []  # (zigzag coefficients (by, bx, 64), (h, v), blocks of a non-interleaved scan (bx, by))
    for plane, (h, v), t in zip(planes, factors, tables):
        full = np.pad(plane, ((0, mcus_y * vmax * 8 - height), (0, mcus_x * hmax * 8 - width)), mode="edge")
        fy, fx = vmax // v, hmax // h
        sub = full.reshape(full.shape[0] // fy, fy, full.shape[1] // fx, fx).mean(axis=(1, 3))
        by, bx = sub.shape[0] // 8, sub.shape[1] // 8
        blocks = (sub - 128).reshape(by, 8, bx, 8).transpose(0, 2, 1, 3)
        coef = np.einsum("ux,abxy,vy->abuv", _DCT, blocks, _DCT).reshape(by, bx, 64)
        quant = np.round(coef / qtables[t].reshape(64)).astype(np.int64)[..., _ZIGZAG]
        comp_w, comp_h = -(-width * h // hmax), -(-height * v // vmax)
        comps.append((quant, (h, v), (-(-comp_w // 8), -(-comp_h // 8))))

    def scan(indices: List[int], ss: int, se: int) -> bytes:
        bits: List[str] = []
        out = bytearray()

        def put(value: int, n: int) -> None:
            if n:
                bits.append(format(value, f"0{n}b"))

        def flush() -> None:
            text = "".join(bits)
            text += "1" * (-len(text) % 8)
            bits.clear()
            packed = np.packbits(np.frombuffer(text.encode(), np.uint8) - 48).tobytes()
            out.extend(packed.replace(b"\xff", b"\xff\x00"))  # byte stuffing

        if len(indices) == 1:  # non-interleaved: the component's own blocks, in raster order
            nbx, nby = comps[indices[0]][2]
            units = [[(indices[0], y, x)] for y in range(nby) for x in range(nbx)]
        else:
            units = [[(ci, my * comps[ci][1][1] + j, mx * comps[ci][1][0] + i) for ci in indices
                      for j in range(comps[ci][1][1]) for i in range(comps[ci][1][0])]
                     for my in range(mcus_y) for mx in range(mcus_x)]
        pred = [0] * len(comps)
        for n, unit in enumerate(units):
            if restart and n and n % restart == 0:
                flush()
                out.extend(bytes([0xFF, 0xD0 + (n // restart - 1) % 8]))
                pred = [0] * len(comps)
            for ci, y, x in unit:
                zz, start = comps[ci][0][y, x], ss
                if ss == 0:
                    diff = int(zz[0]) - pred[ci]
                    pred[ci], size = int(zz[0]), abs(diff).bit_length()
                    put(_DC_CODE[size], 4)
                    put(diff if diff >= 0 else diff + (1 << size) - 1, size)
                    start = 1
                run = 0
                for k in range(start, se + 1):
                    c = int(zz[k])
                    if c == 0:
                        run += 1
                        continue
                    while run > 15:
                        put(_AC_CODE[0xF0], 8)
                        run -= 16
                    size = abs(c).bit_length()
                    put(_AC_CODE[(run << 4) | size], 8)
                    put(c if c >= 0 else c + (1 << size) - 1, size)
                    run = 0
                if run and se > 0:
                    put(_AC_CODE[0x00], 8)
        flush()
        header = bytes([len(indices)]) + b"".join(bytes([ci + 1, 0]) for ci in indices) + bytes([ss, se, 0])
        return _segment(0xDA, header) + bytes(out)

    data = bytearray(b"\xff\xd8" + _segment(0xE0, b"JFIF\0\x01\x01\0\0\x01\0\x01\0\0"))
    for t in sorted(set(tables)):
        data += _segment(0xDB, bytes([t]) + bytes(int(v) for v in qtables[t].reshape(64)[_ZIGZAG]))
    sof = bytes([8]) + height.to_bytes(2, "big") + width.to_bytes(2, "big") + bytes([len(comps)])
    sof += b"".join(bytes([ci + 1, (h << 4) | v, t]) for ci, ((_, (h, v), _), t) in enumerate(zip(comps, tables)))
    data += _segment(0xC2 if progressive else 0xC0, sof)
    dc_bits, ac_bits = [0] * 16, [0] * 16
    dc_bits[3], ac_bits[7] = len(_DC_SYMBOLS), len(_AC_SYMBOLS)
    data += _segment(0xC4, bytes([0x00] + dc_bits + _DC_SYMBOLS))
    data += _segment(0xC4, bytes([0x10] + ac_bits + _AC_SYMBOLS))
    if restart:
        data += _segment(0xDD, restart.to_bytes(2, "big"))
    everyone = list(range(len(comps)))
    if progressive:
        data += scan(everyone, 0, 0)
        for ss, se in ((1, 5), (6, 63)):
            for ci in everyone:
                data += scan([ci], ss, se)
    else:
        data += scan(everyone, 0, 63)
    return bytes(data + b"\xff\xd9")


# -- the JPEGs ------------------------------------------------------------------------------------------

def _name(sampling) -> str:
    return sampling if isinstance(sampling, str) else f"{sampling[0]}x{sampling[1]}"


KINDS = [(_name(s), p) for s in SAMPLINGS + ["grey"] for p in (False, True)]
LIBJPEG_KINDS = [(f"libjpeg-{n}", p) for n in ("444", "422", "420", "grey") for p in (False, True)]
KIND_IDS = [f"{n}-{'progressive' if p else 'baseline'}" for n, p in KINDS]
LIBJPEG_IDS = [f"{n}-{'progressive' if p else 'baseline'}" for n, p in LIBJPEG_KINDS]


@lru_cache(maxsize=None)
def jpeg_of(name: str, progressive: bool) -> bytes:
    arr = photo(WIDTH, HEIGHT, seed=7)
    if name.startswith("libjpeg-"):
        kind = name.split("-", 1)[1]
        if kind == "grey":
            return encode(arr, mode="L", quality=90, progressive=progressive)
        return encode(arr, quality=90, subsampling={"444": 0, "422": 1, "420": 2}[kind], progressive=progressive)
    if name == "grey":
        return write_jpeg(arr[..., 1], (1, 1), progressive=progressive)
    h, v = (int(c) for c in name.split("x"))
    return write_jpeg(arr, (h, v), progressive=progressive)


@lru_cache(maxsize=None)
def whole_decode(payload: bytes, scale: int, gray: bool) -> np.ndarray:
    """Pillow's whole decode at DCT scale 1/scale (``draft``), luma only with ``gray``."""
    image = PILImage.open(io.BytesIO(payload))
    image.draft("L" if gray else image.mode, (image.width // scale, image.height // scale))
    image.load()
    assert image.size == (-(-WIDTH // scale), -(-HEIGHT // scale))
    return np.asarray(image)


def test_the_writer_writes_what_it_says():
    """The fixtures are what the tests claim: the sampling factors in the frame header, progressive or
    not, and libjpeg decodes them without a warning (the region decoder returns None on any)."""
    for name, progressive in KINDS:
        payload = jpeg_of(name, progressive)
        image = PILImage.open(io.BytesIO(payload))
        want = [(1, 1, 1, 0)] if name == "grey" else [(1, *(int(c) for c in name.split("x")), 0), (2, 1, 1, 1),
                                                      (3, 1, 1, 1)]
        assert image.layer == want and bool(image.info.get("progressive")) == progressive, (name, image.layer)
        assert image.size == (WIDTH, HEIGHT)
        assert jpegregion.decode_region(payload, 0, 0, WIDTH, HEIGHT, 1, 0) is not None, name
        ref = photo(WIDTH, HEIGHT, seed=7)
        got = np.asarray(image.convert("RGB")).astype(int)
        want_pixels = ref[..., 1] if name == "grey" else ref
        assert np.abs(got - (want_pixels[..., None] if name == "grey" else want_pixels)).mean() < 6, name


# -- the C function against the whole decode, at every scale ----------------------------------------------

def _regions(rng: random.Random, width: int, height: int, count: int):
    for _ in range(count):
        w, h = rng.randint(1, width), rng.randint(1, height)
        yield rng.randint(0, width - w), rng.randint(0, height - h), w, h
    yield 0, 0, width, height
    yield width - 1, height - 1, 1, 1


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("name,progressive", KINDS + LIBJPEG_KINDS, ids=KIND_IDS + LIBJPEG_IDS)
def test_decode_region_gives_the_whole_decodes_pixels_at_every_scale(name, progressive, scale):
    """Random regions, asked for with the margin Image uses: inside it every pixel is the whole decode's
    at that scale (RGBX and luma-only; a grey JPEG as RGBX is its grey replicated), compact or framed.
    With a comment before EOI too: the C side then decodes the rest of the scan after the region (to see
    what libjpeg makes of the marker), which must not warn either (libjpeg-turbo's jpeg_skip_scanlines()
    from inside an iMCU row decodes too much for 2x4 at 1/2 and 1/4)."""
    plain = jpeg_of(name, progressive)
    margin = image_module._UPSAMPLE_MARGIN
    rng = random.Random(f"{name} {progressive} {scale}")
    grey_jpeg = name.endswith("grey")
    for gray, payload in ((False, plain), (True, plain), (False, damaged(plain, "comment before EOI"))):
        ref = whole_decode(plain, scale, gray or grey_jpeg)
        if grey_jpeg and not gray:
            ref = np.repeat(ref[..., None], 3, axis=2)
        height, width = ref.shape[:2]
        for x, y, w, h in _regions(rng, width, height, 12):
            x_req = max(0, x - margin)
            w_req = min(width, x + w + margin) - x_req
            for framed in (False, True):
                flags = (jpegregion.GRAY if gray else 0) | (jpegregion.FRAMED if framed else 0)
                got = jpegregion.decode_region(payload, x_req, y, w_req, h, scale, flags)
                assert got is not None, (name, scale, x, y, w, h)
                buf, x0, got_w = got
                assert x0 <= x_req and x0 + got_w == x_req + w_req
                channels = () if gray else (4,)
                if framed:
                    frame = np.frombuffer(buf, np.uint8).reshape((y + h, x0 + got_w) + channels)
                    region = frame[y:, x0:]
                else:
                    region = np.frombuffer(buf, np.uint8).reshape((h, got_w) + channels)
                region = region[:, x - x0:x - x0 + w]
                if not gray:
                    region = region[..., :3]
                diff = np.abs(region.astype(int) - ref[y:y + h, x:x + w]).max()
                assert diff == 0, (name, progressive, scale, gray, framed, (x, y, w, h), int(diff))


# -- Image(crop=...) against the whole-decode path ------------------------------------------------------

class _Scales:
    """Stands in for the C module and records the DCT scale of each call."""

    def __init__(self):
        self.seen = set()

    def decode_region(self, *args):
        self.seen.add(args[5])
        return jpegregion.decode_region(*args)


def _outcome(decoder: Image, payload: bytes, key: int, region) -> Optional[np.ndarray]:
    saved = image_module._jpegregion
    image_module._jpegregion = region
    try:
        return decoder(payload, key=key)
    except DecodeError:
        return None
    finally:
        image_module._jpegregion = saved


@pytest.mark.parametrize("name,progressive", KINDS + LIBJPEG_KINDS, ids=KIND_IDS + LIBJPEG_IDS)
def test_fused_decoder_equals_the_whole_decode(name, progressive):
    """The issue's case (48 px, RandomResizedCrop, draft) for 30 keys, then random crops, boxes,
    fractions, filters, modes, draft gaps, reducing_gap and flips (fixed seed): every output equals the
    whole-decode path's, and the region decoder ran at every DCT scale."""
    payload = jpeg_of(name, progressive)
    scales = _Scales()
    cases = [(Image(size=48, crop=RandomResizedCrop(), draft=True), key) for key in range(30)]
    rng = random.Random(f"{name} {progressive}")
    for key in range(60):
        crop = rng.choice([RandomResizedCrop(), RandomResizedCrop(scale=(0.5, 1.0)), CenterCrop(0.875),
                           CenterCrop(round(rng.uniform(0.2, 1.0), 3))])
        cases.append((Image(size=rng.choice([12, 20, 32, 48, 64, 100, 224]), crop=crop,
                            draft=rng.choice([False, True, True, 2.0]), resample=rng.choice(list(RESAMPLING)),
                            mode=rng.choice(["RGB", "L", "keep"]), reducing_gap=rng.choice([None, None, 2.0]),
                            flip=0.5), key))
    for decoder, key in cases:
        got = _outcome(decoder, payload, key, scales)
        want = _outcome(decoder, payload, key, None)
        assert got is not None and want is not None
        assert got.shape == want.shape and np.array_equal(got, want), (name, progressive, decoder, key,
                                                                       int(np.abs(got.astype(int) - want).max()))
    assert scales.seen == set(SCALES), scales.seen


# -- damage: the whole decode's verdict, whatever the crop ----------------------------------------------

def _scan_bounds(payload: bytes) -> Tuple[int, int]:
    """Where the last scan's entropy-coded data starts and ends (at the EOI marker)."""
    sos = payload.rfind(b"\xff\xda")
    return sos + 2 + int.from_bytes(payload[sos + 2:sos + 4], "big"), payload.rfind(b"\xff\xd9")


def damaged(payload: bytes, how: str, at: float = 0.9) -> bytes:
    start, end = _scan_bounds(payload)
    pos = start + int(at * (end - start))
    # Not between an FF and its stuffed 00; and FF FF FF before a byte that makes it a reserved marker
    # (fill bytes, then FF xx: before 00 it would be a stuffed FF, before 01 (TEM), an RSTn, an APPn or
    # COM a marker libjpeg reads on after).
    while payload[pos - 1] == 0xFF or (how == "FF FF FF" and not 0x02 <= payload[pos] <= 0xBF):
        pos += 1
    if how == "truncated":
        return payload[:pos]
    if how == "comment before EOI":  # valid: a COM segment between the scan and EOI
        return payload[:end] + _segment(0xFE, b"made here") + payload[end:]
    dht = payload.find(b"\xff\xc4")
    inserted = {"SOI": b"\xff\xd8", "DHT marker": b"\xff\xc4", "FF FF FF": b"\xff\xff\xff",
                "DHT segment": payload[dht:dht + 2 + int.from_bytes(payload[dht + 2:dht + 4], "big")]}[how]
    return payload[:pos] + inserted + payload[pos:]


DAMAGE = ["SOI", "DHT marker", "FF FF FF", "truncated", "DHT segment", "comment before EOI"]
DAMAGE_KINDS = KINDS + [k for k in LIBJPEG_KINDS if not k[1]]
DAMAGE_IDS = KIND_IDS + [i for i, k in zip(LIBJPEG_IDS, LIBJPEG_KINDS) if not k[1]]


@pytest.mark.parametrize("how", DAMAGE)
@pytest.mark.parametrize("name,progressive", DAMAGE_KINDS, ids=DAMAGE_IDS)
def test_damaged_jpegs_get_the_whole_decodes_verdict_whatever_the_crop(name, progressive, how):
    """FF D8, a DHT marker or FF FF FF inserted at 90% of the (last) scan, or the file cut there: the
    whole decode raises, and so does every one of 30 crops (most of which end above the damage).  A whole
    DHT segment there, or a comment before EOI, only makes libjpeg warn or read on: every crop decodes,
    as the whole decode does (the comment makes the C side decode the rest of the scan to be sure)."""
    payload = damaged(jpeg_of(name, progressive), how)
    decoder = Image(size=48, crop=RandomResizedCrop(), draft=True)
    refused = []
    for key in range(30):
        got = _outcome(decoder, payload, key, jpegregion)
        want = _outcome(decoder, payload, key, None)
        assert (got is None) == (want is None), (name, progressive, how, key)
        assert got is None or np.array_equal(got, want), (name, progressive, how, key)
        refused.append(got is None)
    assert len(set(refused)) == 1, (name, progressive, how, refused)  # one verdict for the sample
    assert refused[0] == (how in ("SOI", "DHT marker", "FF FF FF", "truncated")), (name, how)
    if refused[0]:  # the C function gives up on any region, above the damage too
        assert jpegregion.decode_region(payload, 0, 0, 40, 10, 1, 0) is None


@pytest.mark.parametrize("sampling", [(4, 2), (2, 4), (2, 2)], ids=["4x2", "2x4", "2x2"])
def test_restart_markers_and_damage_between_them(sampling):
    """Restart intervals: exact pixels at every scale through Image; FF FF FF inserted late in the scan
    is skipped by libjpeg's resynchronisation (the whole decode decodes it): so do all crops, alike."""
    payload = write_jpeg(photo(WIDTH, HEIGHT, seed=3), sampling, restart=3)
    scales = _Scales()
    for key in range(40):
        decoder = Image(size=[16, 48, 100][key % 3], crop=RandomResizedCrop(), draft=True,
                        resample=["bilinear", "bicubic", "box"][key % 3])
        assert np.array_equal(_outcome(decoder, payload, key, scales), _outcome(decoder, payload, key, None))
    assert scales.seen == set(SCALES)
    bad = damaged(payload, "FF FF FF")
    decoder = Image(size=48, crop=RandomResizedCrop(), draft=True)
    outcomes = [(_outcome(decoder, bad, key, jpegregion), _outcome(decoder, bad, key, None)) for key in range(30)]
    assert all((a is None) == (b is None) and (a is None or np.array_equal(a, b)) for a, b in outcomes)
    assert len({a is None for a, _ in outcomes}) == 1


def test_grey_jpeg_for_rgb_output_and_rgb_jpeg_for_grey_output():
    """The conversions the whole decode makes (grey -> RGB replicated, Pillow's RGB -> L) happen alike on
    the region, with fractional boxes at full scale (where a shifted box used to round differently)."""
    colour, grey = jpeg_of("libjpeg-420", False), jpeg_of("libjpeg-grey", False)
    for payload, mode in ((grey, "RGB"), (colour, "L"), (grey, "keep"), (colour, "keep")):
        for key, fraction in enumerate(np.linspace(0.3, 1.0, 24)):
            for resample in ("box", "bilinear", "lanczos"):
                decoder = Image(size=37, mode=mode, crop=CenterCrop(float(fraction)), resample=resample)
                assert np.array_equal(_outcome(decoder, payload, key, jpegregion),
                                      _outcome(decoder, payload, key, None)), (mode, fraction, resample)


def test_colour_mask_jpegs_get_the_whole_decodes_class_ids_for_every_box():
    """Mask(colors=...) of an RGB JPEG went to Pillow as the region alone, at its origin, the box shifted:
    Pillow's nearest then picked other pixels than the whole decode for a fractional box (CenterCrop: 13
    of 187 cases, up to 5 ids).  Its class ids are framed now, as the Image path frames pixels: the same
    ids as the whole decode for every crop, size and key."""
    from PIL import Image as PILImageMod
    from parrecio.decoders import Mask
    pal = np.array([[0, 0, 0], [255, 0, 0], [0, 255, 0], [0, 0, 255]], np.uint8)
    colors = ["#000000", "#ff0000", "#00ff00", "#0000ff"]
    rng = random.Random(5)
    scales = _Scales()
    for case in range(200):
        w, h = rng.randint(16, 200), rng.randint(16, 200)
        cells = np.random.default_rng(case).integers(0, 4, (h // 8 + 1, w // 8 + 1)).astype(np.uint8)
        ids = np.asarray(PILImageMod.fromarray(cells).resize((w, h), PILImageMod.NEAREST))
        buf = io.BytesIO()
        PILImageMod.fromarray(pal[ids]).save(buf, "JPEG", quality=95)
        crop = rng.choice([CenterCrop(0.875), CenterCrop(round(rng.uniform(0.3, 1.0), 3)), RandomResizedCrop()])
        mask = Mask(size=(rng.randint(8, 64), rng.randint(8, 64)), crop=crop, colors=colors, unknown=9,
                    flip=0.5, resolution=rng.choice([1.0, 2.0, 0.5, 1.5]))
        got = _outcome(mask, buf.getvalue(), case, scales)
        want = _outcome(mask, buf.getvalue(), case, None)
        assert got is not None and np.array_equal(got, want), (case, w, h, crop, int((got != want).sum()))
    assert scales.seen, "the region decoder never ran"
