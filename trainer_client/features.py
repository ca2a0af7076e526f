"""A host batch's task features as a model's features, in numpy: what seqio's feature converters give t5x.

    batch = next(data_iterator)                      # {"inputs": int32 [rows, 512], "targets": [rows, 114]}
    model = EncDecFeatures()(batch.features)          # encoder_input_tokens, decoder_target_tokens, ...

A batch is what ``DataIterator`` yields: every task feature zero-padded to its length, int32
``[rows, length]``; from a packed cache also ``{k}_segment_ids`` and ``{k}_positions`` for every feature
(``taskdata.example.packing``). The converters give, element for element, what seqio 0.0.20's
converters give t5x's models for the same examples at the same task feature lengths:

- ``EncDecFeatures``: ``seqio.EncDecFeatureConverter`` (``pack=False`` on examples, ``pack=True`` on the
  rows seqio packs them into) and ``PrePackedEncDecFeatureConverter`` (on packed rows).
- ``DecoderFeatures``: ``seqio.DecoderFeatureConverter``: with ``targets`` alone the language model's
  features (``LMFeatureConverter``), with ``inputs`` too the prefix LM's (``PrefixLMFeatureConverter``:
  inputs and targets of each example concatenated, ``decoder_causal_attention`` over the prefix).

Packing is the cache's (``taskdata cache --pack``): a converter never packs or unpacks, it reads the
layout the batch has. Token 0 is padding, as in seqio: an example's tokens end at its last non-zero
token (trailing zeros are padding, which seqio's examples never hold either).

The shifts are public, small and exact, for trainers with other layouts to build on: ``shift_right``
(decoder inputs: BOS first, nothing carried across a segment start) and ``shift_left`` (next-token
labels: a fill value at each segment's end), both one ``_shift``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from taskdata.example.packing import positions_name, segment_ids_name

__all__ = [
    "DecoderFeatures",
    "EncDecFeatures",
    "FeatureConversionError",
    "example_lengths",
    "nonpadding",
    "shift_left",
    "shift_right",
]


class FeatureConversionError(ValueError):
    """A batch that a converter cannot turn into model features; the message names the feature and the fix."""


def _shift(tokens: np.ndarray, by: int, fill: int, segment_ids: np.ndarray | None) -> np.ndarray:
    """``tokens`` moved ``by`` (1: right, -1: left) along the last axis; the position left empty, and with
    ``segment_ids`` every position whose token would come from another segment, hold ``fill``."""
    out = np.full_like(tokens, fill)
    if by == 1:
        out[..., 1:] = tokens[..., :-1]
    else:
        out[..., :-1] = tokens[..., 1:]
    if segment_ids is not None:
        if segment_ids.shape != tokens.shape:
            raise FeatureConversionError(
                f"Segment ids of shape {segment_ids.shape} do not match tokens of shape {tokens.shape}."
            )
        source = np.full_like(segment_ids, -1)  # the segment each shifted token comes from; -1: none
        if by == 1:
            source[..., 1:] = segment_ids[..., :-1]
        else:
            source[..., :-1] = segment_ids[..., 1:]
        out = np.where(source == segment_ids, out, np.asarray(fill, dtype=tokens.dtype))
    return out


def shift_right(tokens: np.ndarray, *, segment_ids: np.ndarray | None = None, bos_id: int = 0) -> np.ndarray:
    """Decoder inputs for ``tokens`` (``[..., length]``): each token moves one position right, ``bos_id`` first.

    With ``segment_ids`` (same shape; packed rows, 0 on padding) every segment starts with ``bos_id``
    instead of the previous segment's last token, and so does the padding after the last one. Without
    them the row shifts as a whole (the token after an unpacked example's last one is that token).
    This is seqio's ``make_autoregressive_inputs``.
    """
    return _shift(tokens, 1, bos_id, segment_ids)


def shift_left(tokens: np.ndarray, *, segment_ids: np.ndarray | None = None, fill: int = 0) -> np.ndarray:
    """Next-token labels for ``tokens`` (``[..., length]``): each token moves one position left, ``fill`` last.

    With ``segment_ids`` the last position of every segment holds ``fill`` too (its next token belongs to
    another example, or is padding), so a loss masked where labels equal ``fill`` never crosses a document
    end. ``fill`` is the trainer's ignore value (0 for a loss weighted by ``nonpadding``, -100 for torch).
    """
    return _shift(tokens, -1, fill, segment_ids)


def nonpadding(tokens: np.ndarray) -> np.ndarray:
    """1 where ``tokens`` holds a token, 0 on padding (token 0), as int32: seqio's decoder loss weights."""
    return (tokens != 0).astype(np.int32)


def example_lengths(tokens: np.ndarray) -> np.ndarray:
    """Each row's length: the position after its last non-zero token (0 for a row of padding)."""
    nonzero = tokens != 0
    last = tokens.shape[-1] - np.argmax(nonzero[..., ::-1], axis=-1)
    return np.where(nonzero.any(axis=-1), last, 0).astype(np.int64)


def _feature(batch: Mapping[str, np.ndarray], name: str, converter: str) -> np.ndarray:
    try:
        array = batch[name]
    except KeyError:
        raise FeatureConversionError(
            f"{converter} needs the task feature {name!r} but the batch has {sorted(batch)}. Read the run with "
            f"lengths for {name!r}, or pick the converter of the task's features."
        ) from None
    if array.ndim != 2:
        raise FeatureConversionError(f"Feature {name!r} must be a [rows, length] array but has shape {array.shape}.")
    return array.astype(np.int32, copy=False)


def _is_packed(batch: Mapping[str, np.ndarray], features: tuple[str, ...]) -> bool:
    """Whether the batch holds packed rows of ``features`` (all of them, or none: anything else is refused)."""
    present = [k for k in features if segment_ids_name(k) in batch or positions_name(k) in batch]
    if present and present != list(features):
        raise FeatureConversionError(
            f"The batch has segment ids or positions for {present} but not for every one of {list(features)}: "
            "a packed cache packs every feature. Read all of its features."
        )
    for k in present:
        for name in (segment_ids_name(k), positions_name(k)):
            if name not in batch:
                raise FeatureConversionError(f"The batch has packed feature {k!r} but no {name!r}.")
    return bool(present)


@dataclasses.dataclass(frozen=True)
class EncDecFeatures:
    """seqio's ``EncDecFeatureConverter`` / ``PrePackedEncDecFeatureConverter`` over host batches.

    Task features ``inputs`` and ``targets``; model features ``encoder_input_tokens``,
    ``decoder_target_tokens``, ``decoder_input_tokens`` (``shift_right``), ``decoder_loss_weights``
    (``nonpadding``), and for packed rows ``encoder_segment_ids``, ``encoder_positions``,
    ``decoder_segment_ids``, ``decoder_positions``.
    """

    bos_id: int = 0

    TASK_FEATURES = ("inputs", "targets")

    def __post_init__(self) -> None:
        _check_bos(self.bos_id)

    def model_lengths(self, task_lengths: Mapping[str, int], *, packed: bool) -> dict[str, int]:
        """The length of every model feature for these task feature lengths."""
        _check_task_lengths(task_lengths, self.TASK_FEATURES, type(self).__name__)
        encoder, decoder = task_lengths["inputs"], task_lengths["targets"]
        out = {"encoder_input_tokens": encoder, "decoder_target_tokens": decoder,
               "decoder_input_tokens": decoder, "decoder_loss_weights": decoder}
        if packed:
            out.update(encoder_segment_ids=encoder, encoder_positions=encoder,
                       decoder_segment_ids=decoder, decoder_positions=decoder)
        return out

    def __call__(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        name = type(self).__name__
        inputs, targets = _feature(batch, "inputs", name), _feature(batch, "targets", name)
        if not _is_packed(batch, self.TASK_FEATURES):
            return {"encoder_input_tokens": inputs, "decoder_target_tokens": targets,
                    "decoder_input_tokens": shift_right(targets, bos_id=self.bos_id),
                    "decoder_loss_weights": nonpadding(targets)}
        segments = _feature(batch, segment_ids_name("targets"), name)
        return {
            "encoder_input_tokens": inputs,
            "decoder_target_tokens": targets,
            "decoder_input_tokens": shift_right(targets, segment_ids=segments, bos_id=self.bos_id),
            "decoder_loss_weights": nonpadding(targets),
            "encoder_segment_ids": _feature(batch, segment_ids_name("inputs"), name),
            "encoder_positions": _feature(batch, positions_name("inputs"), name),
            "decoder_segment_ids": segments,
            "decoder_positions": _feature(batch, positions_name("targets"), name),
        }


@dataclasses.dataclass(frozen=True)
class DecoderFeatures:
    """seqio's ``DecoderFeatureConverter`` over host batches: a language model's or a prefix LM's features.

    With ``targets`` alone (``LMFeatureConverter``): ``decoder_target_tokens``, ``decoder_input_tokens``,
    ``decoder_loss_weights``, and for packed rows ``decoder_segment_ids`` and ``decoder_positions``.
    With ``inputs`` and ``targets`` (``PrefixLMFeatureConverter``): each example's inputs then its targets
    (one padding token when it has none) in a row of ``len(inputs) + len(targets)``, plus
    ``decoder_causal_attention`` (1 over the inputs and the position after them); with
    ``loss_on_targets_only`` the loss weights are 0 on the inputs (exactly seqio's XOR of "inside the
    inputs" and "not padding"). Packed rows are concatenated segment by segment, each segment's inputs
    then its targets, with no padding target where it has none (seqio's packing drops it: it keeps an
    example's non-zero tokens). seqio's own masks after such a segment are one position off (its
    packing keeps the padding target's mask values but not the token); these masks stay aligned.
    """

    loss_on_targets_only: bool = True
    bos_id: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.loss_on_targets_only, bool):
            raise FeatureConversionError(
                f"loss_on_targets_only must be True or False but got {self.loss_on_targets_only!r}."
            )
        _check_bos(self.bos_id)

    def task_features(self, task_lengths: Mapping[str, int]) -> tuple[str, ...]:
        """``("targets",)`` for a language model, ``("inputs", "targets")`` for a prefix LM."""
        return ("inputs", "targets") if "inputs" in task_lengths else ("targets",)

    def model_lengths(self, task_lengths: Mapping[str, int], *, packed: bool) -> dict[str, int]:
        """The length of every model feature for these task feature lengths."""
        features = self.task_features(task_lengths)
        _check_task_lengths(task_lengths, features, type(self).__name__)
        length = sum(task_lengths[k] for k in features)
        names = ["decoder_target_tokens", "decoder_input_tokens", "decoder_loss_weights"]
        names += ["decoder_causal_attention"] if len(features) == 2 else []
        names += ["decoder_segment_ids", "decoder_positions"] if packed else []
        return dict.fromkeys(names, length)

    def __call__(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        name = type(self).__name__
        targets = _feature(batch, "targets", name)
        if "inputs" not in batch:
            if not _is_packed(batch, ("targets",)):
                return {"decoder_target_tokens": targets,
                        "decoder_input_tokens": shift_right(targets, bos_id=self.bos_id),
                        "decoder_loss_weights": nonpadding(targets)}
            segments = _feature(batch, segment_ids_name("targets"), name)
            return {"decoder_target_tokens": targets,
                    "decoder_input_tokens": shift_right(targets, segment_ids=segments, bos_id=self.bos_id),
                    "decoder_loss_weights": nonpadding(targets),
                    "decoder_segment_ids": segments,
                    "decoder_positions": _feature(batch, positions_name("targets"), name)}
        inputs = _feature(batch, "inputs", name)
        if _is_packed(batch, ("inputs", "targets")):
            return self._prefix_lm_packed(batch, inputs, targets)
        return self._prefix_lm(inputs, targets)

    def _prefix_lm(self, inputs: np.ndarray, targets: np.ndarray) -> dict[str, np.ndarray]:
        rows, length = inputs.shape[0], inputs.shape[1] + targets.shape[1]
        widths = example_lengths(inputs)[:, None]
        # An example without targets gets one padding target, as in seqio (its concatenation is one longer).
        ends = widths + np.maximum(example_lengths(targets)[:, None], 1)
        position = np.broadcast_to(np.arange(length), (rows, length))
        tokens = np.where(
            position < widths,
            np.take_along_axis(inputs, np.minimum(position, inputs.shape[1] - 1), axis=1),
            np.take_along_axis(targets, np.clip(position - widths, 0, targets.shape[1] - 1), axis=1),
        )
        tokens = np.where(position < ends, tokens, 0).astype(np.int32)
        inside = position < ends
        return self._prefix_lm_features(
            tokens,
            shift_right(tokens, bos_id=self.bos_id),
            causal=inside & (position < widths + 1),
            in_inputs=inside & (position < widths),
        )

    def _prefix_lm_packed(
        self, batch: Mapping[str, np.ndarray], inputs: np.ndarray, targets: np.ndarray
    ) -> dict[str, np.ndarray]:
        name = type(self).__name__
        in_segments = _feature(batch, segment_ids_name("inputs"), name)
        out_segments = _feature(batch, segment_ids_name("targets"), name)
        rows, length = inputs.shape[0], inputs.shape[1] + targets.shape[1]
        count = int(max(in_segments.max(initial=0), out_segments.max(initial=0))) + 1  # segment ids 0..count-1
        row_of = np.arange(rows)[:, None]

        def per_segment(segments: np.ndarray) -> np.ndarray:
            """[rows, count]: tokens of each segment id (id 0, the padding, counted but never used)."""
            flat = (row_of * count + segments).ravel()
            return np.bincount(flat, minlength=rows * count).reshape(rows, count)

        widths = per_segment(in_segments)
        sizes = per_segment(out_segments)
        present = (widths + sizes) > 0
        present[:, 0] = False
        # No padding target for a segment without targets: seqio's packing keeps an example's non-zero tokens.
        spans = np.where(present, widths + sizes, 0)
        starts = np.cumsum(spans, axis=1) - spans  # where each segment begins in the concatenated row
        tokens = np.zeros((rows, length), np.int32)
        r, c = np.nonzero(in_segments)
        tokens[r, starts[r, in_segments[r, c]] + batch[positions_name("inputs")][r, c]] = inputs[r, c]
        r, c = np.nonzero(out_segments)
        s = out_segments[r, c]
        tokens[r, starts[r, s] + widths[r, s] + batch[positions_name("targets")][r, c]] = targets[r, c]
        # Every position of a segment's span: its row, segment id, and place in the span.
        r, s = np.nonzero(present)
        span = spans[r, s]
        rep_r, rep_s = np.repeat(r, span), np.repeat(s, span)
        within = np.arange(int(span.sum())) - np.repeat(np.cumsum(span) - span, span)
        column = np.repeat(starts[r, s], span) + within
        segment_ids = np.zeros((rows, length), np.int32)
        positions = np.zeros((rows, length), np.int32)
        width_at = np.zeros((rows, length), np.int64)  # the inputs width of each position's segment; 0 on padding
        segment_ids[rep_r, column] = rep_s
        positions[rep_r, column] = within
        width_at[rep_r, column] = widths[rep_r, rep_s]
        inside = segment_ids != 0
        features = self._prefix_lm_features(
            tokens,
            shift_right(tokens, segment_ids=segment_ids, bos_id=self.bos_id),
            causal=inside & (positions < width_at + 1),
            in_inputs=inside & (positions < width_at),
        )
        features["decoder_segment_ids"] = segment_ids
        features["decoder_positions"] = positions
        return features

    def _prefix_lm_features(
        self, tokens: np.ndarray, decoder_inputs: np.ndarray, *, causal: np.ndarray, in_inputs: np.ndarray
    ) -> dict[str, np.ndarray]:
        not_padding = tokens != 0
        # seqio's XOR: 1 on targets, 0 on padding and on the inputs (but 1 on a 0 token inside the inputs).
        weights = np.logical_xor(in_inputs, not_padding) if self.loss_on_targets_only else not_padding
        return {
            "decoder_target_tokens": tokens,
            "decoder_input_tokens": decoder_inputs,
            "decoder_loss_weights": weights.astype(np.int32),
            "decoder_causal_attention": causal.astype(np.int32),
        }


def _check_bos(bos_id: object) -> None:
    if isinstance(bos_id, bool) or not isinstance(bos_id, int) or bos_id < 0:
        raise FeatureConversionError(f"bos_id must be an integer >= 0 but got {bos_id!r}.")


def _check_task_lengths(task_lengths: Mapping[str, int], features: tuple[str, ...], converter: str) -> None:
    if set(task_lengths) != set(features):
        raise FeatureConversionError(
            f"{converter} takes task features {list(features)} but the task feature lengths name "
            f"{sorted(task_lengths)}. Give a length for exactly those features."
        )
    for name in features:
        value = task_lengths[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise FeatureConversionError(f"Task feature length of {name!r} must be a positive integer but got {value!r}.")
