"""Envelope encryption library (encryption and vault issues)."""
