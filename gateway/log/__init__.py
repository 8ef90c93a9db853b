"""The durable log: group-committed, typed records in the object store."""
