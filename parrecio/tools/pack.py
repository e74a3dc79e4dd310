"""Build RecordIO files: MXNet ``.rec`` + ``.idx`` from images (like ``im2rec``), augmented-manifest streams.

Image records (MXNet ``tools/im2rec.py`` with ``--pass-through``: the image bytes are stored as they are,
never re-encoded)::

    folder/cat/1.jpg, folder/cat/2.jpg, folder/dog/a.png          classes in sorted order: cat=0, dog=1
        | list_image_folder("folder")
        v
    ListItem(0, (0.0,), "cat/1.jpg"), ListItem(1, (0.0,), "cat/2.jpg"), ListItem(2, (1.0,), "dog/a.png")
        | pack_image_list(items, "folder", "out.rec", lst_path="out.lst")
        v
    out.rec   record k = pack(IRHeader(0, label, index, 0), image bytes)   (flag = n for n > 1 labels)
    out.idx   "index\\toffset" per record (MXIndexedRecordIO)
    out.lst   "index\\tlabel[\\tlabel...]\\tpath" per record, in the order written (im2rec's list format)

An item's ``index`` is its number in the unshuffled listing; it is the record's ``IRHeader.id`` and its key
in the ``.idx`` file, so a shuffled file still maps back to the listing.

Augmented manifests (:func:`pack_manifest`): one record per attribute name and manifest line, in SageMaker
Pipe-mode framing (``join="concat"``), produced by :func:`parrecio.tools.manifest.iter_manifest_records`,
the same code that ``parrecio pipe-serve`` streams from.

Outputs are written to temporary names next to their destination and renamed at the end, so a failed
run leaves no half-written ``.rec`` behind (and an existing one as it was).  Two outputs on one path (an
output ``o.idx``, whose index is ``o.idx`` too), and an output that is one of the inputs (``pack_manifest(m,
m)``), are refused before anything is written.  An output that exists and is no regular file -- a FIFO, a
device such as ``/dev/null``, a descriptor of this process such as ``/dev/stdout`` -- is written into
(:func:`direct_output`): a rename would replace the node, not feed it; then no ``.idx`` is written beside it
unless one is asked for by name (an index is for a file that can be read again).
"""

from __future__ import annotations

import os
import random
import re
import stat
import struct
from dataclasses import dataclass, field
from typing import (Any, BinaryIO, Callable, Dict, Iterable, Iterator, List, NamedTuple, Optional, Sequence, Tuple,
                    Union)

from ..errors import SourceError
from ..recordio import IRHeader, RecordWriter, pack
from ..recordio.paths import check_path_arg, index_path

__all__ = ["IMAGE_EXTENSIONS", "ListItem", "PackResult", "list_image_folder", "read_image_list",
           "write_image_list", "pack_image_list", "pack_manifest", "output_paths", "direct_output"]

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff")
"""File name endings (case-insensitive) that :func:`list_image_folder` takes for images."""

Progress = Optional[Callable[[int, Optional[int]], None]]  # (records so far, total if known)


class ListItem(NamedTuple):
    """One line of an im2rec ``.lst`` file: ``index``, one or more float ``labels``, ``path`` (relative)."""

    index: int
    labels: Tuple[float, ...]
    path: str


@dataclass
class PackResult:
    """What a pack wrote: record count, bytes of the ``.rec`` stream, the paths written."""

    records: int
    bytes: int
    rec_path: str
    idx_path: Optional[str] = None
    lst_path: Optional[str] = None
    classes: List[str] = field(default_factory=list)
    lines: int = 0
    skipped: List[Tuple[str, str]] = field(default_factory=list)  # (path, why): files that are no image


def output_paths(out_rec: str) -> Tuple[str, str]:
    """``(idx, lst)`` paths that go with ``out_rec``: ``train.rec`` -> ``train.idx``, ``train.lst``."""
    check_path_arg(out_rec, "out_rec", file_ok=False)
    idx = index_path(out_rec)  # where every reader looks for it
    return idx, idx[:-4] + ".lst"


# -- IRHeader fields: what pack() can store ------------------------------------------------------------

_MAX_ID = 2 ** 64 - 1  # IRHeader.id is an unsigned 64-bit number
_FLOAT32 = struct.Struct("<f")


