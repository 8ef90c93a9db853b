"""``orgmem admin``: manage agents, keys, teams and policies and read the audit log.

Used the way ``mc admin`` uses MinIO's admin API: every command is one signed call (or a
few) to the gateway's /admin/v1 API through ``AdminClient``.  Credentials come from the
environment only (ORGMEM_ACCESS_KEY/ORGMEM_SECRET_KEY, else ORGMEM_ROOT_*), never from
the command line where ``ps`` would show them.

Output is a readable table by default; ``--json`` prints machine output on stdout only.
Errors go to stderr as ``error: <code>: <message>`` with exit code 1 (2 for usage errors,
3 for ``policy simulate`` when the request would be denied).  Secret keys are printed by
``agent create``, ``key create``, ``key rotate`` and ``sandbox-credentials`` only.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import sys
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import click

from .admin_client import AdminClient, AdminError, from_env

#: Exit code of ``policy simulate`` when the request would be denied.
EXIT_DENIED = 3
#: Records fetched per audit request (the API's maximum).
AUDIT_PAGE = 1000
#: Seconds between polls of ``audit tail --follow``.
FOLLOW_INTERVAL = 1.0
#: The action of a read of the audit log; ``--follow`` hides its own polls.
AUDIT_READ_ACTION = "admin:ReadAudit"

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"(?:\d+[smhd])+")
_DURATION_PART = re.compile(r"(\d+)([smhd])")


def _stop_on_signals() -> None:
    """Ctrl-C and SIGTERM end ``--follow`` cleanly, even when the shell that started it in the
    background set SIGINT to be ignored (which Python would otherwise keep)."""
    def stop(signum, frame):
        raise KeyboardInterrupt
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)


def parse_duration(text: str) -> int:
    """Seconds in ``90s``, ``15m``, ``1h``, ``7d``, ``1h30m`` or a bare number of seconds."""
    value = text.strip().lower()
    if value.isascii() and value.isdigit():
        return int(value)
    if not _DURATION.fullmatch(value):
        raise ValueError(f"{text!r} is not a duration like 90s, 15m, 1h or 7d")
    return sum(int(n) * _UNITS[unit] for n, unit in _DURATION_PART.findall(value))


class Duration(click.ParamType):
    name = "DURATION"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:
            return parse_duration(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class Since(click.ParamType):
    """A start time for the audit log: a duration ago (10m), an ISO-8601 time or epoch seconds."""

    name = "SINCE"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value).strip()
        if re.fullmatch(r"\d+[smhd]", text.lower()):
            return text.lower()  # the gateway reads a relative time itself, by its own clock
        if _DURATION.fullmatch(text.lower()):  # compound (1h30m): send an absolute time
            when = time.time() - parse_duration(text)
            return datetime.fromtimestamp(when, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        if re.fullmatch(r"\d+(\.\d+)?", text):
            return text
        try:
            datetime.fromisoformat(text)
        except ValueError:
            self.fail(f"{text!r} is not a duration (10m), an ISO-8601 time or epoch seconds", param, ctx)
        return text


class KeyValue(click.ParamType):
    name = "KEY=VALUE"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple:
        if isinstance(value, tuple):
            return value
        key, sep, val = str(value).partition("=")
        if not sep or not key.strip():
            self.fail(f"{value!r} is not KEY=VALUE", param, ctx)
        return key.strip(), val


# --------------------------------------------------------------------------- plumbing

@dataclass
class _Settings:
    endpoint: str | None
    ca_bundle: str | None
    _client: AdminClient | None = None

    def client(self) -> AdminClient:
        if self._client is None:
            self._client = from_env(self.endpoint, ca_file=self.ca_bundle)
        return self._client


def _client() -> AdminClient:
    settings = click.get_current_context().find_object(_Settings)
    if settings is None:  # a subcommand invoked on its own, outside `orgmem admin`
        settings = _Settings(None, None)
    return settings.client()


class _AdminGroup(click.Group):
    """Turns AdminError anywhere below into ``error: <code>: <message>`` and exit code 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except AdminError as exc:
            click.echo(f"error: {exc.code}: {exc.message}", err=True)
            ctx.exit(1)


json_option = click.option("--json", "as_json", is_flag=True,
                           help="Print machine-readable JSON on stdout instead of a table.")


def _without_secrets(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _without_secrets(v) for k, v in value.items() if k != "secret_key"}
    if isinstance(value, list):
        return [_without_secrets(v) for v in value]
    return value


