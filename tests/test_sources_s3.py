"""s3:// channels against a real local S3 server (moto's ThreadedMotoServer on 127.0.0.1), not a mock of
the client: listing, streaming, prefetch, ranged index reads, errors, retries, no hang, no leak.

Faults are injected by :class:`FaultProxy`, a small HTTP proxy in front of moto: it answers chosen
requests with an S3 error, cuts a body short, or never answers.  Every address is on the loopback.
Data is generated here; nothing is committed."""

from __future__ import annotations

import http.client
import os
import http.server
import pickle
import socket
import threading
import time

import numpy as np
import pytest

boto3 = pytest.importorskip("boto3")
pytest.importorskip("moto.server")

from parrecio import ParallelReader  # noqa: E402
from parrecio.decoders import Raw  # noqa: E402
from parrecio.errors import CorruptRecordError, PipelineError, SourceError  # noqa: E402
from parrecio.recordio import RecordWriter  # noqa: E402
from parrecio.sources import S3Source, resolve  # noqa: E402
from parrecio.sources import s3 as s3mod  # noqa: E402
from pipeline_helpers import Fixed  # noqa: E402
from source_helpers import make_payloads, moto_endpoint, records_of, use_moto  # noqa: E402

FAST = {"max_attempts": 2, "connect_timeout": 2, "read_timeout": 2}  # error tests end in seconds


# -- the server, the environment, the data --------------------------------------------------------
@pytest.fixture(scope="module")
def moto():
    """A moto S3 server on a free loopback port, for the whole module: its endpoint URL."""
    yield from moto_endpoint()


@pytest.fixture
def aws(moto, monkeypatch, tmp_path):
    """The standard AWS configuration pointing at moto: AWS_ENDPOINT_URL and dummy credentials, no
    profile or config file of the machine."""
    use_moto(monkeypatch, moto, tmp_path)
    return boto3.client("s3", endpoint_url=moto, region_name="us-east-1",
                        aws_access_key_id="testing", aws_secret_access_key="testing")


_BUCKETS = iter(range(10 ** 6))


def new_bucket(client) -> str:
    name = f"parrecio-test-{next(_BUCKETS)}"
    client.create_bucket(Bucket=name)
    return name


def write_data(client, tmp_path, *, index=True, sizes=(40, 25, 60), hi=3000, big=None):
    """Local .rec files (with .idx if ``index``) in tmp_path/local, the same objects under
    s3://bucket/data/, plus objects that must not be read (an .lst, a hidden object, a folder marker,
    and the .idx objects when streaming).  ``big``: one more object of about that many bytes (several
    reads of the body, beyond the prefetched head).  Returns (bucket, local dir)."""
    bucket = new_bucket(client)
    local = tmp_path / "local"
    local.mkdir(parents=True)
    names = [f"part-{i}.rec" for i in range(len(sizes))]
    for i, (name, n) in enumerate(zip(names, sizes)):
        write_one(local / name, make_payloads(n, seed=i, hi=hi), index)
    if big:
        n = big // 50_000 + 1
        write_one(local / "part-9-big.rec", make_payloads(n, seed=99, lo=45_000, hi=55_000), index)
    (local / "empty.rec").write_bytes(b"")  # an empty object reads as no records, as an empty file
    if index:
        (local / "empty.idx").write_bytes(b"")
    for path in sorted(local.iterdir()):
        client.upload_file(str(path), bucket, f"data/{path.name}")
    client.put_object(Bucket=bucket, Key="data/train.lst", Body=b"0\t0\tx.jpg\n")
    client.put_object(Bucket=bucket, Key="data/.hidden.rec", Body=b"not RecordIO")
    client.put_object(Bucket=bucket, Key="data/sub/", Body=b"")  # a console-made folder marker
    client.put_object(Bucket=bucket, Key="other/x.rec", Body=b"outside the prefix")
    return bucket, local


def write_one(path, payloads, index):
    with RecordWriter(str(path), index=str(path.with_suffix(".idx")) if index else None) as w:
        for key, payload in enumerate(payloads):
            w.write(payload, key=key)


def two_epochs(channel, **kwargs):
    with ParallelReader(channel, **kwargs) as reader:
        return [list(reader), list(reader)], reader.config


