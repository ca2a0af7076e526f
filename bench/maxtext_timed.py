"""MaxText's own train main with the time its loop waits for every batch written down (``bench_maxtext.py``'s
instrument; run with the MaxText environment's Python).

    python bench/maxtext_timed.py --waits FILE taskdata --cache-root DIR --run NAME -- CONFIG.yml key=value ...
    python bench/maxtext_timed.py --waits FILE grain -- CONFIG.yml dataset_type=grain ...

``taskdata`` runs ``trainer_client.maxtext.train`` (taskdata's pipeline), ``grain`` MaxText's ``train.main``
as ``python -m maxtext.trainers.pre_train.train`` does. Both with two timers, measurement only (the one place
the benchmark reaches into MaxText): ``loop``, around ``DataLoader.load_next_batch_pre_sharding`` (where
MaxText's loop takes the next batch: the pipeline's next host rows and their global arrays), and
``pipeline``, around ``next()`` of the iterator ``MultiHostDataLoadIterator`` takes host rows from (the
pipeline's own part). ``FILE`` gets both lists of seconds, one entry per batch.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[0] != "--waits" or argv[2] not in ("taskdata", "grain"):
        print(__doc__, file=sys.stderr)
        return 2
    waits_path, pipeline, rest = argv[1], argv[2], argv[3:]
    from maxtext.common import data_loader
    from maxtext.input_pipeline import multihost_dataloading

    waits: dict[str, list[float]] = {"loop": [], "pipeline": []}
    load_next = data_loader.DataLoader.load_next_batch_pre_sharding
    init = multihost_dataloading.MultiHostDataLoadIterator.__init__
    reset = multihost_dataloading.MultiHostDataLoadIterator.reset

    def timed_load_next(self: Any) -> Any:
        started = time.perf_counter()
        batch = load_next(self)
        waits["loop"].append(time.perf_counter() - started)
        return batch

    def timed_init(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.local_iterator = _Timed(self.local_iterator, waits["pipeline"])

    def timed_reset(self: Any) -> None:
        reset(self)
        self.local_iterator = _Timed(self.local_iterator, waits["pipeline"])

    data_loader.DataLoader.load_next_batch_pre_sharding = timed_load_next
    multihost_dataloading.MultiHostDataLoadIterator.__init__ = timed_init
    multihost_dataloading.MultiHostDataLoadIterator.reset = timed_reset
    code = 0
    try:
        if pipeline == "taskdata":
            from trainer_client.maxtext.train import main as launch

            code = launch(rest)
        else:
            from absl import app
            from maxtext.trainers.pre_train import train

            app.run(train.main, argv=["maxtext", *(rest[1:] if rest[:1] == ["--"] else rest)])
    except SystemExit as end:
        code = int(end.code or 0) if not isinstance(end.code, str) else 1
    finally:
        with open(waits_path, "w") as f:
            json.dump(waits, f)
    return code


class _Timed:
    """The pipeline's own iterator (what MaxText's ``MultiHostDataLoadIterator`` takes host rows from), timed."""

    def __init__(self, iterator: Any, times: list[float]):
        self._iterator, self._times = iterator, times

    def __iter__(self) -> _Timed:
        return self

    def __next__(self) -> Any:
        started = time.perf_counter()
        try:
            return next(self._iterator)
        finally:
            self._times.append(time.perf_counter() - started)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
