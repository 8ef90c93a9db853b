"""``orgmem memory``: move open memory between deployments, losslessly.

    orgmem memory export [--scope S] > memory.jsonl     every version of every document, as stored
    orgmem memory import memory.jsonl                   into another gateway, versions and provenance kept

The export is JSON Lines: one line per version, ordered by scope, id and version; each line is
the full stored document (``format``, provenance, status...). Import sends each document's
versions in one call (``POST /v1/memory/import``); versions already present with the same
content are skipped, so an interrupted import can simply be run again. Importing writes
provenance in other principals' names, so besides ``memory:PutDocument`` and
``memory:DeleteDocument`` it needs ``admin:CreateKey`` on ``arn:orgmem:admin:::agent/*``
(root has it). Errors go to stderr as ``error: <code>: <message>`` with exit code 1.
"""

from __future__ import annotations

import json
import sys
from itertools import groupby

import click

from .admin_cli import _AdminGroup, _Settings, gateway_options
from .admin_client import AdminError
from .memory_client import MemoryClient


def _client() -> MemoryClient:
    settings = click.get_current_context().find_object(_Settings)
    if settings is None:
        settings = _Settings(None, None)
    return MemoryClient.over(settings.client())


@click.group(cls=_AdminGroup)
@gateway_options
@click.pass_context
def memory(ctx: click.Context, endpoint: str | None, ca_bundle: str | None) -> None:
    """Export and import open memory (documents with every version and their provenance).

    Credentials come from ORGMEM_ACCESS_KEY and ORGMEM_SECRET_KEY, else from
    ORGMEM_ROOT_ACCESS_KEY and ORGMEM_ROOT_SECRET_KEY.
    """
    ctx.obj = _Settings(endpoint, ca_bundle)


@memory.command("export")
@click.option("--scope", help="Only this scope: org, team:NAME or agent:NAME (default: all you may read).")
def export(scope: str | None) -> None:
    """Write every version of every document you may read, one JSON object a line, to stdout."""
    client = _client()
    docs = client.list(scope=scope, status="any")
    count = 0
    for doc in sorted(docs, key=lambda x: (x["scope"], x["id"])):
        for version in client.history(doc["scope"], doc["id"]):
            sys.stdout.write(json.dumps(version, ensure_ascii=False, separators=(",", ":")) + "\n")
            count += 1
    sys.stdout.flush()
    click.echo(f"exported {count} versions of {len(docs)} documents", err=True)


@memory.command("import")
@click.argument("path", type=click.File("r", encoding="utf-8"))
def import_(path) -> None:
    """Import an export (a file, or - for stdin) into this gateway, versions and provenance as they were."""
    client = _client()
    versions = []
    for number, line in enumerate(path, 1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
        except ValueError as exc:
            raise AdminError(0, "InvalidInput", f"line {number} is not JSON: {exc}") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("scope"), str) or \
                not isinstance(doc.get("id"), str):
            raise AdminError(0, "InvalidInput", f"line {number} is not an exported memory document")
        versions.append(doc)
    written = skipped = docs = 0
    key = lambda v: (v["scope"], v["id"])  # noqa: E731
    for (scope, doc_id), group in groupby(sorted(versions, key=key), key=key):
        answer = client.import_document(scope, doc_id, list(group))
        written += answer["written"]
        skipped += answer["skipped"]
        docs += 1
    click.echo(f"imported {docs} documents: {written} versions written, {skipped} already present",
               err=True)
