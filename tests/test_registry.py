from fractions import Fraction

import pytest

from taskdata.define.mixture import Mixture, MixtureError
from taskdata.define.registry import DuplicateNameError, UnknownNameError
from taskdata.define.vocabularies import ByteVocabulary
from tests.helpers import make_task


def test_registered_task_is_found_by_name(registry):
    task = registry.add(make_task("toy"))
    assert registry.get("toy") is task
    assert registry.get_task("toy") is task
    assert registry.names() == ["toy"]


def test_duplicate_name_says_where_the_first_was_registered(registry):
    registry.add(make_task("toy"))
    with pytest.raises(DuplicateNameError) as info:
        registry.add(make_task("toy"))
    message = str(info.value)
    assert message.startswith("Task 'toy' is already registered (first registered at ")
    assert "test_registry.py:" in message
    assert "Choose another name" in message


def test_unknown_name_lists_close_matches(registry):
    registry.add(make_task("c4_span_corruption"))
    registry.add(make_task("c4_prefix_lm"))
    with pytest.raises(UnknownNameError) as info:
        registry.get("c4_span_corruption_v2")
    assert str(info.value) == (
        "Unknown task or mixture 'c4_span_corruption_v2'. Did you mean: c4_span_corruption? Use "
        "'taskdata list' to see registered names, or pass --module to import the module that registers it."
    )


def test_unknown_name_without_close_matches_has_no_suggestion(registry):
    registry.add(make_task("toy"))
    with pytest.raises(UnknownNameError, match="Unknown task or mixture 'zzzzzz'. Use 'taskdata list'"):
        registry.get("zzzzzz")


def test_path_like_lookup_is_rejected_before_any_lookup(registry):
    with pytest.raises(ValueError, match="Invalid task or mixture name '..:..:etc'"):
        registry.get("..:..:etc")


def test_mixture_keeps_the_users_rates_exactly_and_flattens_nested_mixtures_exactly(registry):
    for name in ("a", "b", "c"):
        registry.add(make_task(name))
    registry.add_mixture("ab", [("a", 1), ("b", 2)])
    mixture = registry.add_mixture("abc", [("ab", 2.0), ("c", "1/2")])
    assert mixture.task_names == ("a", "b", "c")
    # ab at rate 2 gives a 2 * 1/3 and b 2 * 2/3: thirds, which no float holds.
    assert mixture.rates == (Fraction(2, 3), Fraction(4, 3), Fraction(1, 2))
    assert mixture.shares == (Fraction(4, 15), Fraction(8, 15), Fraction(3, 15))
    assert all(type(r) is Fraction for r in (*mixture.rates, *mixture.shares))


def test_mixture_rates_given_as_floats_are_the_decimals_written(registry):
    for name in ("a", "b", "c"):
        registry.add(make_task(name))
    mixture = registry.add_mixture("m", [("a", 0.1), ("b", 0.2), ("c", 0.7)])
    assert mixture.rates == (Fraction(1, 10), Fraction(1, 5), Fraction(7, 10))
    assert mixture.shares == mixture.rates and sum(mixture.shares) == 1
    assert Fraction(0.1) + Fraction(0.2) + Fraction(0.7) != 1  # the floats' binary values would not


def test_mixture_rate_may_be_a_function_of_the_task(registry):
    registry.add(make_task("a", shards=("x",)))
    registry.add(make_task("b", shards=("x", "y", "z")))
    mixture = registry.add_mixture("m", ["a", "b"], default_rate=lambda t: len(t.source.list_shards("train")))
    assert mixture.rates == (1, 3) and mixture.shares == (Fraction(1, 4), Fraction(3, 4))
    halves = registry.add_mixture("h", ["a", "b"], default_rate=lambda t: "1/3" if t.name == "a" else 0.5)
    assert halves.shares == (Fraction(2, 5), Fraction(3, 5))


def test_a_mixture_of_one_mixture_keeps_its_shares(registry):
    for name in ("a", "b"):
        registry.add(make_task(name))
    inner = registry.add_mixture("ab", [("a", 1), ("b", 2)])
    outer = registry.add_mixture("outer", [("ab", 3)])
    assert outer.rates == (1, 2) and outer.shares == inner.shares == (Fraction(1, 3), Fraction(2, 3))


