"""Where taskdata keeps its files, and what the built-in tasks read: one typed value, built at the edges.

Library code never reads the environment. The entry points (the ``taskdata`` command line, the
server's settings, the example trainer) build a ``Config`` once, from their flags and, for what a flag
does not give, from ``$TASKDATA_HOME``, ``$TASKDATA_C4_DIR`` and ``$TASKDATA_VOCAB``
(``Config.from_environment``); everything below them is handed the value. The cache job ships it to
its Beam workers in the job spec. ``c4_dir`` and ``vocab`` decide what the built-in tasks read, so they
are part of those tasks' fingerprints (through their source files and vocabulary).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

__all__ = ["C4_DIR_ENV", "HOME_ENV", "VOCAB_ENV", "Config", "default_home"]

HOME_ENV = "TASKDATA_HOME"
C4_DIR_ENV = "TASKDATA_C4_DIR"
VOCAB_ENV = "TASKDATA_VOCAB"


def default_home() -> str:
    """``~/.cache/taskdata``: the home of a ``Config`` built without the environment."""
    return os.path.join(os.path.expanduser("~"), ".cache", "taskdata")


@dataclasses.dataclass(frozen=True)
class Config:
    """Attributes:
    home: folder (local) of the built-in corpus and vocabulary, and of caches unless told otherwise.
    c4_dir: folder (local or ``gs://``) of C4 JSON-lines files for the built-in tasks; None: the
      built-in corpus, built into ``home`` on first use.
    vocab: SentencePiece model (local or ``gs://``) for the built-in tasks; None: the one trained on the
      built-in corpus, in ``home``.
    """

    home: str = dataclasses.field(default_factory=default_home)
    c4_dir: str | None = None
    vocab: str | None = None

    def __post_init__(self) -> None:
        for field in ("home", "c4_dir", "vocab"):
            value = getattr(self, field)
            if value is None and field != "home":
                continue
            if not isinstance(value, str) or not value.strip():
                raise ValueError(
                    f"Config {field} must be a non-empty path but got {value!r}; leave it out for the default."
                )

    @property
    def cache_root(self) -> str:
        """The default cache root: ``{home}/caches``."""
        return os.path.join(self.home, "caches")

    @classmethod
    def from_environment(
        cls,
        environ: Mapping[str, str] | None = None,
        *,
        home: str | None = None,
        c4_dir: str | None = None,
        vocab: str | None = None,
    ) -> Config:
        """For entry points only: the given values, else ``$TASKDATA_*``, else the defaults.

        The home defaults to ``$XDG_CACHE_HOME/taskdata`` (else ``~/.cache/taskdata``).
        """
        env = os.environ if environ is None else environ
        xdg = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        return cls(
            home=home or env.get(HOME_ENV) or os.path.join(xdg, "taskdata"),
            c4_dir=c4_dir or env.get(C4_DIR_ENV) or None,
            vocab=vocab or env.get(VOCAB_ENV) or None,
        )

    def to_tuple(self) -> tuple[str, str | None, str | None]:
        """Plain values for a job spec (``Config(*values)`` rebuilds it)."""
        return (self.home, self.c4_dir, self.vocab)
