"""Biographies: every agent's time-ordered record of what it did."""
