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
