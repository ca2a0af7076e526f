"""The error of a MaxText setting, or a run against it, that taskdata's pipeline cannot honour."""

from __future__ import annotations

__all__ = ["MaxTextConfigError"]


class MaxTextConfigError(ValueError):
    """A MaxText setting (or a run's batches against it) the pipeline cannot honour; the message names it and the fix."""
