"""Biography events on the client side: building one, and sending a batch whatever happens.

``log_event`` gives every event its own id and time before it is queued, so sending a
batch again after a timeout stores nothing twice (the gateway keeps an event id once per
agent and day).  :func:`send_batch` retries what may be transient and, when the gateway
refuses a batch (it is all or nothing), splits it in halves until the refused events are
alone: one bad event costs only itself, and the error names it.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ._http import Op, Request, Sleep
from .errors import AccessDenied, InvalidRequest, OrgmemError, Unavailable

#: Events per request, and the interval of the background flusher (seconds).
BATCH_EVENTS = 500
FLUSH_INTERVAL = 1.0
#: Bytes per request: half the gateway's 16 MiB, so a batch is never refused for its size.
BATCH_BYTES = 8 * 1024 * 1024
#: Events waiting to be sent before ``log_event`` waits for the flusher.
MAX_QUEUE = 10_000
#: Backoff between attempts when the gateway cannot be reached or answers 503.
RETRY_DELAYS = (0.2, 0.5, 1.0, 2.0)

NDJSON = {"content-type": "application/x-ndjson"}


@dataclass(frozen=True)
class Pending:
    """A queued event: its id (for error messages) and its NDJSON line."""

    event_id: str
    line: bytes


def new_event_id() -> str:
    return "sdk-" + uuid.uuid4().hex


def build_event(session: str, kind: str, content: str | None, fields: Mapping[str, Any]) -> Pending:
    """One event as a line, with an id and a time so that a resend is idempotent.

    Only what the SDK itself needs is checked here (a session and a kind, JSON-able
    fields); everything else is the gateway's to judge, so its messages stay the one truth.
    """
    if not isinstance(session, str) or not session:
        raise InvalidRequest(0, "InvalidEvent", "session: a non-empty string is required")
    if not isinstance(kind, str) or not kind:
        raise InvalidRequest(0, "InvalidEvent", "kind: a non-empty string is required "
                             "(prompt, response, tool_call, tool_result, note, ...)")
    event: dict[str, Any] = {"session": session, "kind": kind}
    if content is not None:
        event["content"] = content
    event.update({k: v for k, v in fields.items() if v is not None})
    event.setdefault("event_id", new_event_id())
    event.setdefault("ts", time.time())
    try:
        line = json.dumps(event, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(0, "InvalidEvent", f"the event is not JSON-serialisable: {exc}") from None
    return Pending(str(event["event_id"]), line)


def event_lines(events: list[Mapping[str, Any]]) -> bytes:
    """A ready ``put_events`` body (a JSON array)."""
    for i, event in enumerate(events):
        if not isinstance(event, Mapping):
            raise InvalidRequest(0, "InvalidEvent", f"event {i + 1}: each event is a dict, "
                                 f"not {type(event).__name__}")
    try:
        return json.dumps([dict(e) for e in events], ensure_ascii=False).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(0, "InvalidEvent", f"the events are not JSON-serialisable: {exc}") from None


def take(queue, limit_events: int = BATCH_EVENTS, limit_bytes: int = BATCH_BYTES) -> list:
    """Pop the next batch off a deque of (seq, Pending): at most so many events and bytes
    (always at least one, whatever its size: the gateway judges it)."""
    batch, size = [], 0
    while queue and len(batch) < limit_events:
        size += len(queue[0][1].line) + 1
        if batch and size > limit_bytes:
            break
        batch.append(queue.popleft())
    return batch


def send_batch(events: list[Pending]) -> Op[list[OrgmemError]]:
    """Send queued events; return the errors of those the gateway refused (none: all stored)."""
    errors: list[OrgmemError] = []
    parts = [events]
    while parts:
        part = parts.pop()
        body = b"\n".join(p.line for p in part)
        for delay in (*RETRY_DELAYS, None):
            try:
                yield Request("POST", "/v1/events", body=body, headers=NDJSON)
                break
            except Unavailable as exc:
                if delay is None:
                    errors.append(_about(exc, part))
                    break
                yield Sleep(delay)
            except (InvalidRequest, AccessDenied) as exc:
                if len(part) > 1:  # all or nothing: find the refused ones by halves
                    middle = len(part) // 2
                    parts += [part[middle:], part[:middle]]
                else:
                    errors.append(_about(exc, part))
                break
            except OrgmemError as exc:
                errors.append(_about(exc, part))
                break
    return errors


def _about(exc: OrgmemError, part: list[Pending]) -> OrgmemError:
    """The error, saying which events it cost."""
    which = f"event {part[0].event_id}" if len(part) == 1 else f"{len(part)} events"
    return type(exc)(exc.status, exc.code, f"{which} not stored: {exc.message}", request_id=exc.request_id)


def refused(errors: list[OrgmemError]) -> OrgmemError:
    """One exception for a flush that found refused events (the first error's class)."""
    first = errors[0]
    if len(errors) == 1:
        return first
    error = type(first)(first.status, first.code, f"{len(errors)} groups of logged events were refused; "
                        f"the first: {first.message}", request_id=first.request_id)
    error.errors = list(errors)
    return error