def _print_json(value: Any, *, secrets: bool = False) -> None:
    click.echo(json.dumps(value if secrets else _without_secrets(value), indent=2))


def _console():
    from rich.console import Console

    width = None
    if not sys.stdout.isatty() and not os.environ.get("COLUMNS"):
        width = 200  # piped: do not squeeze tables into 80 columns
    return Console(highlight=False, soft_wrap=False, width=width)


def _cell(value: Any, style: str | None = None):
    from rich.text import Text

    if value is None or value == "" or value == []:
        return Text("-", style="dim")
    if isinstance(value, bool):
        return Text("yes" if value else "no", style=style or "")
    if isinstance(value, (list, tuple)):
        return Text(", ".join(str(v) for v in value), style=style or "")
    return Text(str(value), style=style or "")


def _table(columns: Sequence[str], rows: Iterable[Sequence[Any]], **kwargs):
    from rich.table import Table

    table = Table(header_style="bold", **kwargs)
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*(_cell(v) for v in row))
    return table


def _details(pairs: Sequence[tuple[str, Any]]):
    from rich.table import Table

    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    for key, value in pairs:
        grid.add_row(key, _cell(value))
    return grid


def _print_credentials(creds: Mapping[str, Any], title: str) -> None:
    # Plain echo, not rich: a secret must never be wrapped, folded or styled.
    click.echo(title)
    click.echo(f"  access key: {creds['access_key']}")
    click.echo(f"  secret key: {creds['secret_key']}")
    click.echo("Store the secret key now: it cannot be shown again.", err=True)


def _credentials_json(creds: Mapping[str, Any]) -> dict[str, Any]:
    return {"name": creds["name"], "access_key": creds["access_key"], "secret_key": creds["secret_key"]}


# --------------------------------------------------------------------------- the group

def gateway_options(group):
    """``--endpoint`` and ``--ca-bundle``, shared by every command group that calls the gateway."""
    group = click.option("--ca-bundle", type=click.Path(exists=True, dir_okay=False),
                         help="PEM file of the CA that signed the gateway's certificate "
                              "(default $ORGMEM_CA_BUNDLE).")(group)
    return click.option("--endpoint", metavar="URL",
                        help="Gateway URL (default $ORGMEM_ENDPOINT, else http://127.0.0.1:9000).")(group)


@click.group(cls=_AdminGroup)
@gateway_options
@click.pass_context
def admin(ctx: click.Context, endpoint: str | None, ca_bundle: str | None) -> None:
    """Manage agents, keys, teams and policies, and read the audit log.

    Credentials come from ORGMEM_ACCESS_KEY and ORGMEM_SECRET_KEY, else from
    ORGMEM_ROOT_ACCESS_KEY and ORGMEM_ROOT_SECRET_KEY.
    """
    ctx.obj = _Settings(endpoint, ca_bundle)


@admin.command()
@json_option
def whoami(as_json: bool) -> None:
    """Show who the configured credentials belong to."""
    me = _client().whoami()
    if as_json:
        return _print_json(me)
    _console().print(_details([("name", me.get("name")), ("kind", me.get("kind")),
                               ("root", me.get("is_root")), ("teams", me.get("teams")),
                               ("policies", me.get("policies"))]))


# --------------------------------------------------------------------------- agents

@admin.group()
def agent() -> None:
    """Create, inspect, disable and delete agents (and humans)."""


def _agent_rows(agents: Sequence[Mapping[str, Any]]):
    for a in agents:
        keys = [k.get("access_key") for k in a.get("keys") or []]
        yield (a.get("name"), a.get("kind"), "disabled" if a.get("disabled") else "active",
               a.get("teams"), a.get("policies"), keys, a.get("created_at"))


_AGENT_COLUMNS = ("NAME", "KIND", "STATUS", "TEAMS", "POLICIES", "KEYS", "CREATED")


