"""Text files appended one whole line at a time: metrics.jsonl and log.txt.

A run killed, or a disk that filled, while a line was being written leaves
that line torn (without its newline). `LineFile` drops such a line when it
opens the file (`dropped` says what was dropped), and writes whole lines or
nothing: a write that fails (a full disk) is undone before its `OSError` is
raised, so a resumed run never appends onto half a line.
"""
from __future__ import annotations

import os

_TAIL = 1 << 16  # Bytes read at a time, backwards, to find the last newline.


def _drop_torn_line(fd: int) -> bytes:
  """Truncates the file after its last newline; returns what was cut."""
  size = end = os.fstat(fd).st_size
  if not size or os.pread(fd, 1, size - 1) == b"\n":
    return b""
  while end > 0:
    start = max(0, end - _TAIL)
    newline = os.pread(fd, end - start, start).rfind(b"\n")
    if newline >= 0:
      end = start + newline + 1
      break
    end = start
  torn = os.pread(fd, size - end, end)
  os.ftruncate(fd, end)
  return torn


class LineFile:
  """A text file appended to in whole lines.

    log = LineFile("WORKDIR/metrics.jsonl")
    if log.dropped: ...say so...
    log.write('{"step": 1}\\n')
    log.close()

  Attributes:
    path: the file.
    dropped: the torn last line removed at opening ('' if none).
  """

  def __init__(self, path):
    self.path = os.fspath(path)
    self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
      self.dropped = _drop_torn_line(self._fd).decode("utf-8", "replace")
    except OSError:
      os.close(self._fd)
      raise

  def write(self, text: str) -> None:
    """Appends `text` (whole lines, ending in a newline), or nothing.

    Raises:
      OSError: it could not be written (e.g. ENOSPC); the file is as before.
    """
    data = memoryview(text.encode("utf-8"))
    size = os.fstat(self._fd).st_size
    try:
      while data:
        data = data[os.write(self._fd, data):]
    except OSError:
      try:
        os.ftruncate(self._fd, size)
      except OSError:
        pass  # The next opening drops the torn line.
      raise

  def close(self) -> None:
    if self._fd >= 0:
      os.close(self._fd)
      self._fd = -1