# -- a proxy that injects faults --------------------------------------------------------------------
class FaultProxy:
    """Forwards HTTP to moto; ``rule(method, key_part, action, times)`` makes the next ``times``
    matching requests fail:

    - ``("error", status, code)``: an S3 error answer;
    - ``("cut", nbytes[, then])``: headers and the first nbytes of the body, then the connection closes,
      then ``then()`` runs;
    - ``("short", nbytes)``: a whole response of only the first nbytes, its Content-Length saying so;
    - ``("norange",)``: the Range header dropped (a 200 with the whole object, as a server or proxy that
      ignores it answers); ``("noifmatch",)``: the If-Match header dropped, likewise;
    - ``("flip", at)``: the body's byte ``at`` changed on the way, headers and checksums as sent;
    - ``("hang",)``: no answer until ``release()``;
    - ``("stall", nbytes)``: headers and the first nbytes of the body, then nothing more (the connection
      open) until ``release()``.

    ``log`` lists (method, path, Range header, what was done)."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.split("//", 1)[1]
        self.rules: list = []
        self.log: list = []
        self.lock = threading.Lock()
        self.released = threading.Event()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _any(self):
                proxy.handle(self)

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _any

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def rule(self, method, key_part, action, times=1):
        with self.lock:
            self.rules.append([method, key_part, action, times])

    def requests(self, method=None, key_part=""):
        with self.lock:
            return [e for e in self.log if (method is None or e[0] == method) and key_part in e[1]]

    def release(self):
        self.released.set()

    def close(self):
        self.released.set()
        self.server.shutdown()
        self.server.server_close()

    def _match(self, method, path):
        with self.lock:
            for r in self.rules:
                if r[3] > 0 and r[0] == method and r[1] in path:
                    r[3] -= 1
                    return r[2]
        return None

    def handle(self, h):
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else b""
        action = self._match(h.command, h.path)
        with self.lock:
            self.log.append((h.command, h.path, h.headers.get("Range"), action and action[0]))
        if action and action[0] == "hang":
            self.released.wait(30)
            h.close_connection = True
            return
        if action and action[0] == "error":
            _, status, code = action
            xml = (f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code>"
                   f"<Message>injected by the test proxy</Message></Error>").encode()
            h.send_response(status)
            h.send_header("Content-Type", "application/xml")
            h.send_header("Content-Length", str(0 if h.command == "HEAD" else len(xml)))
            h.end_headers()
            if h.command != "HEAD":
                h.wfile.write(xml)
            return
        conn = http.client.HTTPConnection(self.upstream, timeout=30)
        try:
            dropped = {"norange": ("connection", "range"), "noifmatch": ("connection", "if-match")}.get(
                action and action[0], ("connection",))
            headers = {k: v for k, v in h.headers.items() if k.lower() not in dropped}
            conn.request(h.command, h.path, body=body or None, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
        finally:
            conn.close()
        h.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in ("content-length", "transfer-encoding", "connection", "date", "server"):
                h.send_header(k, v)
        if action and action[0] == "short":  # a complete-looking 200 of fewer bytes (Content-Length too)
            data = data[:action[1]]
        if action and action[0] == "flip":
            data = data[:action[1]] + bytes([data[action[1]] ^ 0x20]) + data[action[1] + 1:]
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if h.command == "HEAD":
            return
        if action and action[0] == "stall":
            h.wfile.write(data[:action[1]])
            h.wfile.flush()
            self.released.wait(30)
            h.close_connection = True
            return
        if action and action[0] == "cut":
            h.wfile.write(data[:action[1]])
            h.wfile.flush()
            h.close_connection = True
            h.connection.shutdown(socket.SHUT_RDWR)
            if len(action) > 2:  # ("cut", nbytes, then): then() runs once the body is cut
                action[2]()
            return
        h.wfile.write(data)


@pytest.fixture
def proxy(moto, aws, monkeypatch):
    """A FaultProxy in front of moto, made the endpoint (AWS_ENDPOINT_URL)."""
    p = FaultProxy(moto)
    monkeypatch.setenv("AWS_ENDPOINT_URL", p.url)
    yield p
    p.close()


# -- reading ---------------------------------------------------------------------------------------
def test_prefix_two_epochs_equal_local_directory(aws, tmp_path, no_leaks):
    """The .rec objects under a prefix, in key order, two epochs: byte-exact the local directory's
    records, payloads and decoded arrays, through ParallelReader with 2 workers and with workers=0."""
    bucket, local = write_data(aws, tmp_path, index=False, big=3 << 20)
    url = f"s3://{bucket}/data/"
    source = resolve(url)
    assert isinstance(source, S3Source) and source.name == url and source.kind == "s3"
    assert [o.key for o in source.objects] == [f"data/{p.name}" for p in sorted(local.glob("*.rec"))]
    assert source.index_pairs() == ()  # no .idx objects: streamed, shuffled with a buffer

    expected, _ = two_epochs(str(local), workers=0)
    assert len(expected[0]) == 40 + 25 + 60 + len(records_of((local / "part-9-big.rec").read_bytes()))
    got, cfg = two_epochs(url, workers=2)
    assert got == expected and cfg.index_paths == ()
    assert two_epochs(url, workers=0)[0] == expected

    # decoded arrays (fixed shape, written into shared memory by the decoder processes), in batches
    want, _ = two_epochs(str(local), fields=Fixed(), batch_size=16, workers=0)
    have, _ = two_epochs(url, fields=Fixed(), batch_size=16, workers=2)
    assert [len(e) for e in have] == [len(e) for e in want]
    for a, b in zip(sum(have, []), sum(want, [])):
        np.testing.assert_array_equal(a, b)


def test_single_object_and_prefix_without_slash(aws, tmp_path, no_leaks):
    bucket, local = write_data(aws, tmp_path, index=False, sizes=(30, 10))
    one = f"s3://{bucket}/data/part-1.rec"
    payloads = records_of((local / "part-1.rec").read_bytes())
    source = resolve(one)
    assert [o.key for o in source.objects] == ["data/part-1.rec"]
    got, _ = two_epochs(one, workers=2)
    assert got == [payloads, payloads]
    # s3://bucket/data (no object of that key): the prefix data/, as a directory
    assert [o.key for o in resolve(f"s3://{bucket}/data").objects] == \
        ["data/empty.rec", "data/part-0.rec", "data/part-1.rec"]
    # a list of URLs, read in the given order
    both = resolve([one, f"s3://{bucket}/data/part-0.rec"])
    assert [o.key for o in both.objects] == ["data/part-1.rec", "data/part-0.rec"]


def test_prefix_without_rec_objects_takes_the_others(aws, tmp_path):
    bucket = new_bucket(aws)
    for name in ("shard-2", "shard-10", "shard-1"):
        aws.put_object(Bucket=bucket, Key=f"p/{name}", Body=b"x")
    for name in ("shard.idx", "shard.lst", ".DS_Store", "sub/"):
        aws.put_object(Bucket=bucket, Key=f"p/{name}", Body=b"")
    assert [o.key for o in resolve(f"s3://{bucket}/p/").objects] == ["p/shard-1", "p/shard-10", "p/shard-2"]


def test_index_shuffle_same_order_as_local(aws, tmp_path, no_leaks):
    """With .idx objects, shuffle=True is the global permutation of the local indexed files, read by
    ranged GETs: the same multiset and the same order for the same seed, every epoch; len() from the
    indexes, before any pass."""
    bucket, local = write_data(aws, tmp_path, index=True, sizes=(30, 20, 25))
    url = f"s3://{bucket}/data/"
    with ParallelReader(url, shuffle=True, seed=7, workers=2) as reader:
        assert reader.config.shuffle_mode == "index"
        assert [str(r) for r, _ in reader.config.index_paths] == [o.url for o in reader.source.objects]
        assert len(reader) == 75
        got = [list(reader), list(reader)]
    expected, cfg = two_epochs(str(local), shuffle=True, seed=7, workers=0)
    assert cfg.shuffle_mode == "index"
    assert two_epochs(str(local), shuffle=True, seed=7, workers=2)[0] == expected  # local, processes
    assert got == expected
    assert got[0] != got[1] and sorted(got[0]) == sorted(got[1])
    assert sorted(got[0]) == sorted(two_epochs(str(local), workers=0)[0][0])  # the same multiset
    # workers=0, and groups of two records (a group stays whole, the same permutation of groups)
    assert two_epochs(url, shuffle=True, seed=7, workers=0)[0] == expected
    fields = [Raw(), Raw()]
    bucket2, local2 = write_data(aws, tmp_path / "two", index=True, sizes=(16, 24))
    want, _ = two_epochs(str(local2), fields=fields, shuffle=True, seed=3, workers=0)
    have, _ = two_epochs(f"s3://{bucket2}/data/", fields=fields, shuffle=True, seed=3, workers=2)
    assert have == want


def test_index_shuffle_corrupt_record_as_local(aws, tmp_path, no_leaks):
    """A corrupt record read by index: skipped and counted as for the local file (either pipeline),
    or an error naming the object's URL and the offset."""
    bucket, local = write_data(aws, tmp_path, index=True, sizes=(20, 20))
    path = local / "part-1.rec"
    offset = int((local / "part-1.idx").read_text().splitlines()[5].split("\t")[1])  # record 5
    data = bytearray(path.read_bytes())
    data[offset:offset + 4] = b"XXXX"
    path.write_bytes(bytes(data))
    aws.upload_file(str(path), bucket, "data/part-1.rec")
    url = f"s3://{bucket}/data/"
    expected = {}
    for workers in (0, 2):
        with ParallelReader(str(local), shuffle=True, seed=1, on_error="skip", workers=workers) as reader:
            expected[workers] = (list(reader), reader.stats.skipped, reader.stats.skipped_records)
    assert expected[0] == expected[2] and len(expected[0][0]) == 39
    for workers in (0, 2):
        with ParallelReader(url, shuffle=True, seed=1, on_error="skip", workers=workers) as reader:
            assert (list(reader), reader.stats.skipped, reader.stats.skipped_records) == expected[0]
        with ParallelReader(url, shuffle=True, seed=1, workers=workers) as reader:
            with pytest.raises(CorruptRecordError, match=rf"byte offset {offset} of {url}part-1.rec"):
                list(reader)


