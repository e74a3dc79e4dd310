"""Content sniffing: what a payload looks like, from its first bytes.

:func:`sniff` names the kind of one payload ("jpeg", "png", "json", ...) without decoding it; decoders use
it to say what they got when they refuse a payload ("not an image: the payload looks like JSON text").
:func:`guess_fields` looks at the first records of a stream and guesses how they group into samples, e.g.
an augmented manifest ``[jpeg][json][jpeg][json]...`` -> ``("jpeg", "json")``: two fields per sample.

Both only look at a short prefix (:data:`PREFIX` bytes) of each payload, so they are cheap on any size.
"""

from __future__ import annotations

import struct
from typing import Any, Iterable, Sequence, Tuple

import orjson

__all__ = ["sniff", "sniff_image", "guess_fields", "guess_from_kinds", "describe", "KINDS", "IMAGE_KINDS", "PREFIX"]

#: Every value :func:`sniff` can return.
KINDS = ("jpeg", "png", "gif", "bmp", "webp", "tiff", "json", "text", "empty", "other")
#: The kinds that are image formats.
IMAGE_KINDS = frozenset({"jpeg", "png", "gif", "bmp", "webp", "tiff"})
#: How many leading bytes of a payload :func:`sniff` reads.
PREFIX = 4096

_BOM = b"\xef\xbb\xbf"
_WHITESPACE = b" \t\r\n"
_JSON_FIRST = frozenset(b'{["-0123456789')
_JSON_LITERALS = (b"true", b"false", b"null")
_BMP_DIB_SIZES = frozenset({12, 16, 40, 52, 56, 64, 108, 124})
_TEXT_CONTROLS = bytes(b for b in range(32) if b not in b"\t\n\r\f") + b"\x7f"


def _prefix(payload: Any, n: int = PREFIX) -> bytes:
    """The first ``n`` bytes of a bytes-like ``payload`` (bytes, memoryview, numpy uint8 array)."""
    if isinstance(payload, bytes):
        return payload[:n]
    view = memoryview(payload)
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    return bytes(view[:n])


def _utf8_prefix_ok(data: bytes, complete: bool) -> bool:
    """Whether ``data`` is valid UTF-8, allowing a character cut at the end when it is only a prefix."""
    try:
        data.decode("utf-8")
        return True
    except UnicodeDecodeError as exc:
        # A multi-byte character cut by the prefix boundary is not an error (at most 3 bytes missing).
        return not complete and exc.reason == "unexpected end of data" and exc.start >= len(data) - 3


