"""``orgmem bio``: read, follow and export agents' biographies, and manage compaction and retention.

Every command is a few signed calls to the gateway's biography API through
:class:`~gateway.bio_client.BioClient`, with the ``--endpoint``/``--ca-bundle`` options and the
credentials (ORGMEM_ACCESS_KEY/ORGMEM_SECRET_KEY, else ORGMEM_ROOT_*) of ``orgmem admin``.
Errors go to stderr as ``error: <code>: <message>`` with exit code 1 (2 for usage errors).

Event text is written by agents, so it is shown as plain text only: control characters and
escape sequences are replaced before anything reaches the terminal.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import click

from .admin_cli import (
    _AdminGroup,
    _console,
    _Settings,
    _stop_on_signals,
    _table,
    gateway_options,
    json_option,
)
from .admin_client import AdminError
from .bio_client import PAGE, BioClient

#: Seconds between polls of ``tail --follow``.
FOLLOW_INTERVAL = 1.0
#: How far back each ``--follow`` poll looks behind the newest event already shown, so
#: that events arriving a little late (a client's clock, a batch sent after a delay)
#: are still shown once. Later than this behind, an event is not shown by ``--follow``.
FOLLOW_LOOKBACK_US = 60 * 1_000_000
#: Export formats by file extension.
FORMATS = {".parquet": "parquet", ".ndjson": "ndjson", ".jsonl": "ndjson"}

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_US = timedelta(microseconds=1)
_KIND_COLOURS = {"error": "red", "question": "yellow", "answer": "green", "decision": "cyan",
                 "handoff": "magenta"}


def _fail(message: str, code: str = "InvalidArgument") -> AdminError:
    return AdminError(0, code, message)


def _client() -> BioClient:
    settings = click.get_current_context().find_object(_Settings)
    if settings is None:  # a subcommand invoked on its own, outside `orgmem bio`
        settings = _Settings(None, None)
    return BioClient.over(settings.client())


def _kinds(values: Sequence[str]) -> list[str] | None:
    """``--kind a --kind b,c`` as one list."""
    kinds = [k.strip() for v in values for k in v.split(",") if k.strip()]
    return kinds or None


def _ts_us(text: str) -> int:
    """Microseconds since the epoch of an API timestamp (RFC 3339, ``Z``)."""
    dt = datetime.fromisoformat(text.replace("z", "Z").replace("Z", "+00:00"))
    return (dt - _EPOCH) // _ONE_US


def _rfc3339(ts_us: int) -> str:
    return (_EPOCH + timedelta(microseconds=ts_us)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _plain(text: str) -> str:
    """Text safe to print: no control characters, escape sequences or line breaks."""
    return "".join(ch if ch.isprintable() else " " for ch in text)


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[:max(width - 3, 0)] + "..."


@click.group(cls=_AdminGroup)
@gateway_options
@click.pass_context
def bio(ctx: click.Context, endpoint: str | None, ca_bundle: str | None) -> None:
    """Read, follow and export agents' biographies; compact them and set how long they are kept.

    Credentials come from ORGMEM_ACCESS_KEY and ORGMEM_SECRET_KEY, else from
    ORGMEM_ROOT_ACCESS_KEY and ORGMEM_ROOT_SECRET_KEY. Without --agent, commands use the
    caller's own biography.
    """
    ctx.obj = _Settings(endpoint, ca_bundle)


agent_option = click.option("--agent", metavar="AGENT",
                            help="Whose biography (default: the one of the credentials' agent).")
session_option = click.option("--session", metavar="SESSION", help="Only this session.")
kind_option = click.option("--kind", "kinds", multiple=True, metavar="KIND",
                           help="Only events of this kind (repeatable, or comma-separated): prompt, "
                                "response, tool_call, tool_result, artifact, question, answer, "
                                "decision, note, error, state, handoff.")
since_option = click.option("--since", metavar="TIME", help="From this time on: RFC 3339, unix seconds, "
                            "or a duration back from now such as 10m, 2h, 7d.")


# --------------------------------------------------------------------------- tail

class _EventPrinter:
    """One line per event (time, session, kind, tool, first line of text) or NDJSON."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        if sys.stdout.isatty():
            self.width = shutil.get_terminal_size((160, 24)).columns
        else:
            self.width = int(os.environ.get("COLUMNS") or 0) or 240

    def line(self, e: Mapping[str, Any]) -> str:
        ts = str(e.get("ts") or "")
        when = ts[:23] + "Z" if len(ts) >= 23 else ts
        session = _clip(_plain(str(e.get("session") or "")), 24)
        kind = str(e.get("kind") or "")
        tool = _clip(_plain(str(e.get("tool") or "-")), 20)
        prefix = f"{when}  {session:<24}  {kind:<11}  {tool:<20}  "
        text = _clip(_summary(e), max(self.width - len(prefix) - 1, 40))
        styled = f"{kind:<11}"
        if kind in _KIND_COLOURS:
            styled = click.style(styled, fg=_KIND_COLOURS[kind])
        return f"{when}  {session:<24}  {styled}  {tool:<20}  {text}".rstrip()

    def __call__(self, events: Iterable[Mapping[str, Any]]) -> None:
        for e in events:
            click.echo(json.dumps(e) if self.as_json else self.line(e))
        sys.stdout.flush()


