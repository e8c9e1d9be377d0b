"""A checkpoint save that failed, in a few words instead of many tracebacks.

When a save fails (a full disk, no permission), Orbax logs the error with
its traceback from each thread that met it; TensorStore's writes still in
flight call back into the event loop Orbax has closed (each printing an
unraisable "Event loop is closed"); and asyncio logs every write task whose
error nobody retrieved, when it is collected (often at exit).
`vidjax.checkpoint.Checkpointer` raises the failure itself, naming its
`cause` (a save the system refused: a full disk, no permission; any other
failure is a bug and keeps its traceback). `quiet()` keeps the rest off the
console while a checkpointer is open, and `stay_quiet()` for good once a
save has failed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import threading
import traceback

# Orbax logs through absl's logger; asyncio's reports its orphaned tasks.
_LOGGERS = ("absl", "asyncio")
_ORBAX_DIR = os.sep + "orbax" + os.sep


def cause(error: BaseException) -> str | None:
  """The system's reason a save failed ("No space left on device"), or None
  if it was not refused by the system (then it is a bug)."""
  if isinstance(error, OSError) and error.strerror:
    return error.strerror
  code = re.search(r"os_error_code='?(\d+)", str(error))  # TensorStore's
  return os.strerror(int(code.group(1))) if code else None


def _from_orbax(record: logging.LogRecord) -> bool:
  """Logged by Orbax, or about an error raised in Orbax's code."""
  if _ORBAX_DIR in record.pathname:
    return True
  tb = record.exc_info[2] if record.exc_info else None
  return tb is not None and any(
    _ORBAX_DIR in frame.filename for frame in traceback.extract_tb(tb)
  )


class _Quiet(logging.Filter):
  """Drops error lines from Orbax and the unraisable 'Event loop is closed'."""

  def __init__(self):
    super().__init__()
    self._lock = threading.Lock()
    self._users = 0
    self._previous_hook = None
    self._for_good = False

  def filter(self, record: logging.LogRecord) -> bool:
    return not (record.levelno >= logging.ERROR and _from_orbax(record))

  def _unraisable(self, unraisable):
    if not (
      unraisable.object is None
      and isinstance(unraisable.exc_value, RuntimeError)
      and str(unraisable.exc_value) == "Event loop is closed"
    ):
      self._previous_hook(unraisable)

  def enter(self):
    with self._lock:
      self._users += 1
      if self._users == 1:
        for name in _LOGGERS:
          logging.getLogger(name).addFilter(self)
        self._previous_hook, sys.unraisablehook = (
          sys.unraisablehook,
          self._unraisable,
        )

  def exit(self):
    with self._lock:
      self._users -= 1
      if self._users == 0:
        for name in _LOGGERS:
          logging.getLogger(name).removeFilter(self)
        if sys.unraisablehook == self._unraisable:
          sys.unraisablehook = self._previous_hook

  def for_good(self):
    with self._lock:
      if self._for_good:
        return
      self._for_good = True
    self.enter()  # Never left.


_QUIET = _Quiet()


@contextlib.contextmanager
def quiet():
  """Keeps a failed save's side noise off the console (nestable)."""
  _QUIET.enter()
  try:
    yield
  finally:
    _QUIET.exit()


def stay_quiet():
  """After a failed save: its noise keeps coming (tasks collected late, at
  exit), so it is kept off the console for the rest of the process."""
  _QUIET.for_good()
