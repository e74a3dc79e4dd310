"""``s3://`` channels: the objects under a prefix (or one object) as one RecordIO stream, every epoch.

```
 consumer process                                   reader process
 resolve("s3://b/data/")                            S3Source.streams(e)
   list the prefix once (key order), apply the        GET object 0 --stream--> ring windows
   directory rule, note the .idx objects              ... 32 MiB before its end: a thread GETs object 1
   -> S3Source (settings, listing; no client)         and reads its first 1 MiB; object 1 starts at once
```

**Which objects.**  ``s3://bucket/prefix/`` (or ``s3://bucket``) lists every key under the prefix,
recursively, in S3's key order (the order SageMaker's File mode lays out a channel, and the "name order"
of :func:`parrecio.sources.files.list_recordio_files` with ``recursive``): the ``*.rec`` objects; if there
are none, every object except ``*.idx`` / ``*.lst``.  Keys with a hidden part (``.x`` after the prefix)
and folder markers (keys ending in ``/``) never count.  ``s3://bucket/key`` is that one object if it
exists, else the prefix ``key/``.  The listing is made once, in the consumer (errors come early, every
epoch reads the same objects); each epoch GETs them again.  A list of ``s3://`` URLs is read in order.

**Streaming.**  An object is read with one GET, in reads of at most 256 KiB straight into the input ring
(``readinto``), never whole in memory.  When the reader comes within 32 MiB of an object's end (or at its
start for smaller ones), a thread GETs the next object and reads its first 1 MiB, so that no gap of
request latency opens between objects.  A body that breaks off (a reset, a read timeout, a connection
dropped while a slow consumer paused the reader) is resumed with a ranged GET from the byte it stopped
at.  Every GET of every pass (the first, a resumed one, a ranged read by the index) sends ``If-Match``
with the ETag of the listing, and a response whose length is not the listed size is refused: the
listing is made once per reader, so an object rewritten since (between epochs, or while it is read) is
a :class:`~parrecio.errors.SourceError` that says so, never a pass that mixes versions or reads a
different object silently.  To read new versions, make a new reader.

**Indexed shuffling.**  When every object has its ``.idx`` beside it (the one rule of
:func:`parrecio.recordio.paths.index_path`), :meth:`S3Source.index_pairs` gives the pipeline
``(url, S3Index)`` pairs and ``shuffle=True`` draws the same global permutation as for local files;
:class:`S3IndexedReader` reads each record with a ranged GET (``Range: bytes=offset-next_offset``), with
``read_ahead`` (16) groups of the epoch's order in flight on a thread pool (latency, not bandwidth, is
what limits random reads of S3).  The ``.idx`` objects are fetched by the process that needs them, in
parallel; an :class:`S3Index` keeps the bytes of its ``.idx`` (``index_bytes()``), which ``read_index``
(``len(reader)``, the readers by index) parses as a local ``.idx`` file's.

**Errors** name the URL: an empty prefix, no such bucket, no such key and access denied are a
:class:`~parrecio.errors.SourceError` at once (never retried).  Connection failures, timeouts, 5xx and
throttling (``SlowDown``, 429, ``RequestTimeout``) are retried by botocore's ``standard`` retry mode,
``max_attempts`` (5) attempts in all with exponential backoff and full jitter (base 1 s, at most 20 s
a wait); a broken body is resumed the same number of times without progress (and at most 4x that in all
per object, plus one per ``FORGIVEN_EVERY`` bytes read), after 0.2, 0.4, ... s (at most 5 s); then a
``SourceError`` that names the URL, the byte and the last cause.  Every request has a
``connect_timeout`` (10 s) and a ``read_timeout`` (30 s), so no wait is unbounded; the pipeline's own
liveness (``close()`` kills a reader stuck in a read after a second, the lifeline ends it when the
consumer dies) holds as for any stream.

**Configuration** is the standard AWS one, read by botocore: ``AWS_ENDPOINT_URL`` /
``AWS_ENDPOINT_URL_S3``, ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN``,
``AWS_PROFILE`` and the shared config files, instance and container roles, ``AWS_DEFAULT_REGION``.
``storage_options=`` (a dict, through :func:`parrecio.sources.resolver.resolve`) says anything
explicitly: ``endpoint_url``, ``region_name``, ``profile_name``, ``aws_access_key_id``,
``aws_secret_access_key``, ``aws_session_token`` (s3fs's ``key``, ``secret``, ``token``, ``profile``,
``region`` too), ``anon`` (unsigned requests, public buckets), ``max_attempts``, ``connect_timeout``,
``read_timeout``, ``read_ahead``, and ``config_kwargs`` / ``client_kwargs`` passed to
``botocore.config.Config`` / ``session.client("s3", ...)``.  The ``AWS_*`` environment is taken when the
source is made and applied in the reader process: under ``forkserver`` children inherit the environment
of the fork server, started once, not the consumer's of the moment.

**The client library: boto3** (``pip install 'parrecio[s3]'``; botocore underneath).  Chosen over
fsspec + s3fs because: it pulls 6 small pure-Python packages (botocore, s3transfer, jmespath,
python-dateutil, six, urllib3; never Pillow) where s3fs pulls aiobotocore, aiohttp and 10 more, with
botocore pinned to aiobotocore's range, which breaks other boto3 users in the environment; it installs
in about 5 s; ranged GETs and ``If-Match`` are one keyword each; its ``standard`` retry mode is AWS's
documented policy, configurable in one place; and it is synchronous: s3fs runs an asyncio event loop in
a thread of its own, which is not fork-safe and must be re-made in every child.  Clients are never
pickled and never cross a fork: each process makes its own on first use (:class:`_Conn`), so the
source travels to the reader process under every start method.
"""