def _summary(e: Mapping[str, Any]) -> str:
    """The first line of the content; else the artifact URI; else the data as compact JSON."""
    content = e.get("content")
    if content:
        lines = content.strip().splitlines() or [""]
        return _plain(lines[0]) + (" ..." if len(lines) > 1 else "")
    if e.get("artifact_uri"):
        return _plain(str(e["artifact_uri"]))
    if e.get("data") is not None:
        return _plain(json.dumps(e["data"], separators=(",", ":"), sort_keys=True))
    return ""


class _Follower:
    """New events since the last poll, each shown once.

    Each poll asks for events from a little before the newest one already seen
    (:data:`FOLLOW_LOOKBACK_US`), and leaves out the ids it has shown: events are found by
    their time, and one may arrive after a newer one was already shown.
    """

    def __init__(self, client: BioClient, agent: str | None, session: str | None,
                 kinds: list[str] | None, since: str | None) -> None:
        self.client = client
        self.query = {"agent": agent, "session": session, "kinds": kinds}
        self.since = since
        self.newest: int | None = None
        self.seen: dict[str, int] = {}

    def remember(self, events: Iterable[Mapping[str, Any]]) -> None:
        for e in events:
            ts = _ts_us(e["ts"])
            self.seen[e["event_id"]] = ts
            if self.newest is None or ts > self.newest:
                self.newest = ts
        if self.newest is not None:
            horizon = self.newest - FOLLOW_LOOKBACK_US
            self.seen = {i: ts for i, ts in self.seen.items() if ts >= horizon}

    def poll(self) -> list[Mapping[str, Any]]:
        since = self.since if self.newest is None else _rfc3339(self.newest - FOLLOW_LOOKBACK_US)
        fresh = [e for e in self.client.iter_events(since=since, **self.query)
                 if e["event_id"] not in self.seen]
        fresh.sort(key=lambda e: (_ts_us(e["ts"]), e["event_id"]))
        self.remember(fresh)
        return fresh


#: Windows a tail without --since or --session reads back over, the next wider one only when
#: a window holds fewer than --limit events (the whole biography only when none does).
TAIL_WINDOWS = ("1h", "1d", "7d", "30d", "365d")


def _backlog(client: BioClient, agent: str | None, session: str | None, kinds: list[str] | None,
             since: str | None, limit: int) -> list[Mapping[str, Any]]:
    """Matching events, among which the last ``limit`` are: ``tail -n 1`` of a long
    biography read every page of it before. Without a session, events come in (time, id)
    order, so a window from some time on that holds ``limit`` events holds the last ones.
    In a session the order is the client's ``seq``, which times need not follow: all of it."""
    if since is None and session is None:
        for window in TAIL_WINDOWS:
            found = list(client.iter_events(agent=agent, kinds=kinds, since=window))
            if len(found) >= limit:
                return found
    return list(client.iter_events(agent=agent, session=session, kinds=kinds, since=since))


@bio.command("tail")
@agent_option
@session_option
@kind_option
@since_option
@click.option("--limit", "-n", type=click.IntRange(1, 10_000_000), default=100, show_default=True,
              help="Show at most the last N matching events (before following).")
@click.option("--follow", "-f", is_flag=True,
              help="Keep printing new events (polls every second) until Ctrl-C or SIGTERM.")
