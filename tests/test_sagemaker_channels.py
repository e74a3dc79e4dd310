"""SageMaker channels: Pipe mode FIFOs per epoch, File mode directories, and the input-config errors."""

import io
import json
import multiprocessing
import os
import select
import stat
import threading
import time

import pytest

from parrecio.errors import SourceError
from parrecio.recordio.wrapper import write_sagemaker_recordio
from parrecio.sources import FileChannelSource, PipeChannelSource, resolve
from source_helpers import digest, fifo_feeder, make_payloads, read_epoch, read_in_child, records_of, write_rec


def write_config(root, channels):
    (root / "config").mkdir(parents=True, exist_ok=True)
    (root / "data").mkdir(exist_ok=True)
    (root / "config" / "inputdataconfig.json").write_text(json.dumps(channels))


PIPE = {"TrainingInputMode": "Pipe", "RecordWrapperType": "RecordIO", "S3DistributionType": "FullyReplicated"}


def wrapped(payloads, split_bytes=None) -> bytes:
    out = io.BytesIO()
    write_sagemaker_recordio(payloads, out, split_bytes=split_bytes)
    return out.getvalue()


@pytest.fixture
def feeder():
    """Start a FIFO-feeding process (fork context: cheap); always joined, killed if still running."""
    procs = []

    def start(*args):
        proc = multiprocessing.get_context("fork").Process(target=fifo_feeder, args=args, daemon=True)
        proc.start()
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join()


def test_pipe_mode_epochs_from_late_fifos_in_small_writes(tmp_path, feeder):
    write_config(tmp_path, {"train": PIPE, "validation": PIPE})
    epochs = [make_payloads(40, seed=e, hi=600) for e in range(3)]
    streams = [wrapped(p, split_bytes=97) for p in epochs]  # multipart records at odd sizes
    source = resolve("train", sm_input_dir=str(tmp_path), fifo_timeout=20)
    assert isinstance(source, PipeChannelSource)
    assert (source.default_join, source.kind, source.distribution) == ("concat", "sagemaker-pipe", "FullyReplicated")
    proc = feeder(str(tmp_path / "data"), "train", streams, 0.3, 7)  # each FIFO appears 0.3 s after the last
    for epoch, payloads in enumerate(epochs):
        start = time.monotonic()
        [(name, data)] = read_epoch(source, epoch)  # waits for train_<epoch>, then reads it
        assert time.monotonic() - start > 0.1  # it did wait for the FIFO to appear
        fifo = str(tmp_path / "data" / f"train_{epoch}")
        assert name == f"train_{epoch} (FIFO {fifo})"
        assert records_of(data, join="concat") == payloads
    proc.join(10)
    assert proc.exitcode == 0 and os.listdir(tmp_path / "data") == []


def test_pipe_channel_read_in_a_forkserver_child(tmp_path, feeder):
    streams = [wrapped(make_payloads(30, seed=e)) for e in range(2)]
    write_config(tmp_path, {"train": PIPE})
    source = resolve("train", pipe_dir=str(tmp_path / "data"), config_dir=str(tmp_path / "config"), fifo_timeout=20)
    feeder(str(tmp_path / "data"), "train", streams, 0.2, 1000)
    got = read_in_child("forkserver", [source], epochs=[0, 1])
    assert [[(h, n) for _, h, n in epoch] for epoch in got[0]] == [[(digest(s), len(s))] for s in streams]


def test_fifo_that_never_appears_is_a_timeout_error_naming_it(tmp_path):
    write_config(tmp_path, {"train": PIPE})
    source = resolve("train", sm_input_dir=str(tmp_path), fifo_timeout=0.3)
    start = time.monotonic()
    with pytest.raises(SourceError) as info:
        read_epoch(source, 2)
    assert 0.3 <= time.monotonic() - start < 3
    assert str(tmp_path / "data" / "train_2") in str(info.value) and "0.3 s" in str(info.value)


