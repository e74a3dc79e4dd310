"""``parrecio bench``: the throughput of a ParallelReader configuration on your data, and what limits it.

Example::

    parrecio bench train.rec --fields image,json --workers 1 2 4 --batch-size 64 --size 224

Each ``--workers`` value is one run (a fresh reader, ``--epochs`` passes).  While it runs, a progress line
on stderr (a terminal only, not with ``--json``) shows samples/s and MB/s, redrawn at most 5 times a
second.  At the end: samples/s, MB/s, the per-stage times of ``reader.stats`` and the bottleneck --
``reader.stats.bottleneck`` when the library has it, else a verdict computed here from the stage times.
``samples_per_s`` is measured after the first batch (worker start-up is reported apart as ``startup_s``;
on a short run the pipeline has filled up meanwhile, so it is optimistic), ``overall_samples_per_s``
over the whole run.

On a SageMaker Pipe-mode channel whose FIFO does not exist yet, bench says so on stderr while it waits
("waiting for the Pipe-mode FIFO /opt/ml/input/data/train_0 to appear (3 s)": redrawn every second on a
terminal, a line every 5 s otherwise), up to the channel's ``fifo_timeout``; that wait is not part of the
measured times.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .cat import at_least_one
from .inspect import json_text

NAME = "bench"
HELP = "measure a reader configuration's throughput (samples/s, MB/s) and name the bottleneck"

FIELD_NAMES = ("image", "json", "boxes", "label", "imagerecord", "raw")
PEEK_RECORDS = 64
STAGES = ("read_time", "wait_source_time", "wait_workers_time", "wait_consumer_time", "user_time", "wall_time")
ADVICE = {
    "decode": "the decoder processes are busy: more --workers (while cores are free), a smaller --size, or "
              "cheaper decoding (Image(draft=True))",
    "source": "the reader process waits on the stream: faster storage, or larger reads",
    "consumer": "samples are ready before they are asked for: the consuming process (batch assembly here; "
                "your training step in real use) sets the pace",
    "unknown": "no stage stands out (or the run was too short to tell)",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Run ParallelReader over CHANNEL (a path, directory, glob, - or a SageMaker channel) once per --workers "
        "value and report samples/s, MB/s, per-stage times and the bottleneck (source, decode, consumer). "
        "Field names: " + ", ".join(FIELD_NAMES) + " (image -> Image(size=(S, S)), json -> Json(), boxes -> "
        "BoundingBoxes(), label -> ClassLabel(), imagerecord -> ImageRecord(Image(size=(S, S))), raw -> Raw()); "
        "default: guessed from the first records.")
    parser.add_argument("channel", metavar="CHANNEL", help="what ParallelReader reads")
    parser.add_argument("--fields", default=None, metavar="SPEC",
                        help="comma-separated decoders, one per record of a group, e.g. image,json (default: "
                             "guessed from the first records: jpeg/png -> image, json -> json, else raw)")
    parser.add_argument("--workers", type=int, nargs="+", default=None, metavar="N",
                        help="decoder processes (0: decode in this process); several values run one after the other "
                             "(default: CPU count)")
    parser.add_argument("--batch-size", type=int, default=64, metavar="B", help="batch size (default 64)")
    parser.add_argument("--size", type=int, default=224, metavar="S", help="image side in pixels (default 224)")
    parser.add_argument("--epochs", type=int, default=1, help="passes per run (default 1)")
    parser.add_argument("--samples", type=at_least_one("sample"), default=None, metavar="N",
                        help="stop each pass after about N samples (default: the whole stream)")
    parser.add_argument("--join", choices=("auto", "mxnet", "concat"), default=None,
                        help="multipart convention (default: the source's)")
    parser.add_argument("--skip-errors", action="store_true", help="on_error='skip' instead of failing")
    parser.add_argument("--json", action="store_true", help="print one JSON document (no progress line)")
    parser.add_argument("--quiet", action="store_true", help="no progress line")


# -- fields --------------------------------------------------------------------------------------------

def make_decoder(name: str, size: int):
    """A decoder for one field spec name (see :data:`FIELD_NAMES`)."""
    from ..decoders import BoundingBoxes, ClassLabel, Image, ImageRecord, Json, Raw
    from ..errors import ParrecioError

    side = (size, size)
    table = {"image": lambda: Image(size=side), "json": Json, "boxes": BoundingBoxes, "label": ClassLabel,
             "imagerecord": lambda: ImageRecord(Image(size=side)), "raw": Raw}
    if name not in table:
        raise ParrecioError(f"unknown field {name!r} in --fields (known: {', '.join(FIELD_NAMES)})")
    return table[name]()


def parse_fields(spec: str) -> List[str]:
    from ..errors import ParrecioError
    names = [n.strip().lower() for n in spec.split(",")]
    if not all(names):
        raise ParrecioError(f"bad --fields {spec!r}: expected names separated by commas")
    return names


def fields_from_kinds(kinds: Sequence[str]) -> List[str]:
    """``guess_fields`` kinds -> field names: images -> image, json -> json, image records -> imagerecord,
    anything else -> raw."""
    from ..decoders.sniff import IMAGE_KINDS
    out = []
    for kind in kinds:
        if kind in IMAGE_KINDS or kind == "image":
            out.append("image")
        elif kind == "json":
            out.append("json")
        elif kind.startswith("imagerecord/"):
            out.append("imagerecord")
        else:
            out.append("raw")
    return out


def peek(channel: str, join: Optional[str]) -> Optional[Tuple[List[str], float]]:
    """``(guessed field names, mean payload bytes per record)`` from the first records of a file channel;
    None when the channel cannot be read twice (stdin, a FIFO, a Pipe-mode channel).  Files without a
    record are an error: not RecordIO at all (bytes, but no record), or nothing to bench (all empty)."""
    from ..decoders.sniff import PREFIX, guess_fields
    from ..errors import ParrecioError
    from ..recordio import RecordReader
    from ..sources import resolve
    from ..tools.inspect import head_of, no_record, payload_kind

    if channel == "-":
        return None
    source = resolve(channel)
    prefixes: List[bytes] = []
    kinds: List[str] = []
    sizes: List[int] = []
    try:
        paths = getattr(source, "paths", None)
        if not paths or not all(os.path.isfile(p) for p in paths):
            return None
        for path in paths:  # the first records of the channel, across files (the first may be empty)
            with RecordReader(path, join=join or source.default_join, on_corrupt="skip") as reader:
                found = len(sizes)
                for _, view in reader.iter_views():
                    prefixes.append(bytes(view[:PREFIX + 1]))
                    kinds.append(payload_kind(prefixes[-1]))
                    sizes.append(len(view))
                    if len(sizes) >= PEEK_RECORDS:
                        break
                head = head_of(path) if len(sizes) == found else None
                if head:  # bytes, but no record: not RecordIO at all, or no intact record
                    raise no_record(path, head, os.path.getsize(path), reader.first_error)
            if len(sizes) >= PEEK_RECORDS:
                break
    finally:
        source.release()
    if not sizes:
        what = paths[0] if len(paths) == 1 else f"{channel}: all {len(paths)} files"
        raise ParrecioError(f"{what}: empty, no records to bench")
    try:
        per_pos = list(guess_fields(prefixes))
    except ValueError:
        per_pos = ["other"]
    for pos in range(len(per_pos)):  # imagerecord is not a sniff kind: decide it from our own kinds
        if all(k.startswith("imagerecord/") for k in kinds[pos::len(per_pos)]):
            per_pos[pos] = "imagerecord/"
    return fields_from_kinds(per_pos), sum(sizes) / len(sizes)


# -- verdict -------------------------------------------------------------------------------------------

def own_verdict(stats: Any, wall: float) -> str:
    """A bottleneck word from the stage times, for libraries without ``stats.bottleneck``."""
    if wall <= 0 or not getattr(stats, "samples", 0):
        return "unknown"
    if stats.wait_workers_time < 0.15 * wall:
        return "consumer"
    if stats.read_time + getattr(stats, "wait_source_time", 0.0) >= 0.5 * wall:
        return "source"
    return "decode"


# -- running -------------------------------------------------------------------------------------------

FIFO_WAIT_TTY_EVERY = 1.0
"""Seconds between redraws of the FIFO wait line on a terminal."""
FIFO_WAIT_LINE_EVERY = 5.0
"""Seconds between FIFO wait lines when stderr is not a terminal."""


def pipe_channel(channel: str):
    """The :class:`~parrecio.sources.sagemaker.PipeChannelSource` of ``channel`` when it is a SageMaker
    Pipe-mode channel, else None (resolving opens nothing: a FIFO is never touched here)."""
    from ..sources import resolve
    from ..sources.sagemaker import PipeChannelSource

    if channel == "-":
        return None
    source = resolve(channel)
    if isinstance(source, PipeChannelSource):
        return source
    source.release()
    return None


def wait_for_fifo(source: Any, epoch: int) -> float:
    """Wait for the FIFO of ``epoch`` of the Pipe-mode ``source`` (up to its ``fifo_timeout``; then its
    :class:`~parrecio.errors.SourceError`), saying so on stderr while it is missing; return the seconds
    waited."""
    err = sys.stderr
    tty = err.isatty()
    every = FIFO_WAIT_TTY_EVERY if tty else FIFO_WAIT_LINE_EVERY
    shown = {"next": 0.0, "width": 0}

    def on_wait(path: str, waited: float) -> None:
        if waited < shown["next"]:
            return
        shown["next"] = (int(waited / every) + 1) * every
        text = f"waiting for the Pipe-mode FIFO {path} to appear ({int(waited)} s)"
        if tty:
            err.write("\r" + text.ljust(shown["width"]))
            shown["width"] = len(text)
        else:
            err.write(text + "\n")
        err.flush()

    t0 = time.monotonic()
    try:
        source.wait_for_fifo(epoch, on_wait)
    finally:
        if shown["width"]:
            err.write("\r" + " " * shown["width"] + "\r")
            err.flush()
    return time.monotonic() - t0


def bench_one(channel: str, decoders: list, workers: int, args: argparse.Namespace, show: bool,
              record_bytes: Optional[float], group: int, pipe: Any = None) -> Dict[str, Any]:
    """One run: a fresh reader with ``workers`` decoder processes, ``args.epochs`` passes.  ``pipe``: the
    channel's PipeChannelSource, whose FIFO of each epoch is waited for (out of the clock) before the pass."""
    from ..pipeline.parallel_reader import ParallelReader

    if pipe is not None:
        wait_for_fifo(pipe, 0)
    paused = 0.0  # seconds spent waiting for later epochs' FIFOs, taken out of the measured times
    t_start = time.perf_counter()
    cpu_first = time.process_time()  # this process is the consumer (and the decoder with workers=0)
    t_first = None
    first_samples = 0
    telemetry = None
    t_tel = 0.0
    with ParallelReader(channel, fields=decoders, workers=workers, batch_size=args.batch_size, join=args.join,
                        on_error="skip" if args.skip_errors else "raise") as reader:
        stats = reader.stats
        get_telemetry = getattr(reader, "telemetry", None)
        pbar = _samples_bar(reader, args, workers) if show else None  # show: a terminal, no --json/--quiet
        for epoch in range(args.epochs):
            if pipe is not None and epoch:
                if pbar is not None:
                    pbar.clear()  # the FIFO wait prints its own lines
                paused += wait_for_fifo(pipe, epoch)
            base = stats.samples
            for _ in reader:
                now = time.perf_counter()
                if t_first is None:
                    t_first, first_samples = now, stats.samples
                    cpu_first = time.process_time()
                    t_tel = now
                    telemetry = _telemetry(get_telemetry) or telemetry  # primes cpu_percent
                elif now - t_tel >= 1.0:
                    t_tel = now
                    telemetry = _telemetry(get_telemetry) or telemetry
                if pbar is not None:
                    pbar.update(stats.samples - pbar.n)
                    if now - t_first >= 0.5 and record_bytes:  # a rate over a batch or two means nothing
                        rate = (stats.samples - first_samples) / (now - t_first)
                        pbar.set_postfix_str(f"epoch {epoch + 1}/{args.epochs}, "
                                             f"~{rate * group * record_bytes / 1e6:.1f} MB/s", refresh=False)
                if args.samples is not None and stats.samples - base >= args.samples:
                    break
        t_end = time.perf_counter() - paused
        consumer_cpu = time.process_time() - cpu_first  # from the first sample: the steady state
        if telemetry is None or t_end - t_tel > 0.5:
            telemetry = _telemetry(get_telemetry) or telemetry
        if pbar is not None:
            pbar.close()
        samples, nbytes = stats.samples, stats.bytes
        wall = t_end - t_start
        steady = (t_end - t_first) if t_first is not None else 0.0
        steady_samples = samples - first_samples
        if steady <= 0 or steady_samples <= 0:  # a single batch: fall back to the whole run
            steady, steady_samples = wall, samples
        rate = steady_samples / steady if steady > 0 else 0.0
        mbps = (nbytes * steady_samples / samples) / steady / 1e6 if samples and steady > 0 else 0.0
        stages = {name: round(float(getattr(stats, name)), 4) for name in STAGES if hasattr(stats, name)}
        decode_cpu = sum(getattr(stats, "decode_cpu", {}).values())
        stages["decode_cpu"] = round(decode_cpu, 4)
        busy = getattr(stats, "wall_time", 0.0) or wall
        verdict = getattr(stats, "bottleneck", None)
        origin = "library"
        if not isinstance(verdict, str):
            verdict, origin = own_verdict(stats, busy), "bench"
        if steady < MIN_VERDICT_SECONDS or steady_samples < MIN_VERDICT_SAMPLES:
            verdict, origin = "unknown", "too short"  # start-up and a batch or two: no steady state
        return {
            "workers": workers, "samples": samples, "records": getattr(stats, "records", 0), "bytes": nbytes,
            "epochs": args.epochs, "wall_s": round(wall, 4),
            "startup_s": round((t_first - t_start) if t_first is not None else wall, 4),
            "samples_per_s": round(rate, 2), "mb_per_s": round(mbps, 3),
            "overall_samples_per_s": round(samples / wall, 2) if wall > 0 else 0.0,
            # workers=0: the decoding is this process's own CPU (in cpu_us_per_sample["consumer"])
            "decode_cpu_per_worker_percent": (round(100 * decode_cpu / (workers * busy), 1)
                                              if busy > 0 and workers else None),
            "skipped": getattr(stats, "skipped", 0), "stages": stages,
            "bottleneck": verdict, "bottleneck_from": origin, "telemetry": telemetry,
            "cpu_us_per_sample": _per_sample(samples, getattr(stats, "reader_cpu", 0.0), decode_cpu,
                                             consumer_cpu, steady_samples if t_first is not None else samples),
        }


