"""What each stage of the pipeline costs per sample, and the throughput that allows on bigger hosts.

    python -m bench.stages [--data bench/data] [--n 2000] [--workers 2] [--quick] [--json OUT]
                           [--cases images,boxes16,tiny,pipe] [--cores 1,2,4,...] [--repeat K]

Throughput with W decoder processes is at most ``min(W x worker rate, 1 / reader cost, 1 / consumer cost)``
where a cost is the CPU seconds per sample of that one process (the reader process and the consumer are
serial: one each, whatever W is).  This script measures the three costs by CPU time (never wall time: the
machine is shared), in steady state (the first pass starts the processes and is left out), and prints one
JSON document:

- ``images``: ``ParallelReader(aug.rec, fields=[Image(size=(224, 224)), BoundingBoxes()], workers=W,
  batch_size=64)`` (``aug.rec`` from ``bench/data`` when built, else the built-in demo stream written to a
  temp dir): per-sample CPU of the reader process (``stats.reader_cpu``), of the consumer (this process,
  ``time.process_time``) and of all decoder processes together (psutil), the single-core decode rate of a
  plain loop with the same decoders, and the projected curve ``cores -> samples/s`` to 192 cores with the
  stage that caps each point.  The same with ``workers=0`` (decoding in this process) for comparison.
- ``boxes16``: the same stream with ``fields=[Image(size=(224, 224)), BoundingBoxes(max_boxes=16)]``
  (every value fixed-shape, written into the output slots): the consumer's CPU per sample, against the
  target of 3 us (one consumer keeping up with 300k samples/s); the same with tasks of 256 groups
  (``Tuning(chunk_groups=256)``: four batches per task); and ``at_capacity``, the same output shapes from
  stand-in decoders (:class:`SameShapes`), so that the consumer has to keep up; and ``idle_cores``,
  stand-ins that sleep as long as the real decoders computed (:class:`SleepLike`): the same waits with
  the cores idle.  Each with the consumer's wake-ups per epoch and its CPU per wake-up.  ``--repeat K``:
  epochs of K copies of the stream (the per-pass costs, such as starting the next pass's reader, spread
  further).
- ``tiny``: 200k records of ~90 B JSON: a one-process ``RecordReader`` + ``orjson.loads`` loop against
  ``ParallelReader(fields=Json(), workers=2)`` and ``workers=0``, records/s and ratios.
- ``pipe``: a SageMaker Pipe-mode channel (no RecordIO wrapper) whose FIFOs are fed by ``cat``: raw
  passthrough (``fields=None``) GB/s in steady-state epochs, as ``bytes`` (``for rec in reader``) and as
  views (``reader.iter_views()``), against a plain loop on the same kind of FIFO (``F_SETPIPE_SZ`` to the
  maximum, ``readv`` 1 MiB into one buffer), interleaved round by round: the ratio of each round, and
  the CPU seconds per GB of the reader process, of the consumer and of the plain loop -- also filling a
  64 MiB buffer part by part, the floor of a reader that fills a ring; and ``inline``, ``bytes`` with
  ``workers=0`` (the consumer reads the FIFO itself: two busy processes, as the plain loop).

Run it on a quiet machine (``uptime`` load < 1); every figure is the best of the timed passes.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_DATA = os.path.join(HERE, "data")
CORES = [1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192]


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover
        return os.cpu_count() or 1


# -- data --------------------------------------------------------------------------------------------------
def image_stream(data: str, tmp: str, n: int) -> Dict[str, Any]:
    """``[JPEG][boxes JSON]`` per sample: bench/data/aug.rec if built (real photographs), else the demo's."""
    path = os.path.join(data, "aug.rec")
    if os.path.exists(path):
        return {"path": path, "origin": f"{os.path.relpath(path)} (real photographs)"}
    from parrecio.tools.demo import build_demo_stream
    path = os.path.join(tmp, "aug.rec")
    build_demo_stream(path, n=n, seed=0)
    return {"path": path, "origin": f"parrecio.tools.demo stream, {n} photo-like samples"}


def tiny_stream(tmp: str, n: int) -> str:
    import orjson
    from parrecio import RecordWriter
    path = os.path.join(tmp, "tiny.rec")
    with RecordWriter(path) as w:
        for i in range(n):
            w.write(orjson.dumps({"id": i, "label": i % 1000, "score": 0.5, "split": "train",
                                  "key": f"img/{i:08d}.jpg", "tag": "abcdefghij"[: i % 10]}))
    return path