def _item_problem(index: int, labels: Sequence[float]) -> Optional[str]:
    """Why ``index`` and ``labels`` cannot go into an IRHeader (and its float32 labels), or None.

    A finite label beyond float32's range (about 3.4e38) is refused: one label would fail in
    ``struct.pack``, several would silently become ``inf`` in numpy's float32 array.  ``inf`` and ``nan``
    written as such are stored as they are, as im2rec does.
    """
    if not 0 <= index <= _MAX_ID:
        return f"index {index} is out of range: a record's id is an unsigned 64-bit number (0 to {_MAX_ID})"
    for label in labels:
        try:
            _FLOAT32.pack(label)
        except OverflowError:
            return f"label {label!r} is beyond the float32 range (about +-3.4e38) that labels are stored in"
    return None


# -- listing -------------------------------------------------------------------------------------------

def list_image_folder(root: str, *, extensions: Sequence[str] = IMAGE_EXTENSIONS) -> Tuple[List[str], List[ListItem]]:
    """List the images under ``root``, labelled by sub-folder: ``(classes, items)``.

    The classes are the sub-folders of ``root`` that hold images (at any depth below them), in sorted
    order; an image's label is its top-level sub-folder's position in that list.  Files are taken in sorted
    path order, so ``index`` runs class by class.  A folder with images but no sub-folders is one class
    (label 0, class name ``"."``).  Mixing images at the top level with class sub-folders is an error, as is
    a folder without images.

    Symbolic links to folders are followed, and below the class folders each folder is walked once: a link
    back up (``up -> ..``) or a second way into a folder is left out, so a folder belongs to the parent
    that lists it first (in walk order: the top level's class folders before anything inside them).  The
    class folders themselves are all kept, as im2rec keeps them: two that are one folder (links, bind
    mounts) are two classes of the same images, and the labels of the classes after them do not move.
    """
    check_path_arg(root, "root", file_ok=False)
    if not os.path.isdir(root):
        raise SourceError(f"{root}: not a directory")
    exts = tuple(e.lower() for e in extensions)
    found: List[Tuple[str, str]] = []  # (class, relative path)
    seen = {_node(root)}  # folders listed for walking, by (device, inode)
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        keep = []
        top = dirpath == root
        for name in sorted(d for d in dirnames if not d.startswith(".")):
            key = _node(os.path.join(dirpath, name))
            # (None: gone, or a link loop os.walk cannot list either)
            if key is not None and (top or key not in seen):
                seen.add(key)
                keep.append(name)
        dirnames[:] = keep
        rel_dir = os.path.relpath(dirpath, root)
        for name in sorted(filenames):
            if name.startswith(".") or not name.lower().endswith(exts):
                continue
            rel = name if rel_dir == "." else os.path.join(rel_dir, name)
            if not os.path.isfile(os.path.join(root, rel)):
                continue
            cls = "." if rel_dir == "." else rel_dir.split(os.sep, 1)[0]
            if any(c in rel for c in "\t\n\r") or any(p != p.strip() for p in rel.split(os.sep)):
                # (an im2rec .lst has no escape: "3\tx.png" was read back as labels 0 and 3 of x.png)
                raise SourceError(f"{os.path.join(root, rel)!r}: a name with a tab, a line break, or spaces "
                                  f"at its start or end cannot be written to an im2rec list (.lst), which "
                                  f"has no escape for them: rename it")
            found.append((cls, rel))
    if not found:
        raise SourceError(f"{root}: no images found (looked for {', '.join(exts)})")
    classes = sorted({cls for cls, _ in found})
    if "." in classes and len(classes) > 1:
        top = next(rel for cls, rel in found if cls == ".")
        raise SourceError(f"{root}: images both at the top level ({top}) and in class sub-folders "
                          f"({', '.join(c for c in classes if c != '.')}); move them into a sub-folder")
    label_of = {cls: i for i, cls in enumerate(classes)}
    found.sort(key=lambda item: (label_of[item[0]], item[1]))
    items = [ListItem(i, (float(label_of[cls]),), rel) for i, (cls, rel) in enumerate(found)]
    return classes, items


