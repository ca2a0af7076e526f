"""A real GCS emulator (``gcp-storage-emulator``) on 127.0.0.1 for tests, stopped by its process group."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def gcs_emulator(bucket: str) -> Iterator[dict[str, str]]:
    """Starts the emulator with ``bucket``; yields the environment in which gcsfs (in a subprocess) talks to it."""
    binary = shutil.which("gcp-storage-emulator", path=os.pathsep.join([os.path.dirname(sys.executable),
                                                                        os.environ.get("PATH", "")]))
    if binary is None:
        pytest.skip("gcp-storage-emulator is not installed")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    process = subprocess.Popen([binary, "start", "--host", "127.0.0.1", "--port", str(port), "--default-bucket",
                                bucket, "--in-memory"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/storage/v1/b/{bucket}", timeout=1)
                break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise
                time.sleep(0.2)
        # Without the last variable, recent gcsfs first probes the bucket type over gRPC and stalls a minute.
        yield dict(os.environ, STORAGE_EMULATOR_HOST=f"http://127.0.0.1:{port}",
                   GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT="false", PYTHONPATH=str(REPO))
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)
