"""taskdata.sources.gunzip: a gzip file's bytes, decompressed a block ahead, as gzip reads them."""

from __future__ import annotations

import gzip
import io
import os
import threading
import zlib

import pytest

from taskdata.sources.base import SourceError, iter_text_lines
from taskdata.sources.gunzip import gunzipped_blocks

TEXT = b"".join(b'{"text": "document %d %s"}\n' % (i, b"x" * (i % 97)) for i in range(3000))


def _blocks(data: bytes, block_bytes: int = 512) -> bytes:
    return b"".join(gunzipped_blocks(io.BytesIO(data), block_bytes))


@pytest.mark.parametrize("block_bytes", [1, 7, 512, 1 << 20])
def test_blocks_join_to_the_text_whatever_the_block_size(block_bytes):
    assert _blocks(gzip.compress(TEXT, mtime=0), block_bytes) == TEXT


def test_members_one_after_another_and_zero_padding_after_them_are_read_as_gzip_reads_them():
    data = gzip.compress(TEXT[:1000]) + gzip.compress(TEXT[1000:]) + b"\x00" * 600 + gzip.compress(b"tail\n")
    assert gzip.decompress(data) == TEXT + b"tail\n"
    assert _blocks(data) == TEXT + b"tail\n"


def test_an_empty_file_has_no_blocks():
    assert _blocks(b"") == b""


def test_a_truncated_stream_is_an_error_not_a_short_read():
    with pytest.raises(EOFError, match="ended before the end-of-stream marker"):
        _blocks(gzip.compress(TEXT)[:-30])


def test_data_that_is_not_gzip_is_an_error():
    with pytest.raises(zlib.error, match="incorrect header check"):
        _blocks(b"plain text, not gzip\n")


def test_the_next_block_is_decompressed_in_a_helper_thread_while_this_one_is_used():
    threads = []

    class Recording(io.BytesIO):
        def read(self, size=-1):
            threads.append(threading.current_thread().name)
            return super().read(size)

    blocks = gunzipped_blocks(Recording(gzip.compress(TEXT)), 256)
    first = next(blocks)
    assert first and all(name.startswith("gunzip") for name in threads)
    reads = len(threads)
    assert len(list(blocks)) > 1 and len(threads) > reads


def test_reads_start_small_and_double_up_to_the_block_size():
    sizes = []

    class Recording(io.BytesIO):
        def read(self, size=-1):
            sizes.append(size)
            return super().read(size)

    data = gzip.compress(os.urandom(40_000), mtime=0)  # random bytes do not compress: ~40 KB to read
    assert b"".join(gunzipped_blocks(Recording(data), 8192, first_block_bytes=1024)) == gzip.decompress(data)
    assert sizes[:6] == [1024, 2048, 4096, 8192, 8192, 8192]
    sizes.clear()
    list(gunzipped_blocks(Recording(data), 512))  # a block size below the first read's starts at the block size
    assert set(sizes) == {512}


def test_text_lines_of_a_gzip_file_are_gzips_lines(tmp_path):
    path = tmp_path / "lines.txt.gz"
    text = TEXT + b"last line without a newline"
    path.write_bytes(gzip.compress(text))
    with gzip.open(path, "rb") as f:
        expected = [line.decode() for line in f]
    assert [line for _, line in iter_text_lines(str(path))] == expected
    assert [number for number, _ in iter_text_lines(str(path))] == list(range(1, len(expected) + 1))


def test_a_bad_byte_in_a_gzip_file_names_its_line(tmp_path):
    path = tmp_path / "bad.txt.gz"
    path.write_bytes(gzip.compress(TEXT[:200] + b"\xff broken\n" + TEXT[:100]))
    with pytest.raises(SourceError, match=r"line 8: not valid UTF-8"):
        list(iter_text_lines(str(path)))