def _node(path: str) -> Optional[Tuple[int, int]]:
    """``(device, inode)`` of what ``path`` leads to, or None when it is not there."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return st.st_dev, st.st_ino


def read_image_list(lst_path: str) -> List[ListItem]:
    """Parse an im2rec list file: ``index<TAB>label[<TAB>label...]<TAB>path`` per line.

    Blank lines are skipped; a malformed line, a repeated index, an index an IRHeader cannot hold (below 0,
    above ``2**64 - 1``) or a label beyond float32's range raises :class:`SourceError` naming the line.
    """
    check_path_arg(lst_path, "lst_path", file_ok=False)
    try:
        # (a path that is not UTF-8 stays the bytes it was: a file name is bytes on POSIX, as im2rec's)
        with open(lst_path, "r", encoding="utf-8", errors="surrogateescape") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise SourceError(f"cannot read list file {lst_path}: {getattr(exc, 'strerror', None) or exc}") from exc
    items: List[ListItem] = []
    seen = set()
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        parts = [p.strip() for p in line.strip().split("\t")]
        where = f"{lst_path} line {lineno}"
        if len(parts) < 3:
            raise SourceError(f"{where}: expected 'index<TAB>label[<TAB>label...]<TAB>path', got {line[:80]!r}")
        try:
            index = int(parts[0])
            labels = tuple(float(p) for p in parts[1:-1])
        except ValueError as exc:
            raise SourceError(f"{where}: {exc}") from None
        if index < 0:
            raise SourceError(f"{where}: negative index {index}")
        why = _item_problem(index, labels)
        if why is not None:
            raise SourceError(f"{where}: {why}")
        if index in seen:
            raise SourceError(f"{where}: index {index} appears twice")
        seen.add(index)
        items.append(ListItem(index, labels, parts[-1]))
    if not items:
        raise SourceError(f"{lst_path}: the list is empty")
    return items


def write_image_list(path_or_file: Union[str, BinaryIO], items: Sequence[ListItem]) -> None:
    """Write ``items`` as an im2rec list file (labels formatted ``%f``, as im2rec does; a path that is not
    UTF-8 as its bytes)."""
    check_path_arg(path_or_file, "path_or_file")
    text = "".join(f"{it.index}\t" + "".join(f"{lab:f}\t" for lab in it.labels) + f"{it.path}\n"
                   for it in items)
    if isinstance(path_or_file, str):
        with open(path_or_file, "w", encoding="utf-8", errors="surrogateescape", newline="\n") as f:
            f.write(text)
    else:
        path_or_file.write(text.encode("utf-8", "surrogateescape"))


# -- packing -------------------------------------------------------------------------------------------

def pack_image_list(items: Sequence[ListItem], root: str, out_rec: str, *, idx_path: Optional[str] = None,
                    lst_path: Optional[str] = None, shuffle: bool = False, seed: int = 0,
                    progress: Progress = None, verify: bool = True, list_file: Optional[str] = None) -> PackResult:
    """Write the images of ``items`` (paths relative to ``root``) as MXNet image records.

    Record payloads are ``pack(IRHeader(0, label, item.index, 0), image bytes)`` (several labels: a float32
    label array, ``flag`` = their number).  ``idx_path`` defaults to ``out_rec`` with ``.idx`` (none when
    ``out_rec`` is a FIFO, a device or a descriptor: :func:`direct_output`); keys are the items' indexes.
    With ``lst_path`` the items are also written as a list file, in the order packed.  ``shuffle`` permutes
    the items with ``random.Random(seed)`` first.  ``progress(n, total)`` is called every 1000 records.
    With ``verify`` (default) each file must open as an image (Pillow reads its header and checks its
    structure, without decoding it), and a JPEG must end its last scan: one that does not is left out and
    listed in ``PackResult.skipped`` with the reason (when every one is, :class:`SourceError`: nothing is
    written).  ``list_file``: the list the items were read from,
    which no output may replace (nor any of the images).
    """
    for value, name in ((root, "root"), (out_rec, "out_rec"), (idx_path, "idx_path"), (lst_path, "lst_path"),
                        (list_file, "list_file")):
        check_path_arg(value, name, file_ok=False)
    order = list(items)
    if shuffle:
        random.Random(seed).shuffle(order)
    if idx_path is None and direct_output(out_rec) is None:
        idx_path = output_paths(out_rec)[0]
    for item in order:  # before anything is read or written (read_image_list has said so by line already)
        why = _item_problem(item.index, item.labels)
        if why is not None:
            raise SourceError(f"{item.path}: {why}")
    skipped: List[Tuple[str, str]] = []
    packed: List[ListItem] = []
    total = len(order)
    paths = [item.path if os.path.isabs(item.path) else os.path.join(root, item.path) for item in order]
    outputs = {"records": out_rec}
    if idx_path:
        outputs["index"] = idx_path
    if lst_path:
        outputs["list"] = lst_path
    inputs = [*([(list_file, "list")] if list_file else []), *_named_like(paths, outputs.values(), "image")]
    with _Outputs(outputs, inputs) as tmp:
        with RecordWriter(tmp[out_rec], index=tmp[idx_path] if idx_path else None) as writer:
            for n, (item, path) in enumerate(zip(order, paths), 1):
                data = _read_file(path)
                why = _not_an_image(data) if verify else None
                if why is not None:
                    skipped.append((path, why))
                    continue
                packed.append(item)
                label = item.labels[0] if len(item.labels) == 1 else list(item.labels)
                try:
                    writer.write(pack(IRHeader(0, label, item.index, 0), data), key=item.index)
                except ValueError as exc:
                    raise SourceError(f"{path}: {exc}") from exc
                if progress is not None and n % 1000 == 0:
                    progress(n, total)
            if skipped and not packed:  # (an empty .rec and status 0 read as "packed" in a script)
                path, why = skipped[0]
                raise SourceError(f"none of the {len(skipped)} files opened as an image (the first, {path}: "
                                  f"{why}); nothing was written")
            nbytes = writer.tell()
        if lst_path:
            write_image_list(tmp[lst_path], packed)
    return PackResult(records=len(packed), bytes=nbytes, rec_path=out_rec, idx_path=idx_path or None,
                      lst_path=lst_path, skipped=skipped)


def _named_like(paths: Sequence[str], outputs: Iterable[str], role: str) -> List[Tuple[str, str]]:
    """``(path, role)`` of the ``paths`` whose file name is an output's: the only ones that can be one."""
    names = {os.path.normcase(os.path.basename(out)) for out in outputs}
    return [(p, role) for p in paths if os.path.normcase(os.path.basename(p)) in names]


