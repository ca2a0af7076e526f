"""MaxText on a taskdata run: its input pipeline, its six fields, and a launcher of its own train loop.

- ``fields``: MaxText's six input fields from packed language-model rows (numpy; the shift and loss mask).
- ``layout``: where a step's rows go in MaxText's fixed-shape batch, device by device (pure integers).
- ``pipeline``: the factories ``(config, mesh, process_indices) -> MultiHostDataLoadIterator`` (need maxtext).
- ``resume``: the step MaxText restores, checked against the run that trained the steps before it.
- ``batch_log``: what each process fed MaxText, and the global batch hashes it adds up to.
- ``errors``: ``MaxTextConfigError``, a MaxText setting (or a run against it) the pipeline cannot honour.
- ``train``: ``python -m trainer_client.maxtext.train ... -- MAXTEXT_CONFIG.yml ...`` runs MaxText's own
  ``train.main`` with the pipeline installed.

MaxText 0.2.5 needs Python 3.12; ``deploy/maxtext_env.sh`` builds an environment with it and taskdata. Nothing
here imports maxtext at import time: ``fields``, ``layout``, ``batch_log`` and ``errors`` work without it.
"""
