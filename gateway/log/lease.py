"""Leases: which gateway does a shared background job (compaction, later indexing).

A lease is one compare-and-swap object ``leases/<job>.json`` naming its holder and
when it expires. The holder renews it before every run; anyone may take it once it
has expired, so a dead holder is replaced within ``ttl`` seconds. Correctness never
rests on the lease (every commit of shared state is itself a compare-and-swap, and a
search index snapshot is published only over the one its index was built on): it only
keeps replicas from doing the same work twice. Expiry compares wall clocks, so replicas
should run NTP; a skew shorter than ``ttl`` costs at most duplicated work.
"""

from __future__ import annotations

import time

import orjson

from ..store.base import INTERNAL_BUCKET, ObjectStore, PreconditionFailed
from ..store.objects import read_object, swap_condition, write_object

PREFIX = "leases/"
TTL = 15.0


class Lease:
    def __init__(self, store: ObjectStore, job: str, holder: str, ttl: float = TTL) -> None:
        self.store = store
        self.key = f"{PREFIX}{job}.json"
        self.holder = holder
        self.ttl = ttl

    def acquire(self) -> bool:
        """Take or renew the lease; False while another live holder has it."""
        found = read_object(self.store, INTERNAL_BUCKET, self.key)
        etag = None
        if found is not None:
            doc = orjson.loads(found[0])
            if doc.get("holder") != self.holder and doc.get("expires", 0) > time.time():
                return False
            etag = found[1].etag
        doc = {"holder": self.holder, "expires": time.time() + self.ttl, "ttl": self.ttl}
        try:
            write_object(self.store, INTERNAL_BUCKET, self.key, orjson.dumps(doc), "application/json",
                         swap_condition(etag))
        except PreconditionFailed:
            return False  # another gateway took or renewed it just now
        return True

    def holder_now(self) -> dict | None:
        """Who holds the lease and until when (None: nobody ever did)."""
        found = read_object(self.store, INTERNAL_BUCKET, self.key)
        return orjson.loads(found[0]) if found is not None else None

    def release(self) -> None:
        """Give the lease up at shutdown, so another replica takes over at once."""
        found = read_object(self.store, INTERNAL_BUCKET, self.key)
        if found is None or orjson.loads(found[0]).get("holder") != self.holder:
            return
        doc = {"holder": None, "expires": 0, "ttl": self.ttl}
        try:
            write_object(self.store, INTERNAL_BUCKET, self.key, orjson.dumps(doc), "application/json",
                         swap_condition(found[1].etag))
        except PreconditionFailed:
            pass
