"""S3ArtifactStore against a real S3 endpoint (moto's server mode, a separate process)."""

from __future__ import annotations

import hashlib
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from fleet.adapters.base import AdapterError, ArtifactStore
from fleet.adapters.s3 import (
    CHUNK_SIZE,
    PROGRESS_EVERY,
    S3ArtifactStore,
    map_s3_error,
    parse_s3_uri,
)
from local.s3 import (
    DEMO_ACCESS_KEY_ID,
    DEMO_REGION,
    DEMO_SECRET_ACCESS_KEY,
    MotoProcess,
    enable_iam,
    start_moto,
    stop_pid,
)

StoreFactory = Callable[..., S3ArtifactStore]
BODY = b"switchyard model weights\n" * 40


def sha(data: bytes) -> str:
    """Hex sha256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def cache_entries(store: S3ArtifactStore) -> list[str]:
    """Every name in the store's cache directory, temporary files included."""
    return sorted(p.name for p in store.cache_dir.iterdir())


def count_gets(store: S3ArtifactStore) -> list[str]:
    """Record each GetObject request the store's client sends (hook on ``before-send``)."""
    sent: list[str] = []

    def hook(request: Any, **_: Any) -> None:
        sent.append(request.url)

    store.client.meta.events.register("before-send.s3.GetObject", hook)
    return sent


# --------------------------------------------------------------------------------------------
# Happy path and cache
# --------------------------------------------------------------------------------------------


def test_store_satisfies_protocol(s3_store: S3ArtifactStore) -> None:
    assert isinstance(s3_store, ArtifactStore)


def test_fetch_verifies_and_caches(s3_store: S3ArtifactStore, artifact_bucket: str) -> None:
    uri = f"s3://{artifact_bucket}/models/resnet/1/model.bin"
    digest, size = s3_store.put(uri, BODY)
    assert (digest, size) == (sha(BODY), len(BODY))
    gets = count_gets(s3_store)

    path = s3_store.fetch(uri, sha256=digest, size=size)

    assert path == s3_store.cache_dir / digest
    assert path.read_bytes() == BODY
    assert len(gets) == 1
    assert cache_entries(s3_store) == [digest]
    assert s3_store.cache_size() == size

    # The second fetch comes from the cache: no second download.
    assert s3_store.fetch(uri, sha256=digest.upper(), size=size) == path
    assert len(gets) == 1

    # But a hit still proves access: once the object is gone, the cached copy is not handed out.
    s3_store.delete(uri)
    with pytest.raises(AdapterError, match=f"no object at {uri}"):
        s3_store.fetch(uri, sha256=digest, size=size)
    assert len(gets) == 1

    assert s3_store.evict(digest) is True
    assert s3_store.evict(digest) is False
    assert s3_store.cache_size() == 0
    with pytest.raises(AdapterError, match=f"no object at {uri}"):
        s3_store.fetch(uri, sha256=digest, size=size)
    assert len(gets) == 2  # not cached any more: a real GET, answered 404


def test_put_from_file_and_empty_object(
    s3_store: S3ArtifactStore, artifact_bucket: str, tmp_path: Path
) -> None:
    source = tmp_path / "weights.bin"
    data = os.urandom(3 * CHUNK_SIZE + 17)
    source.write_bytes(data)
    uri = f"s3://{artifact_bucket}/from-file.bin"
    assert s3_store.put(uri, source) == (sha(data), len(data))
    assert s3_store.fetch(uri, sha256=sha(data), size=len(data)).read_bytes() == data

    seen: list[tuple[int, int]] = []
    empty = f"s3://{artifact_bucket}/empty"
    s3_store.put(empty, b"")
    path = s3_store.fetch(empty, sha256=sha(b""), size=0, progress=lambda d, t: seen.append((d, t)))
    assert path.read_bytes() == b""
    assert seen == [(0, 0)]


def test_ensure_bucket_is_idempotent(s3_store: S3ArtifactStore, artifact_bucket: str) -> None:
    s3_store.ensure_bucket(artifact_bucket)
    s3_store.put(f"s3://{artifact_bucket}/k", b"x")
    s3_store.ensure_bucket(artifact_bucket)  # keeps the contents
    assert (
        s3_store.fetch(f"s3://{artifact_bucket}/k", sha256=sha(b"x"), size=1).read_bytes() == b"x"
    )