def test_sm_input_dir_from_the_environment(tmp_path, monkeypatch):
    write_config(tmp_path, {"train": PIPE})
    monkeypatch.setenv("SM_INPUT_DIR", str(tmp_path))
    assert resolve("train").data_dir == str(tmp_path / "data")


@pytest.mark.parametrize("mode", ["File", "FastFile"])
def test_file_mode_directory_recursive_every_epoch(tmp_path, mode):
    write_config(tmp_path, {"train": {"TrainingInputMode": mode, "RecordWrapperType": "None",
                                      "S3DistributionType": "ShardedByS3Key"}})
    chan = tmp_path / "data" / "train"
    (chan / "part-b").mkdir(parents=True)
    files = {rel: write_rec(chan / rel, make_payloads(3, seed=i)) for i, rel in
             enumerate(["part-b/1.rec", "part-a.rec", "part-b/0.rec"])}
    (chan / "part-a.idx").write_text("0\t0\n")
    source = resolve("train", sm_input_dir=str(tmp_path))
    assert isinstance(source, FileChannelSource)
    assert (source.default_join, source.kind, source.distribution) == ("auto", "sagemaker-file", "ShardedByS3Key")
    order = ["part-a.rec", "part-b/0.rec", "part-b/1.rec"]
    for epoch in (0, 1):
        assert read_epoch(source, epoch) == [(str(chan / rel), files[rel]) for rel in order]


def test_file_mode_directory_from_sm_channel_variable(tmp_path, monkeypatch):
    write_config(tmp_path, {"train": {"TrainingInputMode": "File"}})
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    write_rec(elsewhere / "x.rec", [b"x"])
    monkeypatch.setenv("SM_CHANNEL_TRAIN", str(elsewhere))
    assert resolve("train", sm_input_dir=str(tmp_path)).paths == (str(elsewhere / "x.rec"),)
    monkeypatch.delenv("SM_CHANNEL_TRAIN")
    with pytest.raises(SourceError, match="File mode but its directory .*data/train does not exist"):
        resolve("train", sm_input_dir=str(tmp_path))


def test_unknown_channel_lists_the_configured_ones(tmp_path):
    write_config(tmp_path, {"train": PIPE, "validation": PIPE})
    with pytest.raises(SourceError) as info:
        resolve("test", sm_input_dir=str(tmp_path))
    message = str(info.value)
    assert "no channel 'test'" in message and "'train', 'validation'" in message
    assert "not an existing path" in message and "inputdataconfig.json" in message


def test_pipe_without_wrapper_and_raw_content_type_is_refused(tmp_path):
    write_config(tmp_path, {"train": {"TrainingInputMode": "Pipe", "RecordWrapperType": "None",
                                      "ContentType": "application/x-image"}})
    with pytest.raises(SourceError) as info:
        resolve("train", sm_input_dir=str(tmp_path))
    message = str(info.value)
    assert "RecordWrapperType None" in message and "cannot be delimited" in message
    assert "record_wrapping='RecordIO'" in message


def test_pipe_without_wrapper_checks_the_stream_start(tmp_path, feeder):
    """RecordWrapperType None: fine for .rec objects (join decided from the stream), a clear error for raw objects."""
    write_config(tmp_path, {"train": {"TrainingInputMode": "Pipe"}})  # RecordWrapperType unset: None
    payloads = make_payloads(20, seed=4)
    rec = write_rec(tmp_path / "x.rec", payloads)
    source = resolve("train", sm_input_dir=str(tmp_path), fifo_timeout=20)
    assert (source.wrapped, source.default_join) == (False, "auto")
    feeder(str(tmp_path / "data"), "train", [rec + rec, b"\xff\xd8\xff\xe0 a JPEG", b""], 0.0, 3)
    [(_, data)] = read_epoch(source, 0)
    assert records_of(data) == payloads + payloads
    with pytest.raises(SourceError) as info:
        read_epoch(source, 1)
    assert "does not start with the RecordIO magic (first bytes ffd8ffe0)" in str(info.value)
    assert "RecordWrapperType" in str(info.value)
    assert read_epoch(source, 2)[0][1] == b""  # an empty epoch is fine


