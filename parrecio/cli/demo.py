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
    parser.add_argument("--out", default=None, help="write the stream here instead of a temporary folder")


def run(args: argparse.Namespace) -> int:
    from ..demo import build_demo_stream, run_demo
    from ..pipeline.parallel_reader import _default_workers

    workers = args.workers or _default_workers()
    with tempfile.TemporaryDirectory(prefix="parrecio-demo-") as tmp:
        path = args.out or os.path.join(tmp, "demo.rec")
        info = build_demo_stream(path, n=args.samples)
        print(f"demo stream: {info['samples']} samples ([JPEG][Ground Truth boxes JSON]), "
              f"{info['file_mb']:.1f} MB, mean JPEG {info['mean_jpeg_kb']:.0f} KB: {path}")
        run_demo(path, workers=workers, batch_size=args.batch_size, size=args.size)
    return 0
