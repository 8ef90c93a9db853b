"""``orgmem mcp``: the gateway's memory as MCP tools, over stdio, for one agent.

An MCP client (Claude Desktop, Claude Code, an agent framework) starts this command and
speaks JSON-RPC on its stdin and stdout. The credentials come from the environment the
client gives it: ORGMEM_ENDPOINT, ORGMEM_ACCESS_KEY, ORGMEM_SECRET_KEY (and ORGMEM_CA_BUNDLE
for a private CA). Stdout belongs to the protocol: logs go to stderr.
"""

from __future__ import annotations

import sys

import click

from .. import logs


@click.command("mcp")
@click.option("--log-level", type=click.Choice(list(logs.LEVELS)), default="warning", show_default=True,
              help="What goes to stderr.")
def mcp(log_level: str) -> None:
    """Serve the memory tools (search_memory, remember, recall, log_event, get_context, skills and
    workspace files) over MCP on stdin/stdout, as the agent whose keys are in ORGMEM_ACCESS_KEY
    and ORGMEM_SECRET_KEY, against the gateway at ORGMEM_ENDPOINT."""
    logs.configure(log_level)
    import anyio

    from orgmem.errors import OrgmemError

    from .tools import Caller

    try:
        caller = Caller.from_env()
    except OrgmemError as exc:
        raise click.ClickException(exc.message) from None
    try:
        anyio.run(_serve, caller)
    except KeyboardInterrupt:
        pass
    sys.exit(0)


async def _serve(caller) -> None:
    """Serve until the client closes stdin, then close the SDK client on the same loop."""
    from .tools import build_server

    try:
        await build_server(lambda scope: caller).run_stdio_async()
    finally:
        await caller.close()
