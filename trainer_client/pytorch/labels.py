"""Next-token labels of a row of tokens, never crossing an example's end: what PyTorch LM trainers train on.

    labels = next_token_labels(tokens)                                  # unpacked rows: token 0 is padding
    labels = next_token_labels(tokens, segment_ids=row["targets_segment_ids"])   # packed rows

Label ``i`` is token ``i + 1`` when both are tokens of the same example, else ``ignore_index`` (torch's
``cross_entropy`` default, -100, which torchtitan calls ``IGNORE_INDEX``): on the last token of every
example and on padding. A batch of taskdata rows needs no other preparation for a causal LM: the inputs
are the row itself (a label is the next token within the row), and a packed row's examples never see
each other's tokens as labels. The shift is ``trainer_client.features.shift_left``'s; what this adds is the
ignore value on padding, where a loss that masks by label (torch's) needs it.
"""

from __future__ import annotations

import numpy as np

from trainer_client.features import shift_left

__all__ = ["IGNORE_INDEX", "next_token_labels"]

IGNORE_INDEX = -100


def next_token_labels(
    tokens: np.ndarray, *, segment_ids: np.ndarray | None = None, ignore_index: int = IGNORE_INDEX
) -> np.ndarray:
    """int64 labels for ``tokens`` (``[..., length]``): each position's next token in the same example.

    Without ``segment_ids``, each row holds one example whose tokens are the non-zero ones (token 0 is
    padding, as in every taskdata cache). With them (a packed row: 1, 2, ... per example, 0 on padding),
    a label never crosses from one example into the next.
    """
    tokens = np.asarray(tokens)
    if tokens.ndim < 1 or not np.issubdtype(tokens.dtype, np.integer):
        raise ValueError(f"Tokens must be an integer array of shape [..., length] but got {tokens.dtype} {tokens.shape}.")
    if segment_ids is None:
        segments = (tokens != 0).astype(np.int64)
    else:
        segments = np.asarray(segment_ids)
        if segments.shape != tokens.shape:
            raise ValueError(
                f"Segment ids of shape {segments.shape} do not match tokens of shape {tokens.shape}: pass the "
                "row's own '{feature}_segment_ids' (a packed cache's rows carry them)."
            )
    labels = shift_left(tokens.astype(np.int64), segment_ids=segments, fill=ignore_index)
    labels[segments == 0] = ignore_index  # padding: no example, nothing to predict
    return labels