def test_progress_small_object(s3_store: S3ArtifactStore, artifact_bucket: str) -> None:
    uri = f"s3://{artifact_bucket}/small"
    digest, size = s3_store.put(uri, BODY)
    seen: list[tuple[int, int]] = []
    s3_store.fetch(uri, sha256=digest, size=size, progress=lambda d, t: seen.append((d, t)))
    assert seen == [(size, size)]
    # A cache hit reports completion once as well.
    seen.clear()
    s3_store.fetch(uri, sha256=digest, size=size, progress=lambda d, t: seen.append((d, t)))
    assert seen == [(size, size)]


def test_large_object_streams_in_chunks(s3_store: S3ArtifactStore, artifact_bucket: str) -> None:
    data = os.urandom(8 * 1024 * 1024 + 12345)
    uri = f"s3://{artifact_bucket}/large.bin"
    digest, size = s3_store.put(uri, data)
    seen: list[tuple[int, int]] = []

    started = time.monotonic()
    path = s3_store.fetch(uri, sha256=digest, size=size, progress=lambda d, t: seen.append((d, t)))
    elapsed = time.monotonic() - started

    assert path.read_bytes() == data
    assert len(seen) >= 8, seen
    done = [d for d, _ in seen]
    assert done == sorted(done) and len(set(done)) == len(done)
    assert all(total == size for _, total in seen)
    assert seen[-1] == (size, size)
    assert all(b - a >= PROGRESS_EVERY for a, b in zip([0, *done[:-2]], done[:-1], strict=True))
    assert elapsed < 10, f"8 MiB took {elapsed:.1f} s"


# --------------------------------------------------------------------------------------------
# Verification failures leave nothing behind
# --------------------------------------------------------------------------------------------


def test_digest_mismatch_is_permanent_and_leaves_nothing(
    s3_store: S3ArtifactStore, artifact_bucket: str
) -> None:
    uri = f"s3://{artifact_bucket}/tampered"
    actual, size = s3_store.put(uri, BODY)
    expected = sha(b"what the registry recorded")

    with pytest.raises(AdapterError) as info:
        s3_store.fetch(uri, sha256=expected, size=size)

    assert info.value.permanent is True
    assert expected in info.value.message and actual in info.value.message
    assert uri in info.value.message
    assert cache_entries(s3_store) == []


@pytest.mark.parametrize("declared", [len(BODY) - 1, 10, len(BODY) + 1])
def test_size_mismatch_is_permanent_and_leaves_nothing(
    s3_store: S3ArtifactStore, artifact_bucket: str, declared: int
) -> None:
    uri = f"s3://{artifact_bucket}/sized"
    digest, size = s3_store.put(uri, BODY)

    with pytest.raises(AdapterError, match="size mismatch") as info:
        s3_store.fetch(uri, sha256=digest, size=declared)

    assert info.value.permanent is True
    assert str(declared) in info.value.message and str(size) in info.value.message
    assert cache_entries(s3_store) == []