def test_mixture_fingerprint_describes_the_exact_rates(registry):
    for name in ("a", "b"):
        registry.add(make_task(name))
    mixture = registry.add_mixture("m", [("a", 0.1), ("b", "1/3")])
    assert [rate for _, _, rate in mixture.fingerprint_description()["tasks"]] == ["1/10", "1/3"]
    same = registry.add_mixture("m2", [("a", "1/10"), ("b", Fraction(1, 3))])
    assert same.fingerprint_description()["tasks"] == mixture.fingerprint_description()["tasks"]
    other = registry.add_mixture("m3", [("a", 0.1), ("b", 0.3333333333333333)])
    assert other.fingerprint_description()["tasks"] != mixture.fingerprint_description()["tasks"]


def test_mixture_with_mismatched_features_names_task_and_feature(registry):
    registry.add(make_task("a"))
    registry.add(make_task("b", vocab=ByteVocabulary(extra_ids=7)))
    with pytest.raises(MixtureError) as info:
        registry.add_mixture("m", [("a", 1), ("b", 1)])
    assert str(info.value) == (
        "Mixture 'm': output feature 'inputs' of task 'b' differs from task 'a''s in its vocabulary. All "
        "tasks of a mixture must share output features (same vocabulary, dtype, rank and add_eos)."
    )


def test_mixture_with_different_add_eos_is_rejected(registry):
    registry.add(make_task("a"))
    registry.add(make_task("b", add_eos=False))
    with pytest.raises(MixtureError, match=r"'inputs' of task 'b' differs .* add_eos \(False vs True\)"):
        registry.add_mixture("m", [("a", 1), ("b", 1)])


@pytest.mark.parametrize(
    ("rate", "message"),
    [
        (0, "Mixture 'm': rate of 'a' must be > 0 but got 0. Leave the task out instead."),
        (-1, "Mixture 'm': rate of 'a' must be > 0 but got -1. Leave the task out instead."),
        (float("nan"), "Mixture 'm': rate of 'a' must be a finite number but got nan."),
        (
            True,
            "Mixture 'm': rate of 'a' must be a number (int, float, Fraction, Decimal or a string like '1/3') "
            "but got the bool True; write 1 for a rate of one.",
        ),
        (
            "lots",
            "Mixture 'm': rate of 'a' must be a number (int, float, Fraction, Decimal or a string like '1/3') "
            "but got the string 'lots'.",
        ),
    ],
)
def test_mixture_refuses_bad_rates_naming_mixture_task_and_value(registry, rate, message):
    registry.add(make_task("a"))
    with pytest.raises(MixtureError) as raised:
        registry.add_mixture("m", [("a", rate)])
    assert str(raised.value) == message
    assert "m" not in registry


def test_a_rate_function_that_returns_a_bad_rate_is_named(registry):
    registry.add(make_task("a"))

    def num_examples(task):
        return 0

    with pytest.raises(MixtureError) as raised:
        registry.add_mixture("m", ["a"], default_rate=num_examples)
    assert str(raised.value) == (
        "Mixture 'm': rate of 'a' (returned by test_a_rate_function_that_returns_a_bad_rate_is_named.<locals>."
        "num_examples) must be > 0 but got 0. Leave the task out instead."
    )


def test_a_mixture_built_directly_checks_and_reads_its_rates(registry):
    a, b = registry.add(make_task("a")), registry.add(make_task("b"))
    assert Mixture("m", (a, b), (0.1, "2/10")).rates == (Fraction(1, 10), Fraction(1, 5))
    with pytest.raises(MixtureError, match=r"^Mixture 'm': rate of task 'b' must be > 0 but got 0\."):
        Mixture("m", (a, b), (1, 0))


def test_mixture_without_rate_says_how_to_give_one(registry):
    registry.add(make_task("a"))
    with pytest.raises(MixtureError, match=r"'a' has no rate. Give \(name, rate\) pairs or default_rate"):
        registry.add_mixture("m", ["a"])


def test_load_module_calls_register_hook(registry, tmp_path, monkeypatch):
    (tmp_path / "my_tasks_mod.py").write_text(
        "from tests.helpers import make_task\n"
        "def register_tasks(registry):\n"
        "    registry.add(make_task('from_module'))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    registry.load_module("my_tasks_mod")
    assert "from_module" in registry


def test_load_missing_module_says_what_to_check(registry):
    with pytest.raises(ModuleNotFoundError, match="Cannot import task module 'no_such_mod_xyz'.*PYTHONPATH"):
        registry.load_module("no_such_mod_xyz")


def test_default_registry_has_the_builtin_tasks():
    from taskdata.tasks import default_registry

    names = default_registry().names()
    for name in ("c4_span_corruption", "c4_prefix_lm", "c4_mlm", "c4_span_corruption_prefix_lm"):
        assert name in names
