"""The Model Context Protocol face of the gateway: the same memory, as tools a model can call.

    tools.py     the tools (search_memory, remember, recall, ...), each one or two SDK calls
    strict.py    strict arguments: unknown or mistyped arguments are a tool error, nothing is done
    endpoint.py  /mcp on the gateway: streamable HTTP, bearer-authenticated, calls as the caller
    cli.py       ``orgmem mcp``: the same tools over stdio, as the ORGMEM_* credentials

Every tool call goes through an :class:`orgmem.Client` holding the caller's own keys, so it
passes the same authentication, policies and audit as any REST call. Nothing here imports
the MCP SDK at module level except tools.py and strict.py, so the gateway pays for it only
when /mcp is first used.
"""
