"""ImageNet training augmentation, fused into parrecio's decoder, against the usual ways to do it.

    .venv/bin/python -m bench.bench_augment [--data bench/data] [--count 400] [--repeat 3] [--no-peers]

The transform: RandomResizedCrop(224, scale=(0.08, 1), ratio=(3/4, 4/3)) + horizontal flip (p=0.5) +
ToTensor/Normalize(ImageNet mean, std), float32 CHW out, on the real photographs of
``bench/data/images.rec`` (``python bench/data.py build``; ~490x390 JPEGs).

1. ``one_core``: images/s in this one process (one core), the cases interleaved (``bench_decoders.rates``:
   each image keeps its best time over ``--repeat`` rounds, so other load on the machine moves every case
   alike):

   - ``parrecio fused``: ``Image(size=224, crop=RandomResizedCrop(), flip=0.5, mean=..., std=...,
     layout="CHW").decode_into(payload, out, key=k)`` -- out is a preallocated float32 array, as the
     output slot is in the pipeline; ``draft=True`` lets libjpeg decode at 1/2..1/8 scale where the crop
     stays >= 224 px;
   - ``pillow-simd + python``: what a torchvision Dataset does, in numpy (``bench/peers.augment_pil``):
     full decode, ``crop().resize(BILINEAR)``, ``transpose``, ``/ 255``, ``(x - mean) / std``, and the
     sample copied into a batch-sized array as collate does (parrecio's decoder writes there directly);
   - the same two with uint8 HWC output (no normalization), for those who normalize on the GPU;
   - ``mxnet ImageRecordIter``: ``random_resized_crop, rand_mirror, mean/std``, ``preprocess_threads=1``
     (bench/.venvs/mx; an iterator, so it is timed by epochs: ``bench/peers.py mxnet --augment``).

2. ``pipelines``: 2 workers, batches of 64: parrecio's ParallelReader, torch's DataLoader(num_workers=2)
   with the Pillow-SIMD Dataset above (in the dev venv, which has torch and Pillow-SIMD), MXNet with
   ``preprocess_threads=2``.  MXNet 1.9.1 caps its decode threads at ``omp_get_num_procs() / 2 - 1``
   ("real cores"), one thread on 2 cores; the cap is lifted by preloading a two-line shim whose
   ``omp_get_num_procs`` reports ``2 * (processors + 1)``, so that the cap is the processor count
   (compiled here with ``cc`` into bench/out/), and the run says so.

3. ``quality``: mean absolute difference, in grey levels of the uint8 output, between parrecio's
   decoder and torchvision's PIL path (crop + resize(BILINEAR) + flip) on the same boxes: 0 when exact,
   and the figure for ``draft=True``.

Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
from typing import Any, Dict, List

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from bench.bench_decoders import pil_build, rates  # noqa: E402
from bench.peers import RecFile, augment_pil, read_index  # noqa: E402
from parrecio.decoders import IMAGENET_MEAN, IMAGENET_STD, Image, RandomResizedCrop  # noqa: E402
from parrecio.decoders.base import sample_key  # noqa: E402
from parrecio.recordio.irheader import unpack  # noqa: E402


def photographs(data: str, count: int) -> List[bytes]:
    """The JPEG bytes of the first ``count`` records of ``images.rec`` (IRHeader stripped)."""
    rec = RecFile(os.path.join(data, "images.rec"))
    offsets = read_index(os.path.join(data, "images.idx"))[:count]
    return [bytes(unpack(rec.read(o))[1]) for o in offsets]


def one_core(images: List[bytes], repeat: int) -> Dict[str, float]:
    fused = Image(size=224, crop=RandomResizedCrop(), flip=0.5, mean=IMAGENET_MEAN, std=IMAGENET_STD,
                  layout="CHW")
    drafted = Image(size=224, crop=RandomResizedCrop(), flip=0.5, mean=IMAGENET_MEAN, std=IMAGENET_STD,
                    layout="CHW", draft=True)
    fused_u8 = Image(size=224, crop=RandomResizedCrop(), flip=0.5)
    out = np.empty((3, 224, 224), np.float32)
    out_u8 = np.empty((224, 224, 3), np.uint8)
    keyed = [(sample_key(0, 0, 0, i), p) for i, p in enumerate(images)]
    rng = random.Random(0)

    def python(p):  # the sample lands in the batch, as collate copies it there
        out[...] = augment_pil(p, rng)

    def python_u8(p):
        out_u8[...] = augment_pil(p, rng, normalize=False)

    import parrecio.decoders.image as image_module
    region = image_module._jpegregion

    def whole(kp):  # the same decoder without the region decoder: libjpeg decodes every row and column
        image_module._jpegregion = None
        try:
            fused.decode_into(kp[1], out, key=kp[0])
        finally:
            image_module._jpegregion = region

    cases = {
        "parrecio fused (float32 CHW)": (lambda kp: fused.decode_into(kp[1], out, key=kp[0]), keyed),
        "parrecio fused, whole-image decode (float32 CHW)": (whole, keyed),
        "parrecio fused, draft=True (float32 CHW)": (lambda kp: drafted.decode_into(kp[1], out, key=kp[0]), keyed),
        "pillow-simd + python (float32 CHW)": (python, images),
        "parrecio fused (uint8 HWC)": (lambda kp: fused_u8.decode_into(kp[1], out_u8, key=kp[0]), keyed),
        "pillow-simd + python (uint8 HWC)": (python_u8, images),
    }
    return rates(cases, repeat)


def quality(images: List[bytes]) -> Dict[str, float]:
    """Mean |difference| (grey levels, uint8 HWC) against torchvision's PIL path on the same boxes: at
    224 px (where these photos never allow DCT scaling) and at 112 px (where large crops do), with the
    share of samples that draft=True decoded at 1/2 or less."""
    import io

    from PIL import Image as PILImage
    out: Dict[str, float] = {}
    for size in (224, 112):
        exact = Image(size=size, crop=RandomResizedCrop(), flip=0.5)
        drafted = Image(size=size, crop=RandomResizedCrop(), flip=0.5, draft=True)
        diffs: Dict[str, List[float]] = {"exact": [], "draft=True": []}
        for i, payload in enumerate(images):
            key = sample_key(0, 0, 0, i)
            pil = PILImage.open(io.BytesIO(payload))
            plan = exact._plan_of(pil.width, pil.height, key)
            x, y, w, h = (int(v) for v in (plan.box_x, plan.box_y, plan.box_w, plan.box_h))
            ref = pil.convert("RGB").crop((x, y, x + w, y + h)).resize((size, size), PILImage.Resampling.BILINEAR)
            if plan.flip:
                ref = ref.transpose(PILImage.Transpose.FLIP_LEFT_RIGHT)
            ref = np.asarray(ref).astype(np.int16)
            diffs["exact"].append(float(np.abs(exact(payload, key=key) - ref).mean()))
            diffs["draft=True"].append(float(np.abs(drafted(payload, key=key) - ref).mean()))
        for name, v in diffs.items():
            out[f"{size}px {name} mean_abs_diff"] = round(float(np.mean(v)), 3)
            out[f"{size}px {name} worst_image_mean_abs_diff"] = round(float(np.max(v)), 3)
        out[f"{size}px draft=True share_scaled"] = round(float(np.mean([d > 0 for d in diffs["draft=True"]])), 3)
    return out


def nprocs_shim() -> str | None:
    """A shared object whose ``omp_get_num_procs`` reports ``2 * (processors + 1)`` (None when it cannot be
    built): preloaded, MXNet's cap on decode threads (``omp_get_num_procs() / 2 - 1``) becomes the
    processor count."""
    out = os.path.join(HERE, "out")
    os.makedirs(out, exist_ok=True)
    source, shim = os.path.join(out, "nprocs_shim.c"), os.path.join(out, "nprocs_shim.so")
    with open(source, "w") as f:
        f.write("#include <unistd.h>\nint omp_get_num_procs(void) { return 2 * ((int)sysconf(_SC_NPROCESSORS_ONLN) + 1); }\n")
    done = subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", shim, source], capture_output=True)
    return shim if done.returncode == 0 else None


def peer(python: str, *args: str, preload: str | None = None) -> Dict[str, Any]:
    """One run of bench/peers.py in interpreter ``python``: its JSON line, or why there is none."""
    if not os.path.exists(python):
        return {"skipped": f"{python} not found (bash bench/setup_peers.sh)"}
    env = dict(os.environ, LD_PRELOAD=preload) if preload else None
    proc = subprocess.run([python, os.path.join(HERE, "peers.py"), *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=1800, env=env)
    if proc.returncode != 0:
        return {"failed": proc.stderr.strip().splitlines()[-1:] or [f"exit code {proc.returncode}"]}
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    if preload:
        doc["thread_cap_lifted"] = f"LD_PRELOAD={os.path.relpath(preload, ROOT)} (omp_get_num_procs() reports 2 * (processors + 1))"
        doc["preprocess_threads_effective"] = doc.get("preprocess_threads_requested")
    return doc


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=os.path.join(HERE, "data"))
    ap.add_argument("--count", type=int, default=400, help="images for the one-core table and the quality")
    ap.add_argument("--repeat", type=int, default=3, help="interleaved rounds of the one-core table")
    ap.add_argument("--epochs", type=int, default=3, help="epochs of each pipeline run (the first warms up)")
    ap.add_argument("--no-peers", action="store_true", help="only the in-process parts (1 and 3)")
    args = ap.parse_args(argv)
    images = photographs(args.data, args.count)
    doc: Dict[str, Any] = {
        "images": len(images), "mean_jpeg_bytes": round(float(np.mean([len(p) for p in images]))),
        "pil": pil_build(), "cpu_count": os.cpu_count(), "load_before": [round(x, 2) for x in os.getloadavg()],
    }
    table = one_core(images, args.repeat)
    base = table["pillow-simd + python (float32 CHW)"]
    doc["one_core"] = {"images_per_s": table,
                       "fused_over_pillow_python": round(table["parrecio fused (float32 CHW)"] / base, 2),
                       "fused_draft_over_pillow_python":
                           round(table["parrecio fused, draft=True (float32 CHW)"] / base, 2)}
    doc["quality"] = quality(images[:200])
    if not args.no_peers:
        mx = os.path.join(HERE, ".venvs", "mx", "bin", "python")
        epochs = str(args.epochs)
        doc["one_core"]["mxnet ImageRecordIter, 1 thread"] = peer(
            mx, "mxnet", "--augment", "--workers", "1", "--epochs", epochs)
        dev = sys.executable
        doc["pipelines"] = {
            "parrecio ParallelReader(workers=2)": peer(dev, "parrecio", "--augment", "--workers", "2",
                                                       "--epochs", epochs),
            "torch DataLoader(num_workers=2), Pillow-SIMD": peer(dev, "torch", "--augment", "--workers", "2",
                                                                 "--epochs", epochs),
            "mxnet ImageRecordIter(preprocess_threads=2)": peer(mx, "mxnet", "--augment", "--workers", "2",
                                                                "--epochs", epochs, preload=nprocs_shim()),
        }
    doc["load_after"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
