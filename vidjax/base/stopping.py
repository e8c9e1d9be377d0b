"""How a run stops on SIGTERM or Ctrl-C (SIGINT), losing nothing.

A signal never raises where it lands: JAX may swallow an exception raised
in one of its callbacks (the signal is then lost), and one that interrupts a
compilation can crash the process at exit. A signal sets a flag instead,
and the run stops at its next stop point, so that the same command
continues:

* Start-up (`check()`, between the phases of `python -m vidjax.main`,
  `train.setup` and before the first step; also `--mode eval` before its
  evaluation): the phase under way finishes, then `errors.Stopped` (exit
  75); nothing half-written.
* Training (after `defer`): the step under way finishes and the loop
  (`should_stop`) saves its checkpoint, then `errors.Preempted` (exit 75).
  An evaluation under way finishes first; during the final evaluation and
  the final save the run finishes them and ends as finished (exit 0). But
  an evaluation whose data does not come for `data.stall_warn_s` after the
  signal (stuck reads, stopped workers) is given up (`EvaluationStopped`):
  training saves its step and exits 75, `--mode eval` exits 75 having
  written nothing (one process: with several, the others wait in the
  evaluation's collectives for this one's batch).
* Ctrl-C after an earlier signal stops the process at once (exit 130): the
  `on_abort` hooks run (the workdir lock is released), a message names the
  newest checkpoint, and a save in flight is abandoned (its temporary
  directory is removed at the next start).

With several processes (`jax.distributed`), JAX takes SIGTERM itself as
a preemption notice and tells every process: the loop stops at the step
JAX's preemption sync agrees on, the same on every process (during start-up
too, a SIGTERM is acted on there, at one of the first steps). A repeated SIGTERM
is only logged. `python -m vidjax.main` takes the
signals first thing, so this module is light to import; training and
evaluation set what a stop means in their part (`handling`, nested). Called
from Python (a notebook), training handles the signals the same way: the
kernel's interrupt stops the run cleanly; pressed again, it ends the kernel.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
import contextlib
import os
import signal
import sys
import threading

from absl import logging

from vidjax.base import errors

SIGNALS = (signal.SIGTERM, signal.SIGINT)
_abort_hooks: list[Callable[[], None]] = []


class EvaluationStopped(errors.Stopped):
  """An evaluation given up after a signal: its data stopped coming."""

  def __init__(self, annotations: str, waited_s: float, signal_name: str):
    super().__init__(
      f"the evaluation of {annotations} was given up: {signal_name} came "
      "while it "
      f"waited for data, and no batch came for {waited_s:g} s "
      "(data.stall_warn_s; what it waited on is in the warnings above)"
    )


class Signals:
  """The process's SIGTERM/SIGINT handler and what a stop means now.

  Attributes:
    at_start: completes "stopped by SIGTERM ..." in the `errors.Stopped` of
      `check()`; None once deferred.
    then: what the run does after a signal, logged with it.
    abort_note: says what Ctrl-C pressed again leaves (e.g. the newest
      checkpoint).
  """

  def __init__(
    self,
    at_start: str | None,
    then: str = "",
    abort_note: Callable[[], str] = lambda: "",
    sync_every: int = 10,
  ):
    self.at_start, self.then, self.abort_note = at_start, then, abort_note
    self.sync_every = sync_every
    self._signal: str | None = None
    self._event = threading.Event()
    self._previous = {}

  def _handle(self, signum, frame):
    del frame
    name = signal.Signals(signum).name
    if self._event.is_set():
      if signum == signal.SIGINT:
        self._abort()
      logging.warning("received %s again: still stopping", name)
      return
    self._signal = name
    self._event.set()
    doing = (
      "stopping once the start-up phase under way is done"
      if self.at_start is not None
      else self.then
    )
    again = " (Ctrl-C again: stop at once)" if signum == signal.SIGINT else ""
    logging.warning("received %s: %s%s", name, doing, again)

  def _abort(self) -> None:
    """Ctrl-C pressed again: exits now, without waiting for anything."""
    for hook in list(_abort_hooks):
      with contextlib.suppress(Exception):
        hook()
    note = ""
    with contextlib.suppress(Exception):
      note = self.abort_note()
    logging.error(
      "stopped at once by Ctrl-C (pressed again)%s", f"; {note}" if note else ""
    )
    for stream in (sys.stdout, sys.stderr):
      with contextlib.suppress(Exception):
        stream.flush()
    os._exit(errors.EXIT_INTERRUPTED)

  @property
  def requested(self) -> bool:
    """True once a signal arrived in this process."""
    return self._event.is_set()

  @property
  def signal_name(self) -> str:
    """The signal that came ('SIGTERM'), or '' before one."""
    return self._signal or ""

  def _agreed(self) -> bool:
    """Whether a signal arrived on any process (a collective with several)."""
    import jax

    if jax.process_count() == 1:
      return self.requested
    from jax.experimental import multihost_utils
    import numpy as np

    return bool(
      np.any(multihost_utils.process_allgather(np.int32(self.requested)))
    )

  def check(self) -> None:
    """A start-up stop point: raises `errors.Stopped` if a signal came.

    With several processes a collective: every process calls it at the
    same points, and all stop if one got a signal.
    """
    if self.at_start is not None and self._agreed():
      by = self._signal or "a signal to another process"
      raise errors.Stopped(f"stopped by {by} {self.at_start}")

  def defer(self, then: str) -> None:
    """Ends start-up: from now on the loop polls `should_stop`; `then` says
    what happens after a signal (logged with it)."""
    self.at_start, self.then = None, then

  def should_stop(self, step: int) -> bool:
    """Whether to save and stop now; the same answer on every process.

    With several processes, call it at every step on every process: a
    SIGTERM is JAX's preemption notice there (`jax.distributed` takes the
    signal itself and tells every process), and every process stops at the
    step JAX's preemption sync names, as Orbax's `reached_preemption`; a
    Ctrl-C (this handler's) is agreed every `sync_every` steps.
    """
    import jax

    if jax.process_count() == 1:
      return self.requested
    from jax.experimental import multihost_utils

    try:
      preempted = multihost_utils.reached_preemption_sync_point(step)
    except RuntimeError:  # jax_enable_preemption_service=False: no notice.
      preempted = False
    if preempted:
      if not self._event.is_set():
        self._signal = "SIGTERM (JAX's preemption notice)"
        self._event.set()
      logging.warning(
        "%s: every process saves a checkpoint of step %d and stops",
        self._signal,
        step,
      )
      return True
    return step % self.sync_every == 0 and self._agreed()

  def install(self) -> Signals:
    for s in SIGNALS:
      self._previous[s] = signal.signal(s, self._handle)
    return self

  def uninstall(self) -> None:
    for s, previous in self._previous.items():
      signal.signal(s, previous)
    self._previous = {}


_active: Signals | None = None


@contextlib.contextmanager
def handling(
  at_start: str | None,
  *,
  then: str = "",
  abort_note: Callable[[], str] = lambda: "",
) -> Iterator[Signals]:
  """Handles SIGTERM/SIGINT within the context (from the main thread).

  Nested in another `handling`, the same handler goes on (a signal that
  came before still counts) with these settings, and the outer ones come
  back at the end; the outermost puts the previous handlers back.

  Args:
    at_start: completes "stopped by SIGTERM ..." (see `Signals`); None:
      deferred from the start.
    then: see `Signals.defer`.
    abort_note: see `Signals`.
  """
  global _active
  if _active is not None:
    saved = (_active.at_start, _active.then, _active.abort_note)
    _active.at_start, _active.then, _active.abort_note = (
      at_start,
      then,
      abort_note,
    )
    try:
      yield _active
    finally:
      _active.at_start, _active.then, _active.abort_note = saved
    return
  _active = Signals(at_start, then, abort_note).install()
  try:
    yield _active
  finally:
    _active.uninstall()
    _active = None


def check() -> None:
  """`Signals.check` of the active handler, if any."""
  if _active is not None:
    _active.check()


def requested() -> bool:
  """Whether a SIGTERM/Ctrl-C came (within `handling`): for a wait that
  should give up instead of blocking the stop."""
  return _active is not None and _active.requested


def signal_name() -> str:
  """The signal that came (within `handling`), or ''."""
  return _active.signal_name if _active is not None else ""


@contextlib.contextmanager
def on_abort(hook: Callable[[], None]) -> Iterator[None]:
  """Runs `hook` if Ctrl-C pressed again stops the process within the
  context (e.g. releasing a lock)."""
  _abort_hooks.append(hook)
  try:
    yield
  finally:
    _abort_hooks.remove(hook)