def _not_an_image(data: bytes) -> Optional[str]:
    """Why ``data`` is not an image file Pillow can open, or None."""
    import io

    from PIL import Image as PILImage
    try:
        with PILImage.open(io.BytesIO(data)) as img:
            img.verify()
    except Exception as exc:  # UnidentifiedImageError, SyntaxError for broken structure, ...
        import re

        from ..decoders.sniff import IMAGE_KINDS, describe, sniff
        kind = sniff(data)
        if isinstance(exc, PILImage.UnidentifiedImageError) or kind not in IMAGE_KINDS:
            return f"not an image Pillow can open: {describe(data)}"
        # Pillow names the file object it was given ("<_io.BytesIO object at 0x...>"): no news to anyone
        said = re.sub(r"\s*<_io\.BytesIO object at 0x[0-9a-fA-F]+>", "", str(exc)).strip()
        return f"a {kind.upper()} image ({len(data)} bytes) that does not open: {type(exc).__name__}: {said}"
    # verify() does not decode a JPEG's scans: a file cut short passes it, and Image() refuses it later,
    # in the middle of a training run.  Its end marker must follow its first scan's start (bytes after
    # it -- a Motion Photo's video -- are no part of the image: searching the whole file for the last
    # scan found one in such a trailer, and refused the photo): the region decoder's own test.
    from ..decoders.image import _ends_in_eoi
    if data[:3] == b"\xff\xd8\xff" and not _ends_in_eoi(data):
        return f"a JPEG image ({len(data)} bytes) cut short: no end-of-image marker after its last scan"
    return None


