"""t5x for the tests that run its code: imported when installed (CI installs it from ../shared/vendor, see
.ci/run), skipped here when not, and a failure under CI=true, where it must be there."""

from __future__ import annotations

import os
from typing import Any

import pytest

from taskdata.seqio_bridge import import_seqio


def import_t5x() -> Any:
    """The t5x package (after seqio, whose protobuf setting it needs); skip, or fail under CI, without it."""
    import_seqio()
    try:
        import t5x
        import t5x.checkpoints
        import t5x.utils
    except ImportError as error:
        message = (f"t5x is not installed ({error}): pip install --no-deps ../shared/vendor/t5x-*.tar.gz "
                   "../shared/vendor/airio-*.tar.gz ../shared/vendor/jestimator-*.tar.gz (as .ci/run does)")
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        # Called at a test module's import: skip the module, as a collection error would not.
        pytest.skip(message, allow_module_level=True)
    return t5x
