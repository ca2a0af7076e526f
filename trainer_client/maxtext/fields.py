"""MaxText's six input fields from rows in t5x's packed language-model layout (pure numpy).

Input: ``[rows, L]`` integer arrays ``tokens``, ``segment_ids`` (1, 2, ... per document piece in a row, 0 on
padding) and ``positions`` (0, 1, ... within each piece), as ``ConcatenateAndChunk`` rows and packed caches
hold them. Output: what MaxText's train step reads (``maxtext/trainers/pre_train/train.py``), all int32
``[rows, L]``:

- ``inputs``, ``inputs_segmentation``, ``inputs_position``: the tokens, segment ids and positions as given;
- ``targets``: the tokens shifted left by one (the token each position predicts), 0 after the last;
- ``targets_segmentation``: the loss mask, nonzero exactly where the next token is in the same document
  piece as this one: zero at every document's last token (its EOS predicts nothing across the boundary),
  at a row's last token (the next one is in another row) and on padding;
- ``targets_position``: the positions as given (MaxText's own pipelines leave them unshifted).

Both shifts are ``trainer_client.features.shift_left``, the client's one shift: the targets shift as whole
rows (MaxText's own layout), the mask is the segment ids shifted within their segments.

MaxText's own pipeline shifts the same way (``input_pipeline_utils.shift_and_refine``) but masks only padding,
so its last token of a document is trained to predict the next document's first; this mask also stops there.
A row of zeros (padding, a skipped step's row) has a zero mask: it weighs nothing in the loss.
"""

from __future__ import annotations

import numpy as np

from trainer_client.features import shift_left

__all__ = ["FIELDS", "maxtext_fields"]

FIELDS = ("inputs", "inputs_position", "inputs_segmentation", "targets", "targets_position", "targets_segmentation")


def maxtext_fields(tokens: np.ndarray, segment_ids: np.ndarray, positions: np.ndarray) -> dict[str, np.ndarray]:
    """MaxText's fields (see the module docstring) of rows of ``tokens``, ``segment_ids`` and ``positions``."""
    arrays = [np.asarray(a) for a in (tokens, segment_ids, positions)]
    shapes = {a.shape for a in arrays}
    if len(shapes) != 1 or arrays[0].ndim != 2 or any(a.dtype.kind not in "iu" for a in arrays):
        raise ValueError(
            "tokens, segment_ids and positions must be integer arrays of one shape [rows, length] but got "
            f"{[(a.dtype.name, a.shape) for a in arrays]}."
        )
    tokens, segment_ids, positions = (a.astype(np.int32, copy=False) for a in arrays)
    # The next token's segment where it is this token's, else 0: zero at every piece's end and on padding.
    mask = shift_left(segment_ids, segment_ids=segment_ids, fill=0)
    return {
        "inputs": tokens,
        "inputs_position": positions,
        "inputs_segmentation": segment_ids,
        "targets": shift_left(tokens),
        "targets_position": positions,
        "targets_segmentation": mask,
    }
