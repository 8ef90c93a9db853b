"""LangGraph on orgmem: long-term memory (a ``BaseStore``) and threads (a checkpointer)
kept in the gateway, so agents share what they learn and resume work on any machine.

    import orgmem
    from orgmem.langgraph import OrgmemSaver, OrgmemStore

    client = orgmem.Client()                       # ORGMEM_ENDPOINT / _ACCESS_KEY / _SECRET_KEY
    graph = builder.compile(checkpointer=OrgmemSaver(client), store=OrgmemStore(client))

Needs ``langgraph`` (and so ``langgraph-checkpoint``); the rest of ``orgmem`` does not.
"""

from .layout import LayoutError
from .namespaces import InvalidValueError
from .saver import OrgmemSaver
from .store import OrgmemStore

__all__ = ["OrgmemStore", "OrgmemSaver", "InvalidValueError", "LayoutError"]