@pytest.mark.parametrize("workers", [0, 2])
def test_an_index_that_does_not_fit_its_object_is_refused_as_locally(aws, tmp_path, workers, no_leaks):
    """An object appended to after its .idx was written, and an .idx of one line per sample: an
    IndexMismatch naming the object's URL, whatever on_error says (ranged GETs check each record's end
    against the index as pread does).  Not before the first sample, as for a local file: that would cost
    GETs of every object before any sample (thousands of objects); when the record that shows it is read."""
    from parrecio.recordio.index import IndexMismatch
    bucket, local = write_data(aws, tmp_path, index=True, sizes=(20,))
    path, idx = local / "part-0.rec", local / "part-0.idx"
    with RecordWriter(str(tmp_path / "late.rec")) as w:
        w.write(b"appended")
    path.write_bytes(path.read_bytes() + (tmp_path / "late.rec").read_bytes())
    aws.upload_file(str(path), bucket, "data/part-0.rec")
    url = f"s3://{bucket}/data/part-0.rec"
    genuine = set(records_of((local / "part-0.rec").read_bytes()))
    for on_error in ("raise", "skip"):
        with ParallelReader(url, shuffle=True, seed=1, on_error=on_error, workers=workers) as reader:
            got = []
            with pytest.raises(IndexMismatch, match=rf"another record follows it there.*byte offset \d+ of {url}"):
                for sample in reader:
                    got.append(bytes(sample))
            assert len(got) < 20 and set(got) <= genuine  # (the records read before it are right)
    lines = idx.read_text().splitlines()
    aws.put_object(Bucket=bucket, Key="data/part-0.idx", Body=("\n".join(lines[:20:2]) + "\n").encode())
    with ParallelReader(url, fields=[Raw(), Raw()], shuffle=True, seed=1, on_error="skip", workers=workers) as reader:
        with pytest.raises(IndexMismatch, match="where another record starts"):
            list(reader)


def test_indexed_objects_hold_no_descriptor_each(aws, tmp_path, no_leaks):
    """Each .idx object was kept in an anonymous file of its own for as long as the reader lived, after
    close() too: one descriptor per indexed object, and a prefix of about 1000 of them failed with EMFILE
    under the common limit of 1024 (local indexed files keep at most a quarter of the limit open)."""
    bucket = new_bucket(aws)
    local = tmp_path / "local"
    local.mkdir()
    for i in range(60):
        write_one(local / f"o{i:02}.rec", [b"%d-%d" % (i, k) for k in range(3)], True)
    for path in sorted(local.iterdir()):
        aws.upload_file(str(path), bucket, f"data/{path.name}")

    def fds() -> int:
        return len(os.listdir("/proc/self/fd"))
    before = fds()
    with ParallelReader(f"s3://{bucket}/data/", shuffle=True, seed=2, workers=0, storage_options=FAST) as reader:
        assert len(reader) == 180
        assert fds() - before < 10
        got = list(reader)
        assert fds() - before < 10
    assert got == two_epochs(str(local), shuffle=True, seed=2, workers=0)[0][0]


def test_a_ranged_read_whose_body_breaks_keeps_what_came(proxy, aws, tmp_path, no_leaks):
    """Every GET of a record (300 KB) broke off after 100 KB: the ranged read dropped the bytes that had
    come and asked again from the same byte, until it gave up ("ranged read failed at byte 0 after 6
    interruption(s)"), where a stream of the same object went on.  What came is kept now, and the next
    GET asks for the rest."""
    bucket = new_bucket(aws)
    local = tmp_path / "local"
    local.mkdir()
    recs = make_payloads(4, seed=5, lo=290_000, hi=310_000)
    write_one(local / "big.rec", recs, True)
    for name in ("big.rec", "big.idx"):
        aws.upload_file(str(local / name), bucket, f"data/{name}")
    proxy.rule("GET", "/data/big.rec", ("cut", 100_000), times=1000)
    for workers in (0, 2):
        with ParallelReader(f"s3://{bucket}/data/", shuffle=True, seed=1, workers=workers,
                            storage_options=FAST) as reader:
            assert sorted(map(bytes, reader)) == sorted(recs)
    ranges = [int(r[6:].split("-")[0]) for _, _, r, _ in proxy.requests("GET", "/data/big.rec")]
    assert len(set(ranges)) >= 12  # (each record in 3-4 GETs, each from where the last one broke off)


def test_index_reads_are_ranged(proxy, aws, tmp_path, no_leaks):
    bucket, _ = write_data(aws, tmp_path, index=True, sizes=(12,))
    two_epochs(f"s3://{bucket}/data/", shuffle=True, workers=0)
    gets = proxy.requests("GET", "/data/part-0.rec")
    assert len(gets) >= 24 and all(r and r.startswith("bytes=") and "-" in r[6:] for _, _, r, _ in gets)