def _per_sample(samples: int, reader: float, decode: float, consumer: float,
                consumer_samples: int) -> Dict[str, float]:
    """CPU microseconds per sample of the reader process and the decoders (all workers together) over
    the whole run, and of this process (the consumer) from the first sample on (``consumer_samples``):
    starting and stopping the processes is no per-sample cost."""
    if not samples or not consumer_samples:
        return {}
    return {"reader": round(reader / samples * 1e6, 2), "consumer": round(consumer / consumer_samples * 1e6, 2),
            "decode": round(decode / samples * 1e6, 2)}


def inline_advice(runs: List[Dict[str, Any]]) -> Optional[str]:
    """When decoding a sample costs less CPU than moving it between processes, say that ``--workers 0``
    (decoding in the consuming process) is likely fastest; when a workers=0 run was the fastest, say so.
    A workers=0 run that was measured and was slower settles it: no advice then."""
    if not runs:
        return None
    best = max(runs, key=lambda r: r["samples_per_s"])
    if best["workers"] == 0 and len(runs) > 1:
        return ("workers=0 (decoding in this process, no child processes) was the fastest: decoding costs "
                "less than moving the samples between processes")
    if any(r["workers"] == 0 for r in runs):
        return None
    for r in runs:
        cpu = r.get("cpu_us_per_sample") or {}
        if r["workers"] and cpu and cpu["decode"] < cpu["reader"] + cpu["consumer"]:
            return (f"decoding costs {cpu['decode']:.1f} us of CPU per sample, less than moving a sample "
                    f"between processes ({cpu['reader']:.1f} us in the reader process + "
                    f"{cpu['consumer']:.1f} us here): try --workers 0 (decoding in this process)")
    return None


