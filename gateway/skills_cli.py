"""``orgmem skills``: publish, list, show and restore Agent Skills folders.

Every command is a few signed calls to the gateway's skills API through
:class:`~gateway.skills_client.SkillsClient`, with the ``--endpoint``/``--ca-bundle`` options and
credentials of ``orgmem admin``. Errors go to stderr as ``error: <code>: <message>``, exit code 1.
"""

from __future__ import annotations

import click

from .admin_cli import _AdminGroup, _console, _print_json, _Settings, _table, gateway_options, json_option
from .skills_client import SkillsClient

scope_option = click.option("--scope", metavar="SCOPE",
                            help="org, team:<name> or agent:<name> (push: default your own agent "
                                 "scope, or org for root and humans; reads: yours, your teams', the org's).")


def _client() -> SkillsClient:
    settings = click.get_current_context().find_object(_Settings)
    if settings is None:
        settings = _Settings(None, None)
    return SkillsClient.over(settings.client())


@click.group(cls=_AdminGroup)
@gateway_options
@click.pass_context
def skills(ctx: click.Context, endpoint: str | None, ca_bundle: str | None) -> None:
    """Publish and fetch skills: Agent Skills folders (SKILL.md with YAML front matter, plus
    scripts/, references/, assets/), versioned per scope.

    Credentials come from ORGMEM_ACCESS_KEY and ORGMEM_SECRET_KEY, else from
    ORGMEM_ROOT_ACCESS_KEY and ORGMEM_ROOT_SECRET_KEY.
    """
    ctx.obj = _Settings(endpoint, ca_bundle)


@skills.command("push")
@click.argument("folder", type=click.Path(exists=True, file_okay=False))
@scope_option
@json_option
def push(folder: str, scope: str | None, as_json: bool) -> None:
    """Validate FOLDER and publish all its files as the skill's next version, atomically.

    The skill's name is the folder's name, and must equal the name in SKILL.md.
    """
    manifest = _client().push(folder, scope)
    if as_json:
        _print_json(manifest)
        return
    click.echo(f"published {manifest['scope']}/{manifest['name']} version {manifest['version']} "
               f"({len(manifest['files'])} files, {manifest['size']} bytes)")


@skills.command("pull")
@click.argument("name")
@click.argument("folder", type=click.Path(file_okay=False))
@click.option("--version", type=click.IntRange(1), help="This version (default the latest).")
@scope_option
@json_option
def pull(name: str, folder: str, version: int | None, scope: str | None, as_json: bool) -> None:
    """Restore skill NAME into FOLDER (absent or empty), byte for byte."""
    manifest = _client().pull(name, folder, scope, version)
    if as_json:
        _print_json(manifest)
        return
    click.echo(f"restored {manifest['scope']}/{manifest['name']} version {manifest['version']} "
               f"into {folder} ({len(manifest['files'])} files)")


@skills.command("list")
@scope_option
@click.option("-q", "--query", "q", metavar="WORDS", help="Only skills whose name or description "
              "holds every word.")
@json_option
def list_skills(scope: str | None, q: str | None, as_json: bool) -> None:
    """List the skills you may read: scope, name, latest version, author and description."""
    rows = _client().list(scope, q)
    if as_json:
        _print_json(rows)
        return
    _console().print(_table(["scope", "name", "version", "author", "description"],
                            [(r["scope"], r["name"], r["version"], r["author"], r["description"])
                             for r in rows]))


@skills.command("show")
@click.argument("name")
@click.option("--version", type=click.IntRange(1), help="This version (default the latest).")
@scope_option
@json_option
def show(name: str, version: int | None, scope: str | None, as_json: bool) -> None:
    """Show a version's manifest: front matter, author, and every file with its size and sha256."""
    m = _client().manifest(name, scope, version)
    if as_json:
        _print_json(m)
        return
    click.echo(f"{m['scope']}/{m['name']} version {m['version']} by {m['author']} at {m['created_at']}")
    click.echo(f"  {m['description']}")
    _console().print(_table(["path", "size", "sha256", "exec"],
                            [(f["path"], f["size"], f["sha256"][:16], f["executable"]) for f in m["files"]]))
