"""Tantivy index library (search issue)."""
