"""Encryption at rest through a real gateway: nothing plaintext on disk, tampering detected,
ranges across chunk and part boundaries, the KEK checked at start, rotation and rewrap."""

from __future__ import annotations

import io
import json
import os
import random
import sqlite3
import subprocess
import threading
from pathlib import Path

import boto3
import pytest
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import ClientError
from servers import BIN, Gateway

from gateway.admin_client import AdminClient

MARKER = b"PLANTED-MARKER-c0ffee-5eal"
CHUNK = 65536


def client(gw, **kwargs):
    cfg = Config(signature_version="s3v4", s3={"addressing_style": "path"},
                 retries={"max_attempts": 1, "mode": "standard"}, **kwargs)
    return boto3.client("s3", endpoint_url=gw.endpoint, aws_access_key_id=gw.access_key,
                        aws_secret_access_key=gw.secret_key, region_name="us-east-1", config=cfg)


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    gateway = Gateway(tmp_path_factory.mktemp("sealed") / "data").start()
    yield gateway
    gateway.stop()


@pytest.fixture(scope="module")
def s3(gw):
    s3 = client(gw)
    s3.create_bucket(Bucket="sealed")
    return s3


def raw_files(data: Path) -> list[Path]:
    return [p for p in data.rglob("*") if p.is_file()]


def test_no_plaintext_reaches_the_data_directory(gw, s3, tmp_path):
    s3.put_object(Bucket="sealed", Key="small.txt", Body=MARKER * 3, ContentType="text/x-" + MARKER.decode(),
                  Metadata={"note": MARKER.decode()})
    big = os.urandom(200_000) + MARKER + os.urandom(200_000)
    s3.put_object(Bucket="sealed", Key="big.bin", Body=big)
    parts = (os.urandom(5 * 2**20) + MARKER) * 2 + MARKER
    s3.upload_fileobj(io.BytesIO(parts), "sealed", "multi.bin",
                      Config=TransferConfig(multipart_threshold=5 * 2**20, multipart_chunksize=5 * 2**20 + len(MARKER)))
    s3.copy_object(Bucket="sealed", Key="copy.bin", CopySource="sealed/big.bin")
    admin = AdminClient(gw.endpoint, gw.access_key, gw.secret_key)
    created = admin.create_agent("marker-" + "agent")  # an identity and its secret key, stored too
    gw.stop()
    try:
        needles = [MARKER, created["secret_key"].encode(), b"text/x-PLANTED"]
        for path in raw_files(gw.data):
            if path.suffix == ".jsonl":  # audit records name keys and principals, never contents
                continue
            content = path.read_bytes()
            for needle in needles:
                assert needle not in content, f"{needle!r} found in {path}"
    finally:
        gw.start()
    assert s3.get_object(Bucket="sealed", Key="big.bin")["Body"].read() == big
    head = s3.head_object(Bucket="sealed", Key="small.txt")
    assert head["Metadata"] == {"note": MARKER.decode()} and head["ServerSideEncryption"] == "aws:kms"


def test_sizes_and_etags_agree_everywhere(s3):
    for size in (0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 17):
        body = os.urandom(size)
        put = s3.put_object(Bucket="sealed", Key=f"sizes/{size}", Body=body)
        head = s3.head_object(Bucket="sealed", Key=f"sizes/{size}")
        got = s3.get_object(Bucket="sealed", Key=f"sizes/{size}")
        assert got["Body"].read() == body and head["ContentLength"] == size
        assert put["ETag"] == head["ETag"] == got["ETag"]
        assert s3.get_object(Bucket="sealed", Key=f"sizes/{size}", IfMatch=put["ETag"])["ContentLength"] == size
    listed = {o["Key"]: (o["Size"], o["ETag"]) for o in
              s3.list_objects_v2(Bucket="sealed", Prefix="sizes/")["Contents"]}
    for key, (size, etag) in listed.items():
        assert size == int(key.split("/")[1])
        assert etag == s3.head_object(Bucket="sealed", Key=key)["ETag"]


def test_ranged_gets_across_chunk_and_part_boundaries(s3):
    rng = random.Random(7)
    single = os.urandom(5 * CHUNK + 123)
    s3.put_object(Bucket="sealed", Key="ranges/single", Body=single)
    part = 5 * 2**20 + 1000  # parts not aligned to chunks
    multi = os.urandom(2 * part + 4321)
    up = s3.create_multipart_upload(Bucket="sealed", Key="ranges/multi")["UploadId"]
    etags = []
    for n, start in enumerate(range(0, len(multi), part), 1):
        etags.append(s3.upload_part(Bucket="sealed", Key="ranges/multi", UploadId=up, PartNumber=n,
                                    Body=multi[start:start + part])["ETag"])
    s3.complete_multipart_upload(Bucket="sealed", Key="ranges/multi", UploadId=up, MultipartUpload={
        "Parts": [{"PartNumber": n, "ETag": e} for n, e in enumerate(etags, 1)]})
    assert s3.head_object(Bucket="sealed", Key="ranges/multi")["ContentLength"] == len(multi)
    edges = [CHUNK - 1, CHUNK, CHUNK + 1, part - 1, part, part + 1, 2 * part]
    for key, data, points in (("ranges/single", single, [CHUNK - 1, CHUNK, 2 * CHUNK + 5]),
                              ("ranges/multi", multi, edges)):
        spans = [(p - 3, p + 3) for p in points] + [(rng.randrange(len(data)), None) for _ in range(4)]
        spans += [(a, a + rng.randrange(1, 300_000)) for a in (rng.randrange(len(data)) for _ in range(6))]
        for start, end in spans:
            end = min(end if end is not None else len(data) - 1, len(data) - 1)
            got = s3.get_object(Bucket="sealed", Key=key, Range=f"bytes={start}-{end}")["Body"].read()
            assert got == data[start:end + 1], (key, start, end)
        assert s3.get_object(Bucket="sealed", Key=key, Range="bytes=-100")["Body"].read() == data[-100:]
    # A part by number, and a copy of a range across the part boundary.
    assert s3.get_object(Bucket="sealed", Key="ranges/multi", PartNumber=2)["Body"].read() == multi[part:2 * part]
    up = s3.create_multipart_upload(Bucket="sealed", Key="ranges/copied")["UploadId"]
    copied = s3.upload_part_copy(Bucket="sealed", Key="ranges/copied", UploadId=up, PartNumber=1,
                                 CopySource="sealed/ranges/multi", CopySourceRange=f"bytes={part - 10}-{part + 9}")
    s3.complete_multipart_upload(Bucket="sealed", Key="ranges/copied", UploadId=up, MultipartUpload={
        "Parts": [{"PartNumber": 1, "ETag": copied["CopyPartResult"]["ETag"]}]})
    assert s3.get_object(Bucket="sealed", Key="ranges/copied")["Body"].read() == multi[part - 10:part + 10]