def _telemetry(fn) -> Optional[dict]:
    if not callable(fn):
        return None
    try:
        return fn()
    except Exception:  # telemetry is a bonus (psutil missing, a process gone): never fail the bench
        return None


def run(args: argparse.Namespace) -> int:
    from ..errors import ParrecioError
    from ..pipeline.parallel_reader import _default_workers

    if args.batch_size < 1 or args.size < 1 or args.epochs < 1:
        raise ParrecioError("--batch-size, --size and --epochs must be >= 1")
    workers_list = args.workers or [_default_workers()]
    if any(w < 0 for w in workers_list):
        raise ParrecioError("--workers values must be >= 0 (0: decode in this process)")
    if args.channel == "-" and (len(workers_list) > 1 or args.epochs > 1):
        raise ParrecioError("stdin can be read only once: give one --workers value and --epochs 1")
    pipe = pipe_channel(args.channel)
    if pipe is not None and len(workers_list) > 1:
        raise ParrecioError(f"{args.channel!r} is a SageMaker Pipe-mode channel: each --workers value is a fresh "
                            f"reader that would read other epochs' FIFOs (each served once: {pipe.fifo_path(0)}, "
                            f"then the next), so the figures would not be of the same data; give one --workers "
                            f"value")
    peeked = peek(args.channel, args.join)
    if args.fields:
        names = parse_fields(args.fields)
        guessed = False
    elif peeked is not None:
        names, guessed = peeked[0], True
    else:
        raise ParrecioError(f"cannot look at {args.channel!r} ahead of the run (stdin, a FIFO or a Pipe-mode "
                            f"channel is read once): give --fields, e.g. --fields image,json")
    decoders = [make_decoder(n, args.size) for n in names]
    record_bytes = peeked[1] if peeked is not None else None
    show = not args.json and not args.quiet and sys.stderr.isatty()
    if not args.json:
        print(f"bench: {args.channel}  fields {','.join(names)}{' (guessed)' if guessed else ''}  "
              f"batch {args.batch_size}  size {args.size}  epochs {args.epochs}", file=sys.stderr)
    runs = []
    if any(workers_list):
        warm_up(pipe, decoders)  # start the forkserver now: the first --workers value must not pay for it
    for w in workers_list:
        runs.append(bench_one(args.channel, decoders, w, args, show, record_bytes, len(names), pipe))
    doc = {"channel": args.channel, "fields": names, "fields_guessed": guessed, "batch_size": args.batch_size,
           "size": args.size, "epochs": args.epochs, "runs": runs, "advice": inline_advice(runs)}
    if args.json:
        sys.stdout.write(json_text(doc))
    else:
        sys.stdout.write(format_runs(runs))
    return 0