def _show_agent(a: Mapping[str, Any]) -> None:
    console = _console()
    console.print(_details([
        ("name", a.get("name")), ("kind", a.get("kind")),
        ("status", "disabled" if a.get("disabled") else "active"),
        ("teams", a.get("teams")), ("policies", a.get("policies")), ("created", a.get("created_at")),
    ]))
    keys = a.get("keys") or []
    if keys:
        console.print(_table(("ACCESS KEY", "STATUS", "CREATED", "EXPIRES"),
                             ((k.get("access_key"), k.get("status"), k.get("created_at"),
                               k.get("expires_at")) for k in keys)))
    else:
        console.print("no active keys")
    sandbox = a.get("temporary_keys") or []
    if sandbox:
        console.print(_table(("SANDBOX KEY", "CREATED", "EXPIRES", "SESSION POLICY"),
                             ((k.get("access_key"), k.get("created_at"), k.get("expires_at"),
                               _session_policy(k)) for k in sandbox), title="sandbox credentials"))


@agent.command("create")
@click.argument("name")
@click.option("--team", "teams", multiple=True, metavar="TEAM", help="Add to this team (repeatable).")
@click.option("--policy", "policies", multiple=True, metavar="POLICY",
              help="Attach this policy (repeatable); without any, the gateway attaches agent-default.")
@click.option("--human", is_flag=True, help="The principal is a person, not an agent.")
@json_option
def agent_create(name: str, teams: tuple[str, ...], policies: tuple[str, ...], human: bool,
                 as_json: bool) -> None:
    """Create an agent and print its first access key and secret (shown only once)."""
    creds = _client().create_agent(name, kind="human" if human else "agent", teams=teams,
                                   policies=list(policies) if policies else None)
    if as_json:
        return _print_json(_credentials_json(creds), secrets=True)
    _print_credentials(creds, f"Created {'human' if human else 'agent'} {creds['name']}.")


@agent.command("list")
@json_option
def agent_list(as_json: bool) -> None:
    """List agents and humans."""
    agents = _client().list_agents()
    if as_json:
        return _print_json(agents)
    _console().print(_table(_AGENT_COLUMNS, _agent_rows(agents)))


@agent.command("show")
@click.argument("name")
@json_option
def agent_show(name: str, as_json: bool) -> None:
    """Show an agent: teams, policies and active keys (never secrets)."""
    found = _client().get_agent(name)
    if as_json:
        return _print_json(found)
    _show_agent(found)


@agent.command("disable")
@click.argument("name")
@json_option
def agent_disable(name: str, as_json: bool) -> None:
    """Refuse every request made with the agent's keys until it is enabled again."""
    found = _client().disable_agent(name)
    if as_json:
        return _print_json(found)
    click.echo(f"Agent {name} disabled: its keys are refused until `agent enable {name}`.")


@agent.command("enable")
@click.argument("name")
@json_option
def agent_enable(name: str, as_json: bool) -> None:
    """Let a disabled agent's keys work again."""
    found = _client().enable_agent(name)
    if as_json:
        return _print_json(found)
    click.echo(f"Agent {name} enabled.")


@agent.command("delete")
@click.argument("name")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@json_option
def agent_delete(name: str, yes: bool, as_json: bool) -> None:
    """Delete an agent and revoke all of its keys."""
    if not yes:
        click.confirm(f"Delete agent {name} and revoke all of its keys?", abort=True, err=True)
    _client().delete_agent(name)
    if as_json:
        return _print_json({"name": name, "deleted": True})
    click.echo(f"Agent {name} deleted.")


# --------------------------------------------------------------------------- keys

@admin.group()
def key() -> None:
    """Create, rotate and revoke access keys."""


@key.command("create")
@click.argument("name")
@json_option
def key_create(name: str, as_json: bool) -> None:
    """Give agent NAME another access key (the secret is shown only once)."""
    creds = _client().create_key(name)
    if as_json:
        return _print_json(_credentials_json(creds), secrets=True)
    _print_credentials(creds, f"New key for {creds.get('name', name)}.")


@key.command("rotate")
@click.argument("name")
@click.option("--key", "access_key", metavar="ACCESS_KEY",
              help="The key to replace (needed when the agent has more than one).")
@click.option("--grace", type=Duration(), default="0s", show_default=True,
              help="How long the old key keeps working: 90s, 15m, 1h, 7d. 0 revokes it now.")
@json_option
def key_rotate(name: str, access_key: str | None, grace: int, as_json: bool) -> None:
    """Replace an agent's key with a new one (the secret is shown only once)."""
    result = _client().rotate_key(name, access_key=access_key, grace_seconds=grace)
    if as_json:
        return _print_json(result, secrets=True)
    _print_credentials(result, f"New key for {result.get('name', name)}.")
    old, until = result.get("replaced"), result.get("old_key_expires_at")
    if until:
        click.echo(f"The old key {old} keeps working until {until}.")
    else:
        click.echo(f"The old key {old} is revoked.")


