"""``parrecio demo``: build the built-in demo data set and run the pipeline on it."""

from __future__ import annotations

import argparse
import os
import tempfile

NAME = "demo"
HELP = "build a small demo data set ([JPEG][boxes JSON] samples) and decode it in parallel"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--samples", type=int, default=512, help="samples in the demo stream (default 512)")
    parser.add_argument("--workers", type=int, default=None, help="decoder processes (default: CPU count)")
    parser.add_argument("--batch-size", type=int, default=32, help="samples per batch (default 32)")
    parser.add_argument("--size", type=int, default=224, help="output image side in pixels (default 224)")
    parser.add_argument("--out", default=None, metavar="FILE.rec",
                        help="write the stream to this file and keep it (default: a temporary file, "
                             "removed at the end)")


def run(args: argparse.Namespace) -> int:
    from .cat import sigterm_interrupts

    with sigterm_interrupts():  # a demo stopped by SIGTERM removes its temporary stream, as on Ctrl-C
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from ..tools.demo import build_demo_stream, run_demo
    from ..pipeline.parallel_reader import _default_workers

    for name, value, least in (("--samples", args.samples, 1), ("--batch-size", args.batch_size, 1),
                               ("--size", args.size, 1), ("--workers", args.workers, 0)):
        if value is not None and value < least:
            raise SystemExit(f"parrecio demo: {name} must be >= {least}, not {value}")
    workers = args.workers if args.workers is not None else _default_workers()  # (0: decode in this process)
    with tempfile.TemporaryDirectory(prefix="parrecio-demo-") as tmp:
        path = args.out or os.path.join(tmp, "demo.rec")
        if os.path.isdir(path):
            raise SystemExit(f"parrecio demo: --out {path!r} is a folder; give a file name, e.g. "
                             f"{os.path.join(path, 'demo.rec')}")
        from ..recordio.paths import index_path
        if os.path.abspath(index_path(path)) == os.path.abspath(path):  # (records and index in one file)
            raise SystemExit(f"parrecio demo: --out {path!r}: the records and their index would both be "
                             f"written to this one file; name it {os.path.splitext(path)[0]}.rec")
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise SystemExit(f"parrecio demo: --out {path!r}: the folder {folder!r} does not exist")
        info = build_demo_stream(path, n=args.samples)
        kept = "kept" if args.out else "temporary, removed at the end; --out FILE.rec keeps it"
        print(f"demo stream: {info['samples']} samples ([JPEG][Ground Truth boxes JSON]), "
              f"{info['file_mb']:.1f} MB, mean JPEG {info['mean_jpeg_kb']:.0f} KB: {path} and its index "
              f"{info['index']} ({kept})")
        run_demo(path, workers=workers, batch_size=args.batch_size, size=args.size)
        if args.out:
            print(f"read it yourself: ParallelReader({path!r}, fields=[Image(size=({args.size}, {args.size})), "
                  f"BoundingBoxes(max_boxes=8)], batch_size={args.batch_size})")
    return 0
