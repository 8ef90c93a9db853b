"""The baselines the benchmarks build for themselves must keep working: a benchmark whose
peer no longer starts measures nothing. seal_bench's unsealed gateway stopped starting when
the vault came to need the sealed store's key provider, and its end-to-end rows went blank
unnoticed until a full run."""

from __future__ import annotations

import sys
import uuid

import boto3
from botocore.config import Config
from servers import ROOT, Gateway


def test_seal_bench_serves_an_unsealed_gateway_that_stores_plaintext(tmp_path):
    gw = Gateway(tmp_path / "data", program=[sys.executable, str(ROOT / "bench" / "seal_bench.py"),
                                             "--serve-unsealed"]).start()
    try:
        s3 = boto3.client("s3", endpoint_url=gw.endpoint, aws_access_key_id=gw.access_key,
                          aws_secret_access_key=gw.secret_key, region_name="us-east-1",
                          config=Config(s3={"addressing_style": "path"}))
        marker = f"plaintext-marker-{uuid.uuid4().hex}".encode()
        s3.create_bucket(Bucket="plain")
        s3.put_object(Bucket="plain", Key="k", Body=marker * 100)
        assert s3.get_object(Bucket="plain", Key="k")["Body"].read() == marker * 100
    finally:
        gw.stop()
    stored = [f for f in (tmp_path / "data").rglob("*") if f.is_file() and marker in f.read_bytes()]
    assert stored, "the unsealed baseline sealed the object: it would measure sealing against itself"