def test_environment_is_the_consumers_under_forkserver(aws, tmp_path, monkeypatch, no_leaks):
    """The fork server was started before AWS_ENDPOINT_URL was set (children inherit its environment,
    not ours): the reader process still uses the consumer's AWS_* settings."""
    from multiprocessing import forkserver
    forkserver.ensure_running()
    bucket, local = write_data(aws, tmp_path, index=False, sizes=(5,))
    source = resolve(f"s3://{bucket}/data/")
    clone = pickle.loads(pickle.dumps(source))  # as it travels to the reader: settings, no client
    assert clone._conn._client is None and clone.objects == source.objects
    got, _ = two_epochs(f"s3://{bucket}/data/", workers=1)
    assert got[0] == records_of((local / "part-0.rec").read_bytes())


def test_storage_options(moto, aws, tmp_path, monkeypatch, no_leaks):
    """Explicit settings instead of the environment; unknown options and options for a local path are
    refused before anything is opened."""
    bucket, local = write_data(aws, tmp_path, index=False, sizes=(8,))
    for name in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    options = {"endpoint_url": moto, "key": "testing", "secret": "testing", "region": "us-east-1"}
    got, _ = two_epochs(f"s3://{bucket}/data/", storage_options=options, workers=1)
    assert got[1] == records_of((local / "part-0.rec").read_bytes())
    with pytest.raises(ValueError, match="unknown option 'endpoint'"):
        ParallelReader(f"s3://{bucket}/data/", storage_options={"endpoint": moto})
    with pytest.raises(ValueError, match="max_attempts"):
        resolve(f"s3://{bucket}/data/", storage_options={"max_attempts": 0})
    with pytest.raises(ValueError, match="s3:// channels only"):
        ParallelReader(str(local), storage_options=options)
    with pytest.raises(SourceError, match="mixes"):
        resolve([f"s3://{bucket}/data/", str(local)])


def test_prefetch_requests_the_next_object_before_the_current_one_ends(proxy, aws, tmp_path, monkeypatch):
    """Read here with small thresholds: object 1's GET is made while object 0 still has bytes left,
    and each object's bytes are exactly the file's."""
    bucket, local = write_data(aws, tmp_path, index=False, sizes=(300, 300), hi=3000)
    monkeypatch.setattr(s3mod, "PREFETCH_AT", 64 << 10)
    monkeypatch.setattr(s3mod, "HEAD_BYTES", 16 << 10)
    monkeypatch.setattr(s3mod, "READ_CHUNK", 8 << 10)
    source = resolve(f"s3://{bucket}/data/")
    assert [o.key for o in source.objects] == ["data/empty.rec", "data/part-0.rec", "data/part-1.rec"]
    streams = source.streams(0)
    first = next(streams)
    assert first.name == f"s3://{bucket}/data/empty.rec" and first.file.read() == b""
    wait_for(lambda: proxy.requests("GET", "/data/part-0.rec"))  # asked for before it is reached
    stream = next(streams)
    data = (local / "part-0.rec").read_bytes()
    head = stream.file.read(len(data) - (32 << 10))  # within 64 KiB of its end: object 1 is asked for
    wait_for(lambda: proxy.requests("GET", "/data/part-1.rec"))
    assert len(proxy.requests("GET", "/data/part-0.rec")) == 1  # one GET, streamed in 8 KiB reads
    assert head + stream.file.read() == data
    stream.file.close()
    last = next(streams)
    assert last.file.read() == (local / "part-1.rec").read_bytes()
    assert next(streams, None) is None
    assert len(proxy.requests("GET", "/data/part-1.rec")) == 1