def _samples_bar(reader: Any, args: argparse.Namespace, workers: int) -> Any:
    """The run's progress bar: samples, with the total where the reader knows its length (.idx)."""
    from .progress import bar
    try:
        n = len(reader)
        total = (n if reader.batch_size is None else n * reader.batch_size) * args.epochs  # at most
    except TypeError:
        total = None
    if args.samples is not None:
        total = min(total, args.samples * args.epochs) if total else args.samples * args.epochs
    return bar(total, f"workers {workers}", "samples")


MIN_VERDICT_SECONDS = 0.5   # a steady state shorter than this says nothing about which stage limits
MIN_VERDICT_SAMPLES = 100


def warm_up(pipe: Any, decoders: Sequence[Any] = ()) -> None:
    """Start the decoder processes' forkserver (preloading the modules of ``decoders``) before any timing."""
    import multiprocessing
    if pipe is not None or "forkserver" not in multiprocessing.get_all_start_methods():
        return
    from ..pipeline.children import start_forkserver
    start_forkserver(decoders)


def scaling_line(run: Dict[str, Any]) -> Optional[str]:
    """What the stage costs of a run allow on larger hosts (bench/stages.py's model): one reader process
    and one consumer, whatever the number of decoders."""
    cpu = run.get("cpu_us_per_sample") or {}
    if not run["workers"] or not cpu or not cpu.get("decode"):
        return None
    serial = max(cpu["reader"], cpu["consumer"], 1e-3)
    per_worker = 1e6 / cpu["decode"]
    cap = 1e6 / serial
    stage = "reader process" if cpu["reader"] >= cpu["consumer"] else "consumer"
    return (f"scaling: per sample {cpu['reader']:.1f} us in the reader process, {cpu['consumer']:.1f} us here, "
            f"{cpu['decode']:.0f} us of decoding: about {per_worker:.0f} samples/s per decoder process, and "
            f"the serial stages allow {cap:.0f} samples/s (the {stage}), reached with about "
            f"{max(1, round(cap / per_worker))} decoder processes")