@key.command("revoke")
@click.argument("access_key")
@json_option
def key_revoke(access_key: str, as_json: bool) -> None:
    """Revoke an access key now."""
    _client().revoke_key(access_key)
    if as_json:
        return _print_json({"access_key": access_key, "revoked": True})
    click.echo(f"Key {access_key} revoked.")


# --------------------------------------------------------------------------- sandbox credentials

#: The variables ``--format env`` exports: boto3, the aws cli and orgmem's own commands read them.
_ENV_NAMES = (("AWS_ACCESS_KEY_ID", "access_key"), ("AWS_SECRET_ACCESS_KEY", "secret_key"),
              ("ORGMEM_ACCESS_KEY", "access_key"), ("ORGMEM_SECRET_KEY", "secret_key"))


def _session_policy(creds: Mapping[str, Any]) -> str | None:
    return "(inline)" if creds.get("inline_policy") else creds.get("policy")


def _print_sandbox_env(creds: Mapping[str, Any]) -> None:
    """``export`` lines only on stdout, so ``eval "$(orgmem admin sandbox-credentials ...)"`` works."""
    for name, field in _ENV_NAMES:
        click.echo(f"export {name}={shlex.quote(str(creds[field]))}")
    click.echo(f"# sandbox credentials of {creds['agent']} expire at {creds['expires_at']}", err=True)


def _print_sandbox_text(creds: Mapping[str, Any], ttl: int) -> None:
    # Plain echo, not rich: a secret must never be wrapped, folded or styled.
    click.echo(f"Sandbox credentials for {creds['agent']}, valid for {_human_duration(ttl)}.")
    click.echo(f"  access key:     {creds['access_key']}")
    click.echo(f"  secret key:     {creds['secret_key']}")
    click.echo(f"  expires at:     {creds['expires_at']}")
    session = _session_policy(creds) or "- (the agent's own rights)"
    click.echo(f"  session policy: {session}")
    click.echo("Store the secret key now: it cannot be shown again.", err=True)


def _human_duration(seconds: int) -> str:
    """3600 -> 1h, 5400 -> 1h30m: the way --ttl is written."""
    parts, rest = [], seconds
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if rest >= size:
            parts.append(f"{rest // size}{unit}")
            rest %= size
    return "".join(parts) or "0s"


@admin.command("sandbox-credentials")
@click.option("--agent", "agent_name", required=True, metavar="AGENT",
              help="The agent whose rights the credentials carry.")
@click.option("--ttl", type=Duration(), required=True,
              help="How long they work: 90s, 15m, 1h, 2d or seconds (1 second to 7 days).")
@click.option("--policy", "policy_name", metavar="POLICY",
              help="Narrow them to what this named policy also allows (a session policy).")
@click.option("--policy-file", type=click.File("rb"), metavar="FILE",
              help="Narrow them by an inline IAM JSON policy in FILE (- reads stdin).")
@click.option("--format", "output", type=click.Choice(["text", "env", "json"]), default="text",
              show_default=True, help="text for a person, env for `eval`, json for programs.")
@json_option
def sandbox_credentials(agent_name: str, ttl: int, policy_name: str | None, policy_file,
                        output: str, as_json: bool) -> None:
    """Issue temporary keys for a sandbox: the agent's rights, expiring by themselves.

    Requests made with them are allowed only when the agent's policies allow them and,
    with --policy or --policy-file, that session policy allows them too.  After the TTL
    they are refused with ExpiredToken.  The secret is shown only once.
    """
    if as_json and output not in ("text", "json"):
        raise click.UsageError("give --json or --format, not both")
    if policy_name and policy_file:
        raise click.UsageError("give --policy or --policy-file, not both")
    document = policy_file.read() if policy_file else None
    creds = _client().sandbox_credentials(agent_name, ttl, policy=policy_name, policy_document=document)
    if as_json or output == "json":
        return _print_json(creds, secrets=True)
    if output == "env":
        return _print_sandbox_env(creds)
    _print_sandbox_text(creds, ttl)


# --------------------------------------------------------------------------- teams

@admin.group()
def team() -> None:
    """Create teams and manage their members."""


_TEAM_COLUMNS = ("NAME", "MEMBERS", "POLICIES", "CREATED")


