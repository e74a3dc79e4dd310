"""Augmented manifests: JSON lines whose attributes SageMaker turns into one record each.

```
 {"source-ref": "s3://b/img1.jpg", "bounding-box": {"image_size": [...], "annotations": [...]}, ...}
 {"source-ref": "s3://b/img2.jpg", "bounding-box": {...}}
       |  AttributeNames = ["source-ref", "bounding-box"]
       v
 [bytes of img1.jpg] [{"image_size":[...],"annotations":[...]}] [bytes of img2.jpg] [...]
```

SageMaker (augmented manifest, Pipe mode, ``RecordWrapperType: RecordIO``) emits, for every line and for
each name of ``AttributeNames`` in that order, one record: an attribute whose name ends with ``-ref``
carries the bytes of the object it references, any other attribute its JSON text.  Here, for local
emulation and packing, a ``-ref`` is a local path: absolute, relative to the manifest's directory, or a
``file://`` URL; ``s3://`` references are refused (nothing here talks to S3).  JSON text is
``orjson.dumps(value)`` (compact, no spaces; a line with an integer beyond 64 bits, which orjson would
read as a float, is read and written by the standard library, so the value is kept).  Blank lines are
skipped; a line without one of the attributes is an error, as it is for SageMaker.
"""

from __future__ import annotations

import json
import os
import re
import stat
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple
from urllib.parse import unquote, urlparse

import orjson

from ..errors import SourceError

__all__ = [
    "ManifestLine", "read_manifest_lines", "line_records", "iter_manifest_records", "parse_attribute_names",
    "is_manifest_path", "resolve_ref", "MANIFEST_SUFFIXES",
]

MANIFEST_SUFFIXES = (".manifest", ".jsonl")

ManifestLine = Tuple[int, bytes]
"""``(line number, 1-based; the line's bytes)``."""


def is_manifest_path(path: str) -> bool:
    """Whether ``path`` names an augmented manifest (``*.manifest`` or ``*.jsonl``)."""
    return path.lower().endswith(MANIFEST_SUFFIXES)


def parse_attribute_names(text: str) -> List[str]:
    """``"source-ref,bounding-box"`` -> ``["source-ref", "bounding-box"]`` (spaces around names ignored)."""
    names = [name.strip() for name in text.split(",")]
    if not all(names):
        raise SourceError(f"bad attribute names {text!r}: expected names separated by commas")
    return names


def read_manifest_lines(manifest_path: str) -> List[ManifestLine]:
    """The non-blank lines of the manifest, with their line numbers (the lines are parsed later)."""
    try:
        with open(manifest_path, "rb") as f:
            return [(n, line) for n, line in enumerate(f, 1) if line.strip()]
    except OSError as exc:
        raise SourceError(f"cannot read manifest {manifest_path}: {exc.strerror or exc}") from exc


def line_records(line: ManifestLine, attribute_names: Sequence[str], manifest_path: str) -> List[bytes]:
    """The records of one manifest line: one per attribute name, in order (see the module docstring)."""
    where, values, dumps = _line_values(line, attribute_names, manifest_path)
    return [_referenced_bytes(value, manifest_path, where, name) if name.endswith("-ref") else dumps(value)
            for name, value in zip(attribute_names, values)]


def check_manifest(manifest_path: str, attribute_names: Sequence[str]) -> int:
    """Look at every line of the manifest now, as :func:`line_records` would, without reading the
    referenced files (each must be a readable file); SourceError naming the first line that would fail.
    Returns the lines.  (A server of the records -- ``pipe-serve`` -- finds it out before a reader waits
    for its stream, not in the middle of an epoch.)"""
    lines = read_manifest_lines(manifest_path)
    for line in lines:
        where, values, _ = _line_values(line, attribute_names, manifest_path)
        for name, value in zip(attribute_names, values):
            if name.endswith("-ref"):
                path = _ref_path(value, manifest_path, where, name)
                if not (os.path.isfile(path) and os.access(path, os.R_OK)):
                    raise SourceError(f"{where}: cannot read {name} {value!r} ({path}): "
                                      f"{'not a readable file' if os.path.exists(path) else 'no such file'}")
    return len(lines)


def ref_paths(manifest_path: str, attribute_names: Sequence[str]) -> List[str]:
    """The local paths the ``-ref`` attributes of the manifest's lines name, not read (a line that
    :func:`line_records` would refuse is left out: it says so when the line is reached)."""
    paths = []
    refs = [i for i, name in enumerate(attribute_names) if name.endswith("-ref")]
    if refs:
        for line in read_manifest_lines(manifest_path):
            try:
                where, values, _ = _line_values(line, attribute_names, manifest_path)
                paths += [_ref_path(values[i], manifest_path, where, attribute_names[i]) for i in refs]
            except SourceError:
                pass
    return paths


