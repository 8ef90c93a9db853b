"""``orgmem context``: the context pack an agent loads to resume its work, as Markdown.

    orgmem context --agent scout --session s-42 --budget 4000
    orgmem context --agent scout --query "flaky upload retries" --json

One signed ``POST /v1/context`` (see :mod:`gateway.api.context`), with the ``--endpoint`` /
``--ca-bundle`` options and credentials of ``orgmem admin``. The Markdown is the gateway's own
rendering, the text ``used_tokens`` counts; a note on stderr says what was cut to fit.
Errors go to stderr as ``error: <code>: <message>`` with exit code 1.
"""

from __future__ import annotations

import json
from typing import Any

import click

from .admin_cli import _print_json, _Settings, gateway_options, json_option
from .admin_client import AdminClient, AdminError

PATH = "/v1/context"


class ContextClient:
    """``POST /v1/context`` on AdminClient's transport (signing, TLS, errors)."""

    def __init__(self, transport: AdminClient) -> None:
        self._transport = transport

    def pack(self, agent: str, budget_tokens: int, session: str | None = None,
             query: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"agent": agent, "budget_tokens": budget_tokens}
        if session is not None:
            body["session"] = session
        if query is not None:
            body["query"] = query
        return self.post(body)

    def post(self, body: Any) -> dict[str, Any]:
        """Send ``body`` as it is (tests send bad ones); AdminError on >= 400."""
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        _, _, answer = self._transport._request("POST", PATH, body=data, content_type="application/json")
        return json.loads(answer)


@click.command()
@gateway_options
@click.option("--agent", required=True, help="Whose context: an agent name.")
@click.option("--session", help="The session to resume: its open questions, last error, artifacts, "
                                "recent events.")
@click.option("--query", "-q", help="What the work is about: picks the relevant memories and skills "
                                    "(default: the session's open questions and last error).")
@click.option("--budget", type=click.IntRange(100, 200_000), default=4000, show_default=True,
              help="Tokens the pack may take (estimated; see the README).")
@json_option
def context(endpoint: str | None, ca_bundle: str | None, agent: str, session: str | None,
            query: str | None, budget: int, as_json: bool) -> None:
    """Print the context pack of an agent (and a session) as Markdown: the decisions and
    preferences that apply to it, the session's last state, relevant memories and skills, and
    recent events, each with its source, within --budget tokens.

    Credentials come from ORGMEM_ACCESS_KEY and ORGMEM_SECRET_KEY, else from
    ORGMEM_ROOT_ACCESS_KEY and ORGMEM_ROOT_SECRET_KEY.
    """
    try:
        pack = ContextClient(_Settings(endpoint, ca_bundle).client()).pack(agent, budget, session, query)
    except AdminError as exc:
        click.echo(f"error: {exc.code}: {exc.message}", err=True)
        raise click.exceptions.Exit(1) from None
    if as_json:
        _print_json(pack)
        return
    click.echo(pack["markdown"], nl=False)
    cut = ", ".join(s["name"] + (f" ({s['omitted']} left out)" if s["omitted"] else "")
                    for s in pack["sections"] if s["truncated"])
    click.echo(f"\n{pack['used_tokens']} of {pack['budget_tokens']} tokens"
               + (f"; cut to fit: {cut}" if cut else ""), err=True)
