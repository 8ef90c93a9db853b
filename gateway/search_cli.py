"""``orgmem search`` and ``orgmem index status|rebuild``.

Signed calls to ``/v1/search`` and ``/v1/index/...`` with the ``--endpoint``/``--ca-bundle``
options and credentials of ``orgmem admin``. Errors go to stderr as
``error: <code>: <message>``, exit code 1.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

import click

from .admin_cli import _AdminGroup, _console, _print_json, _Settings, _table, gateway_options, json_option
from .admin_client import AdminClient, AdminError


class SearchClient:
    """``/v1/search`` and ``/v1/index/*`` over an :class:`AdminClient`'s signed transport."""

    def __init__(self, transport: AdminClient) -> None:
        self._transport = transport

    def _call(self, method: str, path: str, query: Mapping[str, Any] | None = None) -> Any:
        status, _, data = self._transport._request(method, path, query=query)
        try:
            return json.loads(data) if data.strip() else None
        except ValueError:
            raise AdminError(status, "InvalidResponse", f"{method} {path} answered something that is "
                             f"not JSON (HTTP {status})") from None

    def search(self, q: str, **filters: Any) -> dict:
        query = {"q": q, **{k: v for k, v in filters.items() if v not in (None, "")}}
        return self._call("GET", "/v1/search", query)

    def status(self) -> dict:
        return self._call("GET", "/v1/index/status")

    def rebuild(self) -> dict:
        return self._call("POST", "/v1/index/rebuild")


def _client() -> SearchClient:
    settings = click.get_current_context().find_object(_Settings) or _Settings(None, None)
    return SearchClient(settings.client())


@click.command()
@click.argument("query", required=False, default="")
@click.option("--type", "types", help="event, memory, skill or file (comma-separated for several).")
@click.option("--agent", help="Only items of this agent.")
@click.option("--session", help="Only events of this session.")
@click.option("--scope", help="org, team:<name> or agent:<name> (memory and skills).")
@click.option("--kind", help="Event kind, memory kind (decision, fact...), or file extension.")
@click.option("--since", help="RFC 3339, unix seconds, or a duration back from now (10m, 7d).")
@click.option("--until", help="RFC 3339, unix seconds, or a duration back from now.")
@click.option("--limit", type=click.IntRange(0, 1000), default=10, show_default=True)
@click.option("--offset", type=click.IntRange(0, 10000), default=0)
@gateway_options
@json_option
def search(query: str, types: str | None, agent: str | None, session: str | None, scope: str | None,
           kind: str | None, since: str | None, until: str | None, limit: int, offset: int,
           endpoint: str | None, ca_bundle: str | None, as_json: bool) -> None:
    """Search events, memory, skills and workspace files you may read.

    QUERY: words, "phrases", +must, -not, field:value (kind:decision), time:[2026-01-01 TO *].
    """
    client = SearchClient(_Settings(endpoint, ca_bundle).client())
    try:
        result = client.search(query, type=types, agent=agent, session=session, scope=scope, kind=kind,
                               since=since, until=until, limit=limit, offset=offset)
    except AdminError as exc:
        click.echo(f"error: {exc.code}: {exc.message}", err=True)
        raise SystemExit(1) from None
    if as_json:
        _print_json(result)
        return
    rows = []
    for hit in result["hits"]:
        where = hit.get("scope") or hit.get("agent") or ""
        status = "" if hit.get("status") == "active" else hit.get("status")
        when = hit.get("time", "")[:19].replace("T", " ")
        rows.append([hit["type"], when, where, hit.get("title", "")[:60],
                     " ".join(hit.get("snippet", "").split())[:90], status, hit.get("source", "")])
    console = _console()
    console.print(_table(["type", "time", "where", "title", "snippet", "status", "source"], rows))
    index = result.get("index") or {}
    stale = f", snapshot {index['snapshot_age_seconds']:.0f}s old" if "snapshot_age_seconds" in index else ""
    console.print(f"{len(rows)} of {result['count']} in {result['took_ms']} ms{stale}")
    for warning in result.get("warnings") or []:
        console.print(f"[yellow]note:[/yellow] {warning}")


@click.group(cls=_AdminGroup)
@gateway_options
@click.pass_context
def index(ctx: click.Context, endpoint: str | None, ca_bundle: str | None) -> None:
    """The search index: its status, and a rebuild from the sources."""
    ctx.obj = _Settings(endpoint, ca_bundle)


@index.command("status")
@json_option
def status(as_json: bool) -> None:
    """Checkpoint, lag, snapshot age, who writes the index."""
    st = _client().status()
    if as_json:
        _print_json(st)
        return
    snap = st.get("snapshot") or {}
    rows = [("role (this gateway)", st["role"]), ("writer", st.get("holder") or "none"),
            ("documents", st.get("docs")), ("lag (log objects)", st.get("lag_objects")),
            ("snapshot", f"#{snap.get('seq')} · {snap.get('docs')} docs · {snap.get('age_seconds')} s old"
             if snap else "none yet"),
            ("checkpoint", ", ".join(f"{w}:{s}" for w, s in st.get("checkpoint", {}).items()) or "-"),
            ("started from", st.get("stats", {}).get("started_from")),
            ("last rebuild", (st.get("rebuild") or {}).get("state"))]
    _console().print(_table(["", ""], rows, show_header=False))


@index.command("rebuild")
@click.option("--no-wait", is_flag=True, help="Start the rebuild and return.")
@json_option
def rebuild(no_wait: bool, as_json: bool) -> None:
    """Rebuild the index from the sources (biographies, memory, skills, workspace files)."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    client = _client()
    client.rebuild()
    if no_wait:
        click.echo("rebuild requested")
        return
    progress = {}
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                  console=_console(), transient=as_json) as bar:
        task = bar.add_task("waiting for the index writer", total=None)
        while True:
            progress = client.status().get("rebuild") or {}
            counts = progress.get("counts") or {}
            described = " · ".join(f"{k} {v}" for k, v in counts.items())
            bar.update(task, description=f"{progress.get('state')} {progress.get('phase', '')} {described}")
            if progress.get("state") in ("done", "failed"):
                break
            time.sleep(0.3)
    if as_json:
        _print_json(progress)
    elif progress.get("state") == "failed":
        raise click.ClickException(f"rebuild failed: {progress.get('error')}")
    else:
        click.echo(f"rebuilt in {progress.get('seconds')} s: " +
                   ", ".join(f"{v} {k}" for k, v in (progress.get("counts") or {}).items()))