def test_copy_and_metadata_replace_do_not_reencrypt(gw, s3):
    body = os.urandom(300_000)
    s3.put_object(Bucket="sealed", Key="cp/src", Body=body, Metadata={"a": "1"})
    s3.copy_object(Bucket="sealed", Key="cp/dst", CopySource="sealed/cp/src")
    s3.copy_object(Bucket="sealed", Key="cp/src", CopySource="sealed/cp/src", Metadata={"a": "2"},
                   MetadataDirective="REPLACE")  # what s3fs's chmod does
    assert s3.get_object(Bucket="sealed", Key="cp/dst")["Body"].read() == body
    got = s3.get_object(Bucket="sealed", Key="cp/src")
    assert got["Body"].read() == body and got["Metadata"] == {"a": "2"}
    # The copy kept the sealed bytes (same backend ETag), only the wrapped key changed.
    assert s3.head_object(Bucket="sealed", Key="cp/dst")["ETag"] == s3.head_object(Bucket="sealed", Key="cp/src")["ETag"]


# -- tampering on the backend ---------------------------------------------------------------------


def _stored_files(data: Path, store_key: str) -> tuple[list[str], bytes | None]:
    db = sqlite3.connect(data / "store" / "index.db")
    try:
        files, inline = db.execute("SELECT files, data FROM objects WHERE bucket='sealed' AND key=?",
                                   (store_key.encode(),)).fetchone()
    finally:
        db.close()
    return [data / "store" / f for f, _ in json.loads(files)] if files else [], inline


def _expect_refusal(s3, key: str) -> None:
    with pytest.raises(Exception) as info:  # an error status, or a connection cut mid-body
        s3.get_object(Bucket="sealed", Key=key)["Body"].read()
    if isinstance(info.value, ClientError):
        assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] >= 500


@pytest.fixture
def stopped(gw):
    gw.stop()
    yield gw
    gw.start()


