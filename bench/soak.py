"""Soak run of ParallelReader: many epochs, early breaks, batches held across epochs; prints one JSON document.

Usage (from the repository root)::

    .venv/bin/python bench/soak.py [--epochs 20] [--records 5000] [--workers 4] [--seed 0]

It writes ``--records`` records of 1-20 KB (seeded) to a temporary file and reads it ``--epochs`` times with
``fields=[Fixed((16, 16, 3))]`` (a sha256-derived fixed-shape array written into the output slots, from
``tests/pipeline_helpers.py``), ``batch_size=32``.  In some epochs (seeded) the consumer ``break``s early; in
some it keeps a few batches (views of the shared output slots) alive into the following epochs, then drops
them.  After each epoch it records:

- ``rss_mb``: the consumer's resident set size;
- ``shm_mb`` / ``shm_segments``: bytes and count of this reader's ``/dev/shm/parrecio-<pid>-<token>-*``
  (ring, output slots, one-offs; other processes' segments on a shared machine are not counted);
- ``slot_segments``: the output-slot segments (``...-s<k>``);
- ``children``: live child processes of the consumer (forkserver and resource tracker excluded);
- ``held``: batches the consumer is holding.

Verdict: RSS growth from the end of epoch 1 to the last epoch < ``--rss-mb`` (default 40), /dev/shm usage
flat after the first epochs (the last epoch uses no more than the maximum of the first three plus what
held batches can pin), children == workers between epochs, and nothing left after ``close()``.  The exit
status is 0 when the verdict is ok.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import re
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))  # pipeline_helpers (decoder processes inherit it)

import numpy as np  # noqa: E402
import psutil  # noqa: E402

from parrecio import ParallelReader, RecordWriter  # noqa: E402
from parrecio.pipeline.shm import SHM_DIR, leftover  # noqa: E402
from pipeline_helpers import Fixed, digest_array, our_children  # noqa: E402

SLOT_RE = re.compile(r"^parrecio-\d+-[0-9a-f]+-s\d+$")


def shm_usage(prefix):
    names = leftover(prefix)
    total = 0
    for n in names:
        try:
            total += os.stat(os.path.join(SHM_DIR, n)).st_size
        except OSError:
            pass
    return total, len(names), sum(bool(SLOT_RE.match(n)) for n in names)


def write_file(path: str, n: int, seed: int) -> list:
    rng = np.random.default_rng(seed)
    recs = []
    with RecordWriter(path) as w:
        for _ in range(n):
            r = rng.integers(0, 256, int(rng.integers(1 << 10, 20 << 10)), dtype=np.uint8).tobytes()
            w.write(r)
            recs.append(r)
    return recs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--records", type=int, default=5000)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rss-mb", type=float, default=40.0)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()

    rng = random.Random(args.seed)
    shape = (16, 16, 3)
    tmp = tempfile.TemporaryDirectory(dir=args.dir)
    path = os.path.join(tmp.name, "soak.rec")
    recs = write_file(path, args.records, args.seed)
    expected_first = digest_array(recs[0], shape)
    shm_before = set(leftover())
    proc = psutil.Process()

    per_epoch = []
    held: list = []
    errors: list = []
    t_start = time.perf_counter()
    reader = ParallelReader(path, fields=[Fixed(shape)], workers=args.workers, batch_size=args.batch_size,
                            seed=args.seed)
    try:
        for epoch in range(args.epochs):
            t0 = time.perf_counter()
            n_batches = -(-args.records // args.batch_size)
            stop_at = rng.randrange(1, n_batches) if rng.random() < 0.35 else None
            hold = rng.random() < 0.3
            if held and rng.random() < 0.5:
                held = []  # drop what earlier epochs kept
            samples = 0
            for i, batch in enumerate(reader):
                (arr,) = batch
                if i == 0 and not np.array_equal(arr[0], expected_first):
                    errors.append(f"epoch {epoch}: first sample differs")
                samples += len(arr)
                if hold and i % 40 == 0 and len(held) < 6:
                    held.append(batch)
                if stop_at is not None and i == stop_at:
                    break
            gc.collect()
            time.sleep(0.2)  # let a broken-off run's processes and segments settle
            shm_bytes, shm_n, slots = shm_usage(reader._res.prefix)  # this reader's segments only
            per_epoch.append({
                "epoch": epoch, "samples": samples, "broke_at_batch": stop_at, "held": len(held),
                "seconds": round(time.perf_counter() - t0, 2),
                "rss_mb": round(proc.memory_info().rss / 2**20, 1),
                "shm_mb": round(shm_bytes / 2**20, 2), "shm_segments": shm_n, "slot_segments": slots,
                "children": len(our_children()), "state": reader.state.value,
            })
            print(json.dumps(per_epoch[-1]), file=sys.stderr)
            if stop_at is None and samples != args.records:
                errors.append(f"epoch {epoch}: {samples} samples, expected {args.records}")
        stats = reader.stats.as_dict()
    finally:
        held = []
        reader.close()
    gc.collect()
    deadline = time.monotonic() + 5
    while (our_children() or set(leftover()) - shm_before) and time.monotonic() < deadline:
        time.sleep(0.05)
    after_children = len(our_children())
    after_shm = sorted(set(leftover()) - shm_before)
    tmp.cleanup()

    rss_growth = per_epoch[-1]["rss_mb"] - per_epoch[0]["rss_mb"]
    shm_first = max(e["shm_mb"] for e in per_epoch[:3])
    shm_last = per_epoch[-1]["shm_mb"]
    slot_mb = (args.batch_size * int(np.prod(shape))) / 2**20
    checks = {
        "rss_growth_mb": round(rss_growth, 1),
        "rss_ok": rss_growth < args.rss_mb,
        "shm_first3_max_mb": shm_first, "shm_last_mb": shm_last,
        "shm_max_mb": max(e["shm_mb"] for e in per_epoch),
        "shm_ok": shm_last <= shm_first + 6 * slot_mb + 1e-6,
        "children_ok": all(e["children"] == args.workers for e in per_epoch),
        "after_close_children": after_children, "after_close_shm": after_shm,
        "clean_after_close": after_children == 0 and not after_shm,
        "data_ok": not errors, "errors": errors,
    }
    ok = all(checks[k] for k in ("rss_ok", "shm_ok", "children_ok", "clean_after_close", "data_ok"))
    print(json.dumps({
        "config": {"epochs": args.epochs, "records": args.records, "workers": args.workers,
                   "batch_size": args.batch_size, "seed": args.seed, "record_bytes": "1-20 KB",
                   "file_mb": round(sum(map(len, recs)) / 2**20, 1), "decoder": f"Fixed({shape})",
                   "cpus": os.cpu_count()},
        "total_seconds": round(time.perf_counter() - t_start, 1),
        "epochs": per_epoch,
        "stats": {k: stats[k] for k in ("epochs", "samples", "chunks", "reruns", "workers_replaced",
                                         "skipped")},
        "verdict": "ok" if ok else "FAIL", "checks": checks,
    }, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