def _team_row(t: Mapping[str, Any]) -> tuple:
    return t.get("name"), t.get("members"), t.get("policies"), t.get("created_at")


def _print_team(t: Mapping[str, Any], as_json: bool, message: str | None = None) -> None:
    if as_json:
        return _print_json(t)
    if message:
        click.echo(message)
    _console().print(_table(_TEAM_COLUMNS, [_team_row(t)]))


@team.command("create")
@click.argument("name")
@click.option("--policy", "policies", multiple=True, metavar="POLICY",
              help="Attach this policy (repeatable).")
@json_option
def team_create(name: str, policies: tuple[str, ...], as_json: bool) -> None:
    """Create a team."""
    _print_team(_client().create_team(name, policies), as_json, f"Team {name} created.")


@team.command("list")
@json_option
def team_list(as_json: bool) -> None:
    """List teams with their members and policies."""
    teams = _client().list_teams()
    if as_json:
        return _print_json(teams)
    _console().print(_table(_TEAM_COLUMNS, (_team_row(t) for t in teams)))


@team.command("show")
@click.argument("name")
@json_option
def team_show(name: str, as_json: bool) -> None:
    """Show one team."""
    _print_team(_client().get_team(name), as_json)


@team.command("delete")
@click.argument("name")
@json_option
def team_delete(name: str, as_json: bool) -> None:
    """Delete a team."""
    _client().delete_team(name)
    if as_json:
        return _print_json({"name": name, "deleted": True})
    click.echo(f"Team {name} deleted.")


@team.command("add")
@click.argument("team_name", metavar="TEAM")
@click.argument("agent_name", metavar="AGENT")
@json_option
def team_add(team_name: str, agent_name: str, as_json: bool) -> None:
    """Add AGENT to TEAM."""
    _print_team(_client().add_member(team_name, agent_name), as_json,
                f"Added {agent_name} to team {team_name}.")


@team.command("remove")
@click.argument("team_name", metavar="TEAM")
@click.argument("agent_name", metavar="AGENT")
@json_option
def team_remove(team_name: str, agent_name: str, as_json: bool) -> None:
    """Remove AGENT from TEAM."""
    _print_team(_client().remove_member(team_name, agent_name), as_json,
                f"Removed {agent_name} from team {team_name}.")


# --------------------------------------------------------------------------- policies

@admin.group()
def policy() -> None:
    """Write, attach and test IAM policies."""


_POLICY_COLUMNS = ("NAME", "BUILTIN", "AGENTS", "TEAMS")


def _policy_row(p: Mapping[str, Any]) -> tuple:
    attached = p.get("attached_to") or {}
    return p.get("name"), p.get("builtin"), attached.get("agents"), attached.get("teams")


@policy.command("put")
@click.argument("name")
@click.argument("file", type=click.File("rb"))
@json_option
def policy_put(name: str, file, as_json: bool) -> None:
    """Create or replace policy NAME from an IAM JSON document in FILE (- reads stdin)."""
    document = file.read()
    saved = _client().put_policy(name, document)
    if as_json:
        return _print_json(saved)
    click.echo(f"Policy {name} saved.")


@policy.command("list")
@json_option
def policy_list(as_json: bool) -> None:
    """List policies and what they are attached to."""
    policies = _client().list_policies()
    if as_json:
        return _print_json(policies)
    _console().print(_table(_POLICY_COLUMNS, (_policy_row(p) for p in policies)))


@policy.command("show")
@click.argument("name")
@json_option
def policy_show(name: str, as_json: bool) -> None:
    """Print a policy's JSON document (with --json: the document and its attachments)."""
    found = _client().get_policy(name)
    if as_json:
        return _print_json(found)
    click.echo(json.dumps(found.get("document"), indent=2))


@policy.command("delete")
@click.argument("name")
@json_option
def policy_delete(name: str, as_json: bool) -> None:
    """Delete a policy (refused while it is attached, and for built-ins)."""
    _client().delete_policy(name)
    if as_json:
        return _print_json({"name": name, "deleted": True})
    click.echo(f"Policy {name} deleted.")


def _target(agent_name: str | None, team_name: str | None) -> None:
    if bool(agent_name) == bool(team_name):
        raise click.UsageError("give exactly one of --agent or --team")