def _sniff_binary(head: bytes) -> str | None:
    if head.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return "gif"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp"
    if head[:4] in (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+"):
        return "tiff"
    # "BM" alone is too weak ("BMW..." is text): also check the DIB header size at offset 14.
    if head[:2] == b"BM" and len(head) >= 18 and struct.unpack_from("<I", head, 14)[0] in _BMP_DIB_SIZES:
        return "bmp"
    return None


def _sniff_text(head: bytes, complete: bool) -> str:
    body = head[len(_BOM):] if head.startswith(_BOM) else head
    if len(body.translate(None, _TEXT_CONTROLS)) != len(body) or not _utf8_prefix_ok(body, complete):
        return "other"
    stripped = body.lstrip(_WHITESPACE)
    if not stripped:
        return "text"
    if complete:
        # The whole payload is in hand: let the JSON parser decide.
        try:
            orjson.loads(stripped)
            return "json"
        except orjson.JSONDecodeError:
            return "text"
    first = stripped[0]
    if first in _JSON_FIRST:
        return "json"
    for literal in _JSON_LITERALS:
        if stripped[:len(literal)] == literal[:len(stripped)]:
            return "json"
    return "text"


def sniff(payload: Any) -> str:
    """Name the kind of ``payload`` (any bytes-like object) from its first :data:`PREFIX` bytes.

    Returns one of :data:`KINDS`:

    - ``"jpeg"``, ``"png"``, ``"gif"``, ``"bmp"``, ``"webp"``, ``"tiff"``: the format's magic number;
    - ``"json"``: valid UTF-8 that, after an optional BOM and whitespace, starts like a JSON value (``{``,
      ``[``, ``"``, a digit, ``-``, ``true``, ``false``, ``null``); a payload shorter than :data:`PREFIX`
      is parsed whole, so ``"json"`` then means it *is* valid JSON;
    - ``"text"``: other valid UTF-8 without control characters (tab, CR, LF and FF allowed);
    - ``"empty"``: zero bytes;
    - ``"other"``: anything else (binary data, an MXNet image record, ...).
    """
    head = _prefix(payload, PREFIX + 1)
    if not head:
        return "empty"
    complete = len(head) <= PREFIX
    head = head[:PREFIX]
    return _sniff_binary(head) or _sniff_text(head, complete)


#: The first byte of each image kind's magic number (:func:`_sniff_binary`): a test of one byte leaves out
#: most payloads that are no image before a prefix is copied.
FIRST_BYTES = {"jpeg": 0xFF, "png": 0x89, "gif": 0x47, "webp": 0x52, "tiff": 0x49, "bmp": 0x42}
_TIFF_BE = 0x4D  # (TIFF's big-endian "MM")


def first_bytes(kinds: Iterable[str]) -> frozenset:
    """The first bytes that payloads of the image ``kinds`` may start with."""
    out = {FIRST_BYTES[k] for k in kinds if k in FIRST_BYTES}
    if "tiff" in kinds:
        out.add(_TIFF_BE)
    return frozenset(out)


def sniff_image(payload: Any) -> str | None:
    """The image format whose magic number ``payload`` starts with (a kind of :data:`IMAGE_KINDS`), else
    None: :func:`sniff`'s first test alone, on 32 bytes (~1 us: cheap enough for every record)."""
    return _sniff_binary(_prefix(payload, 32))


def describe(payload: Any) -> str:
    """A short human description of ``payload`` for error messages: its kind, size and first bytes."""
    head = _prefix(payload, 24 + 64)
    try:
        size = memoryview(payload).nbytes
    except TypeError:
        size = len(payload)
    kind = sniff(payload)
    names = {"json": "JSON text", "text": "text", "empty": "an empty payload", "other": "binary data"}
    what = names.get(kind, f"a {kind.upper()} image")
    if kind == "other" and len(head) >= 24:
        flag = struct.unpack_from("<I", head, 0)[0]
        start = 24 + 4 * flag
        if flag < 16 and _sniff_binary(head[start:start + 16]) in IMAGE_KINDS:
            what = "an MXNet image record (IRHeader + image; decode it with ImageRecord)"
    if kind == "empty":
        return what
    return f"{what} ({size} bytes, starting {head[:24]!r})"


def _compatible(kinds: Iterable[str]) -> str | None:
    """The kind a field position has when its records have ``kinds``; ``None`` if they do not mix."""
    found = set(kinds) - {"empty"}
    if not found:
        return "empty"
    if len(found) == 1:
        return found.pop()
    if found <= IMAGE_KINDS:
        return "image"
    if found <= {"json", "text"}:
        return "text"
    return None


def guess_fields(payloads: Sequence[Any], max_group: int = 8) -> Tuple[str, ...]:
    """Guess how the first records of a stream group into samples.

    ``payloads`` are the first records of a stream, in order (a few dozen are plenty).  Returns one kind
    per field position of the smallest group size ``g <= max_group`` such that every record at position
    ``i % g`` is of a compatible kind: e.g. ``[jpeg, json, jpeg, json]`` -> ``("jpeg", "json")``.
    Positions whose records mix image formats are reported as ``"image"``, JSON mixed with plain text as
    ``"text"``; empty records fit any position.  Raises ``ValueError`` when ``payloads`` is empty or no
    group size up to ``max_group`` fits.  With fewer than two whole groups the guess is weak evidence.
    """
    return guess_from_kinds([sniff(p) for p in payloads], max_group)


def guess_from_kinds(kinds: Sequence[str], max_group: int = 8) -> Tuple[str, ...]:
    """:func:`guess_fields` of records whose :func:`sniff` kinds are ``kinds``."""
    if max_group < 1:
        raise ValueError(f"max_group must be >= 1, got {max_group}")
    if not kinds:
        raise ValueError("guess_fields needs at least one payload")
    for group in range(1, min(max_group, len(kinds)) + 1):
        fields = [_compatible(kinds[pos::group]) for pos in range(group)]
        if all(f is not None for f in fields):
            return tuple(fields)  # type: ignore[arg-type]
    raise ValueError(f"no group size up to {max_group} fits the record kinds {kinds[:2 * max_group]}")
