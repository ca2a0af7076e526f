"""The error of the seqio bridge: a seqio Task or Mixture that taskdata cannot cache as it is."""

from __future__ import annotations

__all__ = ["SeqioBridgeError"]


class SeqioBridgeError(ValueError):
    """A seqio Task or Mixture that cannot be bridged; the message names the task and the fix."""