def _attachment(verb: str):
    @click.argument("name")
    @click.option("--agent", "agent_name", metavar="AGENT", help="The agent.")
    @click.option("--team", "team_name", metavar="TEAM", help="The team.")
    @json_option
    def command(name: str, agent_name: str | None, team_name: str | None, as_json: bool) -> None:
        _target(agent_name, team_name)
        client = _client()
        call = client.attach_policy if verb == "attach" else client.detach_policy
        summary = call(name, agent=agent_name, team=team_name)
        if as_json:
            return _print_json(summary)
        who = f"agent {agent_name}" if agent_name else f"team {team_name}"
        click.echo(f"Policy {name} {'attached to' if verb == 'attach' else 'detached from'} {who}.")

    command.__doc__ = (f"{verb.capitalize()} policy NAME {'to' if verb == 'attach' else 'from'} "
                       "an agent (--agent) or a team (--team).")
    return command


policy.command("attach")(_attachment("attach"))
policy.command("detach")(_attachment("detach"))


def _statement_label(s: Mapping[str, Any]) -> str:
    sid = s.get("sid")
    return f"{s.get('policy')}#{sid if sid else s.get('index')}"


@policy.command("simulate")
@click.argument("principal")
@click.argument("action")
@click.argument("resource")
@click.option("--context", "context", type=KeyValue(), multiple=True,
              help="A condition key, e.g. s3:prefix=notes/ or aws:SourceIp=10.0.0.1 (repeatable).")
@json_option
@click.pass_context
def policy_simulate(ctx: click.Context, principal: str, action: str, resource: str,
                    context: tuple[tuple[str, str], ...], as_json: bool) -> None:
    """Would PRINCIPAL be allowed ACTION on RESOURCE?  Exit code 0 if allowed, 3 if denied."""
    result = _client().simulate(principal, action, resource, dict(context))
    allowed = bool(result.get("allowed"))
    if as_json:
        _print_json(result)
    else:
        statement = result.get("statement")
        if statement:
            decided = (f"{_statement_label(statement)} (statement {statement.get('index')}, "
                       f"{statement.get('effect')})")
        else:
            decided = "none: no statement allows it (implicit deny)"
        verdict = "ALLOWED" if allowed else "DENIED"
        click.echo(f"{verdict}: {principal} {action} {resource}")
        click.echo(f"decision:    {result.get('decision')}")
        click.echo(f"statement:   {decided}")
        others = [m for m in result.get("matched") or [] if m != statement]
        if others:
            click.echo("also matched: " + ", ".join(f"{_statement_label(m)} ({m.get('effect')})"
                                                    for m in others))
        click.echo(f"explanation: {result.get('explanation')}")
    ctx.exit(0 if allowed else EXIT_DENIED)


# --------------------------------------------------------------------------- audit

@admin.group()
def audit() -> None:
    """Read the audit log: one record per request, allowed or denied.

    `query` finds records (oldest first from --since); `tail` shows the newest and can
    --follow. Both read the compacted Parquet and the newest records of the log alike.
    """


_AUDIT_COLUMNS = (("TIME", 24), ("PRINCIPAL", 16), ("ACTION", 24), ("RESOURCE", 40),
                  ("DECISION", 8), ("REASON", 30), ("STATUS", 6))


def _audit_table(records: Sequence[Mapping[str, Any]], *, header: bool, fixed: bool):
    from rich.table import Table

    table = Table(header_style="bold", show_header=header, box=None, pad_edge=False)
    for column, width in _AUDIT_COLUMNS:
        table.add_column(column, width=width if fixed else None, overflow="fold")
    for r in records:
        decision = r.get("decision")
        table.add_row(_cell(r.get("time")), _cell(r.get("principal")), _cell(r.get("action")),
                      _cell(r.get("resource")),
                      _cell(decision, "green" if decision == "allow" else "red"),
                      _cell(r.get("reason")), _cell(r.get("status")))
    return table


class _AuditPrinter:
    def __init__(self, as_json: bool, fixed: bool) -> None:
        self.as_json = as_json
        self.fixed = fixed
        self.header = True
        self.console = None if as_json else _console()

    def __call__(self, records: Sequence[Mapping[str, Any]]) -> None:
        records = list(records)
        if self.as_json:
            for r in records:
                click.echo(json.dumps(_without_secrets(r)))
            sys.stdout.flush()
            return
        if not records and not self.header:
            return
        self.console.print(_audit_table(records, header=self.header, fixed=self.fixed))
        self.header = False


