"""Validation of task, mixture and run names.

Names are identifiers, never paths: they may only contain letters, digits, ``_``, ``.`` and ``:``,
must start with a letter or digit, and must not contain ``..`` (so that no name can ever walk a directory tree,
even if some later code were to join it into a path by mistake).
"""

from __future__ import annotations

import re

__all__ = ["NAME_PATTERN", "InvalidNameError", "validate_name"]

# The first character may not be '_' either: names starting with '_' are reserved for the cache root's
# own folders (e.g. '_runs'). The server's HTTP models use the same pattern.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:]*$"
_NAME_RE = re.compile(NAME_PATTERN)
_MAX_LEN = 200


class InvalidNameError(ValueError):
    """A name that is not a valid task, mixture or run name."""


def validate_name(name: object, *, kind: str = "task") -> str:
    """Returns ``name`` if it is a valid identifier, else raises InvalidNameError naming the rule."""
    if not isinstance(name, str):
        raise InvalidNameError(f"{kind} name must be a string but got {type(name).__name__}: {name!r}.")
    if not name or len(name) > _MAX_LEN:
        raise InvalidNameError(
            f"{kind} name must have 1 to {_MAX_LEN} characters but got {len(name)}: {name!r}."
        )
    # fullmatch: with match, '$' also matches before a trailing newline, and 'rnl\n' would pass.
    if not _NAME_RE.fullmatch(name) or ".." in name:
        raise InvalidNameError(
            f"Invalid {kind} name {name!r}: use only letters, digits, '_', '.' and ':', start with a letter "
            "or digit and do not use '..' (for example 'c4_span_corruption' or 'glue:cola.v2')."
        )
    return name