@json_option
def tail(agent: str | None, session: str | None, kinds: tuple[str, ...], since: str | None, limit: int,
         follow: bool, as_json: bool) -> None:
    """Show the most recent events, oldest first: time (UTC), session, kind, tool and the first
    line of the content.

    With --session, events are in session order (seq, then time). With --json, one event
    per line as the API returns it.
    """
    if follow:
        _stop_on_signals()
    client = _client()
    printer = _EventPrinter(as_json)
    kind_list = _kinds(kinds)
    try:
        backlog = _backlog(client, agent, session, kind_list, since, limit)
        printer(backlog[-limit:])
        if not follow:
            return
        follower = _Follower(client, agent, session, kind_list, since)
        follower.remember(backlog)
        while True:
            time.sleep(FOLLOW_INTERVAL)
            try:
                fresh = follower.poll()
            except AdminError as exc:
                if exc.status and exc.status < 500:
                    raise
                click.echo(f"warning: {exc.code}: {exc.message} (retrying)", err=True)
                continue
            if fresh:
                printer(fresh)
    except KeyboardInterrupt:
        return
    except BrokenPipeError:  # `orgmem bio tail -f | head`: the reader is gone, stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return


# --------------------------------------------------------------------------- sessions

def _short(ts: str | None) -> str | None:
    """``2026-11-30T12:00:00.123456Z`` as ``2026-11-30 12:00:00Z``."""
    if not ts:
        return ts
    return ts[:10] + " " + ts[11:19] + "Z" if len(ts) >= 19 else ts


@bio.command("sessions")
@agent_option
@json_option
def sessions(agent: str | None, as_json: bool) -> None:
    """List an agent's sessions, most recently active first, and the questions still open.

    A question is open until an ``answer`` event names it as its parent_id.
    """
    from rich.text import Text

    found = _client().sessions(agent)
    if as_json:
        click.echo(json.dumps(found, indent=2))
        return
    rows = found.get("sessions") or []
    console = _console()
    if not rows:
        console.print(Text(f"No events for agent {found.get('agent')}."))
        return
    console.print(_table(
        ("SESSION", "FIRST", "LAST", "EVENTS", "OPEN QUESTIONS", "KINDS"),
        ((_plain(s["session"]), _short(s.get("first_ts")), _short(s.get("last_ts")), s.get("events"),
          len(s.get("open_questions") or []),
          " ".join(f"{k}:{n}" for k, n in (s.get("kinds") or {}).items()))
         for s in rows),
        title=Text(f"biography of {found.get('agent')}"), title_justify="left"))
    open_sessions = [s for s in rows if s.get("open_questions")]
    if not open_sessions:
        console.print(Text("No open questions."))
        return
    console.print(Text("Open questions:", style="bold"))
    for s in open_sessions:
        console.print(Text(f"  {_plain(s['session'])}"))
        for q in s["open_questions"]:
            first = (q.get("content") or "").strip().splitlines() or [""]
            console.print(Text(f"    {_short(q.get('ts'))}  {q.get('event_id')}  {_plain(first[0])}"))


# --------------------------------------------------------------------------- export

def _export_format(out: Path) -> str:
    fmt = FORMATS.get(out.suffix.lower())
    if fmt is None:
        raise _fail(f"--out {str(out)!r}: the file name must end in .parquet, .ndjson or .jsonl "
                    "(the extension chooses the format)")
    return fmt


def export_schema():
    """The Parquet schema of an export: the segment schema with an ``agent`` column first.

    A segment needs no ``agent`` column (its ``agent=`` partition path says whose it is);
    an exported file stands alone, so it carries it.
    """
    import pyarrow as pa

    from .biography.schema import EVENT_SCHEMA, FORMAT_VERSION

    metadata = {k.decode(): v.decode() for k, v in (EVENT_SCHEMA.metadata or {}).items()
                if not k.startswith(b"orgmem.partitioning") and not k.startswith(b"orgmem.sort")}
    metadata.update({"orgmem.format_version": str(FORMAT_VERSION), "orgmem.export": "1",
                     "orgmem.order": "time (ts, event_id); with --session, session order "
                                     "(seq nulls last, ts, event_id)"})
    agent = pa.field("agent", pa.string(), nullable=False,
                     metadata={"description": "Agent whose biography the event belongs to."})
    return pa.schema([agent, *EVENT_SCHEMA], metadata=metadata)