def test_without_config_the_layout_decides(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data" / "train").mkdir(parents=True)
    write_rec(tmp_path / "data" / "train" / "a.rec", [b"a"])
    os.mkfifo(tmp_path / "data" / "pipe_0")
    assert resolve("train", sm_input_dir=str(tmp_path)).kind == "sagemaker-file"
    pipe = resolve("pipe", sm_input_dir=str(tmp_path))
    os.unlink(tmp_path / "data" / "pipe_0")
    assert (pipe.kind, pipe.default_join) == ("sagemaker-pipe", "concat")
    with pytest.raises(SourceError) as info:
        resolve("other", sm_input_dir=str(tmp_path))
    for word in ["no SageMaker input config", "data/other (File mode)", "data/other_0 (Pipe mode)"]:
        assert word in str(info.value)


def test_config_errors(tmp_path):
    write_config(tmp_path, {"train": {"TrainingInputMode": "Stream"}})
    with pytest.raises(SourceError, match="unknown TrainingInputMode 'Stream'"):
        resolve("train", sm_input_dir=str(tmp_path))
    (tmp_path / "config" / "inputdataconfig.json").write_text("{not json")
    with pytest.raises(SourceError, match="cannot read the SageMaker input config"):
        resolve("train", sm_input_dir=str(tmp_path))


def test_an_existing_path_wins_over_a_channel_name(tmp_path, monkeypatch):
    write_config(tmp_path, {"train": PIPE})
    monkeypatch.chdir(tmp_path)
    write_rec(tmp_path / "train", [b"local"])
    assert resolve("train", sm_input_dir=str(tmp_path)).kind == "files"


# -- RecordWrapperType None: the magic check keeps the FIFO visible to select() -------------------------

def _unwrapped_stream(tmp_path, epoch=0):
    """A Pipe channel without the RecordIO wrapper whose FIFO ``train_<epoch>`` is held open for writing by
    this process (O_RDWR: neither open blocks); ``(write fd, Stream)``."""
    write_config(tmp_path, {"train": {"TrainingInputMode": "Pipe", "RecordWrapperType": "None"}})
    fifo = tmp_path / "data" / f"train_{epoch}"
    os.mkfifo(fifo)
    wfd = os.open(fifo, os.O_RDWR)
    source = resolve("train", sm_input_dir=str(tmp_path), fifo_timeout=5)
    return wfd, fifo, source


def _readable(fd, timeout=0.0):
    return bool(select.select([fd], [], [], timeout)[0])


def test_unwrapped_pipe_stream_has_the_fifo_fileno_and_counts_pending_prefix(tmp_path):
    rec = write_rec(tmp_path / "x.rec", make_payloads(30, seed=9, hi=300))
    wfd, fifo, source = _unwrapped_stream(tmp_path)
    try:
        os.write(wfd, rec[:4096])
        [stream] = source.streams(0)
        raw = stream.file.raw
        fd = stream.file.fileno()
        assert raw.fileno() == fd and stat.S_ISFIFO(os.fstat(fd).st_mode)
        assert os.path.samestat(os.fstat(fd), os.stat(fifo))
        assert raw.pending() == 4
        first = bytearray(3)
        assert raw.readinto(first) == 3 and raw.pending() == 1
        second = bytearray(100)
        assert raw.readinto(second) == 1 and raw.pending() == 0  # the prefix only: never mixed with the FIFO's
        assert bytes(first) + bytes(second[:1]) == rec[:4]
        # Nothing is held in any Python buffer: what was written and not read yet is in the FIFO itself.
        assert _readable(fd)
        os.write(wfd, rec[4096:])
        os.close(wfd)
        wfd = None
        rest = bytearray()
        while True:
            chunk = raw.read(1000)
            if not chunk:
                break
            rest += chunk
        assert rec[:4] + bytes(rest) == rec
        stream.file.close()
        assert raw.closed
        with pytest.raises(ValueError):
            raw.fileno()
    finally:
        if wfd is not None:
            os.close(wfd)


def test_unwrapped_pipe_stream_bytes_identical_through_the_buffered_reader(tmp_path, feeder):
    write_config(tmp_path, {"train": {"TrainingInputMode": "Pipe", "RecordWrapperType": "None"}})
    recs = [write_rec(tmp_path / f"{i}.rec", make_payloads(50, seed=i, hi=700)) for i in range(2)]
    source = resolve("train", sm_input_dir=str(tmp_path), fifo_timeout=20)
    feeder(str(tmp_path / "data"), "train", [recs[0] + recs[1], recs[1][:4]], 0.0, 5)  # 5-byte writes
    [stream] = source.streams(0)
    assert stream.file.raw.pending() == 4
    assert stream.file.read() == recs[0] + recs[1]
    stream.file.close()
    [(_, data)] = read_epoch(source, 1)  # exactly the magic, then EOF
    assert data == recs[1][:4]


def test_writer_stalled_after_the_magic_does_not_block_a_reader_that_checks_pending(tmp_path):
    """The writer sends exactly 4 bytes and stalls: select() says 'not readable' (the 4 bytes were taken by
    the magic check), yet they are readable: pending() says so, and reading them returns at once."""
    rec = write_rec(tmp_path / "x.rec", make_payloads(10, seed=3))
    wfd, fifo, source = _unwrapped_stream(tmp_path)
    try:
        os.write(wfd, rec[:4])
        [stream] = source.streams(0)
        raw = stream.file.raw
        fd = raw.fileno()
        assert not _readable(fd)
        assert raw.pending() == 4
        got, buf = [], bytearray(64)

        def read_once():
            got.append(raw.readinto(buf))

        reader = threading.Thread(target=read_once, daemon=True)
        reader.start()
        reader.join(5)
        blocked = reader.is_alive()
        os.write(wfd, rec[4:])  # unblock a stuck read either way
        os.close(wfd)
        wfd = None
        reader.join(5)
        assert not blocked, "a read with prefix bytes pending waited for the writer"
        assert got == [4] and bytes(buf[:4]) == rec[:4] and raw.pending() == 0
        assert _readable(fd, 5)  # now the data is the FIFO's, and select() sees it
        assert rec[:4] + stream.file.read() == rec
        stream.file.close()
    finally:
        if wfd is not None:
            os.close(wfd)


def test_two_readers_of_one_pipe_channel_whose_passes_overlap_read_the_next_fifos(tmp_path, feeder, no_leaks):
    """A second reader of the channel whose pass starts while the first one's reads train_0 reads train_1:
    it waited on train_0 (its holder "another process": the first reader's own reader process), then timed
    out once train_0 was served and removed."""
    from parrecio import ParallelReader, Tuning
    write_config(tmp_path, {"train": PIPE})
    epochs = [make_payloads(300, seed=e, hi=20_000) for e in range(2)]  # (3 MB: more than r1 reads ahead)
    feeder(str(tmp_path / "data"), "train", [wrapped(p) for p in epochs], 0.1, 1 << 16)
    second = []
    with ParallelReader("train", sm_input_dir=str(tmp_path), workers=1, fifo_timeout=30,
                        tuning=Tuning(ring_bytes=1 << 20)) as r1, \
            ParallelReader("train", sm_input_dir=str(tmp_path), workers=1, fifo_timeout=30) as r2:
        it = iter(r1)
        first = [bytes(next(it))]                               # r1's pass has train_0
        it2 = iter(r2)                                          # r2's pass begins meanwhile
        t = threading.Thread(target=lambda: second.extend(bytes(p) for p in it2))
        t.start()
        first += [bytes(p) for p in it]
        t.join(60)
    assert first == epochs[0] and second == epochs[1]
