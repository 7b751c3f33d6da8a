"""Model artifacts in S3 and S3-compatible stores (MinIO, moto, Ceph RGW).

:class:`S3ArtifactStore` implements :class:`fleet.adapters.base.ArtifactStore` with boto3:
``fetch`` streams an object into a local, content-addressed cache (``cache_dir/<sha256>``),
verifying size and sha256 as the bytes arrive; only a verified file ever gets a cache name,
so a cache hit needs no network. ``put`` and ``ensure_bucket`` seed artifacts (demo, tests).

Errors come out as :class:`~fleet.adapters.base.AdapterError` with a sentence a user can act
on: permanent for a missing bucket or key, denied access, bad credentials, a size or digest
mismatch; transient for connection failures, timeouts and 5xx answers.

It is a plain Python module: no Django, no settings; everything is passed as arguments.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import boto3
import botocore.exceptions as bexc
from botocore.config import Config

from fleet.adapters.base import AdapterError, ProgressFn

CHUNK_SIZE = 1024 * 1024
PROGRESS_EVERY = 256 * 1024
TEMP_PREFIX = ".part-"
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
# Bucket naming rules (lenient on dots; S3-compatible stores accept a little more than AWS).
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.\-_]{1,61}[a-z0-9]$")
_NOT_FOUND_CODES = frozenset({"NoSuchKey", "404", "NotFound"})
_DENIED_CODES = frozenset({"AccessDenied", "403", "Forbidden", "AllAccessDisabled"})
_TRANSIENT_CODES = frozenset(
    {
        "InternalError",
        "ServiceUnavailable",
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestTimeout",
    }
)


@dataclass(frozen=True)
class S3Location:
    """A parsed ``s3://bucket/key`` URI."""

    bucket: str
    key: str

    @property
    def uri(self) -> str:
        """The location as an ``s3://`` URI."""
        return f"s3://{self.bucket}/{self.key}"


def parse_s3_uri(uri: str) -> S3Location:
    """Split ``s3://bucket/key`` into bucket and key; AdapterError (permanent) naming ``uri``
    when it is not of that form (other scheme, empty or invalid bucket name, empty key)."""
    text = uri if isinstance(uri, str) else repr(uri)
    scheme, sep, rest = text.partition("://")
    bucket, _, key = rest.partition("/")
    if scheme != "s3" or not sep or not key or not _BUCKET_RE.match(bucket):
        raise AdapterError(
            f"invalid S3 URI {text!r}: expected s3://<bucket>/<key> "
            "with a lowercase bucket name of 3-63 characters",
            permanent=True,
        )
    return S3Location(bucket=bucket, key=key)


def _check_digest(sha256: str) -> str:
    digest = sha256.lower() if isinstance(sha256, str) else ""
    if not _SHA256_RE.match(digest):
        raise AdapterError(
            f"invalid sha256 {sha256!r}: expected 64 hexadecimal digits", permanent=True
        )
    return digest


def _client_error_fields(exc: bexc.ClientError) -> tuple[str, int, str]:
    error = exc.response.get("Error", {}) or {}
    meta = exc.response.get("ResponseMetadata", {}) or {}
    code = str(error.get("Code", "") or "")
    status = int(meta.get("HTTPStatusCode", 0) or 0)
    message = str(error.get("Message", "") or "")
    return code, status, message