def pack_manifest(manifest_path: str, out: Union[str, BinaryIO], attribute_names: Sequence[str], *,
                  split_bytes: Optional[int] = None, shuffle: bool = False, seed: int = 0,
                  progress: Progress = None) -> PackResult:
    """Write an augmented manifest as the RecordIO stream SageMaker Pipe mode would deliver.

    One record per attribute name per manifest line (``-ref`` attributes: the referenced file's bytes;
    others: their JSON text), in SageMaker's wrapper framing (``join="concat"``, which ``join="auto"``
    finds).
    Records larger than ``split_bytes`` become multipart records.  ``out`` is a path (written atomically;
    a FIFO or a device written into: :func:`direct_output`), or a binary file object (e.g.
    ``sys.stdout.buffer``).  ``shuffle`` permutes the manifest lines with
    ``random.Random(seed)``.  ``progress(n, None)`` is called every 1000 records.
    """
    from ..tools.manifest import iter_manifest_records, read_manifest_lines, ref_paths
    from ..recordio.wrapper import telling_split, write_sagemaker_recordio

    check_path_arg(manifest_path, "manifest_path", file_ok=False)
    check_path_arg(out, "out")
    if split_bytes is not None and split_bytes < 1:
        raise SourceError(f"split_bytes must be >= 1, not {split_bytes}")
    lines = len(read_manifest_lines(manifest_path))
    order = None
    if shuffle:
        order = list(range(lines))
        random.Random(seed).shuffle(order)
    count = [0]

    def records() -> Iterator[bytes]:
        for payload in iter_manifest_records(manifest_path, list(attribute_names), order=order):
            count[0] += 1
            if progress is not None and count[0] % 1000 == 0:
                progress(count[0], None)
            yield payload

    split_bytes = telling_split(split_bytes)  # (parts join="auto" tells from MXNet's at the first one)
    if isinstance(out, str):
        # (a file a line refers to, renamed over, would be lost: its name is checked as pack_images' are)
        inputs = [(manifest_path, "manifest"), *_named_like(ref_paths(manifest_path, attribute_names), [out],
                                                            "referenced file")]
        with _Outputs({"records": out}, inputs) as tmp:
            target = tmp[out]
            if isinstance(target, str):
                with open(target, "wb") as f:
                    nbytes = write_sagemaker_recordio(records(), f, split_bytes)
            else:
                nbytes = write_sagemaker_recordio(records(), target, split_bytes)
        name = out
    else:
        nbytes = write_sagemaker_recordio(records(), out, split_bytes)
        out.flush()
        name = getattr(out, "name", "<stream>")
        name = name if isinstance(name, str) else "<stream>"
    return PackResult(records=count[0], bytes=nbytes, rec_path=name, lines=lines)


def _read_file(path: str) -> bytes:
    from .manifest import read_regular
    try:
        return read_regular(path)
    except OSError as exc:
        raise SourceError(f"cannot read image {path}: {exc.strerror or exc}") from exc


def direct_output(path: str) -> Optional[str]:
    """What ``path`` is when an output there is written into rather than replaced, else None.

    That is an existing node that is no regular file or folder (a FIFO: ``"a FIFO"``; a device such as
    ``/dev/null``: ``"a character device"``), and a file descriptor of this process however it is named
    (``/dev/stdout``, a link to ``/proc/self/fd/1``, ``/dev/fd/3``: ``"file descriptor 1 of this process"``),
    whatever it is open on -- a rename over such a path would replace the node or the link (as root, the
    system's ``/dev/stdout``) instead of writing where it leads.
    """
    fd = _own_fd(path)
    if fd is not None:
        return f"file descriptor {fd} of this process"
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    from .manifest import special_kind
    return special_kind(mode)


_FD_FOLDER = re.compile(r"/proc/(\d+)(?:/task/\d+)?/fd")


def _own_fd(path: str) -> Optional[int]:
    """The descriptor number when ``path`` leads, through links, to ``/proc/<this process>/fd/N``."""
    for _ in range(40):  # (the kernel's own limit on links followed)
        folder, name = os.path.split(path)
        match = _FD_FOLDER.fullmatch(os.path.realpath(folder or "."))
        if match and int(match.group(1)) == os.getpid() and name.isdigit():
            return int(name)
        try:
            target = os.readlink(path)
        except (OSError, ValueError):
            return None  # not a link
        path = os.path.join(folder or ".", target)
    return None


