import gzip
import json

import pytest

from taskdata.sources import (
    C4Source,
    FunctionSource,
    ParquetSource,
    SourceError,
    TextLineSource,
    TFExampleSource,
)
from tests.helpers import numbered_texts


def _write_c4(folder, split, index, total, docs, compress=True):
    name = f"c4-{split}.{index:05d}-of-{total:05d}.json" + (".gz" if compress else "")
    lines = "".join(json.dumps(d) + "\n" for d in docs).encode()
    (folder / name).write_bytes(gzip.compress(lines, mtime=0) if compress else lines)
    return folder / name


def _doc(i):
    return {"text": f"Document {i}.\nSecond line.", "timestamp": "2019-04-25T12:57:54Z", "url": f"https://x/{i}"}


def test_c4_source_lists_files_in_order_and_reads_lines_in_order(tmp_path):
    _write_c4(tmp_path, "train", 1, 2, [_doc(2), _doc(3)])
    _write_c4(tmp_path, "train", 0, 2, [_doc(0), _doc(1)], compress=False)
    source = C4Source(str(tmp_path))
    shards = source.list_shards("train")
    assert [s.rsplit("/", 1)[-1] for s in shards] == [
        "c4-train.00000-of-00002.json", "c4-train.00001-of-00002.json.gz"]
    texts = [r["text"] for s in shards for r in source.read_shard("train", s)]
    assert texts == [_doc(i)["text"] for i in range(4)]
    assert next(iter(source.read_shard("train", shards[0]))) == _doc(0)


def test_c4_source_without_files_says_what_it_expected(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"No C4 files for split 'validation' .*c4-validation.00000-of-01024"):
        C4Source(str(tmp_path)).list_shards("validation")


def test_c4_source_bad_json_names_file_and_line(tmp_path):
    path = tmp_path / "c4-train.00000-of-00001.json"
    path.write_text(json.dumps(_doc(0)) + "\n{not json\n")
    source = C4Source(str(tmp_path))
    with pytest.raises(SourceError) as info:
        list(source.read_shard("train", str(path)))
    assert str(info.value).startswith(f"{path}, line 2: not valid JSON")


def test_c4_source_missing_field_names_field(tmp_path):
    path = tmp_path / "c4-train.00000-of-00001.json"
    path.write_text(json.dumps({"text": "x", "url": "u"}) + "\n")
    with pytest.raises(SourceError, match=r"line 1: field 'timestamp' must be a string"):
        list(C4Source(str(tmp_path)).read_shard("train", str(path)))


def test_c4_source_truncated_gzip_is_an_error_not_a_short_read(tmp_path):
    path = _write_c4(tmp_path, "train", 0, 1, [_doc(i) for i in range(200)])
    path.write_bytes(path.read_bytes()[:-30])
    with pytest.raises(SourceError, match="cannot read"):
        list(C4Source(str(tmp_path)).read_shard("train", str(path)))


def test_unknown_split_lists_the_splits(tmp_path):
    with pytest.raises(ValueError, match=r"Unknown split 'test': this source has splits \['train', 'validation'\]"):
        C4Source(str(tmp_path)).list_shards("test")


def test_text_line_source(tmp_path):
    (tmp_path / "b.txt").write_text("three\n")
    (tmp_path / "a.txt").write_text("one\ntwo\n")
    source = TextLineSource({"train": str(tmp_path / "*.txt")})
    rows = [r["text"] for s in source.list_shards("train") for r in source.read_shard("train", s)]
    assert rows == ["one", "two", "three"]


def test_text_line_source_missing_explicit_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.txt' of split 'train' does not exist"):
        TextLineSource({"train": [str(tmp_path / "missing.txt")]}).list_shards("train")


def test_parquet_source_reads_rows_in_order(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["a", "b", "c"], "n": [1, 2, 3]}), tmp_path / "p.parquet", row_group_size=2)
    source = ParquetSource({"train": str(tmp_path / "*.parquet")}, batch_size=2)
    rows = list(source.read_shard("train", source.list_shards("train")[0]))
    assert rows == [{"text": "a", "n": 1}, {"text": "b", "n": 2}, {"text": "c", "n": 3}]