def _warm(path: str) -> None:
    with open(path, "rb") as f:
        while f.read(8 << 20):
            pass


# -- the pipeline, stage by stage --------------------------------------------------------------------------
def _proc_cpu(pids: List[int]) -> float:
    import psutil
    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def stage_costs(path: str, fields: Any, workers: int, batch_size: Optional[int], passes: int,
                **options: Any) -> Dict[str, Any]:
    """Per-sample CPU microseconds of reader, consumer and decoders over steady-state passes."""
    from parrecio import ParallelReader
    best: Dict[str, Any] = {}
    try:
        reader = ParallelReader(path, fields=fields, workers=workers, batch_size=batch_size, **options)
    except (TypeError, ValueError) as exc:  # an older parrecio without this setting
        return {"error": f"{type(exc).__name__}: {exc}"}
    with reader:
        st = reader.stats
        for p in range(passes + 1):
            pids = reader.worker_pids
            c0, r0, w0, s0 = time.process_time(), st.reader_cpu, _proc_cpu(pids), st.samples
            v0 = resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw
            t0 = time.perf_counter()
            for _ in reader:
                pass
            wall = time.perf_counter() - t0
            n = st.samples - s0
            if p == 0 or n == 0:
                continue  # the first pass starts the processes: not the steady state
            consumer = time.process_time() - c0
            # the consumer's wake-ups: each time it slept (a voluntary context switch) and woke again
            wakes = resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw - v0
            fig = {"samples": n, "wall_s": round(wall, 3), "rate": round(n / wall, 1),
                   "reader_us": round((st.reader_cpu - r0) / n * 1e6, 2),
                   "consumer_us": round(consumer / n * 1e6, 2),
                   "workers_us": round((_proc_cpu(pids) - w0) / n * 1e6, 2),
                   "consumer_wakes": wakes,
                   "consumer_us_per_wake": round(consumer / wakes * 1e6) if wakes else None}
            if not best or fig["rate"] > best["rate"]:
                best = fig
    return best


def single_loop(path: str, decoders: List[Any], limit: Optional[int] = None) -> Dict[str, Any]:
    """The same decoders called in a plain one-process loop: samples/s and CPU us per sample."""
    from parrecio import RecordReader
    nf = len(decoders)
    n = 0
    c0, t0 = time.process_time(), time.perf_counter()
    with RecordReader(path) as rr:
        group = []
        for rec in rr:
            group.append(rec.payload)
            if len(group) == nf:
                for d, b in zip(decoders, group):
                    d(b)
                group = []
                n += 1
                if limit is not None and n >= limit:
                    break
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"samples": n, "rate": round(n / wall, 1), "cpu_us": round(cpu / n * 1e6, 2)}


def projection(reader_us: float, consumer_us: float, worker_us: float, cores: List[int]) -> List[str]:
    """Projected samples/s on hosts of ``cores`` CPUs: W = cores - 2 decoders (at least 1), capped by
    the serial stages."""
    out = []
    for c in cores:
        w = max(1, c - 2)
        caps = {"decode": w * 1e6 / worker_us, "reader": 1e6 / reader_us, "consumer": 1e6 / consumer_us}
        stage = min(caps, key=caps.get)
        out.append(f"{c} cores: {round(caps[stage])} samples/s ({w} workers, capped by {stage})")
    return out


def case_images(data: str, tmp: str, n: int, workers: int, passes: int, cores: List[int]) -> Dict[str, Any]:
    from parrecio.decoders import BoundingBoxes, Image
    src = image_stream(data, tmp, n)
    path = src["path"]
    _warm(path)
    fields = [Image(size=(224, 224)), BoundingBoxes()]
    single = max((single_loop(path, fields, limit=400) for _ in range(2)), key=lambda r: r["rate"])
    par = stage_costs(path, fields, workers, 64, passes)
    inline = stage_costs(path, fields, 0, 64, 1)
    worker_us = par["workers_us"]
    return {
        "data": src["origin"], "fields": "[Image(size=(224, 224)), BoundingBoxes()]", "batch_size": 64,
        "single_core": single, f"workers_{workers}": par, "workers_0": inline,
        "efficiency": round(par["rate"] / (min(workers, _cores()) * single["rate"]), 3),
        "serial_ceiling": round(1e6 / max(par["reader_us"], par["consumer_us"])),
        "projection": projection(par["reader_us"], par["consumer_us"], worker_us, cores),
    }


