"""Label decoders for SageMaker Ground Truth output: bounding boxes and class labels -> numpy arrays.

Ground Truth writes, per labeling job, a label attribute and a ``<name>-metadata`` attribute.  In an
augmented manifest read through RecordIO each attribute is a record of JSON text:

- object detection: ``{"image_size": [{"width": W, "height": H, "depth": 3}],
  "annotations": [{"class_id": 0, "left": x, "top": y, "width": w, "height": h}, ...]}``
  -> :class:`BoundingBoxes` -> ``float32 (k, 5)`` rows ``[class_id, x0, y0, x1, y1]``;
- image classification: the class id, ``0`` or ``"0"``; multi-label: ``[1, 0, 8]``
  -> :class:`ClassLabel` -> a 0-d array, an id array or a multi-hot vector.

The ``-metadata`` attributes (``class-name``, ``class-map``, ``confidence``, ``type``, ...) carry no label
of their own: read them with ``Json()`` if you need them.  JSON is parsed with orjson, which refuses
nesting deeper than 1024 levels, so hostile input cannot exhaust the stack.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from ..errors import DecodeError
from .checks import is_int, check_bool, check_int
from .base import ArraySpec, is_random
from .basic import json_loads
from .value import Value, derive, shown_as

__all__ = ["BoundingBoxes", "ClassLabel"]

_BOX_KEYS = ("class_id", "left", "top", "width", "height")
_NUMBER = (int, float)
#: The most boxes a fixed ``(max_boxes, 5)`` output holds (20 MiB a sample), and the most classes of a
#: multi-hot vector: larger values are typing mistakes that would size every output slot by them.
MAX_BOXES = 1 << 20
MAX_MULTI_HOT = 1 << 24
#: Class ids of boxes are stored in float32, exact up to 2**24; image sizes are Pillow's (int32) pixels.
_MAX_BOX_CLASS = 1 << 24
_MAX_SIDE = (1 << 31) - 1
_FLOAT32_MAX = float(np.finfo(np.float32).max)
_EMPTY = 1e-3  # output pixels: a mapped box less wide or high than this has no area (cropped away, dropped)


_INT = re.compile(r"[+-]?[0-9]+")  # a class id written as a string (ASCII digits only, as in JSON)
_FLOAT = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")


def _shown(value: Any) -> str:
    """``repr(value)``, an integer of more than 30 digits shortened (1e308 read as an id has 309)."""
    text = repr(value)
    if isinstance(value, int) and len(text) > 30:
        return f"{text[:12]}...{text[-4:]} ({len(text.lstrip('-'))} digits)"
    return text


def _is_number(value: Any) -> bool:
    return isinstance(value, _NUMBER) and not isinstance(value, bool)


def _looks_like_metadata(doc: Mapping[str, Any]) -> bool:
    kind = doc.get("type")
    return (isinstance(kind, str) and kind.startswith("groundtruth/")) or "class-map" in doc \
        or "class-name" in doc or "job-name" in doc


@dataclass(frozen=True, repr=False)
class BoundingBoxes(Value):
    """Ground Truth object-detection JSON -> ``float32`` array ``(k, 5)`` of ``[class_id, x0, y0, x1, y1]``.

    Coordinates are in pixels of the original image (``x1 = left + width``), unless ``normalize``.
    A label with no boxes, an empty or missing ``annotations`` list gives shape ``(0, 5)``.  Unknown keys
    are ignored; a ``-metadata`` object given by mistake is refused with a clear :class:`DecodeError`.
    So is a label the output could not hold finitely or faithfully: an ``image_size`` side outside
    1..2**31-1 pixels, a ``class_id`` that is not an int in 0..2**24 (-1 is the padding), a coordinate
    beyond float32's range (JSON has no inf: every output is finite).

    Parameters
    ----------
    normalize:
        Divide x by the image width and y by its height (from ``image_size``, or the output frame of
        ``image`` when that is given), giving 0..1 coordinates.  A label without ``image_size`` is then a
        :class:`DecodeError`.
    max_boxes:
        Pad to exactly ``(max_boxes, 5)`` with rows of ``-1`` (MXNet ``ImageDetRecordIter`` style); the
        decoder then has a fixed ``output_spec`` and a ``decode_into``.  More boxes than that are a
        :class:`DecodeError`, unless ``truncate``.  At most ``MAX_BOXES`` (2**20).
    truncate:
        With ``max_boxes``: keep the first ``max_boxes`` boxes instead of raising.
    image:
        An :class:`~parrecio.decoders.Image` (or ``Mask``) decoder with a ``size``: map the boxes into
        its output frame (stretch, letterbox or centre crop) with ``image.geometry(W, H)``, ``W, H`` from
        ``image_size`` (required then).  Boxes are clipped to the frame; boxes left with no area (wholly
        cropped away by ``resize="shorter"`` or a ``crop``: less than 1/1000 px wide or high) are
        dropped.  With a ``random`` image decoder (``crop=RandomResizedCrop(...)``, ``flip``) the boxes
        follow each sample's crop and flip.
    """

    normalize: bool = False
    max_boxes: Optional[int] = None
    truncate: bool = False
    image: Any = None

    payload_kinds = frozenset({"json"})  # Ground Truth JSON only (parrecio.decoders.base)

    def __post_init__(self) -> None:
        max_boxes = None if self.max_boxes is None else \
            check_int("max_boxes", self.max_boxes, 0, MAX_BOXES, want=f"None or an int in 0..{MAX_BOXES}")
        if self.image is not None and not callable(getattr(self.image, "geometry", None)):
            raise TypeError(f"image must be an Image or Mask decoder (with .geometry), got {self.image!r}")
        derive(self, normalize=check_bool("normalize", self.normalize), max_boxes=max_boxes,
               truncate=check_bool("truncate", self.truncate),
               output_spec=None if max_boxes is None else ArraySpec((max_boxes, 5), np.float32))

    # -- parsing ---------------------------------------------------------------------------------------
    @staticmethod
    def _image_size(doc: Mapping[str, Any]) -> Optional[Tuple[float, float]]:
        size = doc.get("image_size")
        if isinstance(size, list):
            size = size[0] if size else None
        if size is None:
            return None
        if not isinstance(size, dict) or not _is_number(size.get("width")) or not _is_number(size.get("height")):
            raise DecodeError(f"image_size must be [{{'width': W, 'height': H, ...}}], got {size!r}")
        width, height = float(size["width"]), float(size["height"])
        if not (1 <= width <= _MAX_SIDE and 1 <= height <= _MAX_SIDE):  # NaN fails it too
            raise DecodeError(f"image_size must have a width and height of 1..{_MAX_SIDE} pixels, got {size!r}")
        return width, height

    def _boxes(self, doc: Any) -> Tuple[np.ndarray, Optional[Tuple[float, float]]]:
        if not isinstance(doc, dict):
            raise DecodeError(f"a bounding-box label must be a JSON object, got {type(doc).__name__}")
        annotations = doc.get("annotations")
        if annotations is None:
            if _looks_like_metadata(doc):
                raise DecodeError("this JSON is a Ground Truth -metadata attribute (keys "
                                  f"{sorted(doc)[:6]}), not a bounding-box label; decode it with Json()")
            annotations = []
        if not isinstance(annotations, list):
            raise DecodeError(f"'annotations' must be a list, got {type(annotations).__name__}")
        rows = np.empty((len(annotations), 5), dtype=np.float64)
        for i, ann in enumerate(annotations):
            if not isinstance(ann, dict):
                raise DecodeError(f"annotation {i} must be an object, got {type(ann).__name__}")
            try:
                values = [ann[k] for k in _BOX_KEYS]
            except KeyError as exc:
                raise DecodeError(f"annotation {i} has no {exc.args[0]!r} (needs {', '.join(_BOX_KEYS)})") \
                    from None
            if not all(_is_number(v) for v in values):
                raise DecodeError(f"annotation {i} has a non-numeric value: {ann!r}")
            class_id = values[0]
            if class_id != int(class_id) or not 0 <= class_id <= _MAX_BOX_CLASS:  # -1 is max_boxes padding
                raise DecodeError(f"annotation {i} has class_id {class_id!r}: class ids are ints in "
                                  f"0..{_MAX_BOX_CLASS}")
            if values[3] < 0 or values[4] < 0:  # (a row with x1 < x0; dropped silently where it followed an image)
                raise DecodeError(f"annotation {i} has a negative width or height: {ann!r}")
            rows[i] = values
        rows[:, 3] += rows[:, 1]  # x1 = left + width
        rows[:, 4] += rows[:, 2]  # y1 = top + height
        if len(rows) and not np.abs(rows).max() <= _FLOAT32_MAX:
            i = int(np.nonzero(~(np.abs(rows) <= _FLOAT32_MAX))[0][0])
            raise DecodeError(f"annotation {i} has coordinates beyond float32's range: {annotations[i]!r}")
        return rows, self._image_size(doc)

    @property
    def random(self) -> bool:
        """Whether the boxes follow a random crop or flip of ``image`` (then the pipeline gives each sample's
        key, the one the image field gets: same key, same crop)."""
        return is_random(self.image)

    def _finish(self, rows: np.ndarray, size: Optional[Tuple[float, float]], key: Optional[int]) -> np.ndarray:
        """Geometry mapping and normalization of parsed rows (float64) -> float32 rows."""
        if self.image is not None:
            if size is None:
                raise DecodeError("BoundingBoxes(image=...) needs the label's image_size to map boxes")
            width, height = int(round(size[0])), int(round(size[1]))
            res = float(getattr(self.image, "resolution", 1.0))
            if res != 1.0:  # a Mask at another resolution than its image: its geometry is of its own size
                mask_w, mask_h = max(1, round(width * res)), max(1, round(height * res))
                rows = rows.copy()
                rows[:, 1::2] *= mask_w / width
                rows[:, 2::2] *= mask_h / height
                width, height = mask_w, mask_h
            geometry = self.image.geometry(width, height, key) if self.random else self.image.geometry(width, height)
            # (in float64: mapped in float32, an edge on the crop's edge landed a few ulps inside the frame,
            # and a box cropped away stayed as a sliver of 1e-5 px; at a high zoom boxes moved by pixels)
            rows = geometry.apply(rows, dtype=np.float64)
            rows = rows[(rows[:, 3] - rows[:, 1] >= _EMPTY) & (rows[:, 4] - rows[:, 2] >= _EMPTY)]
            size = (float(geometry.width), float(geometry.height))
        if self.normalize:
            if size is None:
                raise DecodeError("normalize=True needs image_size in the label (none found)")
            rows[:, 1::2] /= size[0]
            rows[:, 2::2] /= size[1]
        with np.errstate(over="ignore", invalid="ignore"):
            out = rows.astype(np.float32)
        if not np.isfinite(out).all():  # the input was finite (JSON has no inf): never hand out inf or NaN
            raise DecodeError(f"box coordinates are not finite in float32 after mapping: {rows.tolist()[:4]}")
        return out

    def _check_count(self, count: int) -> int:
        """How many boxes fit ``max_boxes``; raises unless ``truncate`` when there are too many."""
        if self.max_boxes is None or count <= self.max_boxes:
            return count
        if self.truncate:
            return self.max_boxes
        raise DecodeError(f"label has {count} boxes, more than max_boxes={self.max_boxes} "
                          f"(raise max_boxes, or pass truncate=True to keep the first {self.max_boxes})")

    # -- the decoder protocol --------------------------------------------------------------------------
    def decode_into(self, payload: Any, out: np.ndarray, key: Optional[int] = None) -> None:
        """Write the ``(max_boxes, 5)`` padded boxes of ``payload`` into ``out`` (needs ``max_boxes``);
        ``key``: the sample's key, when the boxes follow a ``random`` image decoder."""
        boxes = self._finish(*self._boxes(json_loads(payload)), key)
        count = self._check_count(len(boxes))
        out[:count] = boxes[:count]
        out[count:] = -1

    def __call__(self, payload: Any, key: Optional[int] = None) -> np.ndarray:
        """Decode JSON text (bytes-like or ``str``) to a ``float32`` array ``(k, 5)`` or ``(max_boxes, 5)``;
        ``key``: the sample's key, when the boxes follow a ``random`` image decoder."""
        boxes = self._finish(*self._boxes(json_loads(payload)), key)
        if self.max_boxes is None:
            return boxes
        out = np.empty((self.max_boxes, 5), np.float32)
        count = self._check_count(len(boxes))
        out[:count] = boxes[:count]
        out[count:] = -1
        return out