def map_s3_error(
    exc: Exception,
    *,
    bucket: str,
    key: str | None,
    endpoint_url: str,
    access_key_id: str | None = None,
    connect_timeout: float | None = None,
    read_timeout: float | None = None,
) -> AdapterError:
    """Translate a botocore exception into an AdapterError with a readable message.

    ``bucket``/``key`` name what was being accessed (``key`` None for bucket operations),
    ``endpoint_url`` where, ``access_key_id`` with which credentials (None: the default AWS
    credential chain). Missing bucket or key, denied access and credential errors are
    permanent; connection errors, timeouts, broken transfers and 5xx answers are transient.
    """
    where = f"s3://{bucket}/{key}" if key is not None else f"s3://{bucket}"
    who = (
        f"access key ID {access_key_id!r}" if access_key_id else "the default AWS credential chain"
    )
    if isinstance(exc, bexc.ClientError):
        code, status, message = _client_error_fields(exc)
        detail = f" ({message})" if message and message != code else ""
        if code == "NoSuchBucket":
            return AdapterError(f"bucket {bucket} does not exist at {endpoint_url}", permanent=True)
        if code in _NOT_FOUND_CODES or (status == 404 and not code):
            if key is None:
                return AdapterError(
                    f"bucket {bucket} does not exist at {endpoint_url}", permanent=True
                )
            return AdapterError(f"no object at {where}", permanent=True)
        if code in _DENIED_CODES or (status == 403 and not code):
            return AdapterError(
                f"access denied to {where} (check the credentials of {who} and their "
                f"permissions at {endpoint_url})",
                permanent=True,
            )
        if code == "InvalidAccessKeyId":
            return AdapterError(
                f"{endpoint_url} does not know {who} (InvalidAccessKeyId) while accessing "
                f"{where}: check the configured credentials",
                permanent=True,
            )
        if code == "SignatureDoesNotMatch":
            return AdapterError(
                f"the secret access key of {who} is wrong (SignatureDoesNotMatch at "
                f"{endpoint_url}) while accessing {where}: check the configured credentials",
                permanent=True,
            )
        if code in ("ExpiredToken", "InvalidToken", "TokenRefreshRequired"):
            return AdapterError(
                f"the session token of {who} is invalid or expired ({code} at "
                f"{endpoint_url}) while accessing {where}",
                permanent=True,
            )
        if code == "InvalidBucketName":
            return AdapterError(f"invalid bucket name {bucket!r}{detail}", permanent=True)
        transient = code in _TRANSIENT_CODES or status >= 500 or status == 0
        label = code or f"HTTP {status}"
        return AdapterError(
            f"S3 error {label} for {where} at {endpoint_url}{detail}", permanent=not transient
        )
    if isinstance(exc, bexc.ConnectTimeoutError):
        limit = f" after {connect_timeout:g} s" if connect_timeout is not None else ""
        return AdapterError(f"timed out connecting to S3 endpoint {endpoint_url}{limit}")
    if isinstance(exc, bexc.ReadTimeoutError):
        limit = f" (no data for {read_timeout:g} s)" if read_timeout is not None else ""
        return AdapterError(f"timed out reading {where} from S3 endpoint {endpoint_url}{limit}")
    if isinstance(exc, bexc.EndpointConnectionError):
        return AdapterError(f"cannot connect to S3 endpoint {endpoint_url}: {exc}")
    if isinstance(exc, bexc.ConnectionClosedError | bexc.ConnectionError):
        return AdapterError(f"connection to S3 endpoint {endpoint_url} failed: {exc}")
    if isinstance(exc, bexc.ResponseStreamingError | bexc.IncompleteReadError):
        return AdapterError(f"the transfer of {where} from {endpoint_url} broke off: {exc}")
    if isinstance(exc, bexc.FlexibleChecksumError):
        return AdapterError(f"{where} arrived corrupted from {endpoint_url}: {exc}")
    if isinstance(exc, bexc.NoCredentialsError | bexc.PartialCredentialsError):
        return AdapterError(
            f"no usable S3 credentials for {where} at {endpoint_url}: {exc}", permanent=True
        )
    if isinstance(exc, bexc.ParamValidationError):
        return AdapterError(f"invalid S3 request for {where}: {exc}", permanent=True)
    return AdapterError(f"{type(exc).__name__} accessing {where} at {endpoint_url}: {exc}")