class SameShapes:
    """A stand-in decoder with the output spec of ``like`` that writes one element per value: the
    pipeline around it does all its work (slots, tasks, batches of the same shapes), the decode none."""

    def __init__(self, like: Any) -> None:
        self.output_spec = like.output_spec

    def __call__(self, payload: Any) -> Any:
        import numpy as np
        return np.zeros(self.output_spec.shape, self.output_spec.dtype)

    def decode_into(self, payload: Any, out: Any) -> None:
        out.flat[0] = len(payload) & 127


class SleepLike(SameShapes):
    """A stand-in that takes as long as a real decoder but sleeps instead of computing: the consumer waits
    for results as long as with the real decoders, while the cores stay idle (their caches are the
    consumer's alone)."""

    def __init__(self, like: Any, seconds: float) -> None:
        super().__init__(like)
        self.seconds = seconds

    def decode_into(self, payload: Any, out: Any) -> None:
        time.sleep(self.seconds)
        super().decode_into(payload, out)


def _repeated(path: str, tmp: str, k: int) -> str:
    """An epoch of ``k`` copies of the file ``path``: a directory of ``k`` links to it (copies where links
    cannot be made), read in order as one stream."""
    if k <= 1:
        return path
    out = os.path.join(tmp, f"x{k}")
    os.makedirs(out, exist_ok=True)
    for i in range(k):
        link = os.path.join(out, f"part{i:03d}.rec")
        try:
            os.symlink(os.path.abspath(path), link)
        except OSError:
            shutil.copyfile(path, link)
    return out


def case_boxes16(data: str, tmp: str, n: int, workers: int, passes: int, repeat: int = 1) -> Dict[str, Any]:
    """The consumer's cost when every value is fixed-shape: ``[Image(224), BoundingBoxes(max_boxes=16)]``,
    batches of 64 (the boxes padded into the slot too, nothing travels back but the task's frame), over
    epochs of ``repeat`` copies of the stream.

    With the real decoders (the consumer mostly sleeps between results, and each wake-up finds its
    caches cold: the per-sample figure is inflated by the waiting); ``at_capacity``, the same shapes from
    :class:`SameShapes` stand-ins, so that the consumer and the reader process are the limit: what one
    consumer costs when it has to keep up; and ``idle_cores``, decoders that sleep as long as the real
    ones computed: whether the cold wake-ups come from the decoders sharing the cores (then this one is
    cheaper) or from sleeping at all."""
    from parrecio import Tuning
    from parrecio.decoders import BoundingBoxes, Image
    src = image_stream(data, tmp, n)
    _warm(src["path"])
    path = _repeated(src["path"], tmp, repeat)
    fields = [Image(size=(224, 224)), BoundingBoxes(max_boxes=16)]
    par = stage_costs(path, fields, workers, 64, passes)
    # tasks of four batches instead of two: the consumer's cost is per task, so it halves; the output
    # slots in flight double
    big = stage_costs(path, fields, workers, 64, passes, tuning=Tuning(chunk_groups=256))
    cap = stage_costs(path, [SameShapes(f) for f in fields], workers, 64, max(passes, 10))  # (short passes)
    # the same waits with the cores idle: decoders that sleep as long as the real ones computed
    idle = stage_costs(path, [SleepLike(fields[0], par.get("workers_us", 0) / 1e6), SameShapes(fields[1])],
                       workers, 64, passes)
    return {"data": src["origin"], "epoch": f"{repeat} x the stream",
            "fields": "[Image(size=(224, 224)), BoundingBoxes(max_boxes=16)]",
            "batch_size": 64, f"workers_{workers}": par,
            f"workers_{workers}_chunk_groups_256": big, f"workers_{workers}_at_capacity": cap,
            f"workers_{workers}_idle_cores": idle, "consumer_target_us": 3.0}