def event_from_api(d: Mapping[str, Any]):
    """An API event dict (``ts`` in RFC 3339, ``data`` parsed) back as an :class:`Event`."""
    import orjson

    from .biography.events import Event

    data = d.get("data")
    return Event(d["event_id"], d["agent"], d["session"], _ts_us(d["ts"]), d["kind"], d.get("seq"),
                 d.get("role"), d.get("parent_id"), d.get("tool"), d.get("content"),
                 None if data is None else orjson.dumps(data, option=orjson.OPT_SORT_KEYS).decode(),
                 d.get("artifact_uri"), d.get("model"), d.get("tokens_in"), d.get("tokens_out"),
                 list(d.get("tags") or []), d.get("trace_id"), d.get("span_id"),
                 int(d.get("redactions") or 0))


class _ParquetSink:
    def __init__(self, f) -> None:
        import pyarrow.parquet as pq

        from .biography import schema

        self.schema = export_schema()
        self.rows: list = []
        self.bytes = 0
        self.max_rows = schema.ROW_GROUP_ROWS
        self.max_bytes = schema.ROW_GROUP_BYTES
        self.writer = pq.ParquetWriter(
            f, self.schema, compression="zstd", compression_level=schema.ZSTD_LEVEL,
            use_dictionary=[*schema.DICTIONARY_COLUMNS, "agent"],
            write_statistics=[*schema.STATISTICS_COLUMNS, "agent"], write_page_index=True)

    def write(self, e: Mapping[str, Any]) -> None:
        event = event_from_api(e)
        self.rows.append(event)
        self.bytes += 200 + len(event.content or "") + len(event.data or "")
        if len(self.rows) >= self.max_rows or self.bytes >= self.max_bytes:
            self.flush()

    def flush(self) -> None:
        import pyarrow as pa

        if not self.rows:
            return
        columns = {f.name: pa.array([getattr(e, f.name) for e in self.rows], type=f.type)
                   for f in self.schema}
        table = pa.Table.from_pydict(columns, schema=self.schema)
        self.writer.write_table(table, row_group_size=len(self.rows))
        self.rows, self.bytes = [], 0

    def close(self) -> None:
        self.flush()
        self.writer.close()


class _NdjsonSink:
    def __init__(self, f) -> None:
        self.f = f

    def write(self, e: Mapping[str, Any]) -> None:
        self.f.write(json.dumps(e, ensure_ascii=False).encode() + b"\n")

    def close(self) -> None:
        pass


def _expected(client: BioClient, agent: str | None, session: str | None, filtered: bool) -> int | None:
    """How many events the export will hold, when the sessions summary can say (for the bar)."""
    if filtered:
        return None
    try:
        found = client.sessions(agent)
    except AdminError:
        return None  # e.g. no bio:ListSessions grant: the bar just counts
    rows = found.get("sessions") or []
    if session is not None:
        rows = [s for s in rows if s.get("session") == session]
    return sum(int(s.get("events") or 0) for s in rows)


@bio.command("export")
@agent_option
@session_option
@kind_option
@since_option
@click.option("--until", metavar="TIME", help="Before this time (exclusive); same forms as --since.")
@click.option("--out", "out", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="FILE.parquet or FILE.ndjson (.jsonl too): the extension chooses the format.")
@click.option("--force", is_flag=True, help="Replace --out if it exists.")
def export(agent: str | None, session: str | None, kinds: tuple[str, ...], since: str | None,
           until: str | None, out: Path, force: bool) -> None:
    """Write every matching event to a Parquet or NDJSON file.

    NDJSON holds one event per line as the API returns it. Parquet has the columns of the
    gateway's segments plus an ``agent`` column, so the file stands alone. Rows are in time
    order (session order with --session). The file is written under a temporary name and
    renamed when complete: a failed or interrupted export leaves nothing behind.
    """
    fmt = _export_format(out)
    if out.exists() and not force:
        raise _fail(f"--out {str(out)!r} exists; add --force to replace it")
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise _fail(f"--out {str(out)!r}: the directory {str(parent)!r} does not exist")
    client = _client()
    kind_list = _kinds(kinds)
    events = client.iter_events(agent=agent, session=session, kinds=kind_list, since=since, until=until,
                                page_size=PAGE)
    # The first page checks the arguments (a bad --since, an unknown kind) before any output.
    first = next(events, None)
    total = _expected(client, agent, session, bool(kind_list or since or until))

    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    try:
        fd, tmp_name = tempfile.mkstemp(dir=parent, prefix=f".{out.name}.", suffix=".part")
    except OSError as exc:
        raise _fail(f"cannot write in {str(parent)!r}: {exc.strerror}", "ExportFailed") from None
    tmp = Path(tmp_name)
    count = 0
    name = None
    try:
        with os.fdopen(fd, "wb") as f:
            sink = _ParquetSink(f) if fmt == "parquet" else _NdjsonSink(f)
            columns = (TextColumn("exporting"), BarColumn(),
                       TextColumn("{task.completed} events" + ("" if total is None else f" of {total}")),
                       TimeElapsedColumn())
            with Progress(*columns, console=Console(stderr=True), transient=False) as progress:
                task = progress.add_task("export", total=total)
                for e in itertools.chain([first] if first is not None else [], events):
                    sink.write(e)
                    name = name or e.get("agent")
                    count += 1
                    if count % 100 == 0:
                        progress.update(task, completed=count, total=max(total, count) if total else None)
                progress.update(task, completed=count, total=max(total or 0, count) or 1)
            sink.close()
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, out)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise _fail(f"cannot write {str(out)!r}: {exc.strerror or exc}", "ExportFailed") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    what = "Parquet, with an agent column" if fmt == "parquet" else "NDJSON"
    whose = f" of agent {name}" if name else (f" of agent {agent}" if agent else "")
    click.echo(f"Exported {count} event{'s' if count != 1 else ''}{whose} to {out} ({what}).")