def _flip_bit(path, offset: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0x01
    path.write_bytes(bytes(raw))


def test_tampering_is_detected_never_served(gw, s3):
    body = os.urandom(3 * CHUNK + 500)
    for key in ("t/flip", "t/truncate", "t/reorder", "t/swap-a", "t/swap-b", "t/clean"):
        s3.put_object(Bucket="sealed", Key=key, Body=body)
    gw.stop()
    try:
        (flip,), _ = _stored_files(gw.data, "t/flip")
        _flip_bit(flip, 40_000)
        (trunc,), _ = _stored_files(gw.data, "t/truncate")
        trunc.write_bytes(trunc.read_bytes()[:-(CHUNK + 16 + 500 + 16) // 2])  # cut mid-chunk
        (reorder,), _ = _stored_files(gw.data, "t/reorder")
        raw = reorder.read_bytes()
        sealed = CHUNK + 16
        reorder.write_bytes(raw[:32] + raw[32 + sealed:32 + 2 * sealed] + raw[32:32 + sealed] + raw[32 + 2 * sealed:])
        # Swap: b's bytes and bookkeeping moved under a's name.
        db = sqlite3.connect(gw.data / "store" / "index.db")
        row = db.execute("SELECT size, etag, meta, files, data FROM objects WHERE bucket='sealed' AND key=?",
                         (b"t/swap-b",)).fetchone()
        db.execute("UPDATE objects SET size=?, etag=?, meta=?, files=?, data=? WHERE bucket='sealed' AND key=?",
                   (*row, b"t/swap-a"))
        db.commit()
        db.close()
    finally:
        gw.start()
    for key in ("t/flip", "t/truncate", "t/reorder", "t/swap-a"):
        _expect_refusal(s3, key)
    assert s3.get_object(Bucket="sealed", Key="t/clean")["Body"].read() == body
    # A range that avoids the damaged chunk still reads; one that touches it does not.
    far = f"bytes={2 * CHUNK}-{2 * CHUNK + 99}"  # the flipped byte sits in chunk 0
    assert s3.get_object(Bucket="sealed", Key="t/flip", Range=far)["Body"].read() == body[2 * CHUNK:2 * CHUNK + 100]
    with pytest.raises(ClientError):
        s3.get_object(Bucket="sealed", Key="t/flip", Range="bytes=0-99")


def test_damage_found_mid_answer_cuts_it_off_and_is_still_logged_and_audited(gw, s3):
    """A large object damaged past its first megabyte is found out while its answer streams:
    the connection is cut (never wrong bytes), and the request still has its log line."""
    from clients import wait_until

    body = os.urandom(2 * 1024 * 1024)
    s3.put_object(Bucket="sealed", Key="t/late", Body=body)
    gw.stop()
    try:
        (late,), _ = _stored_files(gw.data, "t/late")
        _flip_bit(late, 1_600_000)
    finally:
        gw.start()
    _expect_refusal(s3, "t/late")

    assert wait_until(lambda: any(d.get("path") == "/sealed/t/late" and d.get("method") == "GET"
                                  for d in gw.log_events("request")))
    assert gw.log_events("response_failed")


# -- the KEK at start ----------------------------------------------------------------------------------


def test_the_gateway_refuses_to_start_without_its_kek(tmp_path):
    gateway = Gateway(tmp_path / "data").start()
    client(gateway).create_bucket(Bucket="kept")
    gateway.stop()
    keyring = tmp_path / "data.keyring.json"
    assert keyring.exists() and keyring.stat().st_mode & 0o077 == 0
    moved = tmp_path / "elsewhere.json"
    keyring.rename(moved)
    env = {**os.environ, "ORGMEM_ROOT_ACCESS_KEY": gateway.access_key,
           "ORGMEM_ROOT_SECRET_KEY": gateway.secret_key}
    args = [str(BIN / "orgmem"), "serve", "--port", "1", "--data", str(tmp_path / "data")]
    missing = subprocess.run(args, env=env, capture_output=True, text=True, timeout=30)
    assert missing.returncode != 0 and "keyring" in missing.stderr and "backup" in missing.stderr
    other = tmp_path / "other.keyring.json"
    from vault.keys import create_keyring
    create_keyring(other)
    wrong = subprocess.run(args + ["--kek", f"file:{other}"], env=env, capture_output=True, text=True,
                           timeout=30)
    assert wrong.returncode != 0 and "sealed under KEK" in wrong.stderr
    inside = subprocess.run(args + ["--kek", f"file:{tmp_path / 'data' / 'k.json'}"], env=env,
                            capture_output=True, text=True, timeout=30)
    assert inside.returncode != 0
    env_key = subprocess.run(args + ["--kek", "env:ORGMEM_TEST_KEK"], env={**env, "ORGMEM_TEST_KEK": "short"},
                             capture_output=True, text=True, timeout=30)
    assert env_key.returncode != 0 and "short" not in env_key.stderr.replace("ORGMEM_TEST_KEK", "")
    gateway.extra_args = ["--kek", f"file:{moved}"]
    gateway.start()
    try:
        assert "kept" in [b["Name"] for b in client(gateway).list_buckets()["Buckets"]]
    finally:
        gateway.stop()


def test_env_kek_and_plaintext_from_before_sealing(tmp_path):
    """A data directory written before sealing is sealed in place at the first start."""
    from gateway.store.base import ObjectMeta
    from gateway.store.local import LocalStore

    legacy = LocalStore(tmp_path / "data" / "store")
    legacy.create_bucket("old")
    legacy.put_object("old", "note.txt", io.BytesIO(MARKER), ObjectMeta(content_type="text/plain"))
    legacy.close()
    key = os.urandom(32).hex()
    gateway = Gateway(tmp_path / "data", extra_args=["--kek", "env:ORGMEM_TEST_KEK"],
                      env={"ORGMEM_TEST_KEK": key}).start()
    try:
        assert client(gateway).get_object(Bucket="old", Key="note.txt")["Body"].read() == MARKER
    finally:
        gateway.stop()
    assert not (tmp_path / "data.keyring.json").exists()
    for path in raw_files(tmp_path / "data"):
        if path.suffix != ".jsonl":
            assert MARKER not in path.read_bytes(), path
    assert key not in gateway.log()


def test_plaintext_planted_beside_sealed_data_is_never_taken_for_the_datas_own(tmp_path):
    """Someone with write access to the store deletes the seal record and plants plaintext
    (forged identities, say): the gateway refuses to start rather than seal it as its own."""
    from gateway.sealing import SEAL_RECORD
    from gateway.store.base import INTERNAL_BUCKET, ObjectMeta
    from gateway.store.local import LocalStore

    gateway = Gateway(tmp_path / "data").start()
    client(gateway).create_bucket(Bucket="kept")
    client(gateway).put_object(Bucket="kept", Key="real", Body=b"sealed and real")
    gateway.stop()
    raw = LocalStore(tmp_path / "data" / "store")
    raw.put_object("kept", "planted", io.BytesIO(b"ATTACKER CONTENT"), ObjectMeta())
    raw.delete_object(INTERNAL_BUCKET, SEAL_RECORD)
    raw.close()
    env = {**os.environ, "ORGMEM_ROOT_ACCESS_KEY": gateway.access_key,
           "ORGMEM_ROOT_SECRET_KEY": gateway.secret_key}
    refused = subprocess.run([str(BIN / "orgmem"), "serve", "--port", "1", "--data", str(tmp_path / "data")],
                             env=env, capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "seal record" in refused.stderr
    assert "ORGMEM_ACCEPT_UNSEALED=1" in refused.stderr
    # an operator who checked the plaintext says so, once
    gateway.env = {"ORGMEM_ACCEPT_UNSEALED": "1"}
    gateway.start()
    try:
        assert client(gateway).get_object(Bucket="kept", Key="real")["Body"].read() == b"sealed and real"
        assert client(gateway).get_object(Bucket="kept", Key="planted")["Body"].read() == b"ATTACKER CONTENT"
    finally:
        gateway.stop()


def test_a_damaged_seal_record_is_said_so_at_start(tmp_path):
    """It was a JSONDecodeError traceback."""
    from gateway.sealing import SEAL_RECORD
    from gateway.store.base import INTERNAL_BUCKET, ObjectMeta
    from gateway.store.local import LocalStore

    gateway = Gateway(tmp_path / "data").start()
    gateway.stop()
    raw = LocalStore(tmp_path / "data" / "store")
    raw.put_object(INTERNAL_BUCKET, SEAL_RECORD, io.BytesIO(b'{"kek_id": "half a rec'), ObjectMeta())
    raw.close()
    env = {**os.environ, "ORGMEM_ROOT_ACCESS_KEY": gateway.access_key,
           "ORGMEM_ROOT_SECRET_KEY": gateway.secret_key}
    refused = subprocess.run([str(BIN / "orgmem"), "serve", "--port", "1", "--data", str(tmp_path / "data")],
                             env=env, capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert f"the seal record {SEAL_RECORD} in the internal bucket is damaged" in refused.stderr


# -- rotation --------------------------------------------------------------------------------------


def test_rotation_and_rewrap_under_load(tmp_path):
    gateway = Gateway(tmp_path / "data").start()
    env = {**os.environ, "ORGMEM_ENDPOINT": gateway.endpoint, "ORGMEM_ROOT_ACCESS_KEY": gateway.access_key,
           "ORGMEM_ROOT_SECRET_KEY": gateway.secret_key}

    def vault(*args, check=True):
        done = subprocess.run([str(BIN / "orgmem"), "vault", *args], env=env, capture_output=True,
                              text=True, timeout=120)
        assert not check or done.returncode == 0, done.stderr
        return done
    try:
        s3 = client(gateway, max_pool_connections=16)
        s3.create_bucket(Bucket="load")
        bodies = {f"k{i}": os.urandom(random.choice([100, 70_000, 200_000])) for i in range(300)}
        for key, body in bodies.items():
            s3.put_object(Bucket="load", Key=key, Body=body)
        # the 300, and the gateway's own sealed objects in its internal bucket
        counts = json.loads(vault("kek", "status", "--json").stdout)["objects_by_version"]
        assert set(counts) == {"1"} and counts["1"] >= 300
        failures, stop = [], threading.Event()

        keys = list(bodies)

        def work(n: int) -> None:
            rng = random.Random(n)
            mine = keys[n::8]  # each key has one writer, so "the last body written" is well defined
            while not stop.is_set():
                write = rng.random() < 0.3
                key = rng.choice(mine if write else keys)
                try:
                    if write:
                        body = os.urandom(rng.choice([50, 90_000]))
                        s3.put_object(Bucket="load", Key=key, Body=body)
                        bodies[key] = body
                    else:
                        s3.get_object(Bucket="load", Key=key)["Body"].read()
                except Exception as exc:  # noqa: BLE001 - every failure is a finding
                    failures.append(repr(exc))
        threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        try:
            assert "now primary" in vault("kek", "rotate").stdout
            retire = vault("kek", "retire", "1", check=False)
            assert retire.returncode == 1 and "DeleteConflict" in retire.stderr
            vault("rewrap", "--batch", "50")
        finally:
            stop.set()
            for t in threads:
                t.join()
        assert failures == []
        status = json.loads(vault("kek", "status", "--json").stdout)
        assert status["primary"] == 2 and set(status["objects_by_version"]) == {"2"}
        vault("kek", "retire", "1")
        for key, body in bodies.items():
            assert s3.get_object(Bucket="load", Key=key)["Body"].read() == body
    finally:
        gateway.stop()


def test_rewrap_resumes_from_its_checkpoint(tmp_path):
    gateway = Gateway(tmp_path / "data").start()
    try:
        s3 = client(gateway)
        s3.create_bucket(Bucket="resume")
        for i in range(30):
            s3.put_object(Bucket="resume", Key=f"k{i:02d}", Body=b"x" * i)
        admin = AdminClient(gateway.endpoint, gateway.access_key, gateway.secret_key)
        call = lambda path, body=None: json.loads(admin._request(  # noqa: E731
            "POST", "/admin/v1/vault/" + path, body=json.dumps(body or {}).encode(),
            content_type="application/json")[2])
        call("kek/rotate")
        first = call("rewrap", {"limit": 10})
        assert first["done"] is False and first["scanned"] == 10
        gateway.stop()  # interrupted: the checkpoint survives a restart
        gateway.start()
        admin = AdminClient(gateway.endpoint, gateway.access_key, gateway.secret_key)
        rest = call("rewrap", {"resume": True, "limit": 1000})
        status = json.loads(admin._request("GET", "/admin/v1/vault/kek")[2])
        # the 30, and the gateway's own sealed objects: the first 10 are not scanned again
        assert rest["done"] is True and rest["scanned"] <= status["total"] - 10
        assert set(status["objects_by_version"]) == {"2"}
        for bad in ({"limit": 0}, {"limit": "many"}, {"surprise": 1}):
            with pytest.raises(Exception) as info:
                call("rewrap", bad)
            assert getattr(info.value, "status", 0) == 400
        for bad, status in (({"version": 0}, 400), ({"version": "one"}, 400), ({}, 400),
                            ({"version": 99}, 404), ({"version": 2}, 400)):  # 2 is the primary
            with pytest.raises(Exception) as info:
                call("kek/retire", bad)
            assert getattr(info.value, "status", 0) == status, bad
        assert set(json.loads(admin._request("GET", "/admin/v1/vault/kek")[2])["versions"]) == {1, 2}
    finally:
        gateway.stop()


def test_no_plaintext_reaches_the_upstream_bucket(tmp_path, seaweed):
    """Through a gateway on SeaweedFS: neither the objects the upstream holds nor the
    upstream's own files on disk contain what was written."""
    from conftest import UPSTREAM_BUCKET

    gateway = Gateway(tmp_path / "data", env=seaweed.env,
                      extra_args=["--backend", f"s3://{UPSTREAM_BUCKET}/sealing-test",
                                  "--backend-endpoint", seaweed.endpoint]).start()
    try:
        s3 = client(gateway)
        s3.create_bucket(Bucket="up-sealed")
        s3.put_object(Bucket="up-sealed", Key="note.txt", Body=MARKER * 5, Metadata={"m": MARKER.decode()})
        parts = (os.urandom(5 * 2**20) + MARKER) * 2
        s3.upload_fileobj(io.BytesIO(parts), "up-sealed", "multi.bin",
                          Config=TransferConfig(multipart_threshold=5 * 2**20,
                                                multipart_chunksize=5 * 2**20 + len(MARKER)))
        assert s3.get_object(Bucket="up-sealed", Key="multi.bin")["Body"].read() == parts
        assert s3.head_object(Bucket="up-sealed", Key="multi.bin")["ContentLength"] == len(parts)
        raw = seaweed.client()
        listed = raw.list_objects_v2(Bucket=UPSTREAM_BUCKET, Prefix="sealing-test/")["Contents"]
        assert listed
        for item in listed:
            got = raw.get_object(Bucket=UPSTREAM_BUCKET, Key=item["Key"])
            assert MARKER not in got["Body"].read(), item["Key"]
            assert MARKER.decode() not in json.dumps(got["Metadata"])
        for path in raw_files(seaweed.dir / "data"):
            assert MARKER not in path.read_bytes(), path
    finally:
        gateway.stop()


def test_aws_kms_kek_through_the_gateway(tmp_path):
    """--kek aws-kms:KEY against moto's KMS server: sealing works, and PUTs and GETs keep
    working while KMS is down, on the cached intermediate key (as S3 Bucket Keys do)."""
    import sys
    import time
    import urllib.request

    from servers import free_port

    port = free_port()
    moto = subprocess.Popen([str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    aws = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1",
           "AWS_ENDPOINT_URL_KMS": endpoint}
    gateway = None
    try:
        deadline = time.time() + 30
        while True:
            try:
                urllib.request.urlopen(endpoint + "/moto-api/", timeout=1).close()
                break
            except OSError:
                assert time.time() < deadline, "moto_server did not start"
                time.sleep(0.1)
        kms = boto3.client("kms", endpoint_url=endpoint, region_name="us-east-1",
                           aws_access_key_id="testing", aws_secret_access_key="testing")
        key_id = kms.create_key()["KeyMetadata"]["KeyId"]
        gateway = Gateway(tmp_path / "data", extra_args=["--kek", f"aws-kms:{key_id}"], env=aws).start()
        s3 = client(gateway)
        s3.create_bucket(Bucket="kms-sealed")
        s3.put_object(Bucket="kms-sealed", Key="before", Body=MARKER)
        assert not (tmp_path / "data.keyring.json").exists()
        moto.terminate()
        moto.wait(10)
        s3.put_object(Bucket="kms-sealed", Key="during", Body=MARKER * 2)
        assert s3.get_object(Bucket="kms-sealed", Key="before")["Body"].read() == MARKER
        assert s3.get_object(Bucket="kms-sealed", Key="during")["Body"].read() == MARKER * 2
        gateway.stop()
        refused = subprocess.run([str(BIN / "orgmem"), "serve", "--port", "1", "--data", str(tmp_path / "data"),
                                  "--kek", f"aws-kms:{key_id}"], env={**os.environ, **aws,
                                  "ORGMEM_ROOT_ACCESS_KEY": gateway.access_key,
                                  "ORGMEM_ROOT_SECRET_KEY": gateway.secret_key},
                                 capture_output=True, text=True, timeout=120)
        assert refused.returncode != 0 and "KMS" in refused.stderr
        for path in raw_files(tmp_path / "data"):
            if path.suffix != ".jsonl":
                assert MARKER not in path.read_bytes(), path
    finally:
        if gateway is not None:
            gateway.stop()
        if moto.poll() is None:
            moto.kill()
            moto.wait()


# -- rewrap over an upstream S3 service (store level, against the session's SeaweedFS) -------------


@pytest.fixture
def upstream_sealed(tmp_path, seaweed, monkeypatch):
    """A SealedStore over an S3Store on SeaweedFS (its own prefix), with a rotatable keyring."""
    from conftest import UPSTREAM_BUCKET

    from gateway.store.base import INTERNAL_BUCKET
    from gateway.store.s3 import S3Store
    from gateway.store.sealed import SealedStore
    from vault.keys import create_keyring

    for name, value in seaweed.env.items():
        monkeypatch.setenv(name, value)
    inner = S3Store(UPSTREAM_BUCKET, f"rewrap-{tmp_path.name}", seaweed.endpoint, "us-east-1")
    inner.learn_quirks()  # as the gateway does at start
    sealed = SealedStore(inner, create_keyring(tmp_path / "ring.json", forbidden_dir=tmp_path / "x"))
    for bucket in ("rw", INTERNAL_BUCKET):
        inner.create_bucket(bucket)
    yield sealed
    inner.close()


def _multipart(sealed, key: str, parts: list[bytes]) -> None:
    from gateway.store.base import ObjectMeta

    up = sealed.create_multipart("rw", key, ObjectMeta(user={"k": key}))
    done = [(n, sealed.upload_part("rw", key, up.upload_id, n, io.BytesIO(p), size=len(p)).etag)
            for n, p in enumerate(parts, 1)]
    sealed.complete_multipart("rw", key, up.upload_id, done)


def _read(sealed, key: str) -> bytes:
    reader = sealed.open_object("rw", key)
    try:
        return reader.read()
    finally:
        reader.close()


def test_an_object_beyond_the_upstreams_copy_limit_is_sealed_anew_when_copied_or_rewrapped(
        tmp_path, seaweed, monkeypatch):
    """An upstream copies an object beyond its single-copy limit (AWS: 5 GiB) in parts. A sealed
    object stored in one piece would come out multipart, unreadable: a copy or a rewrap seals
    it anew instead (its data rewritten). One stored in parts is still copied part by part."""
    from conftest import UPSTREAM_BUCKET

    from gateway.store.base import ObjectMeta, SourceChanged
    from gateway.store.s3 import S3Store
    from gateway.store.sealed import SealedStore
    from vault.keys import create_keyring

    for name, value in seaweed.env.items():
        monkeypatch.setenv(name, value)
    mib = 2**20
    inner = S3Store(UPSTREAM_BUCKET, f"copylimit-{tmp_path.name}", seaweed.endpoint, "us-east-1",
                    copy_limit=6 * mib, copy_part=5 * mib)
    sealed = SealedStore(inner, create_keyring(tmp_path / "ring.json", forbidden_dir=tmp_path / "x"))
    inner.create_bucket("rw")
    try:
        data = os.urandom(11 * mib)
        sealed.put_object("rw", "big", io.BytesIO(data), ObjectMeta(user={"a": "1"}))
        sealed.copy_object("rw", "big", "rw", "copy", None)
        assert _read(sealed, "copy") == data and "-" not in inner.head_object("rw", "copy").etag
        assert sealed.head_object("rw", "copy").meta.user == {"a": "1"}
        # a metadata change in place (what s3fs's chmod sends)
        sealed.copy_object("rw", "big", "rw", "big", ObjectMeta(user={"a": "2"}))
        assert _read(sealed, "big") == data and sealed.head_object("rw", "big").meta.user == {"a": "2"}
        with pytest.raises(SourceChanged):
            sealed.copy_object("rw", "big", "rw", "nowhere", None, source_etag="0" * 32)
        assert not any(e.key == "nowhere" for e in sealed.list_objects("rw").entries)
        sealed.keys.rotate()
        assert sealed.rewrap("rw", "big")
        assert _read(sealed, "big") == data and sealed.head_object("rw", "big").meta.user == {"a": "2"}
        assert sealed.key_version("rw", "big")[1] == sealed.keys.primary_version() == 2
        parts = [os.urandom(5 * mib), os.urandom(2 * mib)]
        _multipart(sealed, "multi", parts)
        sealed.copy_object("rw", "multi", "rw", "multi-copy", None)
        assert inner.head_object("rw", "multi-copy").etag.endswith("-2")
        assert _read(sealed, "multi-copy") == b"".join(parts)

        # rotated and the old version retired while an upload ran: the late rewrap reseals
        # it with the data key in hand, since the retired version can no longer unwrap it
        class RotatesAtTheEnd(io.BytesIO):
            def read(self, n=-1):
                chunk = super().read(n)
                if not chunk and sealed.keys.primary_version() == 2:
                    sealed.keys.rotate()
                    sealed.keys.retire(2)
                return chunk

        sealed.put_object("rw", "late", RotatesAtTheEnd(data), ObjectMeta())
        assert sealed.key_version("rw", "late")[1] == sealed.keys.primary_version() == 3
        assert _read(sealed, "late") == data
    finally:
        inner.close()


def test_multipart_objects_keep_their_parts_when_copied_or_rewrapped_where_copies_flatten(
        tmp_path, moto, monkeypatch):
    """AWS (and moto) give a CopyObject of a multipart object a plain MD5 ETag: one part. A
    sealed object is read by its parts, so copies, in-place metadata changes and rewraps of
    multipart objects go part by part, and they stay readable."""
    from gateway.store.base import ObjectMeta
    from gateway.store.s3 import S3Store
    from gateway.store.sealed import SealedStore
    from vault.keys import create_keyring

    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(name, value)
    boto3.client("s3", endpoint_url=moto, region_name="us-east-1").create_bucket(Bucket="flat")
    inner = S3Store("flat", "g", moto, "us-east-1")
    inner.learn_quirks()
    assert not inner.copy_keeps_parts  # what the gateway learns of AWS-like upstreams at start
    sealed = SealedStore(inner, create_keyring(tmp_path / "ring.json", forbidden_dir=tmp_path / "x"))
    inner.create_bucket("rw")
    try:
        mib = 2**20
        parts = [os.urandom(5 * mib), os.urandom(mib + 7)]
        _multipart(sealed, "multi", parts)
        _multipart(sealed, "one", [os.urandom(mib)])
        sealed.copy_object("rw", "multi", "rw", "multi-copy", None)
        assert inner.head_object("rw", "multi-copy").etag.endswith("-2")
        assert _read(sealed, "multi-copy") == b"".join(parts)
        sealed.copy_object("rw", "multi", "rw", "multi", ObjectMeta(user={"mode": "0600"}))  # s3fs chmod
        assert _read(sealed, "multi") == b"".join(parts)
        assert sealed.head_object("rw", "multi").meta.user == {"mode": "0600"}
        sealed.keys.rotate()
        for key in ("multi", "one", "multi-copy"):
            assert sealed.rewrap("rw", key)
            assert sealed.key_version("rw", key)[1] == 2
        assert _read(sealed, "multi") == b"".join(parts) and len(_read(sealed, "one")) == mib
        assert sealed.head_object("rw", "multi").meta.user == {"mode": "0600"}
    finally:
        inner.close()


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "botocore"])
def test_rewrap_on_s3_is_one_conditional_copy_and_never_clobbers_a_newer_write(upstream_sealed,
                                                                               monkeypatch, direct):
    from gateway.store.base import ObjectMeta

    sealed, inner = upstream_sealed, upstream_sealed.inner
    if not direct:  # as on AWS's virtual hosts: botocore makes every call
        monkeypatch.setattr(inner, "_direct", None)
    sealed.put_object("rw", "single", io.BytesIO(b"old" * 1000), ObjectMeta(user={"a": "1"}))
    parts = [os.urandom(5 * 2**20), os.urandom(777)]
    _multipart(sealed, "multi", parts)
    sealed.keys.rotate()
    before = inner.head_object("rw", "multi")  # (reads, and remembers, its completion record)
    calls = []
    real_call = inner._call
    monkeypatch.setattr(inner, "_call", lambda op, *a, **k: (calls.append(op), real_call(op, *a, **k))[1])
    assert sealed.rewrap("rw", "single") and sealed.rewrap("rw", "multi")
    # a HEAD and one copy each: the direct way, or two botocore calls
    assert calls == ([] if direct else ["head_object", "copy_object"] * 2)
    after = inner.head_object("rw", "multi")
    assert after.etag == before.etag and after.part_sizes == before.part_sizes
    assert sealed.key_version("rw", "multi")[1] == sealed.keys.primary_version() == 2
    assert _read(sealed, "multi") == b"".join(parts)
    assert sealed.head_object("rw", "single").meta.user == {"a": "1"}
    assert not sealed.rewrap("rw", "single")  # already under the primary

    # replaced between the rewrap's HEAD and its copy: the copy is refused, the new write stays
    sealed.keys.rotate()
    real_head = inner.head_object

    def head_then_overwrite(bucket, key):
        info = real_head(bucket, key)
        sealed.put_object("rw", "single", io.BytesIO(b"new"), ObjectMeta(user={"a": "2"}))
        return info

    monkeypatch.setattr(inner, "head_object", head_then_overwrite)
    assert sealed.rewrap("rw", "single") is False
    monkeypatch.setattr(inner, "head_object", real_head)
    assert _read(sealed, "single") == b"new"
    assert sealed.head_object("rw", "single").meta.user == {"a": "2"}
    assert sealed.key_version("rw", "single")[1] == 3  # the writer sealed under the primary

    # deleted between them: NoSuchKey, which rotation counts as nothing to do
    from gateway.store.base import NoSuchKey

    stale = inner.head_object("rw", "multi")
    sealed.delete_object("rw", "multi")
    with pytest.raises(NoSuchKey):
        inner.replace_meta(stale, stale.meta)


def test_rewrap_on_s3_under_concurrent_overwrites(upstream_sealed):
    from gateway.rotation import KeyRotation
    from gateway.store.base import ObjectMeta

    sealed = upstream_sealed
    bodies = {f"k{i:03d}": os.urandom(random.choice([10, 70_000])) for i in range(120)}
    for key, body in bodies.items():
        sealed.put_object("rw", key, io.BytesIO(body), ObjectMeta())
    parts = [os.urandom(5 * 2**20), os.urandom(10)]
    _multipart(sealed, "multi", parts)
    rotation = KeyRotation(sealed)
    old = sealed.keys.primary_version()
    sealed.keys.rotate()
    failures, stop = [], threading.Event()
    lock = threading.Lock()

    def overwrite(n: int) -> None:
        rng = random.Random(n)
        while not stop.is_set():
            key = rng.choice(list(bodies))
            try:
                with lock:  # one writer per key at a time, so ``bodies`` stays the truth
                    body = os.urandom(rng.choice([5, 66_000]))
                    sealed.put_object("rw", key, io.BytesIO(body), ObjectMeta())
                    bodies[key] = body
                assert _read(sealed, rng.choice(list(bodies))) is not None
            except Exception as exc:  # noqa: BLE001 - every failure is a finding
                failures.append(repr(exc))

    threads = [threading.Thread(target=overwrite, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    try:
        batch = rotation.rewrap(False, 50)
        while not batch.done:
            batch = rotation.rewrap(True, 50)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert failures == []
    counts = rotation.status()["objects_by_version"]
    assert str(old) not in counts, counts  # rewrapped, or overwritten under the primary
    for key, body in bodies.items():
        assert _read(sealed, key) == body, key
    assert _read(sealed, "multi") == b"".join(parts)


def test_direct_upstream_signatures_match_botocores():
    """The HEAD and metadata copies S3Store signs itself carry the very signature botocore's
    signer gives the same request (keys with any character, session tokens)."""
    import datetime
    from unittest import mock
    from urllib.parse import quote, urlsplit

    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    from gateway.store.s3 import _Direct, encode_key

    now = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
    for token in (None, "session/token+=="):
        creds = Credentials("AKIDEXAMPLE", "wJalr/XUtnFEMI+K7MDENG", token)
        direct = _Direct(creds, None, "https://s3.example.com:9000/", "up-bucket", "eu-west-3")
        for key in ("a b/c", "ü/ñ é%2F", "x!'()*&$@=;:+,?#[]~", "dir/./..//x ", "."):
            name = "pre/fix/b/" + encode_key(key)
            headers = {"x-amz-copy-source": quote(f"up-bucket/{name}", safe="-._~/"),
                       "If-Match": '"abc"', "x-amz-meta-orgmem": "QUJD  x"}
            url = direct._base + quote(name, safe="/~")
            ours = direct.sign("PUT", urlsplit(url).path, headers, now)
            theirs = AWSRequest(method="PUT", url=url, headers=dict(headers), data=b"")
            with mock.patch("botocore.auth.get_current_datetime", return_value=now.replace(tzinfo=None)):
                S3SigV4Auth(creds.get_frozen_credentials(), "s3", "eu-west-3").add_auth(theirs)
            assert ours["authorization"] == theirs.headers["Authorization"], key


# -- the parts of a multipart object, checked in place ----------------------------------------------


def _local_sealed(tmp_path: Path):
    from gateway.store.base import INTERNAL_BUCKET
    from gateway.store.local import LocalStore
    from gateway.store.sealed import SealedStore
    from vault.keys import create_keyring

    inner = LocalStore(tmp_path / "data")
    sealed = SealedStore(inner, create_keyring(tmp_path / "ring.json", forbidden_dir=tmp_path / "data"))
    sealed.create_bucket("b")
    inner.create_bucket(INTERNAL_BUCKET)  # where rotation keeps its checkpoint
    return sealed, tmp_path / "data" / "index.db"


def _sealed_multipart(sealed, key: str, parts: list[bytes], numbers: list[int]) -> None:
    from gateway.store.base import ObjectMeta

    up = sealed.create_multipart("b", key, ObjectMeta())
    done = [(n, sealed.upload_part("b", key, up.upload_id, n, io.BytesIO(p), size=len(p)).etag)
            for n, p in zip(numbers, parts, strict=True)]
    sealed.complete_multipart("b", key, up.upload_id, done)


def _sealed_read(sealed, key: str, start: int = 0, end: int | None = None) -> bytes:
    reader = sealed.open_object("b", key, start, end)
    try:
        return b"".join(iter(lambda: reader.read(1 << 20), b""))
    finally:
        reader.close()


def _edit_parts(db_path: Path, key: str, edit) -> None:
    """Change the backend's list of an object's part files (what an attacker with the data
    directory could do), leaving its ETag and metadata alone."""
    db = sqlite3.connect(db_path)
    try:
        files = json.loads(db.execute("SELECT files FROM objects WHERE key=?", (key.encode(),)).fetchone()[0])
        db.execute("UPDATE objects SET files=? WHERE key=?", (json.dumps(edit(files)), key.encode()))
        db.commit()
    finally:
        db.close()


def test_moved_or_dropped_parts_are_refused_on_ranged_reads_too(tmp_path):
    """Part numbers are sealed with the object, so a range inside a part checks that the part
    served there is the one that belongs there (parallel ranged downloads read that way), and
    a part dropped from the backend's list is refused though the rest still opens."""
    from gateway.store.base import StoreError

    sealed, db = _local_sealed(tmp_path)
    size = 5 * 1024 * 1024
    parts = [bytes([0x41 + i]) * size for i in range(3)]
    for key, numbers in (("plain", [1, 2, 3]), ("gapped", [2, 5, 9])):
        _sealed_multipart(sealed, key, parts, numbers)
        assert _sealed_read(sealed, key, size + 10, size + 20) == parts[1][10:20]
    # a copy keeps the numbers: its ranged reads are checked alike
    sealed.copy_object("b", "plain", "b", "copied", None)
    assert _sealed_read(sealed, "copied", 2 * size - 3, 2 * size + 3) == b"BBBCCC"

    def swap(files):
        files[1], files[2] = files[2], files[1]
        return files

    for key in ("plain", "gapped", "copied"):
        _edit_parts(db, key, swap)
        for start, end in ((size + 10, size + 20), (size - 3, size + 3), (0, None)):
            with pytest.raises(StoreError, match="part number|integrity"):
                _sealed_read(sealed, key, start, end)
    _sealed_multipart(sealed, "short", parts, [1, 2, 3])
    _edit_parts(db, "short", lambda files: files[:2])
    with pytest.raises(StoreError, match="holds 2 parts where its ETag names 3"):
        sealed.head_object("b", "short")
    with pytest.raises(StoreError, match="holds 2 parts where its ETag names 3"):
        _sealed_read(sealed, "short", 0, 10)
    sealed.close()


def test_a_put_that_outlasts_rotate_rewrap_and_retire_is_wrapped_under_the_primary(tmp_path):
    """The data key is wrapped when an upload starts; an upload still running when the KEK is
    rotated, everything rewrapped and the old version retired is wrapped again as it commits."""
    from gateway.rotation import KeyRotation
    from gateway.store.base import ObjectMeta
    from gateway.store.sealed import SealedStore
    from vault.keys import FileKeyring

    sealed, _ = _local_sealed(tmp_path)
    rotation = KeyRotation(sealed)
    started, go = threading.Event(), threading.Event()

    class SlowBody:
        left = 3 * 1024 * 1024

        def read(self, n: int = -1) -> bytes:
            started.set()
            go.wait(30)
            n = min(self.left, 1 << 20 if n < 0 else n)
            self.left -= n
            return b"z" * n

    put = threading.Thread(target=lambda: sealed.put_object("b", "slow.bin", SlowBody(), ObjectMeta()))
    put.start()
    assert started.wait(10)
    rotation.rotate()
    rotation.rewrap(False, 1000)
    rotation.retire(1)
    go.set()
    put.join(30)
    assert sealed.key_version("b", "slow.bin")[1] == 2
    fresh = SealedStore(sealed.inner, FileKeyring(tmp_path / "ring.json"))  # nothing cached
    assert _sealed_read(fresh, "slow.bin") == b"z" * (3 * 1024 * 1024)
    sealed.close()


def test_a_complete_racing_an_identical_one_answers_the_object(tmp_path, monkeypatch):
    """Two identical Completes at once both answer the object (the README's promise for a
    retried Complete). The one that lost could find the upload gone between reading it and
    listing its parts to check their sizes, and answered 404 NoSuchUpload (test_stress
    caught it once in a full run). Here the rival completes at exactly that moment."""
    from gateway.store.base import ObjectMeta

    sealed, _ = _local_sealed(tmp_path)
    parts = [random.Random(3).randbytes(5 * 1024 * 1024), b"tail"]
    up = sealed.create_multipart("b", "k", ObjectMeta())
    done = [(n, sealed.upload_part("b", "k", up.upload_id, n, io.BytesIO(p), size=len(p)).etag)
            for n, p in enumerate(parts, 1)]
    list_parts = sealed.inner.list_parts
    rival: list = []

    def rival_wins_first(*args, **kwargs):
        if not rival:
            monkeypatch.setattr(sealed.inner, "list_parts", list_parts)
            rival.append(sealed.complete_multipart("b", "k", up.upload_id, done))
        return list_parts(*args, **kwargs)

    monkeypatch.setattr(sealed.inner, "list_parts", rival_wins_first)
    info = sealed.complete_multipart("b", "k", up.upload_id, done)
    assert rival and info.etag == rival[0].etag == sealed.head_object("b", "k").etag
    reader, chunks = sealed.open_object("b", "k", 0, None), []
    try:
        while chunk := reader.read(1024 * 1024):
            chunks.append(chunk)
    finally:
        reader.close()
    assert b"".join(chunks) == b"".join(parts)
