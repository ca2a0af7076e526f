"""Fault drills: each module here exposes ``DRILLS``, a list of (name, callable) pairs; a callable runs one
drill (bounded, on loopback or local files only) and returns a dict of counts and figures.
``python deploy/faults.py`` runs them all. Modules whose names start with ``_`` are helpers, not drills.
"""