def case_tiny(tmp: str, n: int, workers: int, passes: int) -> Dict[str, Any]:
    import orjson
    from parrecio import RecordReader
    from parrecio.decoders import Json
    path = tiny_stream(tmp, n)
    _warm(path)
    loops = []
    for _ in range(max(2, passes)):
        t0 = time.perf_counter()
        k = 0
        with RecordReader(path) as rr:
            for _, view in rr.iter_views():
                orjson.loads(view)
                k += 1
        loops.append(k / (time.perf_counter() - t0))
    loop = max(loops)
    par = stage_costs(path, Json(), workers, None, passes)
    inline = stage_costs(path, Json(), 0, None, passes)
    return {"records": n, "record_bytes": round(os.path.getsize(path) / n - 8, 1),
            "one_process_loop_rate": round(loop, 1),
            f"workers_{workers}": par, "workers_0": inline,
            f"ratio_workers_{workers}": round(par["rate"] / loop, 3),
            "ratio_workers_0": round(inline["rate"] / loop, 3) if "rate" in inline else None}


# -- Pipe mode ----------------------------------------------------------------------------------------------
def _feed(fifo: str, path: str) -> subprocess.Popen:
    os.mkfifo(fifo)
    return subprocess.Popen(f"cat {path} > {fifo}; rm -f {fifo}", shell=True)