class _DigestLocks:
    """One lock per digest, so concurrent fetches of a digest in a process download it once."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[str, tuple[threading.Lock, int]] = {}

    @contextlib.contextmanager
    def hold(self, digest: str) -> Iterator[None]:
        with self._guard:
            lock, users = self._locks.get(digest, (threading.Lock(), 0))
            self._locks[digest] = (lock, users + 1)
        try:
            with lock:
                yield
        finally:
            with self._guard:
                lock, users = self._locks[digest]
                if users <= 1:
                    del self._locks[digest]
                else:
                    self._locks[digest] = (lock, users - 1)


class S3ArtifactStore:
    """Artifacts in S3 (or an S3-compatible store), cached by sha256 under ``cache_dir``.

    One boto3 client per store, shared by all threads (botocore clients are thread-safe).
    Concurrent fetches of a digest are safe, within and across processes: downloads go to
    unique temporary files in ``cache_dir`` that only :func:`os.replace` turns into
    ``cache_dir/<sha256>`` after verification; within a process a second fetch of a digest
    being downloaded waits for the first and then finds it cached.
    """

    def __init__(
        self,
        cache_dir: Path,
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        connect_timeout: float = 5,
        read_timeout: float = 30,
        max_attempts: int = 3,
    ) -> None:
        """Create the store; no network traffic until the first call.

        ``endpoint_url`` selects an S3-compatible store (then path-style addressing is
        used); None means AWS. Credentials default to boto3's usual chain (environment,
        config files, instance role). ``connect_timeout``/``read_timeout`` bound each socket
        operation; ``max_attempts`` counts the first try (botocore "standard" retry mode).
        """
        self.cache_dir = Path(cache_dir)
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        session = boto3.session.Session(
            aws_access_key_id=access_key_id,
            aws_secret_access_key=secret_access_key,
            region_name=region,
        )
        config = Config(
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            retries={"max_attempts": max_attempts, "mode": "standard"},
            s3={"addressing_style": "path"} if endpoint_url else {},
        )
        self._client: Any = session.client("s3", endpoint_url=endpoint_url, config=config)
        self.endpoint_url: str = str(self._client.meta.endpoint_url)
        credentials = session.get_credentials()
        self.access_key_id: str | None = access_key_id or (
            credentials.access_key if credentials is not None else None
        )
        self._locks = _DigestLocks()

    @property
    def client(self) -> Any:
        """The underlying botocore S3 client (for event hooks and diagnostics)."""
        return self._client

    # ------------------------------------------------------------------------------------
    # Cache
    # ------------------------------------------------------------------------------------

    def cached_path(self, sha256: str) -> Path | None:
        """The cache file of ``sha256`` when present (it was verified on download), else None."""
        path = self.cache_dir / _check_digest(sha256)
        return path if path.is_file() else None

    def cache_size(self) -> int:
        """Total bytes of the verified artifacts in the cache (temporary files not counted)."""
        total = 0
        for path in self.cache_dir.iterdir():
            if _SHA256_RE.match(path.name):
                with contextlib.suppress(FileNotFoundError):
                    total += path.stat().st_size
        return total

    def evict(self, sha256: str) -> bool:
        """Delete the cached artifact ``sha256``; True when there was one.

        A path handed out earlier stays readable by whoever has it open; the next fetch
        downloads again.
        """
        try:
            (self.cache_dir / _check_digest(sha256)).unlink()
        except FileNotFoundError:
            return False
        return True

    # ------------------------------------------------------------------------------------
    # Fetch
    # ------------------------------------------------------------------------------------

    def _error(self, exc: Exception, bucket: str, key: str | None) -> AdapterError:
        return map_s3_error(
            exc,
            bucket=bucket,
            key=key,
            endpoint_url=self.endpoint_url,
            access_key_id=self.access_key_id,
            connect_timeout=self.connect_timeout,
            read_timeout=self.read_timeout,
        )

    def fetch(
        self, uri: str, *, sha256: str, size: int, progress: ProgressFn | None = None
    ) -> Path:
        """Return ``cache_dir/<sha256>``, downloading ``uri`` into it unless already cached.

        The object is streamed in 1 MiB chunks into a temporary file in ``cache_dir`` while
        being hashed and counted; ``progress(done, size)`` is called at most every 256 KiB
        and once at the end with ``(size, size)`` (a cache hit calls it just once, so).
        A declared ``size`` that differs from the object's length fails before the download,
        more bytes than declared stop it at once; at the end size and sha256 must match,
        else the temporary file is deleted and a permanent AdapterError names the expected
        and actual values. No temporary file survives the call, whatever happens (an
        exception raised by ``progress`` included: it propagates). A cache file whose length
        is not ``size`` is dropped and downloaded again. Local disk errors (cache full or
        read-only) come out as transient AdapterErrors naming the cache directory.
        """
        location = parse_s3_uri(uri)
        digest = _check_digest(sha256)
        if not isinstance(size, int) or size < 0:
            raise AdapterError(f"invalid size {size!r} for {uri}", permanent=True)
        target = self.cache_dir / digest
        hit = self._cache_hit(target, size)
        if hit is None:
            with self._locks.hold(digest):
                hit = self._cache_hit(target, size)
                if hit is None:
                    return self._download(location, digest, size, target, progress)
        # A hit saves the download, not the permission check: a HEAD proves the caller can
        # still read this object (the cache is shared by every tenant a worker serves).
        self._confirm(location, size)
        if progress is not None:
            progress(size, size)
        return hit

    def _confirm(self, location: S3Location, size: int) -> None:
        try:
            head = self._client.head_object(Bucket=location.bucket, Key=location.key)
        except (bexc.ClientError, bexc.BotoCoreError) as exc:
            raise self._error(exc, location.bucket, location.key) from exc
        if head.get("ContentLength") != size:
            raise AdapterError(
                f"s3://{location.bucket}/{location.key} is {head.get('ContentLength')} bytes, "
                f"not the {size} registered",
                permanent=True,
            )

    @staticmethod
    def _cache_hit(target: Path, size: int) -> Path | None:
        try:
            actual = target.stat().st_size
        except FileNotFoundError:
            return None
        if actual == size:
            return target
        # Damaged after verification (or a wrong declared size): download and verify again.
        with contextlib.suppress(FileNotFoundError):
            target.unlink()
        return None

    def _download(
        self,
        location: S3Location,
        digest: str,
        size: int,
        target: Path,
        progress: ProgressFn | None,
    ) -> Path:
        try:
            fd, temp_name = tempfile.mkstemp(
                prefix=f"{TEMP_PREFIX}{digest[:16]}-", suffix=".tmp", dir=self.cache_dir
            )
        except OSError as exc:
            raise AdapterError(
                f"cannot write to the artifact cache {self.cache_dir}: {exc}"
            ) from exc
        temp = Path(temp_name)
        try:
            with os.fdopen(fd, "wb") as out:
                actual_digest = self._stream(location, size, out, progress)
                out.flush()
                os.fsync(out.fileno())
            if actual_digest != digest:
                raise AdapterError(
                    f"sha256 mismatch for {location.uri}: expected {digest}, got {actual_digest}",
                    permanent=True,
                )
            temp.replace(target)  # atomic (os.replace)
        except OSError as exc:  # local disk: full, read-only, removed directory
            raise AdapterError(
                f"cannot write {location.uri} to the artifact cache {self.cache_dir}: {exc}"
            ) from exc
        finally:
            with contextlib.suppress(FileNotFoundError):
                temp.unlink()
        return target

    def _stream(
        self, location: S3Location, size: int, out: IO[bytes], progress: ProgressFn | None
    ) -> str:
        """Copy the object into ``out``, checking its size; return its sha256 hex digest."""
        try:
            response = self._client.get_object(Bucket=location.bucket, Key=location.key)
        except (bexc.ClientError, bexc.BotoCoreError) as exc:
            raise self._error(exc, location.bucket, location.key) from exc
        body = response["Body"]
        hasher = hashlib.sha256()
        done = 0
        reported = 0
        try:
            length = response.get("ContentLength")
            if isinstance(length, int) and length != size:
                raise AdapterError(
                    f"size mismatch for {location.uri}: expected {size} bytes, "
                    f"the object has {length}",
                    permanent=True,
                )
            try:
                for chunk in body.iter_chunks(CHUNK_SIZE):
                    done += len(chunk)
                    if done > size:
                        raise AdapterError(
                            f"size mismatch for {location.uri}: expected {size} bytes, "
                            f"received more ({done} so far)",
                            permanent=True,
                        )
                    hasher.update(chunk)
                    out.write(chunk)
                    if progress is not None and done - reported >= PROGRESS_EVERY:
                        reported = done
                        progress(done, size)
            except (bexc.ClientError, bexc.BotoCoreError) as exc:
                raise self._error(exc, location.bucket, location.key) from exc
        finally:
            body.close()
        if done != size:
            raise AdapterError(
                f"size mismatch for {location.uri}: expected {size} bytes, got {done}",
                permanent=True,
            )
        if progress is not None and (reported != done or size == 0):
            progress(done, size)
        return hasher.hexdigest()

    # ------------------------------------------------------------------------------------
    # Seeding (demo, tests)
    # ------------------------------------------------------------------------------------

    def ensure_bucket(self, name: str) -> None:
        """Create bucket ``name`` unless it exists (and is reachable with our credentials)."""
        parse_s3_uri(f"s3://{name}/x")  # validates the name
        kwargs: dict[str, Any] = {"Bucket": name}
        region = self._client.meta.region_name
        if region and region != "us-east-1":
            kwargs["CreateBucketConfiguration"] = {"LocationConstraint": region}
        try:
            self._client.create_bucket(**kwargs)
        except bexc.ClientError as exc:
            code, _, _ = _client_error_fields(exc)
            if code == "BucketAlreadyOwnedByYou":
                return
            if code == "BucketAlreadyExists":
                try:
                    self._client.head_bucket(Bucket=name)
                except (bexc.ClientError, bexc.BotoCoreError) as head_exc:
                    raise self._error(head_exc, name, None) from head_exc
                return
            raise self._error(exc, name, None) from exc
        except bexc.BotoCoreError as exc:
            raise self._error(exc, name, None) from exc

    def put(self, uri: str, data: bytes | Path) -> tuple[str, int]:
        """Upload ``data`` (bytes, or a file's content) to ``uri``; return (sha256, size).

        A single PUT (objects up to 5 GiB); the bucket must exist (see :meth:`ensure_bucket`).
        """
        location = parse_s3_uri(uri)
        try:
            if isinstance(data, bytes | bytearray | memoryview):
                payload = bytes(data)
                self._client.put_object(Bucket=location.bucket, Key=location.key, Body=payload)
                return hashlib.sha256(payload).hexdigest(), len(payload)
            path = Path(data)
            hasher = hashlib.sha256()
            size = 0
            with path.open("rb") as fh:
                for chunk in iter(lambda: fh.read(CHUNK_SIZE), b""):
                    hasher.update(chunk)
                    size += len(chunk)
                fh.seek(0)
                self._client.put_object(Bucket=location.bucket, Key=location.key, Body=fh)
            return hasher.hexdigest(), size
        except (bexc.ClientError, bexc.BotoCoreError) as exc:
            raise self._error(exc, location.bucket, location.key) from exc

    def delete(self, uri: str) -> None:
        """Delete the object at ``uri`` (no error when it is already gone)."""
        location = parse_s3_uri(uri)
        try:
            self._client.delete_object(Bucket=location.bucket, Key=location.key)
        except (bexc.ClientError, bexc.BotoCoreError) as exc:
            raise self._error(exc, location.bucket, location.key) from exc
