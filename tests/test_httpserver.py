"""The serving process's interpreter settings (``gateway/httpserver.py``).

Run in a child interpreter: freezing and re-tuning the collector of the test process
would change how every later test runs.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from servers import free_port

from gateway.httpserver import GC_THRESHOLDS, GIL_SWITCH_SECONDS

SERVE_AND_REPORT = textwrap.dedent("""
    import gc, json, sys
    import uvicorn
    from gateway import httpserver
    from gateway.config import Config

    seen = {}
    def fake_run(self, sockets=None):
        # what the interpreter looks like once the server would start answering
        seen.update(threshold=gc.get_threshold(), frozen=gc.get_freeze_count(),
                    switch=sys.getswitchinterval())
        for sock in sockets or ():
            sock.close()
    uvicorn.Server.run = fake_run
    httpserver.run(object(), Config.load({"port": int(sys.argv[1])}, None, env={}))
    print(json.dumps(seen))
""")


def test_serving_freezes_start_up_objects_and_collects_less_often():
    out = subprocess.run([sys.executable, "-c", SERVE_AND_REPORT, str(free_port())],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    seen = json.loads(out.strip().splitlines()[-1])
    assert tuple(seen["threshold"]) == GC_THRESHOLDS
    assert seen["frozen"] > 10_000  # what start-up built is out of every collection
    assert seen["switch"] == GIL_SWITCH_SECONDS


def test_every_route_logs_one_line_per_request_without_secrets(gateway, s3, bucket):
    """S3, REST, admin and MCP requests each leave one JSON ``request`` line on stderr with
    its id, operation, status and bytes; no key or secret appears in any of them."""
    import urllib.request

    from clients import wait_until

    s3.put_object(Bucket=bucket, Key="logged.txt", Body=b"twelve bytes")
    bearer = {"Authorization": f"Bearer {gateway.access_key}:{gateway.secret_key}"}
    for path, body in (("/v1/search?q=logged", None), ("/admin/v1/principals", None),
                       ("/mcp", b'{"jsonrpc":"2.0","id":1,"method":"ping"}')):
        headers = {**bearer, "Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        try:
            urllib.request.urlopen(urllib.request.Request(gateway.endpoint + path, data=body, headers=headers),
                                   timeout=10).read()
        except urllib.error.HTTPError as exc:  # an MCP ping without a session may be refused; still logged
            exc.read()

    def lines() -> list[dict]:
        return gateway.log_events("request")

    def seen(path: str) -> bool:
        return any(d.get("path") == path for d in lines())

    assert wait_until(lambda: all(seen(p) for p in (f"/{bucket}/logged.txt", "/v1/search",
                                                    "/admin/v1/principals", "/mcp")))
    put = next(d for d in lines() if d.get("path") == f"/{bucket}/logged.txt" and d["method"] == "PUT")
    assert put["status"] == 200 and put["bytes_in"] == 12 and put["request_id"]
    mcp = next(d for d in lines() if d.get("path") == "/mcp")
    assert mcp["request_id"] and mcp["bytes_in"] > 0 and mcp["op"] == "McpRequest"
    search = next(d for d in lines() if d.get("path") == "/v1/search")
    assert search["status"] == 200 and search["op"] and search["principal"] and search["bytes_out"] > 0
    s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "logged.txt"}]})  # recorded durably
    assert wait_until(lambda: any(d.get("op") == "DeleteObjects" and d.get("path") == f"/{bucket}"
                                  for d in lines()))
    deleted = next(d for d in lines() if d.get("op") == "DeleteObjects" and d.get("path") == f"/{bucket}")
    assert deleted["bytes_in"] > 0
    assert gateway.secret_key not in gateway.log()
