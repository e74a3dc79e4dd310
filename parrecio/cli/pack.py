"""``parrecio pack``: write RecordIO files.

Examples::

    parrecio pack images photos/ train.rec --shuffle --seed 1     # train.rec + train.idx + train.lst (im2rec)
    parrecio pack list train.lst train.rec --root photos/        # from an im2rec list (multi-label too)
    parrecio pack manifest train.manifest train.rec \\
        --attribute-names source-ref,bounding-box --split-bytes 65536   # SageMaker Pipe-mode stream
    parrecio pack protobuf X.npy train.rec --labels y.npy       # SageMaker RecordIO-protobuf (.npz: sparse)

The work is in :mod:`parrecio.tools.pack`; this module parses arguments and prints a summary.  OUT may be
a FIFO, a device or ``/dev/stdout``: the records are written into it (and no ``.idx``/``.lst`` beside it).
An OUT that is one of the inputs is refused before anything is written; into the file stderr is open on,
nothing is logged.  SIGTERM stops a pack as Ctrl-C
does: its temporary files are removed.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Optional

NAME = "pack"
HELP = "build a .rec (+ .idx, .lst) from images, an im2rec list, an augmented manifest, or arrays (protobuf)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = HELP
    sub = parser.add_subparsers(dest="pack_kind", metavar="KIND", required=True)

    images = sub.add_parser(
        "images", help="a folder of images, one sub-folder per class (like im2rec)",
        description="Pack DIR's images into OUT.rec + OUT.idx + OUT.lst, as MXNet's im2rec does (image bytes "
                    "stored unchanged). Classes are DIR's sub-folders in sorted order; label = class index; "
                    "record = pack(IRHeader(0, label, index, 0), image bytes), index = position in the "
                    "sorted listing (also the .idx key).")
    images.add_argument("dir", metavar="DIR", help="folder of class sub-folders of images")
    images.add_argument("out", metavar="OUT.rec",
                        help="output .rec (the .idx and .lst go next to it; into a FIFO or a device such as "
                             "/dev/stdout only the records are written)")
    images.add_argument("--no-lst", action="store_true", help="do not write the .lst file")
    images.add_argument("--no-verify", action="store_true",
                        help="pack every file as it is (default: leave out, and list, files that do not "
                             "open as images)")
    _add_shuffle(images)

    lst = sub.add_parser(
        "list", help="an im2rec list file: index<TAB>label[<TAB>label...]<TAB>path",
        description="Pack the images of an im2rec list file into OUT.rec + OUT.idx. One label: a scalar "
                    "header label (flag 0); several: a float32 label array (flag = their number).")
    lst.add_argument("list", metavar="FILE.lst", help="im2rec list file")
    lst.add_argument("out", metavar="OUT.rec",
                     help="output .rec (the .idx goes next to it; into a FIFO or a device only the records)")
    lst.add_argument("--root", default=None,
                     help="folder the list's relative paths start from (default: the list file's folder)")
    _add_shuffle(lst)

    man = sub.add_parser(
        "manifest", help="an augmented manifest, as a SageMaker Pipe-mode RecordIO stream",
        description="Write one record per attribute and manifest line (-ref attributes: the referenced "
                    "file's bytes; others: their JSON text), framed as SageMaker Pipe mode's RecordIO "
                    "wrapper does (concat-joined multipart records, which the default join='auto' reads "
                    "back). The same code as 'parrecio pipe-serve'.")
    man.add_argument("manifest", metavar="MANIFEST", help="augmented manifest (JSON lines)")
    man.add_argument("out", metavar="OUT.rec",
                     help="output file (a FIFO or a device: written into), or - for stdout")
    man.add_argument("--attribute-names", required=True,
                     help="attributes, comma separated, one record each in this order (like AttributeNames)")
    man.add_argument("--split-bytes", type=int, default=None, metavar="N",
                     help="split records larger than N bytes into multipart records (cflag 1/2/3) of parts of "
                          "N bytes; N-1 when N is a multiple of 4, so that join=auto tells them from MXNet's")
    _add_shuffle(man)

    pb = sub.add_parser(
        "protobuf", help="numpy / scipy sparse arrays, as SageMaker RecordIO-protobuf",
        description="Write each row of FEATURES (a 2-D .npy array, or a scipy sparse matrix saved with "
                    "scipy.sparse.save_npz) as one aialgs.data.Record, as the SageMaker Python SDK's "
                    "write_numpy_to_dense_tensor / write_spmatrix_to_sparse_tensor do (the same bytes), "
                    "into OUT.rec + OUT.idx; read it with fields=ProtobufRecord().")
    pb.add_argument("features", metavar="FEATURES", help="a 2-D .npy array, or a scipy sparse .npz")
    pb.add_argument("out", metavar="OUT.rec",
                    help="output .rec (the .idx goes next to it; into a FIFO or a device only the records)")
    pb.add_argument("--labels", metavar="LABELS.npy", default=None, help="a 1-D .npy array, one label per row")

    for p in (images, lst, man, pb):
        p.add_argument("--quiet", action="store_true", help="no summary on stderr")


def _add_shuffle(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--shuffle", action="store_true", help="write the items in a random order")
    parser.add_argument("--seed", type=int, default=0, help="shuffle seed (default 0)")


def run(args: argparse.Namespace) -> int:
    from ..tools import pack as tools
    from .cat import sigterm_interrupts

    with sigterm_interrupts():  # a pack stopped by SIGTERM removes its temporary files, as on Ctrl-C
        return _run(args, tools)


def _run(args: argparse.Namespace, tools: Any) -> int:
    import os

    from ..errors import SourceError
    from .cat import os_error

    if args.out == "-" and args.pack_kind != "manifest":  # (it made files named "-", "-.idx", "-.lst")
        raise SourceError(f"OUT '-' (standard output) is for pack manifest; pack {args.pack_kind} writes a "
                          f".rec and its index: give a file name (or /dev/stdout for the records alone)")

    from .progress import bar

    # (stderr that is the output -- OUT /dev/stderr, or "- > out.rec 2>&1" -- would get the log in the records)
    quiet = args.quiet or _is_stderr(args.out, tools)
    log = (lambda line: None) if quiet else (lambda line: print(f"pack: {line}", file=sys.stderr, flush=True))
    pbar = None

    def progress(n: int, total: Optional[int]) -> None:  # every 1000 records: onto the bar
        nonlocal pbar
        if quiet:
            return
        if pbar is None:
            pbar = bar(total, "pack")
        pbar.update(n - pbar.n)

    direct = tools.direct_output(args.out) if args.pack_kind != "manifest" or args.out != "-" else None
    try:
        if args.pack_kind == "images":
            classes, items = tools.list_image_folder(args.dir)
            lst_path = None if args.no_lst or direct is not None else tools.output_paths(args.out)[1]
            res = tools.pack_image_list(items, args.dir, args.out, lst_path=lst_path, shuffle=args.shuffle,
                                        seed=args.seed, progress=progress, verify=not args.no_verify)
            if classes == ["."]:
                log("no class sub-folders: one class, every image has label 0")
            else:
                shown = ", ".join(f"{i}={c}" for i, c in enumerate(classes[:10]))
                log(f"{len(classes)} class{'es' * (len(classes) != 1)} ({shown}{', ...' if len(classes) > 10 else ''})")
            for path, why in res.skipped[:10]:
                log(f"skipped {path}: {why}")
            if len(res.skipped) > 10:
                log(f"skipped {len(res.skipped) - 10} more files that do not open as images")
        elif args.pack_kind == "list":
            items = tools.read_image_list(args.list)
            root = args.root if args.root is not None else (os.path.dirname(args.list) or ".")
            res = tools.pack_image_list(items, root, args.out, shuffle=args.shuffle, seed=args.seed,
                                        progress=progress, verify=False, list_file=args.list)
        elif args.pack_kind == "protobuf":
            res = tools.pack_protobuf(args.features, args.out, args.labels)
        else:
            from ..tools.manifest import parse_attribute_names
            names = parse_attribute_names(args.attribute_names)
            out = sys.stdout.buffer if args.out == "-" else args.out
            if args.out == "-":
                from .cat import refuse_terminal
                refuse_terminal("a RecordIO stream", "redirect it, or give an output file")
            res = tools.pack_manifest(args.manifest, out, names, split_bytes=args.split_bytes,
                                      shuffle=args.shuffle, seed=args.seed, progress=progress)
    except BrokenPipeError:
        from .cat import silence_broken_pipe
        return silence_broken_pipe()
    except OSError as exc:
        raise os_error(exc, args.out) from exc
    finally:
        if pbar is not None:
            pbar.close()
    if direct is not None and args.pack_kind != "manifest":  # (a manifest's stream has no .idx anyway)
        beside = ".idx or .lst" if args.pack_kind == "images" and not args.no_lst else ".idx"
        log(f"{args.out} is {direct}: the records were written into it, and no {beside}")
    written = [p for p in (res.rec_path, res.idx_path, res.lst_path) if p]
    extra = f" from {res.lines} manifest lines" if args.pack_kind == "manifest" else ""
    log(f"{res.records} records{extra}, {res.bytes} bytes: {', '.join(written)}")
    return 0


def _is_stderr(out: str, tools: Any) -> bool:
    """Whether the output ``out`` (``-``: stdout) is the file that stderr is open on: the same node."""
    import os

    def fd_node(fd: int) -> Optional[tuple]:
        try:
            st = os.fstat(fd)
        except OSError:  # (closed)
            return None
        return st.st_dev, st.st_ino

    err = fd_node(2)
    return err is not None and err == (fd_node(1) if out == "-" else tools._node(out))
