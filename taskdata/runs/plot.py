"""A run in one picture: mixture proportions, per-task epochs and batch size over steps, and token lengths.

Every curve is exact index math sampled at a few hundred steps (and at every stage start): the share of
each task among the examples between two samples (``Mixing.counts``), each task's epochs so far (its
examples taken over its records), and the global batch size. Stage starts are marked on every panel.
The histograms are the cache's own ``length_histograms`` from ``stats.{split}.json``. Needs matplotlib
(``pip install 'taskdata[plot]'``); the figure is drawn off-screen and written as PNG (local or gs://).
"""

from __future__ import annotations

import io
import itertools
from collections.abc import Mapping

from taskdata import fs
from taskdata.index import PlanError, RunPlan
from taskdata.runs.ledger import TaskCacheView

__all__ = ["default_until_step", "plot_run"]

_POINTS = 400
_MAX_HISTOGRAMS = 8


def default_until_step(plan: RunPlan) -> int:
    """Far enough to show every stage: a quarter past the last stage start (10,000 steps without stages)."""
    if not plan.stages:
        return 10_000
    last = plan.stages[-1].start
    return last + max(100, last // 4)


def _steps(plan: RunPlan, until_step: int) -> list[int]:
    grid = {round(i * until_step / _POINTS) for i in range(_POINTS + 1)}
    grid |= {stage.start for stage in plan.stages if stage.start <= until_step}
    return sorted(grid)


def plot_run(
    plan: RunPlan, views: Mapping[str, TaskCacheView], out: str, *, until_step: int | None = None
) -> dict[str, object]:
    """Draws ``plan`` over steps ``0 .. until_step`` and writes the PNG to ``out``; returns what was drawn."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ModuleNotFoundError:
        raise ModuleNotFoundError("taskdata plot needs matplotlib: pip install 'taskdata[plot]'.") from None
    until = default_until_step(plan) if until_step is None else until_step
    if isinstance(until, bool) or not isinstance(until, int) or until < 1:
        raise PlanError(f"until_step must be an integer >= 1 but got {until_step!r}.")
    steps = _steps(plan, until)
    names = plan.task_names
    counts = [plan.mixing.counts(plan.first_position(s)) for s in steps]
    records = [layout.num_records for layout in plan.layouts]
    shares: list[list[float]] = [[] for _ in names]
    for before, after in itertools.pairwise(counts):
        total = sum(after) - sum(before)
        for t in range(len(names)):
            shares[t].append((after[t] - before[t]) / total)
    epochs = [[c[t] / records[t] for c in counts] for t in range(len(names))]
    sizes = [plan.batch_size(s) for s in steps[:-1]]
    boundaries = [stage.start for stage in plan.stages if stage.start <= until]

    histogram_tasks = [name for name in names if views[name].stats().get("length_histograms")][:_MAX_HISTOGRAMS]
    columns = max(1, min(4, len(histogram_tasks)))
    rows = (len(histogram_tasks) + columns - 1) // columns
    figure = Figure(figsize=(13, 9 + 2.6 * rows), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    grid = figure.add_gridspec(3 + rows, columns, height_ratios=[3, 2, 1.2] + [2] * rows)
    colors = _palette(len(names))

    mix = figure.add_subplot(grid[0, :])
    mix.stackplot(steps[:-1], shares, labels=names, colors=colors, step="post", alpha=0.9)
    mix.set_ylim(0, 1)
    mix.set_xlim(0, until)
    mix.set_ylabel("share of examples")
    mix.set_title(
        f"run {plan.name}: mixture proportions over steps 0..{until:,} (fingerprint {plan.fingerprint()[:12]})",
        loc="left",
    )
    mix.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=9, frameon=False)

    epoch_axes = figure.add_subplot(grid[1, :], sharex=mix)
    for t, name in enumerate(names):
        epoch_axes.plot(steps, epochs[t], color=colors[t], label=name, linewidth=2)
    epoch_axes.set_ylabel("epochs (per task)")
    finals = [series[-1] for series in epochs if series[-1] > 0]
    if finals and max(finals) > 20 * max(min(finals), 1):
        # Tasks of very different sizes: on a log scale above one epoch, each one's line stays readable.
        epoch_axes.set_yscale("symlog", linthresh=1)
    epoch_axes.set_ylim(bottom=0)

    batch = figure.add_subplot(grid[2, :], sharex=mix)
    batch.step(steps[:-1], sizes, where="post", color="0.25", linewidth=2)
    batch.set_ylabel("global batch")
    batch.set_xlabel("step")
    batch.set_ylim(bottom=0)

    skips = [(r.start, min(r.stop, until)) for r in plan.skip if r.start < until]
    for axes in (mix, epoch_axes, batch):
        axes.grid(alpha=0.3)
        for start, stop in skips:
            axes.axvspan(start, stop, color="0.5", alpha=0.35, linewidth=0)
        for k, start in enumerate(boundaries):
            axes.axvline(start, color="black", linestyle="--", linewidth=1.2)
            if axes is mix:
                stage = plan.stages[k]
                what = "+".join(w for w, v in (("rates", stage.rates), ("batch", stage.schedule)) if v is not None)
                axes.annotate(
                    f"stage {k + 1}: {what}", (start, 1.0), xytext=(3, -12), textcoords="offset points", fontsize=9
                )
    if skips:
        mix.annotate("grey: skipped steps", (0, 0), xytext=(3, 3), textcoords="offset points", fontsize=8)

    for i, name in enumerate(histogram_tasks):
        axes = figure.add_subplot(grid[3 + i // columns, i % columns])
        for feature, pairs in sorted(views[name].stats()["length_histograms"].items()):
            lengths = [length for length, _ in pairs]
            weights = [count for _, count in pairs]
            axes.hist(lengths, bins=min(40, max(1, len(set(lengths)))), weights=weights, histtype="step",
                      linewidth=1.8, label=feature)
        axes.set_title(f"{name}: token lengths", fontsize=10, loc="left")
        axes.set_xlabel("tokens")
        axes.legend(fontsize=8, frameon=False)

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    fs.write_atomic(out, buffer.getvalue())
    return {"until_step": until, "points": len(steps), "stages": len(boundaries), "histograms": histogram_tasks}


def _palette(count: int) -> list[tuple[float, float, float, float]]:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if count <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(count)]
