"""orgmem: the Python SDK of an orgmem gateway.

    from orgmem import Client
    om = Client("http://127.0.0.1:9000", access_key, secret_key)   # or ORGMEM_* variables

Biographies (``log_event``, ``events``), open memory (``get_memory``, ``put_memory``, ...),
search and context packs, vault secrets, skills and workspace files, over the gateway's
REST and S3 APIs, every request signed with SigV4.  ``AsyncClient`` has the same methods
as coroutines.  This package needs only httpx and the standard library: nothing of the
server (``gateway``, ``vault``, ``indexer``) nor its heavy dependencies.
"""

from .aio import AsyncClient
from .client import Client
from .errors import (
    AccessDenied,
    Conflict,
    InvalidRequest,
    NotFound,
    OrgmemError,
    PreconditionFailed,
    Unavailable,
)
from .models import FileData, Memory

__version__ = "0.1.0"

__all__ = ["Client", "AsyncClient", "Memory", "FileData", "OrgmemError", "NotFound", "AccessDenied",
           "Conflict", "PreconditionFailed", "InvalidRequest", "Unavailable", "__version__"]
