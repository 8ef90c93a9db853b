"""``orgmem vault``: rotate the key-encryption key and rewrap data keys, through the gateway.

The gateway holds the store (the embedded one is locked to it), so these commands ask it to do
the work over the admin API (``admin:ManageKeys``), like ``orgmem admin``; they use the same
``--endpoint`` and credentials.
"""

from __future__ import annotations

import json

import click

from .admin_cli import _AdminGroup, _console, _Settings, _table, gateway_options, json_option
from .admin_client import AdminClient


def _client() -> AdminClient:
    return click.get_current_context().find_object(_Settings).client()


def _call(method: str, path: str, body: dict | None = None) -> dict:
    payload = json.dumps(body).encode() if body is not None else b""
    _, _, data = _client()._request(method, "/admin/v1/vault/" + path, body=payload,
                                    content_type="application/json" if body is not None else None)
    return json.loads(data) if data else {}


@click.group(cls=_AdminGroup)
@gateway_options
@click.pass_context
def vault(ctx: click.Context, endpoint: str | None, ca_bundle: str | None) -> None:
    """Manage the key-encryption key (KEK) that seals everything at rest."""
    ctx.obj = _Settings(endpoint, ca_bundle)


@vault.group()
def kek() -> None:
    """The KEK's versions: status, rotate, retire."""


@kek.command("status")
@json_option
def kek_status(as_json: bool) -> None:
    """Count objects per KEK version (what rewrap has left to do)."""
    status = _call("GET", "kek")
    if as_json:
        click.echo(json.dumps(status, indent=2))
        return
    console = _console()
    console.print(f"KEK {status['kek_id']}: primary version {status['primary']}, "
                  f"versions {status['versions']}, retired {status['retired']}")
    rows = [(version, count, "primary" if version == str(status["primary"]) else "")
            for version, count in status["objects_by_version"].items()]
    console.print(_table(["version", "objects", ""], rows))


@kek.command("rotate")
@json_option
def kek_rotate(as_json: bool) -> None:
    """Make a new KEK version primary; new objects use it at once. Then run `orgmem vault rewrap`."""
    result = _call("POST", "kek/rotate")
    if as_json:
        click.echo(json.dumps(result))
    else:
        click.echo(f"KEK version {result['primary']} is now primary. Existing data keys stay "
                   "wrapped by older versions until `orgmem vault rewrap`.")


@kek.command("retire")
@click.argument("version", type=int)
def kek_retire(version: int) -> None:
    """Retire a KEK version; refused while any object still uses it."""
    result = _call("POST", "kek/retire", {"version": version})
    click.echo(f"KEK version {result['retired']} is retired.")


@vault.command("rewrap")
@click.option("--resume", is_flag=True, help="Continue an interrupted rewrap from its checkpoint.")
@click.option("--batch", default=500, show_default=True, help="Objects per request.")
def rewrap(resume: bool, batch: int) -> None:
    """Rewrap every data key under the primary KEK version, without rewriting data.

    Safe while the gateway serves traffic; interrupted, continue with --resume.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    status = _call("GET", "kek")
    primary = str(status["primary"])
    total = sum(n for v, n in status["objects_by_version"].items() if v != primary)
    done = rewrapped = 0
    columns = (TextColumn("rewrapping"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, console=_console(), transient=False) as progress:
        task = progress.add_task("rewrap", total=max(total, 1))
        while True:
            result = _call("POST", "rewrap", {"resume": resume, "limit": batch})
            resume = True  # every later batch continues from the checkpoint
            done += result["scanned"]
            rewrapped += result["rewrapped"]
            progress.update(task, completed=min(rewrapped, total))
            if result["done"]:
                break
    click.echo(f"Rewrapped {rewrapped} of {done} objects; every data key is now under KEK "
               f"version {result['primary']}.")
