"""Search plumbing for the gateway: the indexer's BlobStore over the sealed store, access
tokens from policies, and the mapping from log records and sources to index entries.

The pipeline itself (log consumer, snapshots, lease) is :mod:`gateway.indexing`.
"""