def format_runs(runs: List[Dict[str, Any]]) -> str:
    """The text table of :func:`run`."""
    head = (f"{'workers':>7} {'samples':>8} {'samples/s':>10} {'MB/s':>8} {'startup':>8} {'read':>7} "
            f"{'wait src':>8} {'wait dec':>8} {'wait you':>8} {'dec cpu':>8}  bottleneck")
    lines = [head]
    for r in runs:
        s = r["stages"]
        lines.append(f"{r['workers']:>7} {r['samples']:>8} {r['samples_per_s']:>10.1f} {r['mb_per_s']:>8.1f} "
                     f"{r['startup_s']:>7.2f}s {s.get('read_time', 0):>6.2f}s {s.get('wait_source_time', 0):>7.2f}s "
                     f"{s.get('wait_workers_time', 0):>7.2f}s {s.get('wait_consumer_time', 0):>7.2f}s "
                     f"{s.get('decode_cpu', 0):>7.2f}s  {r['bottleneck']}")
    if runs:
        best = max(runs, key=lambda r: r["samples_per_s"])
        lines.append(f"best: {best['samples_per_s']:.1f} samples/s with {best['workers']} workers; bottleneck "
                     f"there: {best['bottleneck']} -- {ADVICE.get(best['bottleneck'], '')}")
        advice = inline_advice(runs)
        if advice:
            lines.append(advice)
        scaling = scaling_line(best)
        if scaling:
            lines.append(scaling)
    lines.append("(read: reader process reading; wait src: waiting on the stream; wait dec: the loop waiting "
                 "for decoded batches; wait you: the reader waiting for ring space; dec cpu: decoding, all workers)")
    return "\n".join(lines) + "\n"
