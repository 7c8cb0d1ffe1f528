"""Minimization: from a crashing trace to the smallest one that still
crashes the same way, in as few trials as possible (MINIMIZE.md)."""