def _read_until_caught_up(client: AdminClient, first: Mapping[str, Any], principal: str | None,
                          denied: bool, keep: deque) -> str | None:
    """Follow the cursor from ``first`` until a short page; returns the last cursor."""
    params = dict(first)
    cursor = None
    while True:
        page = client.audit(principal=principal, denied=denied, limit=AUDIT_PAGE, **params)
        records = page.get("records") or []
        keep.extend(records)
        new_cursor = page.get("cursor") or cursor
        if len(records) < AUDIT_PAGE or new_cursor in (None, cursor):
            return new_cursor
        cursor = new_cursor
        params = {"after": cursor}


def _audit_filters(command):
    """--since, --principal, --denied, --limit and --json, shared by ``query`` and ``tail``."""
    for option in reversed([
        click.option("--since", type=Since(), help="Start at this time: 10m, 2h, 7d ago, an ISO-8601 "
                     "time or epoch seconds."),
        click.option("--principal", metavar="NAME", help="Only this principal's requests."),
        click.option("--denied", is_flag=True, help="Only denied requests."),
        json_option,
    ]):
        command = option(command)
    return command


@audit.command("query")
@_audit_filters
@click.option("--limit", type=click.IntRange(1, 1_000_000), default=1000, show_default=True,
              help="Show at most the first N matching records.")
def audit_query(since: str | None, principal: str | None, denied: bool, as_json: bool, limit: int) -> None:
    """Find audit records, oldest first: time, principal, action, resource, decision, reason, status.

    With --json, one JSON record per line. When more than --limit records match, the first
    --limit are shown and a note on stderr says so.
    """
    client = _client()
    records: list = []
    params: dict[str, Any] = {"since": since} if since else {}
    while len(records) <= limit:
        want = min(AUDIT_PAGE, limit + 1 - len(records))  # one more than shown: are there more?
        page = client.audit(principal=principal, denied=denied, limit=want, **params)
        got = page.get("records") or []
        records.extend(got)
        if len(got) < want or not page.get("cursor"):
            break
        params = {"after": page["cursor"]}
    _AuditPrinter(as_json, fixed=False)(records[:limit])
    if len(records) > limit:
        click.echo(f"note: more than {limit} records match; showing the first {limit} "
                   "(narrow --since, or raise --limit)", err=True)


@audit.command("retain")
@click.option("--days", type=click.IntRange(1, 36500), help="Keep audit records this many days.")
@click.option("--forever", is_flag=True, help="Keep audit records forever (the default).")
def audit_retain(days: int | None, forever: bool) -> None:
    """Show or set how long audit records are kept (whole UTC days, applied at compaction)."""
    if days is not None and forever:
        raise click.UsageError("give --days or --forever, not both")
    client = _client()
    settings = client.set_audit_retention(days) if days is not None or forever else client.audit_retention()
    kept = settings.get("days")
    click.echo("audit records: kept forever." if kept is None else f"audit records: kept {kept} days.")


@audit.command("tail")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new records (polls every second) "
              "until Ctrl-C; its own polls of the audit log are not shown.")
@_audit_filters
@click.option("--limit", type=click.IntRange(1, 100_000), default=100, show_default=True,
              help="Show at most the last N records (before following).")
def audit_tail(follow: bool, since: str | None, principal: str | None, denied: bool, as_json: bool,
               limit: int) -> None:
    """Show the most recent audit records: time, principal, action, resource, decision, reason, status.

    With --json, one JSON record per line.
    """
    client = _client()
    printer = _AuditPrinter(as_json, fixed=follow)
    last: deque = deque(maxlen=limit)
    cursor = _read_until_caught_up(client, {"since": since} if since else {}, principal, denied, last)
    printer(list(last))
    if not follow:
        return
    _stop_on_signals()
    try:
        while True:
            time.sleep(FOLLOW_INTERVAL)
            fresh: deque = deque()
            try:
                cursor = _read_until_caught_up(client, {"after": cursor} if cursor else {},
                                               principal, denied, fresh)
            except AdminError as exc:
                if exc.status and exc.status < 500:
                    raise
                click.echo(f"warning: {exc.code}: {exc.message} (retrying)", err=True)
                continue
            # Each poll is itself audited: do not echo our own polls back forever.
            fresh_records = [r for r in fresh if not (r.get("action") == AUDIT_READ_ACTION
                                                      and r.get("access_key") == client.access_key)]
            if fresh_records:
                printer(fresh_records)
    except KeyboardInterrupt:
        return
