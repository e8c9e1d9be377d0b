"""What a person reads: console lines, WORKDIR/log.txt, summaries, tables.

`setup_console()` (called by `python -m vidjax.main`) routes log lines
through the progress bar (`tqdm.write`), so they never cut through it: vidjax's
INFO lines and every library's warnings, as `HH:MM:SS message`. The same
lines go to `WORKDIR/log.txt` once `attach_log_file(workdir)` is called
(after the workdir is accepted; lines logged before are kept and written
then). Writing to a closed stdout/stderr (`2>&1 | tee log` after tee died) is
harmless: the stream is pointed at /dev/null and the run goes on, so a
SIGINT/SIGTERM still saves its checkpoint.

`ProgressBar` is the training's progress bar; the rest formats what the
train loop reports: the start-up summary, an evaluation as a short table,
the data-bound warning and the closing lines.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
import logging
import os
import re
import sys
import time
from typing import Any

from absl import logging as absl_logging
import jax
import tqdm

import vidjax
from vidjax.base import internals, rundir, whole_files

_MAX_BUFFERED_LINES = 10_000


class _SafeStream:
  """A text stream whose write errors (a reader that went away) are dropped.

  On the first failure the file descriptor is pointed at /dev/null, so that
  later writes, and Python's own flush at exit, succeed silently.
  """

  def __init__(self, stream):
    self._stream = stream

  def write(self, text: str) -> int:
    try:
      return self._stream.write(text)
    except (OSError, ValueError):  # EPIPE; or the stream was closed.
      self._to_devnull()
      return len(text)

  def flush(self) -> None:
    try:
      self._stream.flush()
    except (OSError, ValueError):
      self._to_devnull()

  def _to_devnull(self) -> None:
    try:
      devnull = os.open(os.devnull, os.O_WRONLY)
      os.dup2(devnull, self._stream.fileno())
      os.close(devnull)
    except (OSError, ValueError):
      pass

  def __getattr__(self, name):
    return getattr(self._stream, name)


class _Formatter(logging.Formatter):
  """`HH:MM:SS message`, `HH:MM:SS warning: message`, `error: message`."""

  def format(self, record: logging.LogRecord) -> str:
    message = record.getMessage()
    if record.exc_info:
      message += "\n" + self.formatException(record.exc_info)
    if record.levelno >= logging.ERROR:
      return f"error: {message}"
    warning = "warning: " if record.levelno >= logging.WARNING else ""
    return f"{time.strftime('%H:%M:%S', time.localtime(record.created))} {warning}{message}"


# absl logs every library's lines under one logger: the file that logged
# says whose a line is (any of vidjax's folders).
_PACKAGE_DIR = os.path.dirname(os.path.abspath(vidjax.__file__)) + os.sep


class _OnlyOurInfo(logging.Filter):
  """Keeps vidjax's INFO lines; other libraries' (Orbax, Grain) from WARNING."""

  def filter(self, record: logging.LogRecord) -> bool:
    if os.path.abspath(record.pathname).startswith(_PACKAGE_DIR):
      return True
    return record.levelno >= logging.WARNING and not (
      internals.is_orbax_read_only_warning(record)
    )


class _ConsoleHandler(logging.Handler):
  """Writes through `tqdm.write`, which lifts a progress bar out of the way.

  (`tqdm.contrib.logging.logging_redirect_tqdm` routes lines the same way,
  but only inside a `with` block, swapping the root's console handlers for
  its duration and dropping their level; this handler is installed once
  for the whole process, lines before and after the bar included.)
  """

  def __init__(self, stream):
    super().__init__(logging.INFO)
    self.stream = stream
    self.setFormatter(_Formatter())

  def emit(self, record: logging.LogRecord) -> None:
    try:
      tqdm.tqdm.write(self.format(record), file=self.stream)
    except Exception:
      self.handleError(record)


class _LogFile(logging.Handler):
  """WORKDIR/log.txt: keeps the lines until the file is opened, then appends.

  Whole lines only (`vidjax.base.whole_files`): a torn last line left by an earlier
  run is dropped, saying so. If the file cannot be written (a full disk), one
  warning says so on the console and the file is left as it is.
  """

  def __init__(self):
    super().__init__(logging.INFO)
    self.setFormatter(
      logging.Formatter(
        "%(asctime)s %(levelname)s %(filename)s:%(lineno)d] %(message)s"
      )
    )
    self._file = None
    self._pending: list[str] = []
    self._failed = False  # Could not write the file: lines are dropped.

  @property
  def is_open(self) -> bool:
    return self._file is not None

  def open(self, path: str) -> None:
    if self._file is not None:
      self._file.close()
    self._file, self._failed = whole_files.LineFile(path), False
    pending, self._pending = "".join(self._pending), []
    self._write(pending)
    if self._file is not None and (note := self._file.dropped_note()):
      logging.getLogger(__name__).warning("%s", note)

  def _write(self, text: str) -> None:
    try:
      if text:
        self._file.write(text)
    except OSError as e:
      self._file.close()
      path, self._file, self._failed = self._file.path, None, True
      logging.getLogger(__name__).warning(
        "stopped writing %s: %s", path, e.strerror or e
      )

  def emit(self, record: logging.LogRecord) -> None:
    try:
      line = self.format(record) + "\n"
      if self._file is None:
        if len(self._pending) < _MAX_BUFFERED_LINES and not self._failed:
          self._pending.append(line)
      else:
        self._write(line)
    except Exception:
      self.handleError(record)


_log_file: _LogFile | None = None


def setup_console(verbose: bool = False) -> None:
  """Console through the progress bar, a log file to come, safe std streams.

  Changes the whole process, once (the command line calls it; library use
  and notebooks do not): `sys.stdout` and `sys.stderr` are wrapped in
  streams that survive a closed reader, the root logger's handlers are
  swapped (absl's and `logging.basicConfig`'s removed; the console's and
  the log file's added), and `warnings.warn` is routed through logging.

  Args:
    verbose: keep every library's INFO lines (`--verbosity` given).
  """
  global _log_file
  for name in ("stdout", "stderr"):
    if not isinstance(getattr(sys, name), _SafeStream):
      setattr(sys, name, _SafeStream(getattr(sys, name)))
  root = logging.getLogger()
  root.removeHandler(absl_logging.get_absl_handler())
  for handler in list(root.handlers):  # Made by absl's first log, if any.
    if internals.is_basic_config_handler(handler):
      root.removeHandler(handler)
  console, _log_file = _ConsoleHandler(sys.stderr), _LogFile()
  for handler in (console, _log_file):
    if not verbose:
      handler.addFilter(_OnlyOurInfo())
    root.addHandler(handler)
  logging.captureWarnings(True)  # warnings.warn goes through the bar too.


def attach_log_file(workdir) -> str | None:
  """Appends the console's lines to WORKDIR/log.txt from now on (and before).

  Returns:
    The file's path, or None without `setup_console` (library use).
  """
  if _log_file is None:
    return None
  path = os.fspath(rundir.path(workdir, rundir.LOG_FILE))
  _log_file.open(path)
  return path


# ---------------------------------------------------------------------------
# The progress bar.
# ---------------------------------------------------------------------------
class ProgressBar:
  """tqdm bar over steps (or other `unit`s) with rate and ETA; silent off
  process 0."""

  def __init__(
    self,
    total_steps: int,
    start_step: int = 0,
    *,
    enabled: bool | None = None,
    desc: str = "train",
    unit: str = "step",
  ):
    enabled = jax.process_index() == 0 if enabled is None else enabled
    self._bar = tqdm.tqdm(
      total=total_steps,
      initial=start_step,
      desc=desc,
      unit=unit,
      dynamic_ncols=True,
      disable=not enabled,
      mininterval=1.0,
    )
    self._step = start_step

  def update(self, step: int, metrics: Mapping[str, Any] | None = None):
    """Moves the bar to `step`; shows a few metrics (Python numbers) if given."""
    self._bar.update(step - self._step)
    self._step = step
    if metrics:
      self._bar.set_postfix(
        {
          k.split("/")[-1]: f"{v:.4g}"
          for k, v in metrics.items()
          if isinstance(v, (int, float))
        },
        refresh=False,
      )

  def close(self):
    self._bar.close()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()  # Also on an error: its message is then the last line.


# ---------------------------------------------------------------------------
# Reports.
# ---------------------------------------------------------------------------
def duration(seconds: float) -> str:
  """3725 -> '1h 02m'; 95 -> '1m 35s'; 4.2 -> '4s'."""
  seconds = int(round(seconds))
  if seconds >= 3600:
    return f"{seconds // 3600}h {seconds % 3600 // 60:02d}m"
  if seconds >= 60:
    return f"{seconds // 60}m {seconds % 60:02d}s"
  return f"{seconds}s"


def _number(value) -> str:
  if isinstance(value, float):
    return f"{value:.4f}" if abs(value) < 1e3 else f"{value:.4g}"
  return str(value)


def _eval_order(name: str) -> tuple:
  # The task's metrics first; the chance levels and the skip count last.
  return (name.startswith("chance"), name == "skipped", natural_key(name))


def eval_table(
  step: int, metrics: Mapping[str, float], columns: int = 3
) -> str:
  """An evaluation as a short table, `eval/` dropped, names in natural order.

  eval at step 300:
    t2v_r1    0.1875 | t2v_r5    0.5208 | t2v_r10   0.7292
    ...
  """
  items = sorted(
    (
      (k.removeprefix("eval/"), _number(v))
      for k, v in metrics.items()
      if v is not None
    ),
    key=lambda kv: _eval_order(kv[0]),
  )
  if not items:
    return f"eval at step {step}: no metrics"
  width = max(len(k) for k, _ in items)
  value_width = max(len(v) for _, v in items)
  cells = [f"{k:<{width}} {v:>{value_width}}" for k, v in items]
  rows = [
    " | ".join(cells[i : i + columns]) for i in range(0, len(cells), columns)
  ]
  return f"eval at step {step}:\n  " + "\n  ".join(rows)


def natural_key(name: str) -> list:
  """Sort key that orders t2v_r5 before t2v_r10."""
  return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def run_summary(
  *,
  devices: Sequence,
  batch_size: int,
  accum_steps: int,
  num_params: int,
  clips: Mapping[str, int],
  total_steps: int,
  first_step: int,
  start: str,
  repeats: int = 1,
) -> str:
  """The start-up summary: devices, batch, parameters, data, steps.

  Args:
    devices: `jax.devices()`.
    batch_size: the global batch.
    accum_steps: gradient accumulation steps per batch.
    num_params: trained parameters.
    clips: clips per split, e.g. {'train': 120, 'eval': 40}.
    total_steps: the step to train to.
    first_step: the step the run starts at (resumed runs: > 0).
    start: where the parameters come from, e.g. 'from scratch'.
    repeats: views per decoded clip (`data.repeats`): the batch and the
      epochs count views.
  """
  kinds = sorted({d.device_kind for d in devices})
  per_device = batch_size // max(len(devices) * accum_steps, 1)
  accum = f" x {accum_steps} accumulation steps" if accum_steps > 1 else ""
  views = (
    f" views ({batch_size // repeats} clips decoded x {repeats} views each)"
    if repeats > 1
    else ""
  )
  lines = [
    f"{len(devices)} device{'s' if len(devices) > 1 else ''} "
    f"({', '.join(kinds)}); batch {batch_size}{views} = "
    f"{per_device} per device{accum}; {num_params / 1e6:.2f}M parameters, "
    f"{start}"
  ]
  if clips:
    data = ", ".join(f"{n} {split} clips" for split, n in clips.items())
    train = clips.get("train")
    # Epochs count views (`config.epochs_to_steps`).
    epoch = (
      f"; {train // batch_size} steps per epoch"
      + (f" (of {train} views)" if repeats > 1 else "")
      + f", {total_steps} steps = "
      f"{total_steps * batch_size / train:.1f} epochs"
      if train and train >= batch_size
      else ""
    )
    lines.append(f"data: {data}{epoch}")
  left = total_steps - first_step
  lines.append(
    f"steps {first_step} -> {total_steps}: time estimated after the first steps"
    if left > 0
    else f"step {first_step}: training is done"
  )
  return "\n  ".join(lines)


def time_estimate(step: int, total_steps: int, seconds_per_step: float) -> str:
  """'about 1h 02m to step 10000 (0.37 s/step)'."""
  return (
    f"about {duration((total_steps - step) * seconds_per_step)} to step "
    f"{total_steps} ({seconds_per_step:.3g} s/step)"
  )


FEWEST_FRAMES = 4  # AVION's pretraining clips: one frame per segment.


def data_bound_warning(wait_fraction: float, data) -> str:
  """The data-bound warning, with the knobs that feed the devices faster.

  Args:
    wait_fraction: share of the step time spent waiting for batches.
    data: `config.data`.
  """
  # Fewer frames only where there are more than AVION's fewest (4).
  frames = (
    f"fewer frames (--config.data.num_frames, now {data.num_frames}); "
    if data.num_frames > FEWEST_FRAMES
    else ""
  )
  return (
    f"the run is data-bound: {wait_fraction:.0%} of the time is spent "
    "waiting for batches. To feed it faster: more reader processes "
    f"(--config.data.workers, now {data.workers}) or threads "
    f"(--config.data.threads, now {data.threads}); less to decode per clip "
    f"({frames}re-chunk with --short-side close to data.size and a shorter "
    "--gop). `python -m benchmarks.pipeline`, in a checkout of vidjax, "
    "measures the settings."
  )


def end_message(
  workdir,
  step: int,
  total_steps: int,
  plots: Sequence,
  checkpoints: Sequence[int],
  *,
  stopped: bool = False,
) -> str:
  """Where a run's results are (`stopped`: by a signal, also at the end)."""
  workdir = os.fspath(workdir)
  finished = step >= total_steps and not stopped
  done = ("finished" if finished else "stopped") + f" at step {step}"
  lines = [
    f"{done}. Results in {workdir}:",
    "metrics      metrics.jsonl (`python -m vidjax.plot WORKDIR` "
    "redraws the plots)",
  ]
  if plots:
    lines.append(
      "plots        plots/ ("
      + ", ".join(os.path.basename(os.fspath(p)) for p in plots)
      + ")"
    )
  if checkpoints:
    lines.append(
      f"checkpoints  checkpoints/{max(checkpoints)} (steps kept: "
      f"{', '.join(map(str, sorted(checkpoints)))})"
    )
  if _log_file is not None and _log_file.is_open:
    lines.append(f"log          {rundir.LOG_FILE}")
  return "\n  ".join(lines)
