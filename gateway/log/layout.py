"""Where the log keeps its objects in the gateway's internal bucket.

``log/<writer>/<seq>``: the log objects of one writer (one gateway process), numbered
from 1 with twelve digits so names sort in commit order. ``checkpoints/<consumer>.json``:
how far each consumer has read, one compare-and-swap object each.
"""

from __future__ import annotations

import os
import re
import time

from ..store.base import INTERNAL_BUCKET

BUCKET = INTERNAL_BUCKET
LOG_PREFIX = "log/"
CHECKPOINT_PREFIX = "checkpoints/"
_SEQ_DIGITS = 12
_KEY = re.compile(r"^log/([A-Za-z0-9_-]+)/(\d{12})\Z")

#: How far a consumer has read: writer -> the last sequence number consumed.
Positions = dict[str, int]


def new_writer_id() -> str:
    """Unique per process start and sortable by start time, so a listing reads oldest first."""
    return f"{int(time.time() * 1000):012x}-{os.urandom(5).hex()}"


def log_key(writer: str, seq: int) -> str:
    return f"{LOG_PREFIX}{writer}/{seq:0{_SEQ_DIGITS}d}"


def writer_prefix(writer: str) -> str:
    return f"{LOG_PREFIX}{writer}/"


def parse_log_key(key: str) -> tuple[str, int] | None:
    """(writer, seq) of a log object's key; None for anything else."""
    found = _KEY.match(key)
    return (found.group(1), int(found.group(2))) if found else None


def checkpoint_key(consumer: str) -> str:
    return f"{CHECKPOINT_PREFIX}{consumer}.json"
