"""Full-text search over biographies, memory, skills and workspace files (Tantivy).

A library: it never imports ``gateway``. The gateway hands it what it needs — an
index directory, entries to index, and for snapshots a :class:`BlobStore` (a sealed
store behind a small adapter).

    writer = IndexWriter(path)
    writer.upsert([event_entry(...), memory_entry(...), skill_entry(...), file_entry(...)])
    writer.commit()
    IndexSearcher(writer.index).search("deploy friday", {"type": "memory"}, tokens=["org", "agent:a"])
    publish(store, "index", path, {"log": 1234})
    restore(store, "index", tmpdir)  # -> {"log": 1234}
    restore_latest(store, "index", newdir, LocalCopy.of(tmpdir, manifest))  # fetches only new files
    collect(store, "index", keep=2)
"""

from .documents import (
                        MAX_BODY_CHARS,
                        MAX_FILE_BYTES,
                        Entry,
                        event_entry,
                        event_ref,
                        file_entry,
                        file_ref,
                        is_indexable,
                        memory_entry,
                        memory_ref,
                        scope_path,
                        skill_entry,
                        skill_ref,
                        skip_reason,
)
from .process_writer import IndexWriterGone, ProcessIndexWriter
from .query import MAX_LIMIT, MAX_OFFSET, MAX_QUERY_CHARS, Exclusion, Filters, QueryError, regex_literal
from .schema import SCHEMA_VERSION, STATUS_FACTOR, TYPES, SchemaMismatch, open_index
from .searcher import Hit, IndexSearcher, SearchResult
from .snapshot import (
                        BlobStore,
                        LocalCopy,
                        MemoryBlobStore,
                        PreconditionFailed,
                        Restored,
                        SnapshotConflict,
                        SnapshotError,
                        collect,
                        latest,
                        publish,
                        restore,
                        restore_latest,
)
from .writer import IndexWriter

__all__ = [
    "BlobStore", "Entry", "Exclusion", "Filters", "Hit", "IndexSearcher", "IndexWriter", "IndexWriterGone",
    "LocalCopy", "MAX_BODY_CHARS", "MAX_FILE_BYTES", "MAX_LIMIT", "MAX_OFFSET", "MAX_QUERY_CHARS",
    "MemoryBlobStore", "PreconditionFailed", "ProcessIndexWriter", "QueryError", "Restored",
    "SCHEMA_VERSION", "STATUS_FACTOR", "SchemaMismatch", "SearchResult", "SnapshotConflict",
    "SnapshotError", "TYPES", "collect", "event_entry", "event_ref", "file_entry", "file_ref",
    "is_indexable", "latest", "memory_entry", "memory_ref", "open_index", "publish", "regex_literal",
    "restore", "restore_latest", "scope_path", "skill_entry", "skill_ref", "skip_reason",
]
