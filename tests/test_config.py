"""``Config``: built once at the edges from flags and ``$TASKDATA_*``; the library only receives it."""

from __future__ import annotations

import os

import pytest

from taskdata.config import Config, default_home
from taskdata.define.registry import Registry
from taskdata.tasks import default_registry, register_builtin_tasks


def test_from_environment_takes_flags_then_variables_then_defaults(tmp_path):
    env = {"TASKDATA_HOME": "/h", "TASKDATA_C4_DIR": "gs://b/c4", "TASKDATA_VOCAB": "/v.model"}
    assert Config.from_environment(env) == Config(home="/h", c4_dir="gs://b/c4", vocab="/v.model")
    assert Config.from_environment(env, home="/flag", vocab="/f.model") == Config("/flag", "gs://b/c4", "/f.model")
    assert Config.from_environment({"XDG_CACHE_HOME": "/xdg"}) == Config(home="/xdg/taskdata")
    assert Config.from_environment({}).home == os.path.join(os.path.expanduser("~"), ".cache", "taskdata")
    assert Config().home == default_home() and Config().cache_root == os.path.join(default_home(), "caches")


def test_config_refuses_empty_paths():
    with pytest.raises(ValueError, match=r"Config c4_dir must be a non-empty path but got ''"):
        Config(home="/h", c4_dir="")
    with pytest.raises(ValueError, match=r"Config home must be a non-empty path"):
        Config(home=" ")


def test_builtin_tasks_read_the_config_they_are_given_not_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("TASKDATA_C4_DIR", "/from/the/environment")
    monkeypatch.setenv("TASKDATA_VOCAB", "/env.model")
    registry = Registry()
    register_builtin_tasks(registry, Config(home=str(tmp_path), c4_dir="/given/c4", vocab="/given.model"))
    task = registry.get_task("c4_span_corruption")
    assert task.source.data_dir == "/given/c4"
    assert task.output_features["targets"].vocabulary.model_file == "/given.model"


def test_default_registry_registers_builtins_again_for_another_config(tmp_path):
    first = default_registry(Config(home=str(tmp_path), c4_dir="/one"))
    assert first.get_task("c4_prefix_lm").source.data_dir == "/one"
    second = default_registry(Config(home=str(tmp_path), c4_dir="/two"))
    assert second is first
    assert second.get_task("c4_prefix_lm").source.data_dir == "/two"
    mixture = second.get_mixture("c4_span_corruption_prefix_lm")
    assert [t.source.data_dir for t in mixture.tasks] == ["/two", "/two"]
    assert default_registry() is first  # None keeps the config in force
    assert second.get_task("c4_mlm").source.data_dir == "/two"
