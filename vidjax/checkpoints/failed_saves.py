"""A checkpoint save that failed, in a few words instead of many tracebacks.

When a save fails (a full disk, no permission), Orbax logs the error with
its traceback from each thread that met it; TensorStore's writes still in
flight call back into the event loop Orbax has closed (each printing an
unraisable "Event loop is closed"); and asyncio logs every write task whose
error nobody retrieved, when it is collected (often at exit).
`vidjax.checkpoints.checkpoint.Checkpointer` raises the failure itself, naming its
`cause` (a save the system refused: a full disk, no permission; any other
failure is a bug and keeps its traceback). `install_quiet()` (called by
`vidjax.main`) keeps the rest off the console.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import traceback

from vidjax.base import internals

# Orbax logs through absl's logger; asyncio's reports its orphaned tasks.
_LOGGERS = ("absl", "asyncio")
_ORBAX_DIR = os.sep + "orbax" + os.sep


def cause(error: BaseException) -> str | None:
  """The system's reason a save failed ("No space left on device"), or None
  if it was not refused by the system (then it is a bug)."""
  if isinstance(error, OSError) and error.strerror:
    return error.strerror
  code = internals.os_error_code(error)  # TensorStore's
  return os.strerror(code) if code is not None else None


def _from_failed_save(record: logging.LogRecord) -> bool:
  """Logged by Orbax, about an error raised in Orbax's code, or about a
  write the system refused (asyncio's "Future exception was never
  retrieved" for a TensorStore write: no Orbax frame in its traceback)."""
  if _ORBAX_DIR in record.pathname:
    return True
  if not record.exc_info or record.exc_info[1] is None:
    return False
  _, error, tb = record.exc_info
  return cause(error) is not None or any(
    _ORBAX_DIR in frame.filename for frame in traceback.extract_tb(tb)
  )


class _Quiet(logging.Filter):
  """Drops a failed save's error lines and the unraisable 'Event loop is
  closed'."""

  def __init__(self):
    super().__init__()
    self._lock = threading.Lock()
    self._previous_hook = None

  def filter(self, record: logging.LogRecord) -> bool:
    return not (record.levelno >= logging.ERROR and _from_failed_save(record))

  def _unraisable(self, unraisable):
    if not (
      unraisable.object is None
      and internals.is_closed_event_loop(unraisable.exc_value)
    ):
      self._previous_hook(unraisable)

  def install(self):
    with self._lock:
      if self._previous_hook is not None:
        return
      for name in _LOGGERS:
        logging.getLogger(name).addFilter(self)
      self._previous_hook, sys.unraisablehook = (
        sys.unraisablehook,
        self._unraisable,
      )


_QUIET = _Quiet()


def install_quiet() -> None:
  """Keeps a failed save's side noise off the console for the rest of the
  process (it comes late too: tasks collected at exit). Process-wide: a
  filter on the absl and asyncio loggers and `sys.unraisablehook`; so
  installed by `vidjax.main` only, never by library code (a notebook's
  failed save then shows Orbax's own tracebacks besides the error raised)."""
  _QUIET.install()