class _Counted:
    """A file written into directly (a FIFO, a device, a descriptor), counting the bytes written; it has
    no ``tell``, so writers count offsets from 0, where this stream starts."""

    def __init__(self, file: BinaryIO) -> None:
        self.file = file
        self.written = 0

    def write(self, data: Any) -> int:
        n = self.file.write(data)
        self.written += n
        return n

    def flush(self) -> None:
        self.file.flush()

    def isatty(self) -> bool:
        return self.file.isatty()


class _Outputs:
    """Temporary names for output paths, renamed over them on success and removed on failure.

    ``outputs`` maps what each output holds (``"records"``, ``"index"``, ``"list"``) to its path; entering
    gives a dict from each path to what to write: its temporary path, or for a :func:`direct_output` an
    open binary file (the node itself, or a duplicate of the descriptor: ``>>`` and the offset are kept).
    Two of them on one file raise :class:`SourceError` before anything is written: they would share one
    temporary file, and the rename would leave one output holding both (``pack protobuf X.npy o.idx``:
    records and index lines interleaved in ``o.idx``).  So does an output that is one of ``inputs``
    (``(path, role)``: ``pack manifest m m``), a folder, or a terminal.
    """

    def __init__(self, outputs: Dict[str, str], inputs: Iterable[Tuple[str, str]] = ()) -> None:
        seen: Dict[str, str] = {}
        self.direct: Dict[str, str] = {}  # path -> what it is, for the outputs written into
        for what, path in outputs.items():
            key = _same_file(path)
            if key in seen:
                stem, ext = os.path.splitext(path)
                hint = f"; name the output {stem}.rec" if seen[key] == "records" and ext in (".idx", ".lst") else ""
                raise SourceError(f"{path}: the {seen[key]} and the {what} would both be written to this one "
                                  f"file{hint}")
            seen[key] = what
            kind = direct_output(path)
            if kind is not None:
                self.direct[path] = kind
            elif os.path.isdir(path):
                raise SourceError(f"{path}: is a folder; give an output file name")
        self._refuse_inputs(outputs, inputs)
        self.final = [p for p in outputs.values() if p not in self.direct]
        self.tmp: Dict[str, Any] = {
            p: os.path.join(os.path.dirname(p) or ".", f".{os.path.basename(p)}.tmp-{os.getpid()}")
            for p in self.final}
        self.opened: List[Tuple[str, _Counted]] = []

    def _refuse_inputs(self, outputs: Dict[str, str], inputs: Iterable[Tuple[str, str]]) -> None:
        """An output renamed over an input, or written into the very file an input is, would destroy it."""
        for inp, role in inputs:
            real = os.path.normcase(os.path.realpath(inp))
            node = _node(inp)  # (None: not there, its reading says so)
            for what, path in outputs.items():
                if path in self.direct:
                    try:
                        out = os.stat(path)
                    except OSError:
                        continue
                    same = node is not None and stat.S_ISREG(out.st_mode) and (out.st_dev, out.st_ino) == node
                else:  # a rename replaces the name (a link, not what it leads to)
                    same = _same_file(path) == real
                if same:
                    shown = f" ({inp})" if inp != path else ""
                    raise SourceError(f"{path}: the {what} would replace the {role} being read{shown}; give "
                                      f"another output file")

    def __enter__(self) -> Dict[str, Any]:
        for path in self.final:
            folder = os.path.dirname(path) or "."
            if not os.path.isdir(folder):
                raise SourceError(f"cannot write {path}: no folder {folder}")
        try:
            for path in self.direct:
                fd = _own_fd(path)
                try:  # (a FIFO's open waits for its reader)
                    handle = os.dup(fd) if fd is not None else os.open(path, os.O_WRONLY)
                except OSError as err:
                    raise SourceError(f"cannot write {path}: {err.strerror or err}") from err
                file = _Counted(os.fdopen(handle, "wb"))
                self.opened.append((path, file))
                self.tmp[path] = file
                if file.isatty():
                    raise SourceError(f"{path}: refusing to write records to a terminal; redirect it, or give "
                                      f"an output file")
        except BaseException:
            self._close(quiet=True)
            raise
        return self.tmp

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self._close(quiet=False)
            try:
                for path in self.final:
                    os.replace(self.tmp[path], path)
                return
            except OSError as err:
                self._remove()
                raise SourceError(f"cannot write {path}: {err.strerror or err}") from err
        self._close(quiet=True)
        self._remove()

    def _close(self, quiet: bool) -> None:
        """Close the outputs written into; unless ``quiet``, the first error closing one (its last bytes
        flushed: a full device says so here) is raised, after every one is closed."""
        failed = None
        for path, file in self.opened:
            try:
                file.file.close()
            except OSError as err:
                if failed is None:
                    failed = (path, err)
        self.opened = []
        if failed is not None and not quiet:
            self._remove()
            path, err = failed
            if isinstance(err, BrokenPipeError):  # (its reader has gone, | head: as a write would say it)
                raise err
            raise SourceError(f"{path}: {err.strerror or err}") from err

    def _remove(self) -> None:
        for path in self.final:
            try:
                os.unlink(self.tmp[path])
            except OSError:
                pass