def _exact_max(dtype: np.dtype) -> int:
    """The largest id ``dtype`` holds exactly (and all below it): ``iinfo.max``, ``2**(mantissa + 1)``."""
    if dtype.kind in "iu":
        return int(np.iinfo(dtype).max)
    return 2 ** (np.finfo(dtype).nmant + 1)


def _class_names(names: Any, num_classes: Optional[int]) -> Optional[Tuple[Tuple[str, int], ...]]:
    """``class_names`` (names in id order, a ``{name: id}`` mapping, or already the sorted ``(name, id)``
    pairs of ``dataclasses.replace``) as sorted ``(name, id)`` pairs, checked."""
    if names is None:
        return None
    if isinstance(names, Mapping):
        items = list(names.items())
    elif isinstance(names, (str, bytes)) or not hasattr(names, "__iter__"):
        raise TypeError(f"class_names must be a sequence of names or a mapping {{name: id}}, got {names!r}")
    else:
        listed = list(names)
        if listed and all(isinstance(p, tuple) and len(p) == 2 for p in listed):
            items = listed  # the frozen (name, id) pairs
        else:
            items = [(name, i) for i, name in enumerate(listed)]
            seen = [n for n in listed if isinstance(n, str)]
            if len(set(seen)) != len(seen):
                raise ValueError(f"class_names lists a name twice: {listed!r}")
    for name, class_id in items:
        if not isinstance(name, str):
            raise TypeError(f"class_names: class names must be strings, got {name!r} (a Ground Truth class-map "
                            f"is {{id: name}}: pass {{name: int(id)}})")
        if not is_int(class_id) or class_id < 0 or (num_classes is not None and class_id >= num_classes):
            want = "an int >= 0" if num_classes is None else f"an int in 0..{num_classes - 1}"
            kind = ValueError if is_int(class_id) else TypeError
            raise kind(f"class_names: the id of {name!r} must be {want}, got {class_id!r}")
    return tuple(sorted((name, int(i)) for name, i in items))


