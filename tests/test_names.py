import re

import pytest

from taskdata.names import NAME_PATTERN, InvalidNameError, validate_name


@pytest.mark.parametrize("name", ["c4_span_corruption", "glue:cola.v2", "a", "T5.1.1:x", "0abc"])
def test_valid_names_pass_through(name):
    assert validate_name(name) == name


@pytest.mark.parametrize(
    "name",
    ["..:..:etc", "../etc/passwd", "a/b", ".hidden", "a..b", "", "x y", "a\\b", "c4\x00", "é", "_runs", "rnl\n", "a\r"],
)
def test_path_like_and_odd_names_are_rejected(name):
    with pytest.raises(InvalidNameError, match="Invalid task name|must have 1 to"):
        validate_name(name)


def test_non_string_name_is_rejected_with_its_type():
    with pytest.raises(InvalidNameError, match="must be a string but got int"):
        validate_name(3)


def test_message_names_the_rule_and_an_example():
    with pytest.raises(InvalidNameError) as info:
        validate_name("a/b", kind="run")
    assert str(info.value) == (
        "Invalid run name 'a/b': use only letters, digits, '_', '.' and ':', start with a letter or digit and "
        "do not use '..' (for example 'c4_span_corruption' or 'glue:cola.v2')."
    )


@pytest.mark.parametrize(
    "name", ["c4_span_corruption", "glue:cola.v2", "0abc", "_runs", ".hidden", "a/b", "x y", "é", "a_", "a..b"]
)
def test_the_http_name_pattern_is_the_same_rule(name):
    # The server's models validate names with NAME_PATTERN; validate_name adds only the '..' rule.
    try:
        validate_name(name)
        valid = True
    except InvalidNameError:
        valid = False
    assert valid == (re.match(NAME_PATTERN, name) is not None and ".." not in name)