def _same_file(path: str) -> str:
    """What two output paths share when they name one file: the real folder, then the name itself (not
    resolved: a rename replaces a link, not what it points to)."""
    folder = os.path.realpath(os.path.dirname(path) or ".")
    return os.path.normcase(os.path.join(folder, os.path.basename(path)))


def pack_protobuf(features_path: str, out: str, labels_path: Optional[str] = None) -> PackResult:
    """Write ``features_path`` (a 2-D ``.npy`` array, or a scipy sparse matrix saved with
    ``scipy.sparse.save_npz``) as SageMaker RecordIO-protobuf, one Record per row, into ``out`` and the
    ``.idx`` next to it (:mod:`parrecio.recordio.protobuf_writer`: the SageMaker SDK's bytes); the
    labels from the 1-D ``.npy`` ``labels_path``.  Both files are written atomically, as the other packs'
    (into a FIFO or a device, :func:`direct_output`: the records only, no ``.idx``)."""
    import numpy as np

    from ..recordio.protobuf_writer import LabelError, write_dense, write_sparse

    def load(path: str) -> Any:
        try:
            got = np.load(path, allow_pickle=False)
            if not isinstance(got, np.ndarray):  # an .npz archive of arrays (it counted as its arrays)
                names = list(got.files)
                got.close()
                raise SourceError(f"{path}: an .npz archive of {len(names)} array(s) {names[:4]}, not a "
                                  f".npy array: save the one array with numpy.save")
            return got
        except (ValueError, OSError, EOFError) as exc:
            try:
                with open(path, "rb") as f:
                    head = f.read(8)
            except OSError:
                head = b""
            if head and not head.startswith(b"\x93NUMPY"):  # (numpy calls any such file "pickled data")
                raise SourceError(f"{path}: not a numpy .npy array file (it starts with {head!r})") from None
            raise SourceError(f"{path}: cannot be read as a numpy .npy array: {exc}") from None

    labels = None if labels_path is None else load(labels_path)
    if features_path.endswith(".npz"):
        try:
            import scipy.sparse
        except ImportError:
            raise SourceError(f"{features_path}: a .npz is read as a scipy sparse matrix, and scipy is not "
                              f"installed: pip install 'parrecio[sparse]'") from None
        try:
            matrix = scipy.sparse.load_npz(features_path)
        except (ValueError, KeyError, OSError) as exc:
            raise SourceError(f"{features_path}: not a scipy sparse matrix saved by scipy.sparse.save_npz "
                              f"({exc})") from None
        write = write_sparse
        features: Any = matrix
    else:
        features = load(features_path)
        write = write_dense
    idx = output_paths(out)[0] if direct_output(out) is None else None  # (no index beside a FIFO, a device)
    inputs = [(features_path, "features"), *([(labels_path, "labels")] if labels_path is not None else [])]
    with _Outputs({"records": out, **({"index": idx} if idx else {})}, inputs) as tmp:
        # a failed run leaves the old out and idx as they were
        try:
            rows = write(tmp[out], features, labels, index=tmp[idx] if idx else None)
        except (ValueError, TypeError) as exc:
            raise SourceError(f"{labels_path if isinstance(exc, LabelError) else features_path}: {exc}") from None
    target = tmp[out]
    nbytes = target.written if isinstance(target, _Counted) else os.path.getsize(out)
    return PackResult(records=rows, bytes=nbytes, rec_path=out, idx_path=idx)
