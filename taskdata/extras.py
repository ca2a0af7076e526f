"""The optional parts of taskdata and the extra that installs each: a missing one is named, with its command.

``pip install taskdata`` is what every trainer host needs to read caches (locally, on gs://, or through
the server with ``taskdata[client]``): no Apache Beam, TensorFlow or tensorflow-text. The rest comes as
extras (pyproject.toml): ``cache`` (the Beam job), ``server``, ``client`` (JAX, orbax, Grain, httpx),
``tf`` (tf.data), ``seqio``, ``t5x``, ``torch`` (PyTorch datasets), ``eval``, ``plot``, ``dask`` (the cache job on
a Dask cluster); ``test`` installs them all.
"""

from __future__ import annotations

import importlib.util

__all__ = ["require"]


def require(module: str, extra: str, purpose: str) -> None:
    """Raises ``ModuleNotFoundError`` naming ``pip install 'taskdata[extra]'`` if ``module`` is not installed."""
    if importlib.util.find_spec(module) is None:
        raise ModuleNotFoundError(
            f"{purpose} needs {module}, which is not installed: pip install 'taskdata[{extra}]'.", name=module
        )
