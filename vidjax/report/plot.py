"""Training curves from a run's metrics.jsonl, as PNG files.

    python -m vidjax.plot WORKDIR      # -> WORKDIR/plots/*.png

Reads `WORKDIR/metrics.jsonl` (see `vidjax.report.monitor.MetricWriter`). A resumed
run appends the steps after its last checkpoint again, so for every
(step, metric) the last line wins. Writes, for the metrics the run has:

  loss.png        train/loss (and a moving average on long runs)
  lr.png          train/lr
  eval.png        one panel per eval/* metric (eval/chance_* drawn as a
                  dashed line on the panels of the same cut-off); recall,
                  accuracy, mAP and nDCG on a 0-1 axis
  throughput.png  perf/clips_per_s (with a moving average), and
                  perf/data_wait_frac when logged

Figures are drawn with matplotlib's object API on the Agg canvas, so nothing
needs a display and importing this module leaves pyplot's backend alone
(notebooks keep their inline plots).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
import math
import os
from pathlib import Path
import re
import sys
from typing import TYPE_CHECKING

import numpy as np

from vidjax.base import errors, rundir
from vidjax.report import console, monitor

if TYPE_CHECKING:
  from matplotlib.figure import Figure

# Noisy curves (loss, throughput) with at least this many points also get
# a trailing mean.
SMOOTH_MIN_POINTS = 20
# Metrics that are fractions by definition (recall@K, top-K accuracy, mAP,
# nDCG, *_frac): drawn on a 0-1 axis, so that noise does not look like swings.
FRACTION_METRIC = re.compile(r"((^|_)(r|top)\d+|(^|_)(mAP|nDCG))(_|$)|_frac$")

Series = tuple[np.ndarray, np.ndarray]  # (int64[N] steps, float64[N] values)


def load_metrics(workdir: str | os.PathLike) -> dict[str, Series]:
  """Every numeric metric of a run as (steps, values), sorted by step.

  Args:
    workdir: the run directory holding metrics.jsonl.

  Returns:
    {name: (int64[N] steps, float64[N] values)}; for a step logged twice
    (a resumed run) the later line's value is kept. Non-finite values
    (logged as null), strings and unreadable lines (a torn last line of a
    killed run) are left out.

  Raises:
    FileNotFoundError: no metrics.jsonl in `workdir`.
  """
  latest: dict[str, dict[int, float]] = {}
  for row in monitor.read_metrics(workdir):
    for name, value in row.items():
      if (
        name == "step"
        or isinstance(value, bool)
        or not isinstance(value, (int, float))
      ):
        continue
      latest.setdefault(name, {})[int(row["step"])] = float(value)
  out = {}
  for name, by_step in latest.items():
    steps = np.array(sorted(by_step), dtype=np.int64)
    values = np.array([by_step[s] for s in steps], dtype=np.float64)
    keep = np.isfinite(values)
    if keep.any():
      out[name] = (steps[keep], values[keep])
  return out


def moving_average(values: np.ndarray, window: int) -> np.ndarray:
  """Trailing mean over up to `window` points: float64[N] -> float64[N]."""
  cumsum = np.cumsum(np.concatenate([[0.0], values]))
  ends = np.arange(1, len(values) + 1)
  starts = np.maximum(ends - window, 0)
  return (cumsum[ends] - cumsum[starts]) / (ends - starts)


def _new_figure(panels: int = 1):
  cols = min(panels, 3)
  rows = math.ceil(panels / cols)
  width, height = 4.5 * cols, 3.2 * rows
  # matplotlib (the `[plots]` extra) is imported when a figure is drawn:
  # `--help` and the module's import need none.
  from matplotlib.figure import Figure

  fig = Figure(figsize=(width, height))
  # Fixed margins, in inches (room for 7-character tick labels and a title),
  # rather than a layout engine, which measures every label at each save.
  fig.subplots_adjust(
    left=0.85 / width,
    right=1 - 0.2 / width,
    bottom=0.55 / height,
    top=1 - 0.35 / height,
    wspace=0.35,
    hspace=0.55,
  )
  axes = fig.subplots(rows, cols, squeeze=False).ravel()
  for ax in axes[panels:]:
    ax.set_visible(False)
  return fig, axes[:panels]


def _curve(ax, series: Series, name: str, *, smooth: bool = False):
  """Draws one metric; `smooth` adds a trailing mean to long noisy curves."""
  steps, values = series
  smooth = smooth and len(steps) >= SMOOTH_MIN_POINTS
  few = len(steps) < SMOOTH_MIN_POINTS
  ax.plot(
    steps,
    values,
    marker="o" if few else None,
    markersize=3,
    lw=1,
    alpha=0.4 if smooth else 1.0,
    label=name,
  )
  if smooth:
    window = max(len(steps) // 20, 5)
    ax.plot(
      steps,
      moving_average(values, window),
      lw=1.8,
      label=f"mean of {window} points",
    )
    ax.legend(fontsize="small")
  ax.ticklabel_format(axis="y", useOffset=False)  # no "1e-13+0.1" axes
  from matplotlib.ticker import MaxNLocator

  ax.xaxis.set_major_locator(MaxNLocator(integer=True))
  if FRACTION_METRIC.search(name.split("/")[-1]):
    ax.set_ylim(0, 1.02)  # Room for the markers of a perfect score.
  ax.set_title(name)
  ax.set_xlabel("step")
  ax.grid(alpha=0.3)


def _save(fig, path: Path) -> Path:
  fig.savefig(path, dpi=110)
  return path


def eval_figure(metrics: dict[str, Series]) -> Figure | None:
  """One panel per eval/* metric, with its chance level; None without any."""
  chance = {
    n[len("eval/chance_") :]: s
    for n, s in metrics.items()
    if n.startswith("eval/chance_")
  }
  names = sorted(
    (
      n
      for n in metrics
      if n.startswith("eval/")
      and not n.startswith("eval/chance_")
      and n != "eval/skipped"
    ),
    key=console.natural_key,
  )
  if not names:
    return None
  fig, axes = _new_figure(len(names))
  for ax, name in zip(axes, names):
    _curve(ax, metrics[name], name)
    # Its own (eval/chance_verb_top1), else its cutoff's (eval/t2v_r1 -> r1).
    own = name.removeprefix("eval/")
    level = chance.get(own, chance.get(own.rsplit("_", 1)[-1]))
    if level is not None:
      # A wide tick marker keeps a single evaluation's chance level visible.
      ax.plot(
        *level, "--", marker="_", markersize=14, color="grey", label="chance"
      )
      ax.legend(fontsize="small")
  return fig


def plot_run(workdir: str | os.PathLike) -> list[Path]:
  """Writes the run's training curves to WORKDIR/plots/.

  Args:
    workdir: a run directory with metrics.jsonl.

  Returns:
    Paths of the PNG files written (figures whose metrics the run never
    logged are skipped).

  Raises:
    ModuleNotFoundError: no matplotlib (the `[plots]` extra); nothing written.
  """
  import matplotlib  # noqa: F401  (missing: said before anything is written)

  metrics = load_metrics(workdir)
  out = rundir.path(workdir, rundir.PLOTS)
  out.mkdir(parents=True, exist_ok=True)
  written = []
  for name, file, smooth in (
    ("train/loss", "loss.png", True),
    ("train/lr", "lr.png", False),
  ):
    if name in metrics:
      fig, (ax,) = _new_figure()
      _curve(ax, metrics[name], name, smooth=smooth)
      written.append(_save(fig, out / file))
  fig = eval_figure(metrics)
  if fig:
    written.append(_save(fig, out / "eval.png"))
  perf = [
    n for n in ("perf/clips_per_s", "perf/data_wait_frac") if n in metrics
  ]
  if perf:
    fig, axes = _new_figure(len(perf))
    for ax, name in zip(axes, perf):
      _curve(ax, metrics[name], name, smooth=True)
    written.append(_save(fig, out / "throughput.png"))
  return written


def main(argv: Sequence[str] | None = None) -> int:
  """The command line; exit status 0 drawn, 2 refused (no matplotlib, a
  directory without metrics.jsonl), 74 the plots could not be written."""
  parser = argparse.ArgumentParser(
    prog="python -m vidjax.plot",
    description="Training curves of a run: WORKDIR/metrics.jsonl -> "
    "WORKDIR/plots/*.png (needs matplotlib: pip install 'vidjax[plots]')",
  )
  parser.add_argument("workdir", nargs="+", help="run directory (or several)")
  args = parser.parse_args(argv)
  try:
    import matplotlib  # noqa: F401  (said before any run is read)
  except ModuleNotFoundError:
    return _refuse(
      errors.ConfigError(
        "matplotlib is not installed", "pip install 'vidjax[plots]'"
      )
    )
  for workdir in args.workdir:
    if not rundir.path(workdir, rundir.METRICS_FILE).is_file():
      return _refuse(
        errors.PathError(
          f"{workdir} has no {rundir.METRICS_FILE}",
          "give a run directory (the --workdir of python -m vidjax.main)",
        )
      )
    try:
      for path in plot_run(workdir):
        print(path)
    except OSError as e:
      return _refuse(
        errors.WriteError(
          f"the plots of {workdir} could not be written: {e.strerror or e}",
          "free space or make WORKDIR/plots writable",
        )
      )
  return 0


def _refuse(e: errors.UserError) -> int:
  print(f"python -m vidjax.plot: error: {e.describe()}", file=sys.stderr)
  return e.exit_code
