"""A checkpoint save that failed, in a few words instead of many tracebacks.

When a save fails (a full disk, no permission), Orbax logs the error with
its traceback from each thread that met it, and TensorStore's writes still
in flight call back into the event loop Orbax has closed (each printing an
unraisable "Event loop is closed"). `vidjax.checkpoint.Checkpointer` raises
the failure itself, naming its `cause`; while a checkpointer is open,
`quiet()` keeps the rest off the console.
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


def cause(error: BaseException) -> str:
  """What made a save fail, in a few words ("No space left on device")."""
  if isinstance(error, OSError) and error.strerror:
    return error.strerror
  text = str(error)
  code = re.search(r"os_error_code='?(\d+)", text)  # TensorStore's errors
  if code:
    return os.strerror(int(code.group(1)))
  first = text.splitlines()[0][:300] if text else ""
  return f"{type(error).__name__}: {first}"


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
