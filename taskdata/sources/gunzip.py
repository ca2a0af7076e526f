"""A gzip file's text, decompressed a block ahead in a helper thread.

``gzip.GzipFile``'s line iterator decompresses in the reading thread, 8 KB at a time through Python
code. zlib releases the GIL while it inflates, so a helper thread that reads and inflates the next
block while the caller parses the current one takes that work off the caller's thread: the cache job's
one Python thread per worker is what bounds it (see BENCHMARKS.md, "Cache job against the SentencePiece
floor"). The bytes are the same; multi-member files and zero padding after a member are read as
``gzip`` reads them, and a truncated or corrupt stream is an error, never a short read.
"""

from __future__ import annotations

import concurrent.futures
import zlib
from collections.abc import Iterator
from typing import IO

__all__ = ["gunzipped_blocks"]

# Compressed bytes read per block: ~2.6 MB of C4 text, many documents per hand-off between the threads.
BLOCK_BYTES = 1 << 20
# The first read is this small, and each next one twice the last, up to the block size: inflating a whole
# first block took 12-15 ms, during which the caller had no line to parse and the cache job's tokenizer no
# text to encode, at the start of every source file (~5% of a 3,000-document file's time).
FIRST_BLOCK_BYTES = 1 << 16
_GZIP_WBITS = 16 + zlib.MAX_WBITS  # zlib reads (and checks) the gzip header and trailer itself


def gunzipped_blocks(raw: IO[bytes], block_bytes: int = BLOCK_BYTES,
                     first_block_bytes: int = FIRST_BLOCK_BYTES) -> Iterator[bytes]:
    """The decompressed bytes of the gzip stream ``raw``, in blocks; the next block is read and
    decompressed in a helper thread while the caller works on this one. Reads start at
    ``first_block_bytes`` of compressed data and double up to ``block_bytes``, so the first text arrives soon.

    Raises ``EOFError`` for a stream that ends inside a member and ``zlib.error`` for corrupt data.
    """
    inflater = _Inflater(raw, block_bytes, min(first_block_bytes, block_bytes))
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="gunzip") as ahead:
        upcoming = ahead.submit(inflater.next_block)
        while (block := upcoming.result()) is not None:
            upcoming = ahead.submit(inflater.next_block)
            yield block


class _Inflater:
    """Reads ``raw`` and inflates its gzip members one after another; one thread at a time."""

    def __init__(self, raw: IO[bytes], block_bytes: int, first_block_bytes: int):
        self._raw = raw
        self._block_bytes = block_bytes
        self._read_bytes = first_block_bytes  # the size of the next read, doubled after each up to block_bytes
        self._decompressor = zlib.decompressobj(_GZIP_WBITS)
        self._unused = b""  # read, but after the end of the member that was being inflated
        self._in_member = False
        self._members = 0

    def next_block(self) -> bytes | None:
        """The next non-empty run of decompressed bytes, or None at the end of the stream."""
        while True:
            if self._unused:
                data, self._unused = self._unused, b""
            else:
                data = self._raw.read(self._read_bytes)
                self._read_bytes = min(2 * self._read_bytes, self._block_bytes)
            if not data:
                if self._in_member:
                    raise EOFError("Compressed file ended before the end-of-stream marker was reached")
                return None
            if not self._in_member:
                if self._members:  # as gzip does: zero bytes may pad the file after a member
                    data = data.lstrip(b"\x00")
                    if not data:
                        continue
                self._in_member = True
            out = self._decompressor.decompress(data)
            if self._decompressor.eof:
                self._unused = self._decompressor.unused_data
                self._decompressor = zlib.decompressobj(_GZIP_WBITS)
                self._in_member = False
                self._members += 1
            if out:
                return out
