import pytest

from taskdata.define.mixture import MixtureError
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


def test_mixture_rates_are_normalised_and_nested_mixtures_flattened(registry):
    for name in ("a", "b", "c"):
        registry.add(make_task(name))
    registry.add_mixture("ab", [("a", 1), ("b", 3)])
    mixture = registry.add_mixture("abc", [("ab", 2.0), ("c", 2.0)])
    assert mixture.task_names == ("a", "b", "c")
    assert mixture.rates == pytest.approx((0.125, 0.375, 0.5))


def test_mixture_rate_may_be_a_function_of_the_task(registry):
    registry.add(make_task("a", shards=("x",)))
    registry.add(make_task("b", shards=("x", "y", "z")))
    mixture = registry.add_mixture("m", ["a", "b"], default_rate=lambda t: len(t.source.list_shards("train")))
    assert mixture.rates == pytest.approx((0.25, 0.75))


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


def test_mixture_rejects_non_positive_rates(registry):
    registry.add(make_task("a"))
    with pytest.raises(MixtureError, match="rate of 'a' must be a positive number but got 0"):
        registry.add_mixture("m", [("a", 0)])


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
