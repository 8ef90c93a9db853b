"""Parquet segments compacted from the durable log: manifest, files, compactor."""
