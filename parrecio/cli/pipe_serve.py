"""``parrecio pipe-serve``: serve ``.rec`` files or an augmented manifest as a local SageMaker Pipe channel.

Example::

    parrecio pipe-serve --root /tmp/sm --channel train --epochs 3 \\
        --attribute-names source-ref,bounding-box --shuffle --seed 7 train.manifest &
    SM_INPUT_DIR=/tmp/sm python train.py      # ParallelReader("train", ...) reads /tmp/sm/data/train_<e>

The serving itself is :func:`parrecio.tools.emulate.serve_pipe_channel`; this module is the glue.
SIGTERM is handled like Ctrl-C, so the FIFO being served is removed either way.
"""

from __future__ import annotations

import argparse
import signal
import sys

NAME = "pipe-serve"
HELP = "serve .rec files or an augmented manifest as a local SageMaker Pipe-mode channel (FIFO per epoch)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sources", nargs="+", metavar="SOURCE",
                        help=".rec files, directories or globs, or augmented manifests (*.manifest, *.jsonl)")
    parser.add_argument("--root", required=True,
                        help="emulated input directory (use as SM_INPUT_DIR): writes ROOT/config/*.json and "
                             "serves ROOT/data/CHANNEL_<epoch>")
    parser.add_argument("--channel", default="train", help="channel name (default: train)")
    parser.add_argument("--epochs", type=int, default=1, help="epochs to serve, one FIFO each (default: 1)")
    parser.add_argument("--attribute-names", default=None,
                        help="manifest attributes, comma separated, one record each in this order "
                             "(like AttributeNames; names ending in -ref carry the referenced file's bytes)")
    parser.add_argument("--shuffle", action="store_true",
                        help="shuffle manifest lines / .rec records every epoch (epoch e uses seed + e)")
    parser.add_argument("--seed", type=int, default=0, help="shuffle seed (default: 0)")
    parser.add_argument("--split-bytes", type=int, default=None,
                        help="split records into concat parts (cflag 1/2/3) of this many bytes; one less when it is a "
                             "multiple of 4, so that join=auto tells them from MXNet's")
    parser.add_argument("--join", choices=("auto", "mxnet", "concat"), default="auto",
                        help="how the .rec sources' multipart records are read (default: auto, decided per file)")
    parser.add_argument("--quiet", action="store_true",
                        help="no progress lines or bar on stderr (the bar is drawn only on a terminal)")


def run(args: argparse.Namespace) -> int:
    from ..tools.emulate import serve_pipe_channel
    from ..tools.manifest import parse_attribute_names

    names = parse_attribute_names(args.attribute_names) if args.attribute_names else None
    from .progress import bar

    log = None if args.quiet else (lambda line: print(f"pipe-serve: {line}", file=sys.stderr, flush=True))
    progress = None if args.quiet else (lambda epoch, total: bar(total, f"pipe-serve: epoch {epoch}"))
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        serve_pipe_channel(args.root, args.channel, args.sources, epochs=args.epochs, attribute_names=names,
                           shuffle=args.shuffle, seed=args.seed, split_bytes=args.split_bytes, log=log,
                           progress=progress, join=args.join)
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0


def _interrupt(signum, frame):
    raise KeyboardInterrupt
