"""Structured logs: one JSON object per line, on stderr.

Hand-rolled rather than ``logging`` because the access log is on the hot
path of every request. Callers pass fields, never whole requests, so secrets
(signatures, keys, query strings of presigned URLs) cannot slip in.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import Any, TextIO

import orjson

LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}


class JsonLog:
    def __init__(self, stream: TextIO | None = None, level: str = "info") -> None:
        self._stream = stream or sys.stderr
        self._level = LEVELS.get(level, 20)
        self._lock = threading.Lock()

    def log(self, level: str, event: str, **fields: Any) -> None:
        if LEVELS[level] < self._level:
            return
        record = {"ts": round(time.time(), 3), "level": level, "event": event}
        record.update(fields)
        line = orjson.dumps(record, default=str, option=orjson.OPT_APPEND_NEWLINE).decode()
        with self._lock:
            self._stream.write(line)
            if LEVELS[level] >= 30 or self._stream.isatty():
                self._stream.flush()

    def flush(self) -> None:
        """Access lines are buffered (a write per request is a syscall per request);
        the gateway flushes them every second and at shutdown."""
        with self._lock:
            self._stream.flush()

    def info(self, event: str, **fields: Any) -> None:
        self.log("info", event, **fields)

    def warning(self, event: str, **fields: Any) -> None:
        self.log("warning", event, **fields)

    def error(self, event: str, **fields: Any) -> None:
        self.log("error", event, **fields)


log = JsonLog()


class _Forward(logging.Handler):
    """Sends records of libraries (uvicorn, asyncio) through the JSON log too."""

    def emit(self, record: logging.LogRecord) -> None:
        level = "error" if record.levelno >= 40 else "warning" if record.levelno >= 30 else "info"
        fields = {"logger": record.name, "message": record.getMessage()}
        if record.exc_info and record.exc_info[0] is not None:
            fields["error"] = record.exc_info[0].__name__
        log.log(level, "library", **fields)


def configure(level: str) -> None:
    log._level = LEVELS.get(level, 20)
    root = logging.getLogger()
    root.handlers[:] = [_Forward()]
    root.setLevel(max(LEVELS.get(level, 20), logging.WARNING))
