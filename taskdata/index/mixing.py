"""Mixing: position in a run's example stream -> (task, position in that task's stream), and back.

Rates are exact: they become positive integer weights ``w_i`` (``r_i = w_i / W``), so no result ever
depends on floating-point rounding.

Construction: a binary tree whose leaves are the tasks. Each internal node ``N`` (weight ``w_N``) hands
its own slots (its positions 0, 1, 2, ... in order) to its two children with a Bresenham split: of
the first ``m`` slots of ``N``, the left child (weight ``w_L``) owns

    L(m) = floor(m * w_L / w_N + 1/2)

and the right child owns the other ``m - L(m)``. ``L`` rises by 0 or 1 per slot, so slot ``m`` belongs
to the left child exactly when ``L(m + 1) > L(m)``, as its ``L(m)``-th slot. A lookup walks from the
root to a leaf (O(depth) <= O(number of tasks)); the inverse walks back up; the counts of all tasks
in a prefix take one pass over the tree. Nothing is materialised and nothing depends on how far the
run has gone: the prefix of length ``n`` is the same for every longer run (prefix-stable).

Guarantee (proved per node, checked by the tests): let ``e_N(n) = c_N(n) - n * w_N / W`` be the lag
of node N after ``n`` positions (the root has lag 0). With ``rho = w_L / w_N``, the left child's lag is
``floor(n*r_L + rho*e_N + 1/2) - n*r_L``, which lies in ``(rho*e_N - 1/2, rho*e_N + 1/2]``; the right
child's lag is ``e_N`` minus that. So if ``|e_N| <= a_N`` then ``|e_child| <= rho_child * a_N + 1/2``,
and a task's lag never exceeds

    bound_i = (1 + sum over its ancestors A, other than the root, of w_i / w_A) / 2.

A task directly under a child of the root has ``bound < 1``: within one example at every prefix.
Any mixture of up to four tasks has such a tree, so the search below finds one whose bounds are all
below one; deeper tasks are within one when the sum is below 1. No O(1) closed form is known that
keeps every task of every mixture within one example: counts floor(n*r_i + o_i) that always sum to n
would tile the stream with three or more Beatty sequences, which for distinct rates happens only for
special rates (Fraenkel's conjecture, proved up to seven sequences), never for 1/2, 1/3, 1/6; and the
schedules that do stay within one (Tijdeman's chairman assignment, earliest-deadline-first) need the
history of the stream. ``lag_bounds`` reports the exact bound of every task, and the tree is chosen
to make them small: Huffman merging down to ``_EXACT_TOP`` subtrees, then an exhaustive search over
the trees on those that maximises the smallest margin ``1/w_i - sum 1/w_A`` (non-negative exactly
when every bound is at most one).
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import math
from collections.abc import Sequence
from fractions import Fraction

import numpy as np

from taskdata.index.errors import PlanError

__all__ = ["Mixing", "check_position_range"]

# Exhaustive search over trees on this many subtrees visits 3**8 / 2 splits: a few milliseconds.
_EXACT_TOP = 8
_INT64_MAX = 2**63 - 1
_SCALAR_SLOTS = 4
# The interleaving repeats every W = sum(weights) positions (``_period``): up to this W, a few periods are kept
# as three int64 arrays (under 1 MiB) and ranges of up to _PERIOD_SPAN positions (a step of a usual batch
# size, or a host's slice of it) are read from them.
_PERIOD_LIMIT = 2**15
_PERIOD_SPAN = 8192


@dataclasses.dataclass(frozen=True)
class Mixing:
    """The deterministic interleaving of tasks with integer weights (see the module docstring)."""

    weights: tuple[int, ...]
    # Internal node j (node id k + j) is (left weight, weight, left id, right id); ids < k are tasks.
    _nodes: tuple[tuple[int, int, int, int], ...] = dataclasses.field(init=False, repr=False, compare=False)
    _parent: tuple[int, ...] = dataclasses.field(init=False, repr=False, compare=False)
    _root: int = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        weights = self.weights
        if not isinstance(weights, tuple) or not weights:
            raise PlanError(
                f"Mixing weights must be a non-empty tuple of positive integers but got {weights!r}."
            )
        for i, w in enumerate(weights):
            if isinstance(w, bool) or not isinstance(w, int) or w < 1:
                raise PlanError(f"Mixing weight {i} must be a positive integer but got {w!r}.")
        if math.gcd(*weights) != 1:
            raise PlanError(
                f"Mixing weights must be in lowest terms (gcd 1) but got {weights!r}: use Mixing.from_rates."
            )
        nodes, root = _build_tree(weights)
        parent = [-1] * (len(weights) + len(nodes))
        for j, (_, _, left, right) in enumerate(nodes):
            parent[left] = parent[right] = len(weights) + j
        object.__setattr__(self, "_nodes", tuple(nodes))
        object.__setattr__(self, "_parent", tuple(parent))
        object.__setattr__(self, "_root", root)

    @classmethod
    def from_rates(cls, rates: Sequence[Fraction | int]) -> Mixing:
        """Exact positive rates (any scale) -> the smallest integer weights with the same ratios."""
        fractions = []
        for i, rate in enumerate(rates):
            if isinstance(rate, bool) or not isinstance(rate, Fraction | int) or rate <= 0:
                raise PlanError(f"Mixing rate {i} must be a positive Fraction or int but got {rate!r}.")
            fractions.append(Fraction(rate))
        if not fractions:
            raise PlanError("A mixture needs at least one task with a positive rate.")
        scale = math.lcm(*(f.denominator for f in fractions))
        integers = [int(f * scale) for f in fractions]
        divisor = math.gcd(*integers)
        return cls(tuple(w // divisor for w in integers))

    @property
    def num_tasks(self) -> int:
        return len(self.weights)

    @property
    def rates(self) -> tuple[Fraction, ...]:
        total = sum(self.weights)
        return tuple(Fraction(w, total) for w in self.weights)

    def locate(self, position: int) -> tuple[int, int]:
        """Stream position -> (task index, position in that task's stream)."""
        _check_count(position, "A stream position")
        return self._descend(self._root, position)

    def _descend(self, node: int, m: int) -> tuple[int, int]:
        """The task and task position of slot ``m`` of ``node``."""
        k = len(self.weights)
        while node >= k:
            w_left, w, left, right = self._nodes[node - k]
            before = (2 * m * w_left + w) // (2 * w)
            after = (2 * (m + 1) * w_left + w) // (2 * w)
            node, m = (left, before) if after > before else (right, m - before)
        return node, m

    def tasks_in_range(self, start: int, stop: int) -> np.ndarray:
        """The task of every position in ``[start, stop)`` at once (an int64 array), as ``locate`` gives them.

        A node's slots among a contiguous range of stream positions are a contiguous range of its own
        slots, so each node splits its range with one vectorised Bresenham step, and only the first slot
        of the range needs big-integer math (a node whose weights would overflow int64 does its step in
        Python ints). A range the kept period holds is read from it instead (``_period``). The index
        chain takes each task's positions from ``counts`` (they are consecutive within a range).
        """
        check_position_range(start, stop)
        period = self._period
        if period is not None and stop <= _INT64_MAX:
            offset = start % sum(self.weights)
            end = offset + stop - start
            if end <= len(period):
                return period[offset:end].copy()
        return self._split_range(start, stop)

    @functools.cached_property
    def _period(self) -> np.ndarray | None:
        """The tasks of positions ``[0, E)``: whole periods of ``W = sum(weights)`` positions, at least ``W +
        _PERIOD_SPAN`` of them; None when W exceeds ``_PERIOD_LIMIT``.

        Position ``p + W`` holds position ``p``'s task: in W slots a node of weight ``w_N`` hands out exactly
        ``L(w_N) = w_L`` to its left child and ``w_N - w_L`` to its right one, and ``L(m + w_N) = L(m) + w_L``,
        so by induction from the root every node, down to each task, sees its own slots repeat. A range then
        starts at ``start % W`` in this array, and a range of at most ``_PERIOD_SPAN`` positions is a slice
        of it: no division per position.
        """
        total = sum(self.weights)
        if total > _PERIOD_LIMIT:
            return None
        tasks = self._split_range(0, total * -(-(total + _PERIOD_SPAN) // total))
        tasks.flags.writeable = False
        return tasks

    def _split_range(self, start: int, stop: int) -> np.ndarray:
        """``tasks_in_range`` node by node (see there)."""
        k = len(self.weights)
        tasks = np.empty(stop - start, np.int64)
        # (node, the node's slot at the first stream position of the range, where its positions go).
        pending = [(self._root, start, np.arange(stop - start))]
        while pending:
            node, first, where = pending.pop()
            if where.size <= _SCALAR_SLOTS:
                # A numpy step costs as much as walking a few positions down one at a time: with many
                # tasks, most nodes hold only a few positions of a range.
                for j, out in enumerate(where.tolist()):
                    tasks[out] = self._descend(node, first + j)[0]
                continue
            if node < k:
                tasks[where] = node
                continue
            w_left, w, left, right = self._nodes[node - k]
            # L(first + j) = L(first) + floor((rest + 2 * j * w_left) / (2 * w)), j = 0..size: the
            # numerators stay below (size + 1) * 2 * w, which decides whether int64 is exact.
            before, rest = divmod(2 * first * w_left + w, 2 * w)
            step_dtype = np.int64 if (where.size + 1) * 2 * w <= _INT64_MAX else object
            owned = np.arange(rest, rest + (where.size + 1) * 2 * w_left, 2 * w_left, dtype=step_dtype) // (
                2 * w
            )
            to_left = owned[1:] != owned[:-1]
            pending.append((left, before, where[to_left]))
            pending.append((right, first - before, where[~to_left]))
        return tasks

    def position_of(self, task: int, task_position: int) -> int:
        """The inverse of ``locate``: the stream position of ``task``'s ``task_position``-th example."""
        self._check_task(task)
        _check_count(task_position, "A task position")
        k = len(self.weights)
        node, m = task, task_position
        while node != self._root:
            parent = self._parent[node]
            w_left, w, left, _ = self._nodes[parent - k]
            if node == left:  # smallest m with L(m + 1) = j + 1
                m = -(-(2 * m + 1) * w // (2 * w_left)) - 1
            else:  # smallest m with (m + 1) - L(m + 1) = j + 1
                m = (2 * m + 1) * w // (2 * (w - w_left))
            node = parent
        return m

    def counts(self, n: int) -> tuple[int, ...]:
        """How many of the first ``n`` positions each task owns (one pass over the tree)."""
        _check_count(n, "A prefix length")
        k = len(self.weights)
        owned = {self._root: n}
        # Internal nodes are created after their children, so walking them backwards goes root-first.
        for j in range(len(self._nodes) - 1, -1, -1):
            w_left, w, left, right = self._nodes[j]
            m = owned.pop(k + j)
            owned[left] = (2 * m * w_left + w) // (2 * w)
            owned[right] = m - owned[left]
        return tuple(owned[i] for i in range(k))

    def lag_bounds(self) -> tuple[Fraction, ...]:
        """Per task, the exact bound on ``|counts(n)[i] - n * rates[i]|`` over all prefixes ``n``."""
        k = len(self.weights)
        bounds = []
        for task, w in enumerate(self.weights):
            total = Fraction(0)
            node = self._parent[task]
            while node != -1 and node != self._root:
                total += Fraction(w, self._nodes[node - k][1])
                node = self._parent[node]
            bounds.append((1 + total) / 2)
        return tuple(bounds)

    def _check_task(self, task: int) -> None:
        if isinstance(task, bool) or not isinstance(task, int) or not 0 <= task < len(self.weights):
            raise PlanError(f"Task index must be an integer in [0, {len(self.weights)}) but got {task!r}.")


def _check_count(value: int, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise PlanError(f"{what} must be an integer >= 0 but got {value!r}.")


def check_position_range(start: int, stop: int) -> None:
    """A range ``[start, stop)`` of stream positions: integers >= 0, start <= stop (Mixing and StagedMixing)."""
    _check_count(start, "A stream position")
    _check_count(stop, "A stream position")
    if stop < start:
        raise PlanError(f"A position range must have start <= stop but got start={start}, stop={stop}.")


def _build_tree(weights: tuple[int, ...]) -> tuple[list[tuple[int, int, int, int]], int]:
    """The internal nodes (children before parents) and the root id; see the module docstring."""
    k = len(weights)
    nodes: list[tuple[int, int, int, int]] = []
    if k == 1:
        return nodes, 0

    def new_node(left: int, right: int, w_left: int, w: int) -> int:
        nodes.append((w_left, w, left, right))
        return k + len(nodes) - 1

    # Items are (weight, tie-break order, node id, margin); margin = min over the subtree's tasks of
    # 1/w_i - sum of 1/w_A over the ancestors A inside the subtree.
    items = [(w, i, i, Fraction(1, w)) for i, w in enumerate(weights)]
    heapq.heapify(items)
    order = k
    while len(items) > _EXACT_TOP:
        a = heapq.heappop(items)
        b = heapq.heappop(items)
        w = a[0] + b[0]
        heapq.heappush(items, (w, order, new_node(a[2], b[2], a[0], w), min(a[3], b[3]) - Fraction(1, w)))
        order += 1
    top = sorted(items, key=lambda item: item[1])
    full = (1 << len(top)) - 1
    mask_weight = [sum(top[i][0] for i in range(len(top)) if mask >> i & 1) for mask in range(full + 1)]

    @functools.cache
    def best(mask: int) -> tuple[Fraction, int]:
        """(largest margin, left part) over the trees on the items in ``mask``; the root pays no term."""
        if mask & (mask - 1) == 0:
            return top[mask.bit_length() - 1][3], 0
        lowest = mask & -mask
        choice: tuple[Fraction, int] | None = None
        part = (mask - 1) & mask
        while part:
            if part & lowest:  # each unordered split once: the left part holds the lowest item
                margin = min(best(part)[0], best(mask ^ part)[0])
                if choice is None or margin > choice[0]:
                    choice = (margin, part)
            part = (part - 1) & mask
        assert choice is not None
        own_term = Fraction(0) if mask == full else Fraction(1, mask_weight[mask])
        return choice[0] - own_term, choice[1]

    def build(mask: int) -> int:
        if mask & (mask - 1) == 0:
            return top[mask.bit_length() - 1][2]
        part = best(mask)[1]
        left, right = build(part), build(mask ^ part)
        return new_node(left, right, mask_weight[part], mask_weight[mask])

    return nodes, build(full)
