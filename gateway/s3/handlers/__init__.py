"""Thin S3 operation handlers: parse the request, call the store, render the answer."""
