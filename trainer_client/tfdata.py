"""A run as a ``tf.data.Dataset``: this host's padded numpy batches, step by step, resumable at any step.

    ds = tf_dataset(ServerAssignments(url, "c4_sc"), {"inputs": 512, "targets": 114},
                    start=state, host_slice=HostSlice(jax.process_index(), jax.process_count()))
    for batch in ds.as_numpy_iterator():   # {"inputs": int32 [rows, 512], "targets": ..., "step": int64}
        ...                                # checkpoint DataState(int(batch["step"]) + 1, fingerprint)

For input pipelines written in tf.data (the HF TF/TPU language-model recipe, t5x's dataset functions):
each element is one step's host batch, exactly what ``DataIterator`` yields for that step, plus its
``step``. A step that the plan skips yields no element. The dataset wraps a ``DataIterator`` built
here, so a start state of another run fails here with its ``ResumeError``; the iterator reads ahead
in its own threads and ``from_generator`` hands its batches to TensorFlow.

Resuming is by step: build the dataset again with ``start=DataState(k, fingerprint)`` (tf.data
cannot checkpoint a ``from_generator`` iterator itself). Since tf.data reads ahead of the train step
(``prefetch``), the state to save is the step of the last element the train step consumed, plus one.
The dataset owns its source and can be iterated once; build another one to read again.

TensorFlow is imported when ``tf_dataset`` is called: the rest of ``trainer_client`` works without it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from trainer_client.assignments import AssignmentSource, HostSlice
from trainer_client.iterator import DataIterator, DataState

__all__ = ["STEP_KEY", "tf_dataset"]

STEP_KEY = "step"


def tf_dataset(
    source: AssignmentSource,
    lengths: Mapping[str, int],
    *,
    start: int | DataState = 0,
    host_slice: HostSlice | None = None,
    stop_step: int | None = None,
    lookahead: int = 16,
    prefetch: int = 4,
    verify_crc: bool = True,
) -> Any:
    """A ``tf.data.Dataset`` of this host's batches from ``start`` (arguments as for ``DataIterator``)."""
    import tensorflow as tf

    if STEP_KEY in lengths:
        raise ValueError(
            f"A feature cannot be named {STEP_KEY!r} in a tf.data element: that key holds the step. Rename the "
            "feature in the task's output features."
        )
    iterator = DataIterator(
        source,
        lengths,
        start=start,
        host_slice=host_slice,
        lookahead=lookahead,
        prefetch=prefetch,
        stop_step=stop_step,
        verify_crc=verify_crc,
    )
    schedule = iterator.info.plan.schedule
    rows = schedule.end // iterator.host_slice.count if schedule.is_constant else None
    signature = {name: tf.TensorSpec((rows, length), tf.int32) for name, length in lengths.items()}
    signature[STEP_KEY] = tf.TensorSpec((), tf.int64)
    claimed = threading.Lock()

    def batches() -> Iterator[dict[str, np.ndarray]]:
        if not claimed.acquire(blocking=False):
            raise RuntimeError(
                "A taskdata tf.data dataset is read once (it owns its source and iterator). Build another "
                "one with tf_dataset(..., start=DataState(step, fingerprint)) to read again from any step."
            )
        try:
            for batch in iterator:
                if not batch.skipped:
                    yield {**batch.features, STEP_KEY: np.int64(batch.step)}
        finally:
            iterator.close()

    return tf.data.Dataset.from_generator(batches, output_signature=signature)