def test_failing_progress_callback_leaves_no_temp_file(
    s3_store: S3ArtifactStore, artifact_bucket: str
) -> None:
    data = os.urandom(3 * CHUNK_SIZE)
    uri = f"s3://{artifact_bucket}/interrupted"
    digest, size = s3_store.put(uri, data)

    def explode(done: int, total: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        s3_store.fetch(uri, sha256=digest, size=size, progress=explode)
    assert cache_entries(s3_store) == []
    # The store still works afterwards (the digest lock was released).
    assert s3_store.fetch(uri, sha256=digest, size=size).read_bytes() == data


def test_damaged_cache_entry_is_downloaded_again(
    s3_store: S3ArtifactStore, artifact_bucket: str
) -> None:
    uri = f"s3://{artifact_bucket}/damaged"
    digest, size = s3_store.put(uri, BODY)
    path = s3_store.fetch(uri, sha256=digest, size=size)
    path.write_bytes(BODY[:-5])  # truncated behind our back
    gets = count_gets(s3_store)
    assert s3_store.fetch(uri, sha256=digest, size=size).read_bytes() == BODY
    assert len(gets) == 1


# --------------------------------------------------------------------------------------------
# Error messages
# --------------------------------------------------------------------------------------------


def test_missing_bucket(s3_store: S3ArtifactStore) -> None:
    bucket = f"absent-{uuid.uuid4().hex[:8]}"
    with pytest.raises(AdapterError, match=f"bucket {bucket} does not exist") as info:
        s3_store.fetch(f"s3://{bucket}/model.bin", sha256=sha(b"x"), size=1)
    assert info.value.permanent is True
    assert cache_entries(s3_store) == []


def test_missing_key(s3_store: S3ArtifactStore, artifact_bucket: str) -> None:
    uri = f"s3://{artifact_bucket}/models/none/1/model.bin"
    with pytest.raises(AdapterError) as info:
        s3_store.fetch(uri, sha256=sha(b"x"), size=1)
    assert info.value.message == f"no object at {uri}"
    assert info.value.permanent is True
    assert cache_entries(s3_store) == []


@pytest.mark.parametrize(
    "uri",
    [
        "https://bucket/key",
        "s3://bucket",
        "s3://bucket/",
        "s3:///key",
        "s3://Upper_Case/key",
        "s3://ab/key",
        "bucket/key",
        "",
    ],
)
def test_bad_uri_is_permanent(s3_store: S3ArtifactStore, uri: str) -> None:
    with pytest.raises(AdapterError) as info:
        s3_store.fetch(uri, sha256=sha(b"x"), size=1)
    assert info.value.permanent is True
    assert repr(uri) in info.value.message


def test_bad_digest_is_permanent(s3_store: S3ArtifactStore, artifact_bucket: str) -> None:
    for bad in ("../../etc/passwd", "abc", "g" * 64):
        with pytest.raises(AdapterError, match="invalid sha256") as info:
            s3_store.fetch(f"s3://{artifact_bucket}/k", sha256=bad, size=1)
        assert info.value.permanent is True


def test_parse_s3_uri_keeps_nested_keys() -> None:
    location = parse_s3_uri("s3://my.bucket-1/a/b/c.onnx")
    assert (location.bucket, location.key) == ("my.bucket-1", "a/b/c.onnx")
    assert location.uri == "s3://my.bucket-1/a/b/c.onnx"


def test_closed_port_is_transient_and_names_the_endpoint(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again when the block ends
    endpoint = f"http://127.0.0.1:{port}"
    store = S3ArtifactStore(
        tmp_path / "cache",
        endpoint_url=endpoint,
        region=DEMO_REGION,
        access_key_id=DEMO_ACCESS_KEY_ID,
        secret_access_key=DEMO_SECRET_ACCESS_KEY,
        connect_timeout=1,
        read_timeout=2,
        max_attempts=3,
    )
    started = time.monotonic()
    with pytest.raises(AdapterError) as info:
        store.fetch("s3://bucket/key", sha256=sha(b"x"), size=1)
    elapsed = time.monotonic() - started
    assert info.value.permanent is False
    assert f"cannot connect to S3 endpoint {endpoint}" in info.value.message
    assert elapsed < 10, f"took {elapsed:.1f} s"
    assert cache_entries(store) == []


def test_silent_server_times_out_transiently(tmp_path: Path) -> None:
    """A server that accepts connections but never answers: the read timeout bounds the call."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)  # never accept: the kernel completes the handshakes
        endpoint = f"http://127.0.0.1:{listener.getsockname()[1]}"
        store = S3ArtifactStore(
            tmp_path / "cache",
            endpoint_url=endpoint,
            region=DEMO_REGION,
            access_key_id=DEMO_ACCESS_KEY_ID,
            secret_access_key=DEMO_SECRET_ACCESS_KEY,
            connect_timeout=1,
            read_timeout=0.5,
            max_attempts=2,
        )
        started = time.monotonic()
        with pytest.raises(AdapterError) as info:
            store.fetch("s3://bucket/key", sha256=sha(b"x"), size=1)
        elapsed = time.monotonic() - started
    assert info.value.permanent is False
    assert "timed out" in info.value.message and endpoint in info.value.message
    assert elapsed < 2 * 0.5 + 3, f"took {elapsed:.1f} s"
    assert cache_entries(store) == []


def _client_error(code: str, status: int, operation: str = "GetObject") -> ClientError:
    return ClientError(
        {
            "Error": {"Code": code, "Message": f"{code} message"},
            "ResponseMetadata": {"HTTPStatusCode": status},
        },
        operation,
    )


@pytest.mark.parametrize(
    ("code", "status", "expected", "permanent"),
    [
        ("AccessDenied", 403, "access denied to s3://b-1/k (check the credentials of", True),
        ("403", 403, "access denied to s3://b-1/k (check the credentials of", True),
        ("", 403, "access denied to s3://b-1/k", True),
        ("NoSuchKey", 404, "no object at s3://b-1/k", True),
        ("404", 404, "no object at s3://b-1/k", True),
        ("NoSuchBucket", 404, "bucket b-1 does not exist", True),
        ("InvalidAccessKeyId", 403, "does not know access key ID 'AKIDEXAMPLE'", True),
        ("SignatureDoesNotMatch", 403, "secret access key of access key ID 'AKIDEXAMPLE'", True),
        ("ExpiredToken", 400, "session token", True),
        ("SlowDown", 503, "S3 error SlowDown", False),
        ("InternalError", 500, "S3 error InternalError", False),
        ("InvalidRange", 416, "S3 error InvalidRange", True),
    ],
)
def test_map_client_errors(code: str, status: int, expected: str, permanent: bool) -> None:
    error = map_s3_error(
        _client_error(code, status),
        bucket="b-1",
        key="k",
        endpoint_url="http://s3.example:9000",
        access_key_id="AKIDEXAMPLE",
    )
    assert expected in error.message
    assert error.permanent is permanent


# --------------------------------------------------------------------------------------------
# Real IAM answers: a moto server of its own with IAM enforcement switched on
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GuardedS3:
    """A moto server enforcing IAM, one object in it and the credentials of two users."""

    server: MotoProcess
    uri: str
    digest: str
    size: int
    reader: tuple[str, str]
    outsider: tuple[str, str]


@pytest.fixture(scope="module")
def guarded_s3(
    tmp_path_factory: pytest.TempPathFactory, make_s3_store: StoreFactory
) -> Iterator[GuardedS3]:
    """Seed users, bucket and object with IAM off, then switch enforcement on."""
    base = tmp_path_factory.mktemp("moto-iam")
    server = start_moto(log_path=base / "moto.log")
    try:
        seed = make_s3_store(server, base / "seed-cache")
        seed.ensure_bucket("guarded")
        uri = "s3://guarded/models/secret/1/model.bin"
        digest, size = seed.put(uri, BODY)
        iam = boto3.client(
            "iam",
            endpoint_url=server.endpoint_url,
            region_name=DEMO_REGION,
            aws_access_key_id=DEMO_ACCESS_KEY_ID,
            aws_secret_access_key=DEMO_SECRET_ACCESS_KEY,
        )
        keys = {}
        for user in ("reader", "outsider"):
            iam.create_user(UserName=user)
            key = iam.create_access_key(UserName=user)["AccessKey"]
            keys[user] = (key["AccessKeyId"], key["SecretAccessKey"])
        iam.put_user_policy(
            UserName="reader",
            PolicyName="read-guarded",
            PolicyDocument=(
                '{"Version": "2012-10-17", "Statement": [{"Effect": "Allow", '
                '"Action": "s3:GetObject", "Resource": "arn:aws:s3:::guarded/*"}]}'
            ),
        )
        enable_iam(server.endpoint_url)
        yield GuardedS3(server, uri, digest, size, keys["reader"], keys["outsider"])
    finally:
        server.stop()


def test_iam_reader_can_fetch(
    guarded_s3: GuardedS3, tmp_path: Path, make_s3_store: StoreFactory
) -> None:
    key_id, secret = guarded_s3.reader
    store = make_s3_store(
        guarded_s3.server, tmp_path, access_key_id=key_id, secret_access_key=secret
    )
    path = store.fetch(guarded_s3.uri, sha256=guarded_s3.digest, size=guarded_s3.size)
    assert path.read_bytes() == BODY


def test_iam_access_denied(
    guarded_s3: GuardedS3, tmp_path: Path, make_s3_store: StoreFactory
) -> None:
    key_id, secret = guarded_s3.outsider
    store = make_s3_store(
        guarded_s3.server, tmp_path, access_key_id=key_id, secret_access_key=secret
    )
    with pytest.raises(AdapterError) as info:
        store.fetch(guarded_s3.uri, sha256=guarded_s3.digest, size=guarded_s3.size)
    assert info.value.permanent is True
    assert info.value.message.startswith(
        f"access denied to {guarded_s3.uri} (check the credentials of access key ID {key_id!r}"
    )
    assert cache_entries(store) == []


def test_iam_unknown_access_key(
    guarded_s3: GuardedS3, tmp_path: Path, make_s3_store: StoreFactory
) -> None:
    store = make_s3_store(guarded_s3.server, tmp_path, access_key_id="AKIANOBODY0000000000")
    with pytest.raises(AdapterError, match="InvalidAccessKeyId") as info:
        store.fetch(guarded_s3.uri, sha256=guarded_s3.digest, size=guarded_s3.size)
    assert info.value.permanent is True
    assert "'AKIANOBODY0000000000'" in info.value.message


def test_iam_wrong_secret(
    guarded_s3: GuardedS3, tmp_path: Path, make_s3_store: StoreFactory
) -> None:
    key_id, _ = guarded_s3.reader
    store = make_s3_store(
        guarded_s3.server, tmp_path, access_key_id=key_id, secret_access_key="not-the-secret"
    )
    with pytest.raises(AdapterError, match="SignatureDoesNotMatch") as info:
        store.fetch(guarded_s3.uri, sha256=guarded_s3.digest, size=guarded_s3.size)
    assert info.value.permanent is True


# --------------------------------------------------------------------------------------------
# Concurrency
# --------------------------------------------------------------------------------------------


def _run_threads(targets: list[Callable[[], Path]]) -> tuple[list[Path], list[BaseException]]:
    results: list[Path] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(targets))
    lock = threading.Lock()

    def run(target: Callable[[], Path]) -> None:
        barrier.wait()
        try:
            path = target()
        except BaseException as exc:
            with lock:
                errors.append(exc)
        else:
            with lock:
                results.append(path)

    threads = [threading.Thread(target=run, args=(t,)) for t in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return results, errors


def test_concurrent_fetch_same_digest_one_store(
    s3_store: S3ArtifactStore, artifact_bucket: str
) -> None:
    data = os.urandom(2 * CHUNK_SIZE + 1)
    uri = f"s3://{artifact_bucket}/shared.bin"
    digest, size = s3_store.put(uri, data)
    gets = count_gets(s3_store)

    results, errors = _run_threads(
        [lambda: s3_store.fetch(uri, sha256=digest, size=size) for _ in range(4)]
    )

    assert errors == []
    assert results == [s3_store.cache_dir / digest] * 4
    assert cache_entries(s3_store) == [digest]
    assert (s3_store.cache_dir / digest).read_bytes() == data
    assert len(gets) == 1  # the others waited and found it cached


def test_concurrent_fetch_same_digest_separate_stores(
    moto_s3: MotoProcess,
    s3_store: S3ArtifactStore,
    artifact_bucket: str,
    make_s3_store: StoreFactory,
) -> None:
    """Four stores on one cache directory (like four worker processes) all download."""
    data = os.urandom(2 * CHUNK_SIZE + 1)
    uri = f"s3://{artifact_bucket}/shared-by-processes.bin"
    digest, size = s3_store.put(uri, data)
    stores = [make_s3_store(moto_s3, s3_store.cache_dir) for _ in range(4)]
    gets = [count_gets(store) for store in stores]

    results, errors = _run_threads(
        [lambda s=store: s.fetch(uri, sha256=digest, size=size) for store in stores]
    )

    assert errors == []
    assert results == [s3_store.cache_dir / digest] * 4
    assert cache_entries(s3_store) == [digest]
    assert (s3_store.cache_dir / digest).read_bytes() == data
    assert sum(len(g) for g in gets) >= 1


# --------------------------------------------------------------------------------------------
# The moto process itself
# --------------------------------------------------------------------------------------------


def test_moto_process_stop_is_idempotent(tmp_path: Path) -> None:
    server = start_moto(log_path=tmp_path / "moto.log")
    assert server.is_running()
    assert server.endpoint_url.startswith("http://127.0.0.1:")
    server.stop()
    server.stop()
    assert not server.is_running()
    assert stop_pid(server.pid) is False  # gone


def test_stop_pid_stops_a_moto_server(tmp_path: Path) -> None:
    server = start_moto(log_path=tmp_path / "moto.log")
    try:
        assert stop_pid(os.getpid()) is False  # not a moto server
        assert stop_pid(server.pid) is True
        assert server._popen is not None
        assert server._popen.wait(5) is not None
    finally:
        server.stop()