from __future__ import annotations

import bisect
import io
import os
import random
import threading
import time
import weakref
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from ..errors import CorruptRecordError, SourceError
from ..recordio.framing import DEFAULT_MAX_RECORD_BYTES, HEADER_SIZE, check_join, read_record
from ..recordio.index import WindowSource, check_end, spans_of
from ..recordio.paths import index_path, recordio_names
from ..recordio.joins import IndexedJoin
from .base import Source, Stream
from .daemon_pool import DaemonPool
from .fifo import check_stop

__all__ = ["S3Source", "S3Index", "S3IndexedReader", "is_s3_url", "parse_url", "check_storage_options"]

SCHEME = "s3://"
FORGIVEN_EVERY = 64 << 20     # one more interruption allowed an object per this many bytes read
READ_CHUNK = 256 << 10        # bytes asked of the body per read: records flow even from a slow stream
HEAD_BYTES = 1 << 20          # bytes of the next object read ahead by the prefetch thread
PREFETCH_AT = 32 << 20        # the next object's GET starts this many bytes before the current one ends
_SPAN_READ = 64 << 10         # bytes asked for when a record's span is unknown (index reads)
INFLIGHT_BYTES = 64 << 20     # index reads in flight: at most about this many bytes of spans
_RESUME_BACKOFF = 0.2         # seconds before the first resume of a broken body (doubles, at most 5 s)

DEFAULTS = {"max_attempts": 5, "connect_timeout": 10.0, "read_timeout": 30.0, "read_ahead": 16}
_ALIASES = {"key": "aws_access_key_id", "secret": "aws_secret_access_key", "token": "aws_session_token",
            "profile": "profile_name", "region": "region_name"}
_SESSION_KEYS = ("aws_access_key_id", "aws_secret_access_key", "aws_session_token", "profile_name",
                 "region_name")
_KNOWN = frozenset(_SESSION_KEYS + ("endpoint_url", "anon", "config_kwargs", "client_kwargs")
                   + tuple(DEFAULTS))

# error codes that retrying cannot fix (the request is refused as it is)
_DENIED = frozenset({"AccessDenied", "403", "Forbidden", "InvalidAccessKeyId", "SignatureDoesNotMatch",
                     "ExpiredToken", "InvalidToken", "AccountProblem", "AllAccessDisabled",
                     "InvalidObjectState"})
_MISSING_KEY = frozenset({"NoSuchKey", "404", "NotFound"})


def is_s3_url(channel: Any) -> bool:
    return isinstance(channel, str) and channel.startswith(SCHEME)


def parse_url(url: str) -> Tuple[str, str]:
    """``"s3://bucket/some/key"`` -> ``("bucket", "some/key")``; SourceError for a URL without a bucket."""
    if not is_s3_url(url):
        raise SourceError(f"not an s3:// URL: {url!r}")
    bucket, _, key = url[len(SCHEME):].partition("/")
    if not bucket:
        raise SourceError(f"{url!r}: no bucket name (expected s3://bucket/prefix/ or s3://bucket/key)")
    return bucket, key


def check_storage_options(options: Optional[dict]) -> Dict[str, Any]:
    """The validated ``storage_options`` (aliases resolved, defaults filled in); ValueError / TypeError
    naming the option otherwise."""
    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise TypeError(f"storage_options must be a dict, not {type(options).__name__}")
    out: Dict[str, Any] = dict(DEFAULTS)
    for name, value in options.items():
        key = _ALIASES.get(name, name)
        if key not in _KNOWN:
            raise ValueError(f"storage_options: unknown option {name!r}; known: "
                             f"{', '.join(sorted(_KNOWN | set(_ALIASES)))}")
        out[key] = value
    for name in ("max_attempts", "read_ahead"):
        v = out[name]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"storage_options[{name!r}] must be an int >= 1, not {v!r}")
    for name in ("connect_timeout", "read_timeout"):
        v = out[name]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise ValueError(f"storage_options[{name!r}] must be a number of seconds > 0, not {v!r}")
        out[name] = float(v)
    for name in ("config_kwargs", "client_kwargs"):
        if name in out and not isinstance(out[name], dict):
            raise TypeError(f"storage_options[{name!r}] must be a dict, not {type(out[name]).__name__}")
    return out


def _import_boto3():
    try:
        import boto3
        import botocore.config
    except ImportError as exc:
        raise ImportError("reading s3:// channels needs boto3: pip install 'parrecio[s3]' "
                          f"(or pip install boto3): {exc}") from exc
    return boto3, botocore.config


# -- clients, one per process -------------------------------------------------------------------------
_LOCK = threading.Lock()


def _after_fork() -> None:
    global _LOCK
    _LOCK = threading.Lock()  # another thread of the parent may have held it at the fork


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


