"""A run as a ``tf.data.Dataset``: this host's padded numpy batches, step by step, resumable at any step.

    ds = tf_dataset(ServerAssignments(url, "c4_sc"), {"inputs": 512, "targets": 114},
                    start=state, host_slice=HostSlice(jax.process_index(), jax.process_count()))
    for batch in ds.as_numpy_iterator():   # {"inputs": int32 [rows, 512], "targets": ..., "step": int64}
        ...                                # checkpoint DataState(int(batch["step"]) + 1, fingerprint)

For input pipelines written in tf.data (the HF TF/TPU language-model recipe, t5x's dataset functions):
each element is one step's host batch, exactly what ``DataIterator`` yields for that step, plus its
``step``. A step that the plan skips yields no element. The dataset wraps a ``DataIterator`` built
here, so a start state of another run fails here with its ``ResumeError``; the iterator reads ahead
in its own threads, and the dataset, a sequence of steps mapped in order through ``tf.numpy_function``,
hands each step's batch to TensorFlow (cheaper than ``from_generator``, whose end of stream also
stalled for seconds on a one-core host in ``bench/bench_client.py``).

Its iterators checkpoint like any tf.data iterator (``tf.train.Checkpoint(ds=iterator)``, and so t5x's
``TfDatasetIterator(checkpoint=True)`` and its dataset checkpoints): their state is the data state, the
next step and the run fingerprint of the steps before it, carried by a ``scan``, and a step's batch is
a function of the step alone (the Python function that reads it is stateless to TensorFlow: asked for
another step than the next, it moves the ``DataIterator`` there). Restoring a state of another run
fails at the next element with the ``DataIterator``'s ``ResumeError`` (inside TensorFlow's error).
Without checkpoints, resuming is by step: build the dataset again with ``start=DataState(k,
fingerprint)``, where ``fingerprint`` is ``source.run_info().plan.fingerprint_before(k)`` (the run's
fingerprint, for a plan without stages). Since tf.data may read ahead of the train step
(``prefetch``), the state to save by hand is the step of the last element trained on, plus one.
An element's rows are a static shape while the run's batch size is constant from the start step on,
through every stage; otherwise they are dynamic. The dataset owns its source; its iterators read one
at a time (a new iterator starts at ``start`` again).

TensorFlow is imported when ``tf_dataset`` is called: the rest of ``trainer_client`` works without it.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

from taskdata.extras import require
from taskdata.index import RunPlan
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
    lookahead: int | None = None,
    prefetch: int = 4,
    verify_crc: bool = True,
) -> Any:
    """A ``tf.data.Dataset`` of this host's batches from ``start`` (arguments as for ``DataIterator``)."""
    require("tensorflow", "tf", "tf_dataset")
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
    names = list(lengths)
    first = iterator.state()
    rows = _static_rows(iterator.info.plan, first.step, iterator.host_slice.count)
    moving = threading.Lock()  # one iterator of the dataset reads at a time; another moves the DataIterator

    def following(step: np.int64) -> np.bytes_:
        """The fingerprint of the state after ``step``: the scan's next state, with its step."""
        return np.bytes_(iterator.info.plan.fingerprint_before(int(step) + 1).encode())

    def read(step: np.int64, fingerprint: np.bytes_) -> list[np.ndarray | np.bool_]:
        state = DataState(int(step), bytes(fingerprint).decode())
        with moving:
            if state != iterator.state():  # a restored checkpoint, or another iterator of the dataset
                iterator.restore(state)  # ResumeError for a state of another run
            batch = next(iterator)
        if batch.skipped:  # filtered out below: the arrays only have to fit the element's shapes
            return [np.zeros((rows or 0, lengths[name]), np.int32) for name in names] + [np.bool_(False)]
        if rows is not None and batch.global_batch_size // iterator.host_slice.count != rows:
            raise RuntimeError(
                f"Step {batch.step} has {batch.global_batch_size // iterator.host_slice.count} examples per host "
                f"but this dataset was built with {rows} per element (the run's batch size was constant from "
                f"step {first.step} on; a stage appended since changes it). Build the dataset again with "
                f"start=DataState({batch.step}, ...) to read on with the new batch size."
            )
        return [batch.features[name] for name in names] + [np.bool_(True)]

    def advance(state: Any, _: Any) -> tuple[Any, Any]:
        step, fingerprint = state
        after = tf.ensure_shape(tf.numpy_function(following, [step], tf.string, stateful=False), ())
        return (step + 1, after), (step, fingerprint)

    def element(step: Any, fingerprint: Any) -> tuple[dict[str, Any], Any]:
        # Stateless to TensorFlow: a step's batch depends on the step alone, so tf.data checkpoints the scan.
        *arrays, trained = tf.numpy_function(
            read, [step, fingerprint], [tf.int32] * len(names) + [tf.bool], stateful=False
        )
        features = {n: tf.ensure_shape(a, (rows, lengths[n])) for n, a in zip(names, arrays, strict=True)}
        return {**features, STEP_KEY: step}, trained

    # A dataset abandoned before its end may leave tf.data's thread waiting in read(): DataIterator closes
    # every iterator still open at exit, before the interpreter's teardown, which ends that wait.
    options = tf.data.Options()
    options.experimental_optimization.map_parallelization = False  # read() takes the steps in order
    # The DataIterator reads ahead in its own threads already. tf.data's autotuning (and the prefetch it
    # injects) adds nothing to that, and its end of stream stalled for 1-7 s on a loaded host pinned
    # to one core (bench/bench_client.py --ecosystem, 2 hosts): off, read() runs in next()'s thread.
    options.autotune.enabled = False
    options.experimental_optimization.inject_prefetch = False
    initial = (tf.constant(first.step, tf.int64), tf.constant(first.fingerprint))
    steps = tf.data.Dataset.counter().scan(initial, advance)
    if stop_step is not None:
        steps = steps.take_while(lambda step, _: step < stop_step)
    # A plan may skip a step's data: that step yields no element.
    dataset = steps.map(element).filter(lambda _, trained: trained).map(lambda batch, _: batch)
    return dataset.with_options(options)


def _static_rows(plan: RunPlan, first: int, hosts: int) -> int | None:
    """The rows of every host batch from step ``first`` on, if the plan's stages fix them, else None."""
    staged = plan.staged_schedule
    ahead = staged.schedules[staged.segment_of_step(first) :]
    if all(s.is_constant for s in ahead) and len({s.end for s in ahead}) == 1:
        return ahead[0].end // hosts
    return None
