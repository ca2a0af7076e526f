"""Where a plan's rows go in MaxText's batch: even over the trained devices, the same on any number of processes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer_client.assignments import HostSlice
from trainer_client.maxtext.layout import BatchLayout, DevicePiece


def global_batch(layout: BatchLayout, processes: list[list[int]], batch_size: int) -> np.ndarray:
    """MaxText's global batch ([G] row numbers of the plan's step, -1 for zero rows) as the processes holding the
    devices ``processes`` (flat positions each) build it, the way multihost_dataloading puts it together."""
    share = layout.rows_per_trained_device(0, batch_size) if batch_size else 0
    out = np.full(layout.rows, -2)
    c = layout.rows_per_device
    for positions in processes:
        pieces = layout.pieces(positions)
        if all(piece.host_slice is None for piece in pieces):  # MaxText's placeholder process: zeros
            for p in positions:
                out[p * c : (p + 1) * c] = -1
            continue
        real = []
        for piece in pieces:
            if piece.host_slice is None:
                real.append(None)
                continue
            piece_rows = piece.host_slice.rows(batch_size) if batch_size else range(0)
            real.append(np.array(piece_rows, dtype=np.int64).reshape(-1, 1) + 1)  # +1: zero rows stay 0
        local = layout.process_rows(pieces, real, share)[:, 0] - 1
        for i, p in enumerate(positions):  # local device i is flat position p: global rows [p*c, (p+1)*c)
            out[p * c : (p + 1) * c] = local[i * c : (i + 1) * c]
    return out


def split(devices: int, processes: int) -> list[list[int]]:
    per = devices // processes
    return [list(range(i * per, (i + 1) * per)) for i in range(processes)]


def test_golden_layout_of_a_ramp_step():
    layout = BatchLayout(rows=8, trained_rows=8, devices=4)
    assert (layout.rows_per_device, layout.trained_devices) == (2, 4)
    # 4 rows of the plan on 4 devices of 2 rows: one plan row then one zero row per device.
    assert global_batch(layout, split(4, 1), 4).tolist() == [0, -1, 1, -1, 2, -1, 3, -1]
    assert global_batch(layout, split(4, 1), 8).tolist() == [0, 1, 2, 3, 4, 5, 6, 7]
    assert global_batch(layout, split(4, 1), 0).tolist() == [-1] * 8  # a skipped step


@settings(max_examples=60, deadline=None)
@given(devices_log=st.integers(0, 4), per_device=st.integers(1, 4), processes_log=st.integers(0, 4),
       fraction=st.integers(0, 4), data=st.data())
def test_the_global_batch_is_the_plans_step_on_any_number_of_processes(devices_log, per_device, processes_log,
                                                                       fraction, data):
    devices = 2**devices_log
    processes = 2 ** min(processes_log, devices_log)
    layout = BatchLayout(rows=devices * per_device, trained_rows=devices * per_device, devices=devices)
    batch_size = devices * data.draw(st.integers(0, per_device))
    one = global_batch(layout, split(devices, 1), batch_size)
    many = global_batch(layout, split(devices, processes), batch_size)
    assert one.tolist() == many.tolist()
    assert sorted(one[one >= 0].tolist()) == list(range(batch_size))  # every row once, nothing else
    assert (one == -1).sum() == layout.rows - batch_size


def test_per_device_batch_below_one_puts_the_rows_on_the_first_devices():
    # per_device_batch_size=0.5 on 8 devices: MaxText loads 8 rows (one a device) and trains on the first 4.
    layout = BatchLayout(rows=8, trained_rows=4, devices=8)
    assert layout.trained_devices == 4
    assert global_batch(layout, split(8, 4), 4).tolist() == [0, 1, 2, 3, -1, -1, -1, -1]
    assert layout.pieces([4, 5]) == (DevicePiece(4, 1, None), DevicePiece(5, 1, None))


def test_devices_that_are_not_neighbours_are_read_as_aligned_pieces():
    layout = BatchLayout(rows=16, trained_rows=16, devices=8)
    assert layout.pieces([0, 1, 2, 3]) == (DevicePiece(0, 4, HostSlice(0, 2)),)
    assert layout.pieces([1, 2]) == (DevicePiece(1, 1, HostSlice(1, 8)), DevicePiece(2, 1, HostSlice(2, 8)))
    assert layout.pieces([0, 1, 4, 5]) == (DevicePiece(0, 2, HostSlice(0, 4)), DevicePiece(4, 2, HostSlice(2, 4)))
    processes = [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert global_batch(layout, processes, 8).tolist() == global_batch(layout, split(8, 1), 8).tolist()


def test_batches_the_devices_cannot_hold_evenly_are_refused_with_the_fix():
    layout = BatchLayout(rows=8, trained_rows=8, devices=4)
    with pytest.raises(ValueError, match=r"Step 7 of the plan has a global batch of 6 rows, which MaxText's 4 trained "
                                         r"devices of 2 rows each cannot hold evenly.*multiple-of=4"):
        layout.rows_per_trained_device(7, 6)
    with pytest.raises(ValueError, match=r"at most 8 \(global_batch_size_to_train_on\)"):
        layout.rows_per_trained_device(0, 12)
    with pytest.raises(ValueError, match=r"does not split over the mesh's 3 devices"):
        BatchLayout(rows=8, trained_rows=8, devices=3)
    with pytest.raises(ValueError, match=r"with per_device_batch_size < 1 use gradient_accumulation_steps=1"):
        BatchLayout(rows=8, trained_rows=3, devices=4)
    with pytest.raises(ValueError, match=r"distinct, increasing and in \[0, 4\)"):
        layout.pieces([1, 0])