class _Conn:
    """How to reach the bucket: the validated options and the ``AWS_*`` environment when the source was
    made.  Picklable; its client is made in the process that uses it, on first use, and never leaves it
    (not pickled, and not used after a fork: a child makes its own)."""

    def __init__(self, options: Dict[str, Any]) -> None:
        self.options = options
        self.env = {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
        self._home = os.getpid()
        self._client: Any = None
        self._client_pid = 0

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_client"], state["_client_pid"] = None, 0
        return state

    @property
    def max_attempts(self) -> int:
        return self.options["max_attempts"]

    def client(self) -> Any:
        pid = os.getpid()
        if self._client is not None and self._client_pid == pid:
            return self._client
        with _LOCK:
            if self._client is None or self._client_pid != pid:
                if pid != self._home:  # another process (the reader): the consumer's AWS_* environment
                    for k in [k for k in os.environ if k.startswith("AWS_") and k not in self.env]:
                        del os.environ[k]
                    os.environ.update(self.env)
                self._client = self._make()
                self._client_pid = pid
        return self._client

    def _make(self) -> Any:
        boto3, bconfig = _import_boto3()
        o = self.options
        session = boto3.session.Session(**{k: o[k] for k in _SESSION_KEYS if o.get(k) is not None})
        cfg = dict(retries={"mode": "standard", "max_attempts": o["max_attempts"]},
                   connect_timeout=o["connect_timeout"], read_timeout=o["read_timeout"],
                   max_pool_connections=o["read_ahead"] + 4)
        if o.get("anon"):
            import botocore
            cfg["signature_version"] = botocore.UNSIGNED
        cfg.update(o.get("config_kwargs") or {})
        kwargs = dict(o.get("client_kwargs") or {})
        if o.get("endpoint_url"):
            kwargs["endpoint_url"] = o["endpoint_url"]
        try:
            return session.client("s3", config=bconfig.Config(**cfg), **kwargs)
        except Exception as exc:  # a bad profile, region or endpoint: say so, naming the settings
            raise SourceError(f"cannot make an S3 client ({type(exc).__name__}: {exc})") from exc

    def endpoint(self) -> str:
        try:
            return str(self.client().meta.endpoint_url)
        except Exception:
            return "?"


# -- errors -------------------------------------------------------------------------------------------
def _code(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        err = response.get("Error") or {}
        code = err.get("Code") or response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return str(code or "")
    return ""


def _error(conn: _Conn, url: str, exc: BaseException, doing: str) -> SourceError:
    """A SourceError naming the URL for what botocore raised while ``doing`` something."""
    import botocore.exceptions as bex
    code = _code(exc)
    bucket, _ = parse_url(url)
    if isinstance(exc, bex.NoCredentialsError):
        msg = (f"{url}: no AWS credentials found ({doing}): set AWS_ACCESS_KEY_ID and "
               f"AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or storage_options=dict(key=..., secret=...), or "
               f"storage_options=dict(anon=True) for a public bucket")
    elif code == "NoSuchBucket":
        msg = f"{url}: no such bucket {bucket!r} (endpoint {conn.endpoint()})"
    elif code in _MISSING_KEY:
        msg = f"{url}: no such object (endpoint {conn.endpoint()})"
    elif code in _DENIED:
        msg = (f"{url}: access denied ({doing}: {code}: {_message(exc)}); check the credentials, the "
               f"bucket policy and the region (endpoint {conn.endpoint()}); not retried")
    elif code == "PreconditionFailed":
        msg = (f"{url}: the object changed since it was listed or its reading began ({doing}: its ETag "
               f"differs); make a new reader to read the new version")
    elif isinstance(exc, bex.ClientError):
        msg = (f"{url}: {doing} failed after {conn.max_attempts} attempt(s): {code}: {_message(exc)} "
               f"(endpoint {conn.endpoint()})")
    else:
        msg = (f"{url}: {doing} failed after {conn.max_attempts} attempt(s): {type(exc).__name__}: {exc} "
               f"(endpoint {conn.endpoint()})")
    err = SourceError(msg)
    err.__cause__ = exc
    return err


def _message(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str((response.get("Error") or {}).get("Message") or exc)
    return str(exc)


def _call(conn: _Conn, url: str, doing: str, op: str, **kwargs: Any) -> Any:
    """``client.op(**kwargs)``, botocore's errors as SourceError (retries are botocore's)."""
    import botocore.exceptions as bex
    try:
        return getattr(conn.client(), op)(**kwargs)
    except (bex.BotoCoreError, bex.ClientError) as exc:
        raise _error(conn, url, exc, doing) from exc


def _body_errors() -> tuple:
    """What reading a response body raises when the connection breaks."""
    import http.client
    import botocore.exceptions as bex
    import urllib3.exceptions as uex
    return (bex.BotoCoreError, uex.HTTPError, http.client.HTTPException, OSError, ValueError)


# -- the source ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Obj:
    url: str
    bucket: str
    key: str
    size: int
    etag: Optional[str]


class S3Source(Source):
    """Objects of one or more ``s3://`` URLs (prefixes or objects), read one after the other, every epoch.

    Made in the consumer by :meth:`from_urls`, which lists the prefixes; read in the reader process
    (:meth:`streams`).  ``objects`` is the listing, in reading order."""

    kind = "s3"

    def __init__(self, objects: Sequence[_Obj], conn: _Conn, *, name: str,
                 indexes: Optional[Dict[str, str]] = None) -> None:
        if not objects:
            raise SourceError(f"{name}: no objects")
        self.objects = tuple(objects)
        self.name = name
        self._conn = conn
        self._indexes = dict(indexes or {})  # object url -> url of its .idx, for the listed ones
        self._pool: Optional[DaemonPool] = None
        self._pool_pid = 0

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_pool"], state["_pool_pid"] = None, 0
        return state

    def rereadable(self) -> bool:
        return True

    @classmethod
    def from_urls(cls, urls: Sequence[str], *, storage_options: Optional[dict] = None,
                  name: Optional[str] = None) -> "S3Source":
        """List ``urls`` (each a prefix or an object, see the module docstring) into one source."""
        options = check_storage_options(storage_options)
        for url in urls:
            if not is_s3_url(url):
                raise SourceError(f"a channel list mixes s3:// URLs with {url!r}: give only s3:// URLs")
            parse_url(url)
        _import_boto3()
        conn = _Conn(options)
        objects: List[_Obj] = []
        indexes: Dict[str, str] = {}
        for url in urls:
            found, idx = _list_url(conn, url)
            objects.extend(found)
            indexes.update(idx)
        if name is None:
            name = urls[0] if len(urls) == 1 else (
                f"[{', '.join(urls[:3])}{', ...' if len(urls) > 3 else ''}] ({len(urls)} URLs)")
        return cls(objects, conn, name=name, indexes=indexes)

    # -- streaming ---------------------------------------------------------------------------------
    def streams(self, epoch: int) -> Iterator[Stream]:
        self.check_epoch(epoch)
        objs, conn = self.objects, self._conn
        ahead: Dict[int, _Prefetch] = {}

        def start(i: int) -> None:  # the GET of object i, in a thread (once)
            if i < len(objs) and i not in ahead:
                ahead[i] = _Prefetch(conn, objs[i], threaded=True)

        try:
            for i, obj in enumerate(objs):
                opened = ahead.pop(i, None) or _Prefetch(conn, obj, threaded=False)
                raw = _ObjectStream(conn, obj, opened, lambda i=i: start(i + 1))
                yield Stream(obj.url, io.BufferedReader(raw, buffer_size=READ_CHUNK))
        finally:
            for p in ahead.values():
                p.cancel()

    # -- indexed reading ---------------------------------------------------------------------------
    def index_pairs(self) -> Tuple[Tuple[str, "S3Index"], ...]:
        """``((object url, S3Index), ...)`` when every object has an ``.idx`` beside it, else ``()``."""
        if not all(o.url in self._indexes for o in self.objects):
            return ()
        return tuple((o.url, S3Index(self._indexes[o.url], self._conn)) for o in self.objects)

    def open_indexed(self, rec: str, idx: Any, *, join: str = "auto",
                     max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> "S3IndexedReader":
        """A reader of the records of object ``rec`` by the offsets of its index ``idx``."""
        obj = next((o for o in self.objects if o.url == rec), None)
        if obj is None:
            raise SourceError(f"{rec}: not an object of this source ({self.name})")
        if not isinstance(idx, S3Index):
            idx = S3Index(str(idx), self._conn)
        return S3IndexedReader(obj, idx, self._conn, self.executor(), join=join,
                               max_record_bytes=max_record_bytes)

    def executor(self) -> DaemonPool:
        """This process's thread pool for ranged reads and index fetches (``read_ahead`` daemon threads:
        reads still running against a server that stopped answering do not hold up the exit of a
        program that closed its reader)."""
        if self._pool is None or self._pool_pid != os.getpid():
            self._pool = DaemonPool(self._conn.options["read_ahead"], "parrecio-s3")
            self._pool_pid = os.getpid()
            weakref.finalize(self, self._pool.shutdown)
        return self._pool

    def release(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None and self._pool_pid == os.getpid():
            pool.shutdown()


def _list_url(conn: _Conn, url: str) -> Tuple[List[_Obj], Dict[str, str]]:
    """The objects of one URL by the rules of the module docstring, and the .idx URL of each one that
    has an index object beside it."""
    bucket, key = parse_url(url)
    if key and not key.endswith("/"):  # one object, if there is such a key; else the prefix key/
        import botocore.exceptions as bex
        try:
            head = conn.client().head_object(Bucket=bucket, Key=key)
        except bex.ClientError as exc:
            if _code(exc) not in _MISSING_KEY:
                raise _error(conn, url, exc, "HEAD") from exc
            head = None
        except bex.BotoCoreError as exc:
            raise _error(conn, url, exc, "HEAD") from exc
        if head is not None:
            obj = _Obj(url, bucket, key, int(head.get("ContentLength", 0)), head.get("ETag"))
            idx_key = index_path(key)
            indexes = {}
            if idx_key != key:
                try:
                    conn.client().head_object(Bucket=bucket, Key=idx_key)
                    indexes[url] = f"{SCHEME}{bucket}/{idx_key}"
                except bex.ClientError as exc:
                    if _code(exc) not in _MISSING_KEY:
                        raise _error(conn, f"{SCHEME}{bucket}/{idx_key}", exc, "HEAD") from exc
                except bex.BotoCoreError as exc:
                    raise _error(conn, f"{SCHEME}{bucket}/{idx_key}", exc, "HEAD") from exc
            return [obj], indexes
        prefix = key + "/"
    else:
        prefix = key
    listed: List[Tuple[str, int, Optional[str]]] = []
    token: Optional[str] = None
    while True:
        kwargs: Dict[str, Any] = dict(Bucket=bucket, Prefix=prefix)
        if token:
            kwargs["ContinuationToken"] = token
        page = _call(conn, url, "listing the objects", "list_objects_v2", **kwargs)
        for item in page.get("Contents", ()):
            listed.append((item["Key"], int(item.get("Size", 0)), item.get("ETag")))
        if not page.get("IsTruncated"):
            break
        token = page.get("NextContinuationToken")
        if not token:  # (a truncated page without a token would list its first page again, for ever)
            raise SourceError(f"{url}: the listing is truncated but gives no continuation token (endpoint "
                              f"{conn.endpoint()}): the server does not page list_objects_v2 as S3 does")
    listed.sort()  # S3 lists in key (UTF-8 byte) order already; other servers may not
    kept = [(k, s, e) for k, s, e in listed
            if not k.endswith("/") and not any(p.startswith(".") for p in k[len(prefix):].split("/"))]
    sizes = {k: (s, e) for k, s, e in kept}
    chosen = [(k,) + sizes[k] for k in recordio_names([k for k, _, _ in kept])]
    if not chosen:
        where = f"{SCHEME}{bucket}/{prefix}"
        if key and not key.endswith("/"):
            raise SourceError(f"{url}: no such object, and no objects under {where} "
                              f"(endpoint {conn.endpoint()})")
        raise SourceError(f"{where}: no objects under this prefix (looked for *.rec, then for any object "
                          f"other than *.idx/*.lst, recursively; endpoint {conn.endpoint()})")
    keys = {k for k, _, _ in kept}
    objects, indexes = [], {}
    for k, size, etag in chosen:
        obj_url = f"{SCHEME}{bucket}/{k}"
        objects.append(_Obj(obj_url, bucket, k, size, etag))
        idx_key = index_path(k)
        if idx_key in keys and idx_key != k:
            indexes[obj_url] = f"{SCHEME}{bucket}/{idx_key}"
    return objects, indexes


class _Prefetch:
    """The GET of one object and its first ``HEAD_BYTES`` bytes, now or in a thread of its own."""

    def __init__(self, conn: _Conn, obj: _Obj, *, threaded: bool) -> None:
        self.conn, self.obj = conn, obj
        self.body: Any = None
        self.head = b""
        self.etag: Optional[str] = None
        self.size = 0
        self.error: Optional[BaseException] = None
        self._cancelled = False
        self._done = threading.Event()
        if threaded:
            threading.Thread(target=self._run, name=f"parrecio-s3 prefetch {obj.key}", daemon=True).start()
        else:
            self._run()

    def _run(self) -> None:
        obj = self.obj
        try:
            kwargs = dict(Bucket=obj.bucket, Key=obj.key)
            if obj.etag:  # the version that was listed, in every pass: a pass never mixes versions
                kwargs["IfMatch"] = obj.etag
            resp = _call(self.conn, obj.url, "GET", "get_object", **kwargs)
            _check_version(resp, obj.url, "GET", obj.etag, obj.size)
            self.body, self.etag = resp["Body"], resp.get("ETag") or obj.etag
            self.size = int(resp.get("ContentLength", 0))
            if self.size != obj.size:  # a body of another length than the listed object is not it
                self._close_body()
                raise SourceError(f"{obj.url}: the GET answered {self.size} bytes (Content-Length) where the "
                                  f"listing has {obj.size}: the object changed since it was listed, or the "
                                  f"server cut it short; make a new reader to read a new version "
                                  f"(endpoint {self.conn.endpoint()})")
            try:
                self.head = self.body.read(min(HEAD_BYTES, self.size)) if self.size else b""
            except _body_errors():
                self.head = b""  # the stream resumes from byte 0 with a ranged GET
                self._close_body()
            if self.body is not None and len(self.head) == self.size:  # the whole object: its checksum
                try:                                                  # is checked before any record
                    _read_to_end(self.body, obj, self.conn)
                finally:
                    self._close_body()
        except BaseException as exc:  # handed to the reader when it comes to this object
            self.error = exc
        finally:
            self._done.set()
            if self._cancelled:
                self._close_body()

    def result(self) -> "_Prefetch":
        """Wait for the GET (bounded: every attempt has its timeouts), then this object or its error."""
        o = self.conn.options
        bound = o["max_attempts"] * (o["connect_timeout"] + o["read_timeout"] + 25.0)
        if not self._done.wait(bound):
            raise SourceError(f"{self.obj.url}: GET did not finish within {bound:.0f} s")
        if self.error is not None:
            raise self.error
        return self

    def cancel(self) -> None:
        self._cancelled = True
        if self._done.is_set():
            self._close_body()

    def _close_body(self) -> None:
        body, self.body = self.body, None
        if body is not None:
            _close_quietly(body)


class _ObjectStream(io.RawIOBase):
    """One object's bytes: the prefetched head, then its body, resumed by ranged GETs when it breaks."""

    def __init__(self, conn: _Conn, obj: _Obj, opened: _Prefetch, near_end: Any) -> None:
        super().__init__()
        self._conn, self._obj, self._opened = conn, obj, opened
        self._near_end = near_end
        self._ready = False
        self._body: Any = None
        self._head = memoryview(b"")
        self._pos = 0
        self._size = 0
        self._etag: Optional[str] = None
        self._stalls = 0     # failures since the last byte that came
        self._failures = 0   # failures of this object in all

    def readable(self) -> bool:
        return True

    def _open(self) -> None:
        p = self._opened.result()
        self._body, self._etag, self._size = p.body, p.etag, p.size
        self._head = memoryview(p.head)
        p.body = None  # ours now
        self._ready = True
        if self._size - len(self._head) <= PREFETCH_AT:
            self._near_end()

    def readinto(self, buf) -> int:
        if not self._ready:
            self._open()
        view = memoryview(buf).cast("B")
        n = min(len(view), READ_CHUNK)
        if n == 0 or self._pos >= self._size:
            return 0
        if self._head:
            k = min(n, len(self._head))
            view[:k] = self._head[:k]
            self._head = self._head[k:]
        else:
            k = self._read_body(view[:n])
        self._pos += k
        if self._pos >= self._size and self._body is not None:
            self._end_body()  # (before the last bytes are handed on: the last record is checked first)
        if self._size - self._pos <= PREFETCH_AT:
            self._near_end()
        return k

    def _read_body(self, view: memoryview) -> int:
        errors = _body_errors()
        while True:
            cause: Any = "the connection broke off"
            if self._body is not None:
                try:
                    k = _readinto(self._body, view)
                    if k:
                        self._stalls = 0
                        return k
                    cause = f"the body ended at byte {self._pos} of {self._size}"
                except errors as exc:
                    cause = exc
            self._failed(cause)
            self._body = self._resume()

    def _end_body(self) -> None:
        try:
            _read_to_end(self._body, self._obj, self._conn)
        finally:
            self._close_body()

    def _failed(self, cause: Any) -> None:
        self._close_body()
        check_stop()  # (with workers=0 this is the user's thread: a close() from another one ends the pass)
        self._stalls += 1
        self._failures += 1
        attempts = self._conn.max_attempts
        if self._stalls > attempts or self._failures > _failures_allowed(attempts, self._pos):
            what = f"{type(cause).__name__}: {cause}" if isinstance(cause, BaseException) else str(cause)
            err = SourceError(f"{self._obj.url}: reading failed at byte {self._pos} of {self._size} after "
                              f"{self._failures} interruption(s) ({what}; endpoint {self._conn.endpoint()})")
            if isinstance(cause, BaseException):
                err.__cause__ = cause
            raise err
        pause = min(5.0, _RESUME_BACKOFF * 2 ** (self._stalls - 1)) * random.uniform(0.5, 1.0)
        until = time.monotonic() + pause
        while True:  # (in steps: a pass ended meanwhile stops here, not after the next GET's tries)
            time.sleep(max(0.0, min(0.1, until - time.monotonic())))
            check_stop()
            if time.monotonic() >= until:
                break

    def _resume(self) -> Any:
        kwargs = dict(Bucket=self._obj.bucket, Key=self._obj.key, Range=f"bytes={self._pos}-")
        if self._etag:
            kwargs["IfMatch"] = self._etag
        what = f"GET from byte {self._pos}"
        return _ranged(_call(self._conn, self._obj.url, what, "get_object", **kwargs), self._pos,
                       self._obj.url, what, self._etag, self._size)

    def _close_body(self) -> None:
        body, self._body = self._body, None
        if body is not None:
            _close_quietly(body)

    def close(self) -> None:
        if not self.closed:
            self._close_body()
            if not self._ready:
                self._opened.cancel()
        super().close()


def _read_to_end(body: Any, obj: _Obj, conn: _Conn) -> None:
    """Read ``body``, whose ``obj.size`` bytes were all read, to its end (0 bytes more): only there does
    botocore compare what came with the checksum the server sent (``x-amz-checksum-*``, which S3 sends
    with whole-object GETs): a byte damaged on the way is a SourceError.  Other errors there are let be:
    every byte came."""
    import botocore.exceptions as bex
    try:
        more = _readinto(body, memoryview(bytearray(1)))
    except bex.FlexibleChecksumError as exc:
        raise SourceError(f"{obj.url}: its bytes do not match the checksum the server sent for them ({exc}): "
                          f"damaged on the way; read it again (endpoint {conn.endpoint()})") from exc
    except _body_errors():
        return
    if more:
        raise SourceError(f"{obj.url}: the body goes on past the {obj.size} bytes listed: the object changed "
                          f"since it was listed; make a new reader to read the new version")


def _readinto(body: Any, view: memoryview) -> int:
    readinto = getattr(body, "readinto", None)
    if readinto is not None:
        return readinto(view)
    data = body.read(len(view))
    view[:len(data)] = data
    return len(data)


# -- indexes ------------------------------------------------------------------------------------------
class S3Index:
    """The ``.idx`` object at ``url``: :meth:`index_bytes` fetches it (once per process) and keeps its
    bytes, which :func:`~parrecio.recordio.index.read_index_columns` parses as a local ``.idx`` file's.
    ``str()`` is the URL; equal and hashed by it; pickles without the bytes.  (No descriptor is held: one
    per object, an anonymous file each, reached the descriptor limit at about 1000 indexed objects.)"""

    def __init__(self, url: str, conn: _Conn) -> None:
        self.url = url
        self._conn = conn
        self._data: Optional[bytes] = None
        self._lock, self._lock_pid = threading.Lock(), os.getpid()

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_data"] = None
        del state["_lock"], state["_lock_pid"]
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock, self._lock_pid = threading.Lock(), os.getpid()

    def index_bytes(self) -> bytes:
        """The index's bytes (fetched on the first call; thread-safe)."""
        if self._data is None:
            if self._lock_pid != os.getpid():  # a forked copy: a thread of the parent may have held it
                self._lock, self._lock_pid = threading.Lock(), os.getpid()
            with self._lock:
                if self._data is None:
                    self._data = self._fetch()
        return self._data

    def _fetch(self) -> bytes:
        bucket, key = parse_url(self.url)
        resp = _call(self._conn, self.url, "GET", "get_object", Bucket=bucket, Key=key)
        try:
            return resp["Body"].read()
        except _body_errors() as exc:  # one more try: the index is small
            try:
                return _call(self._conn, self.url, "GET", "get_object", Bucket=bucket, Key=key)["Body"].read()
            except _body_errors() as exc2:  # (not _error(): its count is of botocore's attempts per request)
                raise SourceError(f"{self.url}: reading the index failed twice, each time after its GET was "
                                  f"answered ({type(exc2).__name__}: {exc2}; endpoint "
                                  f"{self._conn.endpoint()})") from exc

    def __str__(self) -> str:
        return self.url

    def __repr__(self) -> str:
        return f"S3Index({self.url!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, S3Index) and other.url == self.url

    def __hash__(self) -> int:
        return hash(("S3Index", self.url))


def _ranged(resp: Any, at: int, url: str, what: str, etag: Optional[str], size: int) -> Any:
    """The body of ``resp``, the answer to a GET with a ``Range`` from byte ``at`` of the object listed
    with ``etag`` and ``size``; SourceError when it holds other bytes.  HTTP lets a server (or a proxy
    between) ignore ``Range`` and answer 200 with the whole object: taken for the bytes asked for, an
    indexed read framed the object's first record in place of another, and a resumed stream repeated its
    start.  (Its version is checked too: see :func:`_check_version`.)"""
    status = resp.get("ResponseMetadata", {}).get("HTTPStatusCode")
    got = str(resp.get("ContentRange") or "")
    if got.startswith("bytes ") and got[6:].split("-", 1)[0] == str(at) and status in (206, None):
        _check_version(resp, url, what, etag, size)
        return resp["Body"]
    _close_quietly(resp["Body"])
    said = f"Content-Range {got!r}" if got else "no Content-Range"
    raise SourceError(f"{url}: the {what} was answered with {said} (HTTP {status}): the server, or a proxy "
                      f"between, did not honour the Range header, and a ranged read cannot go on without it")


def _check_version(resp: Any, url: str, what: str, etag: Optional[str], size: int) -> None:
    """SourceError (the body closed) when ``resp`` is of another version of the object than the one
    listed with ``etag`` and ``size``: its ETag differs, or the total of its ``Content-Range``.  A server
    that honours ``If-Match`` answers 412 instead; one that ignores it (or a proxy that drops it) had a
    pass read a rewritten object, or the start of one version and the rest of another."""
    got = resp.get("ETag")
    total = str(resp.get("ContentRange") or "").rpartition("/")[2]
    if etag and got and _bare_etag(got) != _bare_etag(etag):
        said = f"its ETag is {got}, the listing's {etag}"
    elif total.isdigit() and int(total) != size:
        said = f"Content-Range says {total} bytes, the listing {size}"
    else:
        return
    _close_quietly(resp["Body"])
    raise SourceError(f"{url}: the object changed since it was listed or its reading began ({what}: {said}; "
                      f"the server did not refuse it by If-Match); make a new reader to read the new version")


def _bare_etag(etag: str) -> str:
    """An ETag without the weak mark and the quotes that servers (and proxies) add or leave out."""
    etag = etag.strip()
    return (etag[2:] if etag.startswith("W/") else etag).strip('"')


def _failures_allowed(attempts: int, done: int) -> int:
    """Interruptions one object (a ranged read) may have in all, ``done`` bytes into it: 4x ``attempts``
    and one more per :data:`FORGIVEN_EVERY` bytes read.  A bound, so that a server that cuts every body
    after a few bytes ends the read; growing, so that a long read over a flaky link (a reset every few
    hundred MB of a 10 GB object) is not given up while it goes on."""
    return 4 * attempts + done // FORGIVEN_EVERY


def _close_quietly(body: Any) -> None:
    try:
        body.close()
    except Exception:
        pass



class S3IndexedReader:
    """Records of one object read by their index offsets with ranged GETs: what
    :class:`~parrecio.recordio.IndexedRecordReader` is for a local file (``offsets``, ``read_at``,
    ``close``).  ``read_ahead`` tells :func:`parrecio.sources.resolver.read_groups` how many groups to
    request ahead, on ``executor``.  The index is fetched on the executor at once; :attr:`offsets`
    waits for it."""

    def __init__(self, obj: _Obj, idx: S3Index, conn: _Conn, executor: DaemonPool, *,
                 join: str = "auto", max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> None:
        self.rec_path = obj.url
        self.idx_path = idx.url
        self.join = check_join(join)
        self.max_record_bytes = int(max_record_bytes)
        self.read_ahead = conn.options["read_ahead"]
        self.inflight_bytes = INFLIGHT_BYTES
        self.executor = executor
        self._obj, self._idx, self._conn = obj, idx, conn
        self._etag = obj.etag  # of the listing: every read must see the object that was listed
        self._size = obj.size
        self._entries: "Future" = executor.submit(self._read_index)
        self._sorted: Optional[List[int]] = None
        self._auto = None if self.join != "auto" else IndexedJoin.of(self)
        self.closed = False

    def _read_index(self) -> List[int]:
        from ..recordio.index import read_index_columns
        try:
            return read_index_columns(self._idx)[1]
        except CorruptRecordError as exc:
            raise CorruptRecordError(exc.reason, exc.offset, source=self.idx_path) from None

    @property
    def offsets(self) -> List[int]:
        o = self._conn.options
        offs = self._entries.result(o["max_attempts"] * (o["connect_timeout"] + o["read_timeout"] + 25))
        if self._sorted is None:
            self._sorted = sorted(set(offs))
        return list(offs)

    def span(self, offset: int) -> int:
        """Bytes from ``offset`` to the next indexed offset (or the end): what one read asks for."""
        if self._sorted is None:
            self.offsets
        i = bisect.bisect_right(self._sorted, offset)
        span = (self._sorted[i] if i < len(self._sorted) else self._size) - offset
        return min(max(span, HEADER_SIZE), self.max_record_bytes + HEADER_SIZE + 3)

    def read_at(self, offset: int) -> bytes:
        """The payload of the record whose first frame starts at byte ``offset`` (thread-safe)."""
        if self.closed:
            raise ValueError("I/O operation on a closed S3IndexedReader")
        if offset < 0:
            raise ValueError(f"offset must be >= 0, not {offset}")
        if self._auto is not None:
            return self._auto.payload(offset).tobytes()
        return self._read(offset, self.join).tobytes()

    def _read(self, offset: int, join: str, parts: Optional[List[int]] = None) -> memoryview:
        got = read_record(WindowSource(self.fetch, self.span(offset), _SPAN_READ), offset, join=join,
                          max_record_bytes=self.max_record_bytes, source=self.rec_path, parts=parts)
        if got is None:
            raise CorruptRecordError("no record here: offset at or past the end of the object", offset,
                                     source=self.rec_path)
        listed = self._sorted
        assert listed is not None  # (span() fetched it)
        i = bisect.bisect_right(listed, offset)
        want = listed[i] if i < len(listed) else self._size
        if got[1] != want and i and listed[i - 1] == offset:  # (a listed record: it ends at the next one)
            check_end(offset, got[1], want, self._size, self.rec_path, self.idx_path, self.fetch)
        return got[0]

    probe_upfront = False  # (check_index: each read is a GET, and a channel may hold thousands of objects;
    #                       each record's end is checked as it is read)

    @property
    def size(self) -> int:
        """The object's size in bytes (of the listing)."""
        return self._size

    def index_identity(self) -> Optional[Tuple[Any, ...]]:
        """What :func:`~parrecio.recordio.index.check_index` remembers a passed check by (the index is
        fetched once per process): the object's URL, ETag and size."""
        return (self.rec_path, self._etag, self._size, self.idx_path) if self._etag else None

    def _spans(self) -> List[Tuple[int, int]]:
        if self._sorted is None:
            self.offsets
        return spans_of(self._sorted, self._size)

    def fetch(self, start: int, nbytes: int) -> bytes:
        """Bytes ``[start, start + nbytes)`` of the object (fewer at its end), with one ranged GET;
        a body that breaks off is asked again from where it stopped (bounded, as for streams)."""
        if nbytes <= 0 or start >= self._size:
            return b""
        end = min(start + nbytes, self._size)
        out = bytearray()
        stalls = failures = 0
        errors = _body_errors()
        while start + len(out) < end:
            if self.closed or self.executor.closed:  # (a read ahead of a reader closed meanwhile: no more GETs)
                raise SourceError(f"{self.rec_path}: the reader was closed")
            at = start + len(out)
            kwargs = dict(Bucket=self._obj.bucket, Key=self._obj.key, Range=f"bytes={at}-{end - 1}")
            if self._etag:
                kwargs["IfMatch"] = self._etag
            what = f"ranged GET of bytes {at}-{end - 1}"
            body = _ranged(_call(self._conn, self.rec_path, what, "get_object", **kwargs), at, self.rec_path, what,
                           self._etag, self._size)
            cause: Any = None
            try:  # (in pieces: what came before a break is kept, and the next GET asks for the rest)
                while True:
                    data = body.read(READ_CHUNK)
                    if not data:
                        break
                    out += data
            except errors as exc:
                cause = exc
            finally:
                body.close()
            if start + len(out) > at:  # progress: a stall is a break without any
                stalls = 0
                if cause is None:
                    continue
            elif cause is None:
                cause = f"the body ended at byte {at}"
            stalls += 1
            failures += 1
            attempts = self._conn.max_attempts
            if stalls > attempts or failures > _failures_allowed(attempts, len(out)):
                raise SourceError(f"{self.rec_path}: ranged read failed at byte {at} after {failures} "
                                  f"interruption(s) ({cause}; endpoint {self._conn.endpoint()})")
            time.sleep(min(5.0, _RESUME_BACKOFF * 2 ** (stalls - 1)) * random.uniform(0.5, 1.0))
        return bytes(out)

    def close(self) -> None:
        self.closed = True
        self._entries.cancel()

    def __enter__(self) -> "S3IndexedReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"S3IndexedReader({self.rec_path!r})"