def _line_values(line: ManifestLine, attribute_names: Sequence[str],
                 manifest_path: str) -> Tuple[str, list, Callable[[Any], bytes]]:
    """``(where, the values of the attributes, how a value is written as JSON)`` of one manifest line;
    SourceError naming the line."""
    lineno, text = line
    where = f"{manifest_path} line {lineno}"
    dumps: Callable[[Any], bytes] = orjson.dumps
    try:
        obj = orjson.loads(text)
        if _LONG_DIGITS.search(text):  # orjson reads an integer beyond 64 bits as a float: another value
            obj, dumps = json.loads(text), _exact_dumps
    except (orjson.JSONDecodeError, ValueError) as exc:
        raise SourceError(f"{where}: not valid JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise SourceError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    for name in attribute_names:
        if name not in obj:
            raise SourceError(f"{where}: no attribute {name!r} (the line has {', '.join(map(repr, obj))})")
    return where, [obj[name] for name in attribute_names], dumps


_LONG_DIGITS = re.compile(rb"\d{19}")  # 19 digits or more: maybe an integer beyond 64 bits (-2**63 - 1 has 19)


def _exact_dumps(value: Any) -> bytes:
    """Compact JSON with Python's integers as they are (a line that holds a long number)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def iter_manifest_records(manifest_path: str, attribute_names: Sequence[str], *,
                          order: Optional[Sequence[int]] = None) -> Iterator[bytes]:
    """The records of an augmented manifest, ``len(attribute_names)`` per line, as SageMaker would stream them.

    ``order`` optionally lists the indexes of the manifest's non-blank lines to emit (a permutation for a
    shuffled epoch); referenced files are read only when their line is reached.
    """
    if not attribute_names:
        raise SourceError(f"{manifest_path}: give at least one attribute name (AttributeNames)")
    lines = read_manifest_lines(manifest_path)
    for index in (range(len(lines)) if order is None else order):
        yield from line_records(lines[index], attribute_names, manifest_path)


def special_kind(mode: int) -> Optional[str]:
    """What a node of ``st_mode`` ``mode`` is when it is neither a regular file nor a folder: "a FIFO", "a
    character device", "a block device", "a socket"; else None."""
    for test, what in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return what
    return None


def read_regular(path: str) -> bytes:
    """The bytes of the regular file ``path``, or an ``OSError`` that says what else it is: a FIFO (read,
    it waited for a writer for ever), a device (``/dev/zero``: read until memory ran out), a folder."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))  # (a FIFO: no wait)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            what = "a folder" if stat.S_ISDIR(mode) else special_kind(mode) or "a special file"
            raise OSError(f"not a regular file ({what})")
        os.set_blocking(fd, True)
        with open(fd, "rb", closefd=False) as f:
            return f.read()
    finally:
        os.close(fd)


def _referenced_bytes(value, manifest_path: str, where: str, name: str) -> bytes:
    path = _ref_path(value, manifest_path, where, name)
    try:
        return read_regular(path)
    except OSError as exc:
        raise SourceError(f"{where}: cannot read {name} {value!r} ({path}): {exc.strerror or exc}") from exc


def _ref_path(value: Any, manifest_path: str, where: str, name: str) -> str:
    if not isinstance(value, str):
        raise SourceError(f"{where}: attribute {name!r} should be a path or URL string, got {value!r}")
    try:
        return resolve_ref(value, manifest_path)
    except SourceError as exc:  # (an s3:// or a remote file:// reference: which line holds it)
        raise SourceError(f"{where}: {name}: {exc}") from None


def resolve_ref(ref: str, manifest_path: str) -> str:
    """The local path of a ``-ref`` value: ``file://`` URL, absolute path, or relative to the manifest."""
    if "://" in ref:
        url = urlparse(ref)
        if url.scheme != "file":
            raise SourceError(
                f"cannot fetch {ref!r}: only local files are read here (a path, relative to the manifest "
                f"or absolute, or a file:// URL); download the objects and rewrite the manifest's references"
            )
        if url.netloc not in ("", "localhost"):
            raise SourceError(f"cannot read {ref!r}: a file:// URL must name a local path (file:///...)")
        return unquote(url.path)
    if os.path.isabs(ref):
        return ref
    return os.path.join(os.path.dirname(os.path.abspath(manifest_path)), ref)
