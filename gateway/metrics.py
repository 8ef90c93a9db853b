"""Prometheus metrics: requests, latency, bytes, denials and open multipart uploads.

Each gateway owns its registry (not the library's global one), so several
gateways in one process, as in tests, never mix their counts. Labels are
bounded: the operation name comes from the router's fixed table.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import GaugeMetricFamily

# ``*_created`` series double the output and no dashboard reads them.
disable_created_metrics()

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: Seconds: from sub-millisecond metadata reads to multi-minute uploads.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
                   30, 60, 300)


class _OpenUploads:
    """Asks the store at scrape time, so the gauge is never stale after a restart."""

    def __init__(self, count: Callable[[], int]) -> None:
        self._count = count

    def collect(self):
        gauge = GaugeMetricFamily("orgmem_multipart_uploads_open",
                                  "Multipart uploads created and neither completed nor aborted.")
        gauge.add_metric([], self._count())
        yield gauge


class Metrics:
    def __init__(self, open_uploads: Callable[[], int]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._requests = Counter("orgmem_requests", "Requests served, by operation and HTTP status.",
                                 ["operation", "status"], registry=self.registry)
        self._latency = Histogram("orgmem_request_duration_seconds",
                                  "Time from the request's arrival to the end of its response.",
                                  ["operation"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self._bytes_in = Counter("orgmem_received_bytes", "Request body bytes received.",
                                 registry=self.registry)
        self._bytes_out = Counter("orgmem_sent_bytes", "Response body bytes sent.",
                                  registry=self.registry)
        self._denied = Counter("orgmem_denied_requests", "Requests refused by a policy decision.",
                               ["operation"], registry=self.registry)
        self.registry.register(_OpenUploads(open_uploads))
        #: labelled children by label values: ``labels()`` costs more than the increment
        self._children: dict[tuple[str, int], tuple] = {}

    def observe(self, operation: str, status: int, seconds: float, bytes_in: int, bytes_out: int,
                denied: bool = False) -> None:
        children = self._children.get((operation, status))
        if children is None:
            children = (self._requests.labels(operation, str(status)), self._latency.labels(operation))
            self._children[(operation, status)] = children
        children[0].inc()
        children[1].observe(seconds)
        if bytes_in:
            self._bytes_in.inc(bytes_in)
        if bytes_out:
            self._bytes_out.inc(bytes_out)
        if denied:
            self._denied.labels(operation).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