def wait_for(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


# -- errors ----------------------------------------------------------------------------------------
def test_empty_prefix_is_an_error_naming_it(aws):
    bucket = new_bucket(aws)
    aws.put_object(Bucket=bucket, Key="data/x.idx", Body=b"0\t0\n")
    with pytest.raises(SourceError, match=rf"s3://{bucket}/empty/: no objects under this prefix"):
        ParallelReader(f"s3://{bucket}/empty/")
    with pytest.raises(SourceError, match=rf"s3://{bucket}/data/: no objects"):
        resolve(f"s3://{bucket}/data/")  # only an index: nothing to read
    with pytest.raises(SourceError, match=rf"s3://{bucket}/nope.rec: no such object"):
        resolve(f"s3://{bucket}/nope.rec")


def test_missing_bucket_is_an_error_naming_it(aws):
    with pytest.raises(SourceError, match=r"s3://no-such-bucket-here/data/: no such bucket "
                                          r"'no-such-bucket-here'"):
        ParallelReader("s3://no-such-bucket-here/data/")
    with pytest.raises(SourceError, match="no such bucket"):
        resolve("s3://no-such-bucket-here/key.rec")
    with pytest.raises(SourceError, match="no bucket name"):
        resolve("s3:///key.rec")


def test_access_denied_is_not_retried(proxy, aws, tmp_path, no_leaks):
    bucket, _ = write_data(aws, tmp_path, index=False, sizes=(5,))
    proxy.rule("GET", f"/{bucket}?list-type=2", ("error", 403, "AccessDenied"), times=10)
    with pytest.raises(SourceError, match=rf"s3://{bucket}/data/: access denied.*not retried"):
        resolve(f"s3://{bucket}/data/")
    assert len(proxy.requests("GET", f"/{bucket}?list-type=2")) == 1
    proxy.rules.clear()
    # denied in the reader process: the GET of an object
    proxy.rule("GET", "/data/part-0.rec", ("error", 403, "AccessDenied"), times=10)
    with ParallelReader(f"s3://{bucket}/data/", workers=1) as reader:
        with pytest.raises(SourceError, match=rf"s3://{bucket}/data/part-0.rec: access denied"):
            list(reader)
    assert len(proxy.requests("GET", "/data/part-0.rec")) == 1


def test_throttling_and_5xx_are_retried_then_succeed(proxy, aws, tmp_path, no_leaks):
    bucket, local = write_data(aws, tmp_path, index=False, sizes=(20, 20))
    proxy.rule("GET", f"/{bucket}?list-type=2", ("error", 503, "SlowDown"), times=2)
    proxy.rule("GET", "/data/part-1.rec", ("error", 500, "InternalError"), times=1)
    proxy.rule("GET", "/data/part-1.rec", ("error", 503, "SlowDown"), times=1)
    got, _ = two_epochs(f"s3://{bucket}/data/", workers=2)
    assert got[0] == got[1] == two_epochs(str(local), workers=0)[0][0]
    assert [a for *_, a in proxy.requests("GET", f"/{bucket}?list-type=2")] == ["error", "error", None]
    assert [a for *_, a in proxy.requests("GET", "/data/part-1.rec")] == ["error", "error", None, None]


def test_a_broken_body_is_resumed_with_a_ranged_get(proxy, aws, tmp_path, no_leaks):
    bucket, local = write_data(aws, tmp_path, index=False, sizes=(10,), big=3 << 20)
    proxy.rule("GET", "/data/part-9-big.rec", ("cut", (3 << 20) // 2), times=1)
    got, _ = two_epochs(f"s3://{bucket}/data/", workers=2)
    assert got[0] == got[1] == two_epochs(str(local), workers=0)[0][0]
    gets = proxy.requests("GET", "/data/part-9-big.rec")
    assert gets[0][3] == "cut" and gets[1][2] is not None and gets[1][2].startswith("bytes=")
    assert int(gets[1][2][6:].rstrip("-")) > 0  # resumed where it stopped, not from the start


def test_a_long_read_that_goes_on_is_not_given_up_for_its_interruptions(proxy, aws, tmp_path, monkeypatch,
                                                                          no_leaks):
    """An object gave up after 4x max_attempts interruptions in all, however far each resumed GET got: a
    10 GB object over a link that resets every few hundred MB was never read.  One more interruption is
    allowed per FORGIVEN_EVERY bytes read (64 MiB; 256 KiB here, for a 3 MiB object cut every 200 KB).
    A server that cuts every body after a few bytes still ends the read."""
    import parrecio.sources.s3 as s3mod
    monkeypatch.setattr(s3mod, "FORGIVEN_EVERY", 256 << 10, raising=False)
    bucket, local = write_data(aws, tmp_path, index=False, sizes=(5,), big=3 << 20)
    proxy.rule("GET", "/data/part-9-big.rec", ("cut", 200_000), times=1000)
    expected = two_epochs(str(local), workers=0)[0][0]
    with ParallelReader(f"s3://{bucket}/data/", workers=0, storage_options=FAST) as reader:
        assert list(reader) == expected
    cuts = [e for e in proxy.requests("GET", "/data/part-9-big.rec") if e[3] == "cut"]
    assert len(cuts) > 4 * FAST["max_attempts"] + 1  # (more than the old bound, each one resumed)
    _quiet(proxy)
    proxy.rules.clear()
    proxy.rule("GET", "/data/part-9-big.rec", ("cut", 1000), times=1000)
    with pytest.raises(SourceError, match=r"part-9-big.rec: reading failed at byte \d+ of \d+ after 9 "
                                          r"interruption\(s\)"):
        with ParallelReader(f"s3://{bucket}/data/", workers=0, storage_options=FAST) as reader:
            list(reader)


def _quiet(proxy, seconds: float = 0.5, timeout: float = 20) -> None:
    """Wait until the proxy has had no request for ``seconds``."""
    end = time.monotonic() + timeout
    seen = -1
    while time.monotonic() < end:
        n = len(proxy.log)
        if n == seen:
            return
        seen = n
        time.sleep(seconds)
    raise AssertionError(f"the proxy was still asked after {timeout} s")


@pytest.mark.parametrize("how", ["index", "resume"])
def test_a_server_that_ignores_range_is_an_error_not_other_records(proxy, aws, tmp_path, how, no_leaks):
    """A ranged GET answered 200 with the whole object (HTTP allows a server or proxy to ignore Range)
    was taken for the bytes asked for: an indexed shuffle delivered the object's first record in place
    of others (rec000 four times, three records missing, no error), a resumed stream repeated its first
    half.  Now a SourceError that says so, after records that are all right."""
    bucket, local = write_data(aws, tmp_path, index=how == "index", sizes=(12,),
                               big=3 << 20 if how == "resume" else None)
    url = f"s3://{bucket}/data/"  # (the proxy answers a HEAD without its length: a prefix is listed)
    kw = dict(shuffle=True) if how == "index" else {}
    expected = two_epochs(str(local), workers=0)[0][0]
    if how == "index":
        proxy.rule("GET", "/data/part-0.rec", ("norange",), times=3)
    else:
        proxy.rule("GET", "/data/part-9-big.rec", ("cut", (3 << 20) // 2), times=1)
        proxy.rule("GET", "/data/part-9-big.rec", ("norange",), times=1)
    for workers in (0, 2):
        got = []
        with pytest.raises(SourceError, match=r"was answered with no Content-Range \(HTTP 200\): the server, or a "
                                              r"proxy between, did not honour the Range header"):
            with ParallelReader(url, workers=workers, storage_options=FAST, **kw) as reader:
                for p in reader:
                    got.append(bytes(p))
        assert len(got) < len(expected) and len(set(got)) == len(got)
        assert set(got) <= set(expected) if how == "index" else got == expected[:len(got)]
        # (GETs the closed reader's read-ahead had in flight run to their end, discarded: they must not
        # take the rules meant for the next reader)
        _quiet(proxy)
        proxy.rules.clear()
        if how == "index":
            proxy.rule("GET", "/data/part-0.rec", ("norange",), times=3)
        else:
            proxy.rule("GET", "/data/part-9-big.rec", ("cut", (3 << 20) // 2), times=1)
            proxy.rule("GET", "/data/part-9-big.rec", ("norange",), times=1)


def test_unreachable_endpoint_is_a_clear_error_without_hang(aws, monkeypatch):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    t0 = time.monotonic()
    with pytest.raises(SourceError, match=r"s3://bucket/data/: listing the objects failed after 2 attempt"):
        ParallelReader("s3://bucket/data/", storage_options=FAST)
    assert time.monotonic() - t0 < 15


def test_persistent_failures_in_the_reader_end_with_a_clear_error(proxy, aws, tmp_path, no_leaks):
    """Every GET of an object fails (5xx), or the server never answers: after the bounded retries
    the pass raises a SourceError naming the object, within seconds, and nothing is left behind."""
    bucket, _ = write_data(aws, tmp_path, index=False, sizes=(10, 10))
    proxy.rule("GET", "/data/part-1.rec", ("error", 503, "ServiceUnavailable"), times=100)
    t0 = time.monotonic()
    with ParallelReader(f"s3://{bucket}/data/", workers=1, storage_options=FAST) as reader:
        got = []
        with pytest.raises(SourceError, match=rf"s3://{bucket}/data/part-1.rec: GET failed after 2 "
                                              r"attempt\(s\): ServiceUnavailable"):
            for item in reader:
                got.append(item)
        assert len(got) == 10  # the first object was delivered before the error
    assert time.monotonic() - t0 < 20
    proxy.rule("GET", "/data/part-0.rec", ("hang",), times=100)
    t0 = time.monotonic()
    with ParallelReader(f"s3://{bucket}/data/", workers=0, storage_options=FAST) as reader:
        with pytest.raises(SourceError, match=rf"s3://{bucket}/data/part-0.rec: GET failed.*Timeout"):
            list(reader)
    assert time.monotonic() - t0 < 20
    proxy.release()


def test_close_while_the_reader_waits_for_a_hung_server(proxy, aws, tmp_path, no_leaks):
    bucket, _ = write_data(aws, tmp_path, index=False, sizes=(10,))
    proxy.rule("GET", "/data/part-0.rec", ("hang",), times=100)
    reader = ParallelReader(f"s3://{bucket}/data/", workers=1)  # default timeouts: 30 s a read
    it = iter(reader)
    threading.Timer(1.0, reader.close).start()
    t0 = time.monotonic()
    with pytest.raises(PipelineError, match="close"):
        next(it)
    assert time.monotonic() - t0 < 10
    proxy.release()


def test_close_from_another_thread_ends_a_workers_0_read_of_a_stalled_body(proxy, aws, tmp_path, no_leaks):
    """workers=0 reads in the user's thread: a body that stops mid-way (the server holds the connection,
    every resumed GET stalls too) is given up after one read timeout once close() came, with the
    PipelineError of a closed reader.  It went on for every resume (max_attempts x read_timeout each):
    13 s and a SourceError here, 3.5 minutes with the default options."""
    bucket, _ = write_data(aws, tmp_path, index=False, sizes=(2,), big=3 << 20)
    proxy.rule("GET", "/data/part-9-big.rec", ("stall", 2 << 20))
    proxy.rule("GET", "/data/part-9-big.rec", ("hang",), times=100)  # (the resumed GETs)
    opts = dict(max_attempts=5, connect_timeout=2, read_timeout=2)
    reader = ParallelReader(f"s3://{bucket}/data/", workers=0, storage_options=opts)
    try:
        it = iter(reader)
        assert len(next(it)) > 0  # part-0.rec's first record: the big object's GET is sent ahead
        threading.Timer(0.5, reader.close).start()
        t0 = time.monotonic()
        with pytest.raises(PipelineError, match="close"):
            for _ in it:
                pass
        assert time.monotonic() - t0 < 8  # one read timeout (2 s) after the close, and a margin
    finally:
        proxy.release()
        reader.close()


# -- SageMaker-style concat objects (multipart records, groups of two) --------------------------------
from parrecio import Tuning  # noqa: E402
from parrecio.recordio.wrapper import write_sagemaker_recordio  # noqa: E402


def write_concat_data(client, tmp_path, *, per_object=100_000, objects=3, split=10_000, seed=0):
    """An augmented-manifest-like stream in SageMaker's wrapper framing: groups of two records, an
    "image" of 0 B to 90 KB (split into parts of ``split`` bytes when larger, joined by concatenation)
    then a small "label", ``objects`` objects of about ``per_object`` bytes, each holding whole groups
    (as a SageMaker channel's objects do).  No ``.rec`` names: the directory rule takes every object.
    The same files in tmp_path/local.  Returns (bucket, local dir, the groups in stream order)."""
    bucket = new_bucket(client)
    local = tmp_path / "local"
    local.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    groups = []
    for i in range(objects):
        mine, nbytes = [], 0
        while nbytes < per_object:
            lo, hi = [(0, 100), (1_000, 8_000), (30_000, 90_000)][int(rng.integers(3))]
            image, label = make_payloads(2, seed=int(rng.integers(1 << 30)), lo=lo, hi=hi)
            label = label[:int(rng.integers(20, 200))]
            mine.append((image, label))
            nbytes += len(image) + len(label)
        with open(local / f"shard-{i}", "wb") as f:
            write_sagemaker_recordio([p for g in mine for p in g], f, split)
        client.upload_file(str(local / f"shard-{i}"), bucket, f"train/shard-{i}")
        groups += mine
    assert any(len(image) > split for image, _ in groups)  # multipart records, cflag 1 (2) 3
    return bucket, local, groups


CONCAT = dict(fields=[Raw(), Raw()], join="concat")


def test_prefix_of_concat_objects_equals_local_directory(aws, tmp_path, no_leaks):
    """Several objects of a join="concat" stream with multipart records of very different sizes: the
    groups, byte-exact and in stream order, two epochs, with workers 0, 1 and 2, and as the local
    directory of the same bytes reads them (each object, like each file, a stream of whole records).
    The objects' ring windows took the ring's head past 16 MiB after about 250 KB of data, where held
    groups (every multipart record is copied) met the early wrap (the reader crashed writing a
    group's second record at offset -1)."""
    bucket, local, groups = write_concat_data(aws, tmp_path)
    url = f"s3://{bucket}/train/"
    assert [o.key for o in resolve(url).objects] == [f"train/shard-{i}" for i in range(3)]
    assert 250_000 < sum(o.size for o in resolve(url).objects) < 450_000  # about 350 KB
    expected, _ = two_epochs(str(local), workers=0, **CONCAT)
    assert expected == [groups, groups]
    assert two_epochs(str(local), workers=2, **CONCAT)[0] == expected
    for workers in (0, 1, 2):
        got, cfg = two_epochs(url, workers=workers, **CONCAT)
        assert got == expected, workers
        assert cfg.index_paths == ()


def test_prefix_of_concat_objects_shuffled_each_group_once(aws, tmp_path, no_leaks):
    """shuffle=True (a shuffle buffer: no .idx objects): every group exactly once per epoch, whole,
    the same order with workers 1 and 2 as with workers=0 and as the local directory, for one seed."""
    bucket, local, groups = write_concat_data(aws, tmp_path, seed=1)
    url = f"s3://{bucket}/train/"
    shuffled = dict(shuffle=True, seed=11, shuffle_buffer=16, **CONCAT)
    expected, cfg = two_epochs(url, workers=0, **shuffled)
    assert cfg.shuffle_mode == "buffer"
    for epoch in expected:
        assert sorted(epoch) == sorted(groups) and len(epoch) == len(groups)
    assert expected[0] != groups and expected[0] != expected[1]
    for workers in (1, 2):
        assert two_epochs(url, workers=workers, **shuffled)[0] == expected, workers
    assert two_epochs(str(local), workers=0, **shuffled)[0] == expected


def test_prefix_of_concat_objects_through_a_small_ring(aws, tmp_path, no_leaks):
    """A 1 MiB input ring (128 KiB windows, records of up to 90 KB) wraps many times over about 3 MB
    of objects: the same groups as the local directory, with workers 1, 2 and 0, unshuffled and
    shuffled."""
    bucket, local, groups = write_concat_data(aws, tmp_path, per_object=1_000_000, seed=2)
    url = f"s3://{bucket}/train/"
    small = dict(tuning=Tuning(ring_bytes=1 << 20), **CONCAT)
    for workers in (1, 2, 0):
        got, cfg = two_epochs(url, workers=workers, **small)
        assert got == [groups, groups], workers
        assert cfg.ring_bytes == 1 << 20
    shuffled = dict(shuffle=True, seed=5, **small)
    expected, _ = two_epochs(str(local), workers=0, **shuffled)
    assert sorted(expected[0]) == sorted(groups)
    for workers in (2, 0):
        assert two_epochs(url, workers=workers, **shuffled)[0] == expected, workers


# -- an object must be the one that was listed, in every pass ---------------------------------------
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("index", [False, True])
@pytest.mark.parametrize("change", ["same length", "longer", "shorter"])
def test_an_object_rewritten_between_epochs_is_refused(aws, tmp_path, workers, index, change, no_leaks):
    """Epoch 0 reads the listed objects; one is rewritten; epoch 1 raises a SourceError naming it
    (every GET sends If-Match with the listed ETag), instead of reading the new records silently."""
    bucket, local = write_data(aws, tmp_path, index=index, sizes=(30, 20))
    url = f"s3://{bucket}/data/part-1.rec"
    with ParallelReader(f"s3://{bucket}/data/", workers=workers) as reader:
        first = list(reader)
        assert first == two_epochs(str(local), workers=0)[0][0]
        n = {"same length": 20, "longer": 25, "shorter": 12}[change]
        payloads = [p[::-1] for p in make_payloads(20, seed=1, hi=3000)][:n]  # same sizes, other bytes
        if change == "longer":
            payloads += make_payloads(5, seed=7, hi=3000)
        path = tmp_path / "new.rec"
        write_one(path, payloads, index)
        aws.upload_file(str(path), bucket, "data/part-1.rec")
        if index:
            aws.upload_file(str(path.with_suffix(".idx")), bucket, "data/part-1.idx")
        with pytest.raises(SourceError, match=r"the object changed since it was listed") as info:
            list(reader)
        assert url in str(info.value)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_response_shorter_than_the_listed_size_is_refused(proxy, aws, tmp_path, workers, no_leaks):
    """A 200 whose body and Content-Length are shorter than the listing says: an error naming both
    sizes, not the records that happen to be in it (60 of 100 before)."""
    bucket, local = write_data(aws, tmp_path, index=False, sizes=(100,), hi=80)
    size = (local / "part-0.rec").stat().st_size
    proxy.rule("GET", "/data/part-0.rec", ("short", size * 6 // 10), times=1)
    with ParallelReader(f"s3://{bucket}/data/", workers=workers) as reader:
        with pytest.raises(SourceError, match=rf"part-0.rec: the GET answered {size * 6 // 10} bytes "
                                              rf"\(Content-Length\) where the listing has {size}"):
            list(reader)
        assert reader.stats.samples < 100
        assert list(reader) == two_epochs(str(local), workers=0)[0][0]  # the next GET is whole again


def test_every_get_of_every_pass_sends_the_listed_etag(proxy, aws, tmp_path, no_leaks):
    bucket, local = write_data(aws, tmp_path, index=False, sizes=(10, 10))
    etags = {o["Key"]: o["ETag"] for o in aws.list_objects_v2(Bucket=bucket, Prefix="data/")["Contents"]}
    seen = []
    real = s3mod._call

    def spy(conn, url, doing, op, **kwargs):
        if op == "get_object":
            seen.append((kwargs["Key"], kwargs.get("IfMatch")))
        return real(conn, url, doing, op, **kwargs)

    import unittest.mock
    with unittest.mock.patch.object(s3mod, "_call", spy):
        two_epochs(f"s3://{bucket}/data/", workers=0)
    objects = [k for k, _ in seen if k.endswith(".rec")]
    assert sorted(set(objects)) == ["data/empty.rec", "data/part-0.rec", "data/part-1.rec"]
    assert len(objects) == 6 and all(tag == etags[k] for k, tag in seen)


# -- what reaches us is what was listed ---------------------------------------------------------------
@pytest.mark.parametrize("big, where", [(False, "first"), (False, "last"), (True, "first"), (True, "last")])
@pytest.mark.parametrize("workers", [0, 2])
def test_a_byte_damaged_on_the_way_is_refused_by_the_servers_checksum(proxy, aws, tmp_path, workers, big, where,
                                                                      no_leaks):
    """S3 sends a checksum of the whole object (x-amz-checksum-*; boto3 stores a CRC32 with every upload),
    and botocore compares it only when a body is read to its end.  The stream stopped at the listed size
    (a small object's head read took exactly all of it): a byte changed on the way was delivered in its
    record, with no error.  Now the body is read to its end before its last bytes are handed on, and the
    mismatch is a SourceError naming the object: an object of up to 1 MiB delivers no record; a larger
    one may deliver the records before the damage (they come before the end), never its last."""
    bucket, local = write_data(aws, tmp_path, index=False, sizes=(40,), big=3 << 20 if big else None)
    name = "part-9-big.rec" if big else "part-0.rec"
    size = (local / name).stat().st_size
    proxy.rule("GET", f"/data/{name}", ("flip", 20 if where == "first" else size - 1000), times=1)
    expected = two_epochs(str(local), workers=0)[0][0]
    first = expected.index(two_epochs(str(local / name), workers=0)[0][0][0])  # the object's first record
    got = []
    with ParallelReader(f"s3://{bucket}/data/", workers=workers, storage_options=FAST) as reader:
        with pytest.raises(SourceError, match=rf"data/{name}: its bytes do not match the checksum the server "
                                              rf"sent for them \(Expected checksum .* did not match"):
            for p in reader:
                got.append(bytes(p))
        if not big:
            assert got == expected[:first]  # (the objects before it) and none of this one
        elif where == "last":
            assert got == expected[:len(got)] and len(got) < len(expected)
        else:
            assert first <= len(got) < len(expected) and got[:first] == expected[:first]
        assert list(reader) == expected  # the next GET is right again


@pytest.mark.parametrize("workers", [0, 2])
def test_a_server_that_ignores_if_match_cannot_mix_versions(proxy, aws, tmp_path, workers, no_leaks):
    """A server (or proxy) that ignores If-Match answered a rewritten object with 200: a rewrite of the
    same size was read whole, and one between a broken body and its resume gave the start of one version
    and the rest of another (then a misleading CorruptRecordError).  Now the answer's ETag, and a ranged
    answer's Content-Range total, are compared with the listing's: a SourceError naming the object."""
    bucket, local = write_data(aws, tmp_path, index=False, sizes=(), big=3 << 20)
    key = "data/part-9-big.rec"
    data = (local / "part-9-big.rec").read_bytes()
    expected = two_epochs(str(local), workers=0)[0][0]
    # a rewrite of the same size after the listing
    reader = ParallelReader(f"s3://{bucket}/data/", workers=workers, storage_options=FAST)
    with reader:
        aws.put_object(Bucket=bucket, Key=key, Body=data[:-8] + b"\0" * 8)
        proxy.rule("GET", key, ("noifmatch",), times=1)
        with pytest.raises(SourceError, match=r"part-9-big.rec: the object changed since it was listed or its "
                                              r"reading began \(GET: its ETag is .*, the listing's .*did not "
                                              r"refuse it by If-Match\)"):
            list(reader)
    # a larger rewrite between a broken body and its resume
    aws.put_object(Bucket=bucket, Key=key, Body=data)
    got = []
    with ParallelReader(f"s3://{bucket}/data/", workers=workers, storage_options=FAST) as reader:
        proxy.rules.clear()
        rewrite = lambda: aws.put_object(Bucket=bucket, Key=key, Body=data + data[:4096])  # noqa: E731
        proxy.rule("GET", key, ("cut", len(data) // 2, rewrite), times=1)  # (rewritten before the resume)
        proxy.rule("GET", key, ("noifmatch",), times=1)
        with pytest.raises(SourceError, match=rf"the object changed since it was listed or its reading began "
                                              rf"\(GET from byte \d+: its ETag is .*"):
            for p in reader:
                got.append(bytes(p))
    assert got == expected[:len(got)] and len(got) < len(expected)


def test_a_closed_reader_leaves_no_thread_that_holds_up_the_exit(proxy, aws, tmp_path, no_leaks):
    """workers=0 reads ahead by index on a pool of threads: with the server hung, close() returned at once
    but those threads (a ThreadPoolExecutor's, joined at exit) kept sending GETs and retries, and the
    program could not exit for 20 s (3 minutes with the default timeouts).  Now they are daemon threads and
    send nothing more once closed; a child process that closes such a reader exits at once."""
    import subprocess
    import sys
    import textwrap
    bucket, _ = write_data(aws, tmp_path, sizes=(200,), hi=500)
    script = tmp_path / "exit.py"
    script.write_text(textwrap.dedent(f"""\
        import os, sys, time
        from parrecio import ParallelReader

        def main():
            opts = dict(max_attempts=3, connect_timeout=2, read_timeout=5)
            with ParallelReader("s3://{bucket}/data/", workers=0, shuffle=True, batch_size=4,
                                storage_options=opts) as r:
                next(iter(r))
                with open(sys.argv[1], "w") as f:
                    f.write("hang")  # the test hangs the server now
                time.sleep(1.0)
            print("closed", time.time(), flush=True)

        if __name__ == "__main__":
            main()
        """))
    flag = tmp_path / "flag"
    proc = subprocess.Popen([sys.executable, str(script), str(flag)], stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    try:
        wait_for(flag.exists, timeout=60)
        proxy.rule("GET", "/data/part-0.rec", ("hang",), times=10_000)
        out, _ = proc.communicate(timeout=60)
        ended = time.time()
    finally:
        proc.kill()
        proxy.release()
    closed = float(out.split()[1])
    assert proc.returncode == 0 and ended - closed < 3, (out, ended - closed)


def test_an_index_whose_body_breaks_twice_says_so(proxy, aws, tmp_path, no_leaks):
    """The .idx body is read twice at most (it is small); the error said "failed after 2 attempt(s)",
    botocore's count of the GET's own tries, which had all succeeded."""
    bucket, local = write_data(aws, tmp_path, sizes=(30,))
    proxy.rule("GET", "/data/part-0.idx", ("cut", 10), times=2)
    with pytest.raises(SourceError, match=r"data/part-0.idx: reading the index failed twice, each time after its "
                                          r"GET was answered \("):
        with ParallelReader(f"s3://{bucket}/data/", workers=0, shuffle=True, storage_options=FAST) as reader:
            list(reader)
    assert [e[3] for e in proxy.requests("GET", "/data/part-0.idx")][:2] == ["cut", "cut"]


@pytest.mark.parametrize("listed, answered, same", [
    ('"abc"', '"abc"', True), ('"abc"', "abc", True), ('"abc"', 'W/"abc"', True), ("abc", '"abc"', True),
    ('"abc-2"', '"abc-2"', True), ('"abc"', '"abd"', False), ('"abc"', 'W/"abd"', False)])
def test_an_etag_is_compared_without_its_quotes_or_weak_mark(listed, answered, same):
    """Servers and proxies quote ETags differently: only another value is another version."""
    class Body:
        closed = False

        def close(self):
            self.closed = True

    body = Body()
    resp = {"ETag": answered, "Body": body}
    if same:
        s3mod._check_version(resp, "s3://b/k.rec", "GET", listed, 10)
        assert not body.closed
    else:
        with pytest.raises(SourceError, match=r"s3://b/k.rec: the object changed since it was listed"):
            s3mod._check_version(resp, "s3://b/k.rec", "GET", listed, 10)
        assert body.closed
    with pytest.raises(SourceError, match="Content-Range says 11 bytes, the listing 10"):
        s3mod._check_version({"ContentRange": "bytes 5-10/11", "Body": body}, "s3://b/k.rec", "GET", listed, 10)
