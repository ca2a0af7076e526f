"""MaxText's own train main with the time its loop waits for every batch written down (``bench_maxtext.py``'s
instrument; run with the MaxText environment's Python).

    python bench/maxtext_timed.py --waits FILE taskdata --cache-root DIR --run NAME -- CONFIG.yml key=value ...
    python bench/maxtext_timed.py --waits FILE grain -- CONFIG.yml dataset_type=grain ...

``taskdata`` runs ``trainer_client.maxtext.train`` (taskdata's pipeline), ``grain`` MaxText's ``train.main``
as ``python -m maxtext.trainers.pre_train.train`` does. Both with one timer around MaxText's
``DataLoader.load_next_batch_pre_sharding`` (where its loop takes the next batch: ``next()`` on the data
iterator and its global arrays): measurement only, the one place the benchmark reaches into MaxText.
"""

from __future__ import annotations

import json
import sys
import time


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[0] != "--waits" or argv[2] not in ("taskdata", "grain"):
        print(__doc__, file=sys.stderr)
        return 2
    waits_path, pipeline, rest = argv[1], argv[2], argv[3:]
    from maxtext.common import data_loader

    waits: list[float] = []
    original = data_loader.DataLoader.load_next_batch_pre_sharding

    def timed(self):  # type: ignore[no-untyped-def]
        started = time.perf_counter()
        batch = original(self)
        waits.append(time.perf_counter() - started)
        return batch

    data_loader.DataLoader.load_next_batch_pre_sharding = timed
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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
