"""A checkpoint save that failed, in a few words instead of many tracebacks.

When a save fails (a full disk, no permission), Orbax logs the error with
its traceback from each thread that met it, and TensorStore's writes still
in flight call back into the event loop Orbax has closed (each printing an
unraisable "Event loop is closed"). `vidjax.checkpoint.Checkpointer` raises
the failure itself, naming its `cause` (a save the system refused: a full
disk, no permission; any other failure is a bug and keeps its traceback);
while a checkpointer is open, `quiet()` keeps the rest off the console.
"""
from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import threading

_ABSL_LOGGER = logging.getLogger("absl")  # Where Orbax logs.
_ORBAX_DIR = os.sep + "orbax" + os.sep


def cause(error: BaseException) -> str | None:
  """The system's reason a save failed ("No space left on device"), or None
  if it was not refused by the system (then it is a bug)."""
  if isinstance(error, OSError) and error.strerror:
    return error.strerror
  code = re.search(r"os_error_code='?(\d+)", str(error))  # TensorStore's
  return os.strerror(int(code.group(1))) if code else None


class _Quiet(logging.Filter):
  """Drops Orbax's error lines and the unraisable 'Event loop is closed'."""

  def __init__(self):
    super().__init__()
    self._lock = threading.Lock()
    self._users = 0
    self._previous_hook = None

  def filter(self, record: logging.LogRecord) -> bool:
    return not (record.levelno >= logging.ERROR and
                _ORBAX_DIR in record.pathname)

  def _unraisable(self, unraisable):
    if not (unraisable.object is None and
            isinstance(unraisable.exc_value, RuntimeError) and
            str(unraisable.exc_value) == "Event loop is closed"):
      self._previous_hook(unraisable)

  def enter(self):
    with self._lock:
      self._users += 1
      if self._users == 1:
        _ABSL_LOGGER.addFilter(self)
        self._previous_hook, sys.unraisablehook = (sys.unraisablehook,
                                                   self._unraisable)

  def exit(self):
    with self._lock:
      self._users -= 1
      if self._users == 0:
        _ABSL_LOGGER.removeFilter(self)
        if sys.unraisablehook == self._unraisable:
          sys.unraisablehook = self._previous_hook


_QUIET = _Quiet()


@contextlib.contextmanager
def quiet():
  """Keeps a failed save's side noise off the console (nestable)."""
  _QUIET.enter()
  try:
    yield
  finally:
    _QUIET.exit()
