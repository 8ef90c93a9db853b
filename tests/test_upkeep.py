"""Background upkeep: abandoned multipart uploads are aborted after a configurable age."""

from __future__ import annotations

import time

from conftest import make_client
from servers import Gateway


def test_abandoned_uploads_are_aborted(tmp_path):
    gw = Gateway(tmp_path / "data", extra_args=["--upload-expiry", "2"]).start()
    try:
        s3 = make_client(gw)
        s3.create_bucket(Bucket="upkeep")
        uid = s3.create_multipart_upload(Bucket="upkeep", Key="abandoned")["UploadId"]
        s3.upload_part(Bucket="upkeep", Key="abandoned", UploadId=uid, PartNumber=1, Body=b"x" * 1000)
        deadline = time.time() + 15
        while time.time() < deadline and s3.list_multipart_uploads(Bucket="upkeep").get("Uploads"):
            time.sleep(0.5)
        assert s3.list_multipart_uploads(Bucket="upkeep").get("Uploads", []) == []
        assert list((tmp_path / "data" / "store" / "parts").iterdir()) == []
        assert '"event":"uploads_expired"' in gw.log()
    finally:
        gw.stop()