@dataclass(frozen=True, repr=False)
class ClassLabel(Value):
    """Ground Truth classification labels -> numpy arrays.

    Accepted payloads (JSON text, bytes-like or ``str``): a class id as a number (``3``, ``3.0``) or a
    string (``"3"``), a list of them (multi-label, ``[1, 0, 8]``); with ``class_names`` also a class name
    (``"cat"``, quoted or bare text) or an object with a ``class-name`` key.  Booleans are refused.
    A Ground Truth ``-metadata`` object carries the class *name*, not its id: it is refused unless
    ``class_names`` is given (decode the label attribute itself, the one without ``-metadata``).

    Parameters
    ----------
    dtype:
        Output dtype; default ``None``: ``int64`` for ids, ``float32`` for multi-hot vectors.  A float dtype also
        accepts non-integral numbers (regression targets); an integer dtype refuses them.
    num_classes:
        When given, ids must be in ``0 .. num_classes-1``; needed for multi-hot output (then at most
        ``MAX_MULTI_HOT``, 2**24).  An integer ``dtype`` must hold ``num_classes - 1``, a float one exactly.
    multi_label:
        ``False``: one label per payload -> 0-d array, fixed ``output_spec = ArraySpec((), dtype)`` (so a
        batch column is one array); a one-element list is accepted, longer lists are a
        :class:`DecodeError`.  ``True`` with ``num_classes``: multi-hot vector ``(num_classes,)`` (fixed
        ``output_spec``).  ``True`` without ``num_classes``: a 1-D array of ids (ragged: no spec).
    class_names:
        Names of the classes in id order (``["dog", "cat"]``) or a mapping ``{name: id}``; lets names stand
        for ids.
    """

    dtype: Any = field(default=None, metadata=shown_as(lambda dtype: dtype.name))
    num_classes: Optional[int] = None
    multi_label: bool = False
    #: normalized to sorted ``(name, id)`` pairs, so that the decoder hashes
    class_names: Union[Sequence[str], Mapping[str, int], None] = field(default=None, metadata=shown_as(dict))

    def __post_init__(self) -> None:
        multi_label = check_bool("multi_label", self.multi_label)
        num_classes = None if self.num_classes is None else \
            check_int("num_classes", self.num_classes, 1, want="None or an int >= 1")
        multi_hot = multi_label and num_classes is not None
        if multi_hot and num_classes > MAX_MULTI_HOT:
            raise ValueError(f"num_classes={num_classes} with multi_label=True: a multi-hot vector holds at most "
                             f"{MAX_MULTI_HOT} classes")
        try:
            given = None if self.dtype is None else np.dtype(self.dtype)  # None stays None: dataclasses.replace
        except TypeError:
            raise TypeError(f"dtype must be None or a numpy integer or float dtype, got {self.dtype!r}") from None
        dtype = given if given is not None else np.dtype(np.float32 if multi_hot else np.int64)
        if dtype.kind not in "iuf":
            raise ValueError(f"dtype must be an integer or float dtype, got {dtype}")
        if num_classes is not None and not multi_hot and num_classes - 1 > _exact_max(dtype):
            raise ValueError(f"dtype={dtype.name} cannot hold class ids up to num_classes - 1 = {num_classes - 1} "
                             f"exactly (at most {_exact_max(dtype)})")
        names = _class_names(self.class_names, num_classes)
        if multi_hot:
            spec: Optional[ArraySpec] = ArraySpec((num_classes,), dtype)
        else:
            spec = None if multi_label else ArraySpec((), dtype)
        derive(self, dtype=given, _dtype=dtype, num_classes=num_classes, multi_label=multi_label,
               class_names=names, _names=dict(names or ()), _multi_hot=multi_hot, output_spec=spec)

    @property
    def payload_kinds(self) -> frozenset:
        """JSON text; with ``class_names`` bare text too (see :mod:`parrecio.decoders.base`)."""
        return frozenset({"json", "text"} if self._names else {"json"})

    # -- parsing ---------------------------------------------------------------------------------------
    def _parse(self, payload: Any) -> Any:
        try:
            return json_loads(payload)
        except DecodeError:
            if not self._names:
                raise
            # bare text such as  cat  (not JSON): a class name, after a UTF-8 BOM as JSON is
            text = payload if isinstance(payload, str) else \
                bytes(memoryview(payload).cast("B")).decode("utf-8", "replace")
            return text.removeprefix("\ufeff").strip()

    def _one(self, value: Any) -> Union[int, float]:
        """One label value -> a class id (or a float target for float dtypes)."""
        if isinstance(value, dict):
            if "class-name" in value and self._names:
                value = value["class-name"]
            else:
                raise DecodeError("a JSON object is not a class label (a Ground Truth -metadata attribute? "
                                  "it holds the class name, not the id; decode the label attribute, or pass "
                                  f"class_names=...); keys: {sorted(value)[:6]}")
        if isinstance(value, str):
            text = value.strip()
            if text in self._names:
                value = self._names[text]
            elif _INT.fullmatch(text):
                try:
                    value = int(text)  # (exact: through a float, an id past 2**53 would lose digits)
                except ValueError:  # (past Python's 4300 digits: no dtype holds it)
                    raise DecodeError(f"class label {text[:12]}...{text[-4:]} ({len(text)} digits) is out of "
                                      f"range") from None
            elif _FLOAT.fullmatch(text):
                value = float(text)
            else:
                hint = "" if self._names else " (pass class_names=... to use class names)"
                raise DecodeError(f"class label {text!r} is neither a number nor a known class name{hint}")
        if isinstance(value, bool) or not _is_number(value):
            raise DecodeError(f"a class label must be a number or a numeric string, got {value!r}")
        if isinstance(value, float) and not math.isfinite(value):  # (an int is; isfinite(10**309) raises)
            raise DecodeError(f"class label {_shown(value)} is not finite")
        if self._dtype.kind != "f" or self._multi_hot:  # a multi-hot vector sets the entry of an id
            if value != int(value):
                raise DecodeError(f"class label {_shown(value)} is not an integer (use a float dtype for targets)")
            if isinstance(value, float) and abs(value) >= 2 ** 53 and self._in_range(value):
                # (a JSON integer past 64 bits comes as a float from orjson: its digits are gone)
                raise DecodeError(f"class label {_shown(value)} is too large to be an exact integer")
            value = int(value)
        if self.num_classes is not None and not 0 <= value < self.num_classes:
            raise DecodeError(f"class id {value!r} out of range 0..{self.num_classes - 1}")
        return value

    def _in_range(self, value: float) -> bool:
        """Whether ``value`` lies within the integer dtype's bounds (else _check_dtype says it does not fit)."""
        if self._dtype.kind not in "iu":
            return True
        info = np.iinfo(self._dtype)
        return info.min <= value <= info.max

    def _values(self, doc: Any) -> list:
        if isinstance(doc, list):
            return [self._one(v) for v in doc]
        return [self._one(doc)]

    def _check_dtype(self, values: list) -> None:
        if self._multi_hot:
            return  # ids index the vector (checked against num_classes); its entries are 0 and 1
        info = np.iinfo(self._dtype) if self._dtype.kind in "iu" else np.finfo(self._dtype)
        lo, hi = (info.min, info.max) if self._dtype.kind in "iu" else (float(info.min), float(info.max))
        exact = self._dtype.kind == "f"
        for v in values:  # (integers against the integer bounds: as floats, int64's max rounds up to 2**63)
            if not lo <= v <= hi:  # a float16 target of 1e5 would become inf
                raise DecodeError(f"class label {_shown(v)} does not fit {self._dtype}")
            # an integer id a float dtype cannot hold would become another id (16777217 -> 16777216 in
            # float32); a float value is a target, rounded as floats are
            if exact and isinstance(v, int) and int(self._dtype.type(v)) != v:
                bits = np.finfo(self._dtype).nmant + 1
                raise DecodeError(f"class id {_shown(v)} is not exact in {self._dtype} (its integers are exact up "
                                  f"to 2**{bits}): use an integer dtype")

    # -- the decoder protocol --------------------------------------------------------------------------
    def __call__(self, payload: Any) -> np.ndarray:
        """Decode one label payload (see the class docstring for the shapes)."""
        values = self._values(self._parse(payload))
        self._check_dtype(values)
        if not self.multi_label:
            if len(values) != 1:
                raise DecodeError(f"got {len(values)} labels {values[:8]} for a single-label ClassLabel "
                                  "(use multi_label=True)")
            return np.array(values[0], dtype=self._dtype)
        if self.num_classes is None:
            return np.array(values, dtype=self._dtype).reshape(-1)
        hot = np.zeros(self.num_classes, dtype=self._dtype)
        hot[[int(v) for v in values]] = 1
        return hot

    def decode_into(self, payload: Any, out: np.ndarray) -> None:
        """Write the label into ``out`` (shape ``()`` or ``(num_classes,)``, see ``output_spec``)."""
        out[...] = self(payload)
