"""A /dev/shm as small as Docker's default (64 MiB): the reader shrinks its ring and its output slots to
what is there, says so in one line, and delivers exactly what it would with more.  Run for real in a
private mount namespace with a 64 MiB tmpfs on /dev/shm (``unshare -m``, as root), and as a pure
function of the free bytes."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from parrecio import ParallelReader
from parrecio.decoders import BoundingBoxes, Image
from parrecio.errors import PipelineError
from parrecio.pipeline.resources import fit_memory

HERE = os.path.dirname(os.path.abspath(__file__))
MIB = 2 ** 20


def test_fit_memory_as_a_function_of_the_free_bytes(tmp_path):
    (tmp_path / "x.rec").write_bytes(b"")
    with ParallelReader(tmp_path / "x.rec", fields=[Image(size=(224, 224)), BoundingBoxes(max_boxes=16)],
                        workers=2, batch_size=64) as r:
        cfg = r.config
    slot = cfg.layout.nbytes
    assert 9 * MIB < slot < 10 * MIB  # 64 images of 224x224x3 and their boxes
    same, n, said = fit_memory(cfg, 10, 5, 10 << 30)
    assert same is cfg and n == 10 and said is None          # room enough: as asked
    small, n, said = fit_memory(cfg, 10, 5, 64 * MIB)
    assert 5 <= n < 10 and small.ring_bytes < cfg.ring_bytes
    assert 2 * small.ring_bytes + n * slot <= 64 * MIB       # the ring, its one-off budget, the slots
    assert small.oneoff_budget == small.ring_bytes and small.mapped_budget == 4 * small.ring_bytes
    assert "64 MiB free" in said and "--shm-size" in said and f"{n} output slots" in said
    # not even the least (a 1 MiB ring, as much again, 5 slots: 48 MiB): say so with the figures, before
    # anything is allocated (allocating what was asked failed on whichever segment came last, and blamed
    # the free space that the ring had just taken)
    with pytest.raises(PipelineError, match=r"^/dev/shm has 20\.0 MiB free, and this reader needs at least 48\.0 "
                                            r"MiB there: a 1\.0 MiB input ring and as much again for records "
                                            r"larger than half of it, and 5 output slots of 9\.2 MiB \(64 samples "
                                            r"of 0\.14 MiB .*docker run --shm-size=64m\).*workers=0"):
        fit_memory(cfg, 10, 5, 20 * MIB)
    # a ring asked smaller than the 1 MiB that fitting shrinks to is kept, and the slots are fitted around
    # it (such a ring turned fitting off: the start failed where the default ring's did not)
    tiny = dataclasses.replace(cfg, ring_bytes=256 << 10, oneoff_budget=256 << 10)
    small, n, said = fit_memory(tiny, 10, 5, 64 * MIB)
    assert small.ring_bytes == 256 << 10 and n == 6 and 2 * small.ring_bytes + n * slot <= 64 * MIB
    assert "using the 0.25 MiB input ring asked for and 6 output slots of 9.2 MiB (instead of 10)" in said
    with pytest.raises(PipelineError, match="needs at least 46.5 MiB"):
        fit_memory(tiny, 10, 5, 46 * MIB)
    # values that travel pickled (no output slots): the ring alone is spoken of ("0 output slots of
    # 0.0 MiB (instead of 0)" was said)
    with ParallelReader(tmp_path / "x.rec", fields=lambda p: len(p), workers=2) as r:
        raw = r.config
    small, n, said = fit_memory(raw, 0, 0, 8 * MIB)
    assert small.ring_bytes == 2 * MIB and n == 0
    assert said.startswith("parrecio: /dev/shm has 8 MiB free, less than the 128 MiB asked for; using a 2.0 MiB "
                           "input ring (ring_bytes=67108864), which may be slower")
    with pytest.raises(PipelineError, match=r"^/dev/shm has 1\.5 MiB free, and this reader needs at least 2\.0 MiB "
                                            r"there: a 1\.0 MiB input ring and as much again for records larger "
                                            r"than half of it\. .*--shm-size=2m\), or ask for less: workers=0"):
        fit_memory(raw, 0, 0, 3 * MIB // 2)


SCRIPT = textwrap.dedent("""\
    import glob, io, logging, os, sys
    import numpy as np
    from PIL import Image as PILImage
    from parrecio import ParallelReader, RecordWriter
    from parrecio.decoders import BoundingBoxes, Image

    def main():
        path = sys.argv[1]
        with ParallelReader(path, fields=[Image(size=(224, 224)), BoundingBoxes(max_boxes=16)], workers=2,
                            batch_size=64) as r:
            n = 0
            for images, boxes in r:
                assert images.shape[1:] == (224, 224, 3) and boxes.shape[1:] == (16, 5)
                n += len(images)
            print("samples", n, "ring", r.config.ring_bytes, "slots", len(r._res.slots.segments), flush=True)
        print("left", len(glob.glob("/dev/shm/parrecio-*")), flush=True)

    if __name__ == "__main__":
        main()
    """)


def _run_in_a_private_dev_shm(tmp_path, mount_options: str, script_text: str, *args) -> subprocess.CompletedProcess:
    """``script_text`` run with ``args`` in a private mount namespace whose /dev/shm is a tmpfs mounted with
    ``mount_options``; skips where no tmpfs can be mounted.  Its exit status is checked."""
    script = tmp_path / "in_private_shm.py"
    script.write_text(script_text)
    words = " ".join(str(a) for a in args)
    cmd = f"mount -t tmpfs -o {mount_options} tmpfs /dev/shm && {sys.executable} {script} {words}"
    proc = subprocess.run(["unshare", "-m", "sh", "-c", cmd], capture_output=True, text=True, timeout=180)
    if proc.returncode != 0 and "mount" in proc.stderr and "permission" in proc.stderr.lower():
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _jpeg(rng, height: int, width: int) -> bytes:
    import io
    from PIL import Image as PILImage
    buf = io.BytesIO()
    PILImage.fromarray(rng.integers(0, 256, (height, width, 3), dtype="uint8")).save(buf, "JPEG")
    return buf.getvalue()


def _manifest_stream(path, n=200):
    import json
    import numpy as np
    from parrecio import RecordWriter
    rng = np.random.default_rng(0)
    with RecordWriter(str(path)) as w:
        for i in range(n):
            w.write(_jpeg(rng, 90, 120))
            w.write(json.dumps({"image_size": [{"width": 120, "height": 90, "depth": 3}],
                                "annotations": [{"class_id": 1, "left": 3, "top": 4, "width": 50,
                                                 "height": 20}]}).encode())


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare -m")
def test_docker_sized_dev_shm(tmp_path):
    path = tmp_path / "m.rec"
    _manifest_stream(path)
    proc = _run_in_a_private_dev_shm(tmp_path, "size=64m", SCRIPT, path)
    words = proc.stdout.split()
    assert words[:2] == ["samples", "200"], proc.stdout
    assert int(words[3]) < 64 * MIB and 5 <= int(words[5]) < 10
    assert words[-2:] == ["left", "0"]
    warnings = [line for line in proc.stderr.splitlines() if "MiB free" in line]
    assert len(warnings) == 1 and "--shm-size" in warnings[0], proc.stderr


FAULT_SCRIPT = textwrap.dedent("""\
    import glob, os, sys
    from parrecio import ParallelReader
    from parrecio.decoders import Image

    def main():
        path, batch = sys.argv[1], int(sys.argv[2])
        with ParallelReader(path, fields=Image(size=(512, 512)), workers=2, batch_size=batch) as r:
            try:
                n = sum(len(b) for b in r)
                print("samples", n, flush=True)
            except Exception as e:
                print("error", type(e).__name__, e, flush=True)
        print("left", len(glob.glob("/dev/shm/parrecio-*")), flush=True)
        with ParallelReader(path, fields=Image(size=(512, 512)), workers=0, batch_size=batch) as r:
            print("workers=0", sum(len(b) for b in r), flush=True)

    if __name__ == "__main__":
        main()
    """)


def _jpegs(path, n=12):
    import numpy as np
    from parrecio import RecordWriter
    rng = np.random.default_rng(1)
    with RecordWriter(str(path)) as w:
        for _ in range(n):
            w.write(_jpeg(rng, 60, 80))


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare -m")
@pytest.mark.parametrize("mount, batch, want", [
    # read-only: a PipelineError that names /dev/shm and says what to do (a bare OSError EROFS was raised,
    # after a warning that fitted the ring into the "free" space of a file system no one can write)
    ("ro,size=64m", 4, r"^error PipelineError cannot create the shared-memory segment parrecio-\d+-[0-9a-f]+-ring in "
                       r"/dev/shm: Read-only file system \(EROFS\)\. The decoder processes need a writable /dev/shm "
                       r".*workers=0 reads without shared memory$"),
    # too small for even the least (1 MiB ring, as much again, 5 slots of 4 x 0.75 MiB): the figures of the
    # whole, and a --shm-size that holds them
    ("size=8m", 4, r"^error PipelineError /dev/shm has 8\.0 MiB free, and this reader needs at least 17\.0 MiB "
                   r"there: .*5 output slots of 3\.0 MiB \(4 samples of 0\.75 MiB .*--shm-size=32m"),
    # a tmpfs of no limit says 0 blocks free: not "too small" (it would be refused now), but unknown
    ("size=0", 4, r"^samples 12$"),
])
def test_a_dev_shm_that_cannot_serve_says_so_at_start(tmp_path, mount, batch, want):
    import re
    path = tmp_path / "j.rec"
    _jpegs(path)
    proc = _run_in_a_private_dev_shm(tmp_path, mount, FAULT_SCRIPT, path, batch)
    lines = proc.stdout.splitlines()
    assert re.search(want, lines[0]), lines[0]
    assert lines[1:] == ["left 0", "workers=0 12"]
    assert "MiB free, less than" not in proc.stderr  # (no fitting warning before either error)


VIEWS_SCRIPT = textwrap.dedent("""\
    import glob, random, sys
    from parrecio import ParallelReader, RecordWriter, Tuning

    def main():
        path = sys.argv[1]
        rnd = random.Random(3)
        recs = [rnd.randbytes(1100 << 10) for _ in range(24)]  # over half the 1 MiB ring: one-off segments
        with RecordWriter(path) as w:
            for p in recs:
                w.write(p)
        for keep in (False, True):
            kept, n = [], 0
            with open(path, "rb") as f, ParallelReader(f, workers=1, tuning=Tuning(ring_bytes=1 << 20)) as r:
                try:
                    for v in r.iter_views():
                        assert bytes(v) == recs[n], n
                        n += 1
                        if keep:
                            kept.append(v)
                    print("samples", n, flush=True)
                except Exception as e:
                    print("error after", n, type(e).__name__, e, flush=True)
            assert all(bytes(v) == recs[i] for i, v in enumerate(kept))
            del kept
            print("left", len(glob.glob("/dev/shm/parrecio-*")), flush=True)

    if __name__ == "__main__":
        main()
    """)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare -m")
def test_views_kept_of_groups_larger_than_half_the_ring_are_named_when_dev_shm_fills(tmp_path):
    """Views of one-off segments keep them in /dev/shm (like output slots the user holds, they are bounded
    by /dev/shm alone): a plain loop over 1.1 MiB records reads them all in a 16 MiB /dev/shm; keeping every
    view fills it, and the error names the group that did not fit and what the views hold (it blamed
    ring_bytes, workers and batch_size)."""
    import re
    proc = _run_in_a_private_dev_shm(tmp_path, "size=16m", VIEWS_SCRIPT, tmp_path / "big.rec")
    lines = proc.stdout.splitlines()
    assert lines[:2] == ["samples 24", "left 0"], lines
    m = re.fullmatch(r"error after (\d+) PipelineError cannot allocate 1\.1 MiB of shared memory for a group larger "
                     r"than half the input ring \(at byte offset (\d+)\) \(\d\.\d MiB free in /dev/shm\): .*\. Views "
                     r"still in use hold (\d+\.\d) MiB of it: .*copy what you keep \(bytes\(view\)\)", lines[2])
    assert m, lines[2]
    n, offset, held = int(m[1]), int(m[2]), float(m[3])
    assert 8 <= n < 24 and offset > n * (1100 << 10)  # (the reader reads ahead of what was delivered)
    assert held >= n * 1.07 and lines[3:] == ["left 0"]
