"""S3-only behaviour, against a real SeaweedFS on 127.0.0.1 (never moto: it accepts wrong checksums)."""

from __future__ import annotations

import os

import pytest

from buildctl.artifact_store.backends import s3 as s3mod
from buildctl.artifact_store.errors import StoreUnavailableError
from buildctl.artifact_store.backends.s3 import S3Store


@pytest.fixture
def s3store(seaweed, s3_env) -> S3Store:
    return S3Store(f"s3://{seaweed.new_bucket()}/p")


def corrupt_in_flight(store: S3Store, operation: str, *, drop_checksum: bool = False) -> None:
    """Flip one byte of the body after the CRC64NVME was computed and before signing, as a bad
    NIC or proxy would; optionally drop the checksum header to show what it protects."""

    def flip(request, **_):
        d = request.data
        data = bytearray(d.read() if hasattr(d, "read") else bytes(d))
        data[len(data) // 2] ^= 0xFF
        request.data = bytes(data)
        if drop_checksum:
            del request.headers["x-amz-checksum-crc64nvme"]

    store.client.meta.events.register(f"before-sign.s3.{operation}", flip)


def test_single_part_corruption_is_rejected(s3store):
    corrupt_in_flight(s3store, "PutObject")
    with pytest.raises(StoreUnavailableError) as exc:
        s3store.put_bytes("blobs/x", os.urandom(4096))
    assert "BadDigest" in str(exc.value)
    assert s3store.stat("blobs/x") is None


def test_without_the_checksum_corruption_would_land(seaweed, s3_env):
    """The control: the same corruption with the checksum header removed is stored silently."""
    st = S3Store(f"s3://{seaweed.new_bucket()}/p")
    corrupt_in_flight(st, "PutObject", drop_checksum=True)
    data = os.urandom(4096)
    assert st.put_bytes("blobs/x", data) is True
    assert st.get_bytes("blobs/x") != data


def test_multipart_roundtrip_and_create_only(s3store, tmp_path, monkeypatch):
    monkeypatch.setattr(s3mod, "MULTIPART_THRESHOLD", 1024 * 1024)
    monkeypatch.setattr(s3mod, "PART_SIZE", 5 * 1024 * 1024)
    f = tmp_path / "big"
    data = os.urandom(12 * 1024 * 1024 + 5)
    f.write_bytes(data)
    seen = []
    assert s3store.put_file("blobs/big", f, size=len(data), on_bytes=seen.append) is True
    assert sum(seen) == len(data) and len(seen) == 3
    assert s3store.get_bytes("blobs/big") == data
    head = s3store.client.head_object(Bucket=s3store.bucket, Key="p/blobs/big", ChecksumMode="ENABLED")
    assert head["ContentLength"] == len(data)
    # IfNoneMatch on CompleteMultipartUpload: an existing key is never overwritten
    f.write_bytes(os.urandom(len(data)))
    assert s3store.put_file("blobs/big", f, size=len(data)) is False
    assert s3store.get_bytes("blobs/big") == data
    uploads = s3store.client.list_multipart_uploads(Bucket=s3store.bucket).get("Uploads", [])
    assert uploads == [], "failed multipart uploads are aborted"


def test_multipart_part_corruption_is_rejected(s3store, tmp_path, monkeypatch):
    monkeypatch.setattr(s3mod, "MULTIPART_THRESHOLD", 1024 * 1024)
    monkeypatch.setattr(s3mod, "PART_SIZE", 5 * 1024 * 1024)
    f = tmp_path / "big"
    f.write_bytes(os.urandom(11 * 1024 * 1024))
    corrupt_in_flight(s3store, "UploadPart")
    with pytest.raises(StoreUnavailableError):
        s3store.put_file("blobs/big", f, size=f.stat().st_size)
    assert s3store.stat("blobs/big") is None


def test_unreachable_endpoint_is_a_clean_error(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    from botocore.config import Config
    import boto3

    client = boto3.client("s3", endpoint_url="http://127.0.0.1:9", config=Config(retries={"max_attempts": 1},
                                                                                 connect_timeout=1))
    st = S3Store("s3://bucket-x/p", client=client)
    with pytest.raises(StoreUnavailableError):
        st.stat("anything")


def test_bucket_name_rules():
    from buildctl.artifact_store.errors import StoreUriError

    for bad in ("s3://ab/p", "s3://Bad_Bucket/x", "s3://-lead/p", "s3://trail-/p", "s3://a..b/p", "s3://192.168.1.1/p",
                "s3://" + "a" * 64 + "/p", "s3://xn--idn/p", "s3://name-s3alias/p", "s3://", "s3:///p"):
        with pytest.raises(StoreUriError):
            S3Store(bad)  # before any request: exit 2, not 9
    for good in ("s3://engines/buildctl", "s3://my.bucket-2/p", "s3://abc"):
        assert S3Store(good).bucket == good[5:].split("/")[0]


def test_missing_or_refused_credentials_and_dead_endpoint_exit_9(seaweed, s3_env, tmp_path):
    """Store access problems are exit 9 with a one-line cause, not a traceback or "unexpected".
    Real processes: boto3's default session caches the credentials it found first."""
    import subprocess
    import sys

    exe = os.path.join(os.path.dirname(sys.executable), "buildctl")
    bucket = seaweed.new_bucket()

    def run(*args: str, **env: str | None) -> tuple[int, str]:
        e = {**os.environ, "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"), "AWS_CONFIG_FILE": str(tmp_path / "none")}
        for k, v in env.items():
            if v is None:
                e.pop(k, None)
            else:
                e[k] = v
        r = subprocess.run([exe, "--store", f"s3://{bucket}/p", *args, "ls"], capture_output=True, text=True, env=e)
        return r.returncode, r.stderr

    code, err = run(AWS_SECRET_ACCESS_KEY="not-the-secret")
    assert code == 9 and "credentials refused" in err and len(err.strip().splitlines()) == 1, err
    code, err = run(AWS_ACCESS_KEY_ID=None, AWS_SECRET_ACCESS_KEY=None, AWS_PROFILE=None)
    assert code == 9 and "no credentials found" in err, err
    code, err = run("--endpoint-url", "http://127.0.0.1:9")
    assert code == 9 and "cannot reach the endpoint http://127.0.0.1:9" in err, err


def test_publish_confirms_reused_blobs_by_their_stored_crc64nvme(s3store, tmp_path, monkeypatch, draft):
    """Republishing confirms each stored blob with a HEAD (its full-object CRC64NVME against the
    one computed in the hashing pass), multipart blobs included, without reading a byte back; a
    blob stored with other bytes and their own valid checksum (a buggy writer) is caught by it."""
    import base64

    from awscrt import checksums

    from buildctl.artifact_store.publish import publish_tree
    from buildctl.artifact_store.layout import blob_key
    from buildctl.artifact_store.upkeep.repair import blob_holds

    from ...support.helpers import make_tree

    monkeypatch.setattr(s3mod, "MULTIPART_THRESHOLD", 1024 * 1024)
    monkeypatch.setattr(s3mod, "PART_SIZE", 5 * 1024 * 1024)
    tree = make_tree(tmp_path / "t", {"big.bin": 6 * 1024 * 1024 + 3, "small.json": b"{}"})
    first = publish_tree(s3store, tree, draft)
    gets: list[str] = []
    s3store.client.meta.events.register("provide-client-params.s3.GetObject", lambda params, **_: gets.append(params["Key"]))
    again = publish_tree(s3store, tree, draft)
    assert again.artifact_id == first.artifact_id and again.reused_repaired == []
    assert not [k for k in gets if k.startswith("p/blobs/")], "a confirmed blob is not read back"
    small = next(f for f in first.manifest.files if f.path == "small.json")
    wrong = b"[]"  # same size, other bytes, stored with a checksum that is right for them
    s3store.client.put_object(Bucket=s3store.bucket, Key=s3store._k(blob_key(small.digest)), Body=wrong,
                              ChecksumCRC64NVME=base64.b64encode(checksums.crc64nvme(wrong).to_bytes(8, "big")).decode())
    gets.clear()
    right = base64.b64encode(checksums.crc64nvme(b"{}").to_bytes(8, "big")).decode()
    assert blob_holds(s3store, small.digest, small.size, right) is False
    assert blob_holds(s3store, small.digest, small.size, None) is False  # read back and hashed: the fallback
    assert gets == [s3store._k(blob_key(small.digest))], "the checksum decided without reading"
    (tree / "other.txt").write_bytes(b"a new artifact that shares small.json")
    fixed = publish_tree(s3store, tree, draft)
    assert fixed.reused_repaired == [small.digest]
    assert s3store.get_bytes(blob_key(small.digest)) == b"{}"


def test_list_requests_pages_only_as_the_caller_reads(s3store):
    """``list`` is lazy page by page: a ranged listing (listing.list_ranges) stops each range at
    its bound, and must not pay for the pages after it. 1,001 keys are two pages."""
    from concurrent.futures import ThreadPoolExecutor

    keys = [f"m/{i:05d}" for i in range(1001)]
    with ThreadPoolExecutor(16) as pool:
        assert all(pool.map(lambda k: s3store.put_bytes(k, b""), keys))
    pages = []
    s3store.client.meta.events.register("before-call.s3.ListObjectsV2", lambda **_: pages.append(1))
    listed = s3store.list("m/")
    assert pages == []  # nothing requested before the caller reads
    assert next(listed) == keys[0] and len(pages) == 1
    assert [next(listed) for _ in range(999)] == keys[1:1000] and len(pages) == 1
    assert list(listed) == [keys[1000]] and len(pages) == 2
    pages.clear()
    assert list(s3store.list("m/", start_after=keys[999])) == [keys[1000]] and len(pages) == 1


def test_list_pages_parse_timestamps_fast_and_the_same():
    """The client's timestamp parser (``_parse_last_modified``): botocore's default's value for the ISO
    8601 of a LIST page (dateutil spent two thirds of a page's client time) and for an HTTP date."""
    from botocore.utils import parse_timestamp

    for text in ("2026-12-04T18:53:57.000Z", "2026-12-04T18:53:57Z", "2026-12-04T18:53:57.123456+00:00",
                 "Fri, 04 Dec 2026 18:53:57 GMT"):
        assert s3mod._parse_last_modified(text) == parse_timestamp(text), text
    factory = s3mod._boto_session()._session.get_component("response_parser_factory")
    assert factory._defaults["timestamp_parser"] is s3mod._parse_last_modified
