"""What every S3 handler needs: the store, the region, and who owns the buckets."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..store.base import ObjectStore
from .errors import S3Error
from .xml import element


@dataclass
class S3Context:
    store: ObjectStore
    region: str = "us-east-1"
    owner_id: str = "orgmem"
    owner_name: str = "orgmem"
    max_object_size: int = 5 * 1024**3
    #: the biography service behind the ``biographies`` bucket (None: not served)
    biographies: Any = None
    #: the open-memory service behind the ``memory`` bucket (None: not served)
    memory: Any = None
    #: the skills service behind the read-only ``skills`` bucket (None: not served)
    skills: Any = None

    def owner_xml(self) -> str:
        return "<Owner>" + element("ID", self.owner_id) + element("DisplayName", self.owner_name) + "</Owner>"

    def check_region(self, location: str | None) -> None:
        if location and location != self.region:
            raise S3Error("IllegalLocationConstraintException",
                          f"The {location} location constraint is incompatible with the region "
                          f"this gateway serves ({self.region}).")
