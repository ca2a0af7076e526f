"""The MaxText launcher's command line (no MaxText needed): MaxText's own arguments pass through, with the
dataset type that carries taskdata's pipeline."""

from __future__ import annotations

import pytest

from trainer_client.maxtext.pipeline import MaxTextConfigError
from trainer_client.maxtext.train import DATASET_TYPE, build_parser, maxtext_argv


def test_maxtexts_arguments_pass_through_with_the_dataset_type_added():
    args = build_parser().parse_args(["--cache-root", "/c", "--run", "lm", "--", "base.yml", "run_name=x", "steps=5"])
    assert (args.cache_root, args.run, args.workers) == ("/c", "lm", 0)
    assert maxtext_argv(args.maxtext) == ["base.yml", "run_name=x", "steps=5", f"dataset_type={DATASET_TYPE}"]
    assert maxtext_argv(["base.yml", f"dataset_type={DATASET_TYPE}"])[-1] == f"dataset_type={DATASET_TYPE}"


def test_another_dataset_type_or_no_config_file_is_refused_with_the_fix():
    with pytest.raises(MaxTextConfigError, match=r"dataset_type=grain: the launcher feeds MaxText through "
                                                 r"dataset_type=olmo_grain .*leave dataset_type out"):
        maxtext_argv(["--", "base.yml", "dataset_type=grain"])
    with pytest.raises(MaxTextConfigError, match=r"Give MaxText's config file after '--'.*\(got \['steps=5'\]\)"):
        maxtext_argv(["--", "steps=5"])