# --------------------------------------------------------------------------- compact

@bio.command("compact")
@json_option
def compact(as_json: bool) -> None:
    """Compact now: commit buffered events, merge the log into Parquet segments and apply retention.

    Returns when the result is committed.
    """
    result = _client().compact()
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    n = {k: result.get(k, 0) for k in ("records", "log_objects", "segments_written", "segments_merged",
                                       "segments_expired", "files_deleted", "log_objects_removed")}
    click.echo(f"Compacted {n['records']} records from {n['log_objects']} log objects: "
               f"{n['segments_written']} segments written, {n['segments_merged']} merged, "
               f"{n['segments_expired']} expired by retention, {n['files_deleted']} files deleted, "
               f"{n['log_objects_removed']} log objects removed.")
    if result.get("conflict"):
        click.echo("Another gateway was compacting at the same time; its work counts too.", err=True)


# --------------------------------------------------------------------------- retention

def _days(days: int | None) -> str:
    return "forever" if days is None else f"{days} day{'s' if days != 1 else ''}"


def _effective(settings: Mapping[str, Any], agent: str) -> tuple[int | None, bool]:
    agents = settings.get("agents") or {}
    if agent in agents:
        return agents[agent], True
    return settings.get("default_days"), False


def _show_retention(settings: Mapping[str, Any], agent: str | None) -> None:
    if agent:
        days, own = _effective(settings, agent)
        click.echo(f"{agent}: kept {_days(days)} ({'its own setting' if own else 'the default'}).")
        return
    click.echo(f"default: kept {_days(settings.get('default_days'))}")
    agents = settings.get("agents") or {}
    if agents:
        _console().print(_table(("AGENT", "KEPT"), ((a, _days(d)) for a, d in agents.items())))
    else:
        click.echo("No agent has its own setting.")


@bio.command("retain")
@agent_option
@click.option("--days", type=click.IntRange(1, 36500), metavar="N",
              help="Keep N days of events (whole UTC days of partitions), then delete them at compaction.")
@click.option("--forever", is_flag=True, help="Keep events forever.")
@click.option("--reset", is_flag=True,
              help="With --agent: drop the agent's own setting; the default applies.")
@json_option
def retain(agent: str | None, days: int | None, forever: bool, reset: bool, as_json: bool) -> None:
    """Show or set how long biographies are kept.

    Without --days, --forever or --reset: show the settings. Otherwise set the default
    (without --agent) or one agent's setting (with --agent).
    """
    if sum((days is not None, forever, reset)) > 1:
        raise click.UsageError("give at most one of --days, --forever and --reset")
    if reset and not agent:
        raise click.UsageError("--reset needs --agent (the default has no default to fall back to)")
    client = _client()
    if days is None and not forever and not reset:
        settings = client.retention(agent)
        if as_json:
            click.echo(json.dumps(settings, indent=2))
        else:
            _show_retention(settings, agent)
        return
    settings = client.set_retention(days, agent, reset=reset)
    if as_json:
        click.echo(json.dumps(settings, indent=2))
        return
    if agent:
        kept, own = _effective(settings, agent)
        click.echo(f"{agent}: kept {_days(kept)}" + ("." if own else " (the default)."))
    else:
        click.echo(f"default: kept {_days(settings.get('default_days'))}.")