def _plain_fifo_loop(fifo: str, sweep: int = 0) -> float:
    """GB/s of a plain loop that reads ``fifo`` to its end with ``readv`` of up to 1 MiB: into one
    reused buffer, or (``sweep`` bytes) into successive parts of a buffer of that size, as a reader
    filling a ring does (the copy then lands in memory no cache holds)."""
    import fcntl
    fd = os.open(fifo, os.O_RDONLY)
    try:
        try:
            with open("/proc/sys/fs/pipe-max-size") as f:
                fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, int(f.read()))
        except OSError:
            pass
        buf = memoryview(bytearray(max(sweep, 1 << 20)))
        pos = total = 0
        t0 = time.perf_counter()
        while True:
            if pos + (1 << 20) > len(buf):
                pos = 0
            k = os.readv(fd, [buf[pos:pos + (1 << 20)]])
            if not k:
                break
            total += k
            if sweep:
                pos += -(-k // 4096) * 4096
        return total / (time.perf_counter() - t0)
    finally:
        os.close(fd)


def case_pipe(tmp: str, size: int, count: int, passes: int) -> Dict[str, Any]:
    """Raw passthrough of a Pipe-mode channel fed by ``cat``: ``for rec in reader`` (bytes, copied by the
    consumer) and ``reader.iter_views()`` (views of the ring, no copy), and ``for rec in reader`` with
    ``workers=0`` (``inline``), each round against a plain FIFO loop in the same round; and the CPU
    seconds per GB of each process."""
    import numpy as np
    from parrecio import ParallelReader, RecordWriter
    from parrecio.tools.emulate import write_channel_config
    path = os.path.join(tmp, "pipe.rec")
    rng = np.random.default_rng(1)
    blobs = [rng.integers(0, 256, size, dtype=np.uint8).tobytes() for _ in range(8)]
    with RecordWriter(path) as w:
        for i in range(count):
            w.write(blobs[i % 8])
    nbytes = os.path.getsize(path)
    _warm(path)
    # Two channels: one for the pipeline with a reader process, one for workers=0 (each reader counts
    # its own epochs, FIFO train_<epoch>).
    datas = {}
    for workers in (1, 0):
        root = os.path.join(tmp, f"sm{workers}")
        write_channel_config(root, "train", settings={"TrainingInputMode": "Pipe", "RecordWrapperType": "None"})
        datas[workers] = os.path.join(root, "data")
        os.makedirs(datas[workers], exist_ok=True)
    modes = ("bytes", "views", "inline")  # inline: `for rec in reader` with workers=0
    figs: Dict[str, List[float]] = {k: [] for k in ["plain", "plain_cpu", "sweep", "sweep_cpu"] + [
        m + suffix for m in modes for suffix in ("", "_ratio", "_reader_cpu", "_consumer_cpu")]}
    epochs = {1: 0, 0: 0}

    def timed(reader: Any, mode: str, workers: int) -> None:
        st = reader.stats
        feeder = _feed(os.path.join(datas[workers], f"train_{epochs[workers]}"), path)
        epochs[workers] += 1
        got, first = 0, None
        r0, c0 = st.reader_cpu, time.process_time()
        items = reader.iter_views() if mode == "views" else iter(reader)
        for rec in items:  # timed from the first record, as the plain loop is timed from open()
            if first is None:
                first = time.perf_counter()
            else:
                got += len(rec)
        end = time.perf_counter()
        feeder.wait()
        if record and first is not None and end > first:
            figs[mode].append(got / (end - first))
            figs[mode + "_ratio"].append(figs[mode][-1] / figs["plain"][-1])
            figs[mode + "_reader_cpu"].append((st.reader_cpu - r0) / nbytes * 1e9)
            figs[mode + "_consumer_cpu"].append((time.process_time() - c0) / nbytes * 1e9)

    root1, root0 = (os.path.dirname(datas[w]) for w in (1, 0))
    with ParallelReader("train", fields=None, workers=1, sm_input_dir=root1) as reader, \
            ParallelReader("train", fields=None, workers=0, sm_input_dir=root0) as inline:
        # Interleaved, round by round: the FIFO's rate swings with the machine's moment (1.5-4.4 GB/s here),
        # and only a ratio within a round compares the two at the same moment.
        for e in range(passes + 1):
            record = e > 0  # (round 0 starts the reader's processes)
            for loop, sweep in (("plain", 0), ("sweep", 64 << 20)):
                fifo = os.path.join(datas[1], f"{loop}_{e}")
                feeder = _feed(fifo, path)
                c0 = time.process_time()
                rate = _plain_fifo_loop(fifo, sweep)
                cpu = time.process_time() - c0
                feeder.wait()
                if record:
                    figs[loop].append(rate)
                    figs[loop + "_cpu"].append(cpu / nbytes * 1e9)
            timed(reader, "bytes", 1)
            timed(reader, "views", 1)
            timed(inline, "inline", 0)

    def gb(xs: List[float]) -> List[float]:
        return [round(x / 1e9, 3) for x in xs]

    def r3(xs: List[float]) -> List[float]:
        return [round(x, 3) for x in xs]

    out: Dict[str, Any] = {"record_bytes": size, "records": count, "stream_mb": round(nbytes / 2**20, 1),
                           "plain_fifo_loop_gb_s": gb(figs["plain"]),
                           "plain_loop_cpu_s_per_gb": r3(figs["plain_cpu"]),
                           # the reader's floor: the same loop filling a 64 MiB buffer part by part
                           "sweeping_loop_cpu_s_per_gb": r3(figs["sweep_cpu"])}
    for mode in modes:
        ratios = figs[mode + "_ratio"]
        out[mode] = {"gb_s": gb(figs[mode]), "ratio_by_round": r3(ratios),
                     "ratio_median": round(statistics.median(ratios), 3), "ratio_min": round(min(ratios), 3),
                     # the serial stages by their CPU time, which swings less than wall rates
                     "reader_process_cpu_s_per_gb": r3(figs[mode + "_reader_cpu"]),
                     "consumer_cpu_s_per_gb": r3(figs[mode + "_consumer_cpu"])}
    return out


def main(argv: Optional[List[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=DEFAULT_DATA)
    ap.add_argument("--n", type=int, default=2000, help="demo samples when bench/data/aug.rec is absent")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--passes", type=int, default=2, help="timed passes after the warm-up pass")
    ap.add_argument("--cases", default="images,boxes16,tiny,pipe")
    ap.add_argument("--repeat", type=int, default=1,
                    help="boxes16: epochs of this many copies of the stream (3: 6000 samples of aug.rec)")
    ap.add_argument("--cores", default=",".join(map(str, CORES)))
    ap.add_argument("--quick", action="store_true", help="fewer samples: a smoke run")
    ap.add_argument("--json", help="also write the JSON here")
    args = ap.parse_args(argv)
    cases = args.cases.split(",")
    cores = [int(c) for c in args.cores.split(",")]
    tmp = tempfile.mkdtemp(prefix="parrecio-stages-")
    out: Dict[str, Any] = {"cores_here": _cores(), "load": [round(x, 2) for x in os.getloadavg()],
                           "python": sys.version.split()[0]}
    try:
        if "images" in cases:
            out["images"] = case_images(args.data, tmp, 300 if args.quick else args.n, args.workers,
                                        1 if args.quick else args.passes, cores)
        if "boxes16" in cases:
            out["boxes16"] = case_boxes16(args.data, tmp, 300 if args.quick else args.n, args.workers,
                                          1 if args.quick else args.passes, args.repeat)
        if "tiny" in cases:
            out["tiny"] = case_tiny(tmp, 20_000 if args.quick else 200_000, args.workers,
                                    1 if args.quick else args.passes)
        if "pipe" in cases:
            out["pipe"] = case_pipe(tmp, 100_000, 300 if args.quick else 3000, 1 if args.quick else args.passes)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    text = json.dumps(out, indent=1)
    print(text)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