def test_parquet_source_missing_column_is_named(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["a"]}), tmp_path / "p.parquet")
    source = ParquetSource({"train": str(tmp_path / "*.parquet")}, columns=["text", "label"])
    with pytest.raises(SourceError, match=r"missing columns \['label'\]"):
        list(source.read_shard("train", source.list_shards("train")[0]))


def test_parquet_source_rejects_a_non_parquet_file(tmp_path):
    (tmp_path / "p.parquet").write_bytes(b"not parquet at all")
    source = ParquetSource({"train": str(tmp_path / "*.parquet")})
    with pytest.raises(SourceError, match="not a readable Parquet file"):
        list(source.read_shard("train", source.list_shards("train")[0]))


def test_function_source_declared_shards():
    source = FunctionSource(numbered_texts, {"train": ["x", "y"]})
    assert source.list_shards("train") == ["x", "y"]
    assert next(iter(source.read_shard("train", "y"))) == {"text": "train shard y document 0"}


def _yields_a_string(split, shard):
    yield "oops"


def test_function_source_rejects_non_mapping_records():
    source = FunctionSource(_yields_a_string, {"train": ["0"]})
    with pytest.raises(SourceError, match="shard '0' record 0: expected a mapping but got str"):
        list(source.read_shard("train", "0"))


def test_tfexample_source_reads_tf_examples(tmp_path):
    from taskdata.cache.tfrecord import frame_record
    from taskdata.example import encode_example

    path = tmp_path / "data.tfrecord"
    path.write_bytes(b"".join(frame_record(encode_example({"text": f"t{i}", "label": [i]})) for i in range(3)))
    source = TFExampleSource({"train": str(path)}, features={"text": "string", "label": "int"})
    rows = list(source.read_shard("train", str(path)))
    assert [r["text"] for r in rows] == ["t0", "t1", "t2"]
    assert [int(r["label"][0]) for r in rows] == [0, 1, 2]


def test_tfexample_source_wrong_kind_names_record(tmp_path):
    from taskdata.cache.tfrecord import frame_record
    from taskdata.example import encode_example

    path = tmp_path / "data.tfrecord"
    path.write_bytes(frame_record(encode_example({"text": "a"})) + frame_record(encode_example({"text": [5]})))
    source = TFExampleSource({"train": str(path)}, features={"text": "string"})
    with pytest.raises(SourceError, match=r"record 1: feature 'text' is not of kind 'string'"):
        list(source.read_shard("train", str(path)))


@pytest.mark.parametrize(
    ("given", "shown"),
    [("x.txt", "'x.txt'"), (["a.txt", "b.txt"], "['a.txt', 'b.txt']")],
)
def test_a_file_source_given_files_without_a_split_shows_the_right_call(given, shown):
    with pytest.raises(ValueError) as raised:
        TextLineSource(given)
    assert str(raised.value) == (
        f"TextLineSource takes a mapping of split name to files, not {type(given).__name__} {given!r}: write "
        f"TextLineSource({{'train': {shown}}}) for a single split, or TextLineSource({{'train': 'data/train-*.txt', "
        "'validation': [...]}) with, per split, a glob pattern or a list of paths."
    )


def test_source_constructors_reject_what_they_cannot_read():
    with pytest.raises(ValueError, match=r"TextLineSource split 'train' has files 3: TextLineSource\(\{'train'"):
        TextLineSource({"train": 3})
    with pytest.raises(ValueError, match=r"C4Source splits must be a tuple of split names, e.g. splits=\('train',\)"):
        C4Source("/c4", splits="train")
    with pytest.raises(ValueError, match=r"split 'train' declares the string '0': give a list of shard names"):
        FunctionSource(lambda split, shard: [], {"train": "0"})
    with pytest.raises(ValueError, match=r"FunctionSource takes fn\(split, shard\) -> records first"):
        FunctionSource({"train": ["0"]}, {"train": ["0"]})
