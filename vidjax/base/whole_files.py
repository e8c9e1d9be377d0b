"""Files a reader finds whole: lines appended whole, files replaced whole.

A run killed, or a disk that filled, while a line was being written leaves
that line torn (without its newline). `LineFile` (metrics.jsonl, log.txt)
drops such a line when it opens the file (`dropped` says what was dropped),
and writes whole lines or nothing: a write that fails (a full disk) is
undone before its `OSError` is raised, so a resumed run never appends onto
half a line.

`replaced(path)` writes a file that replaces another at once (config.json,
best.json, init_from.json, evaluation embeddings, a checkpoint's
checksums.json): into a temporary file beside it, renamed over it when
written whole, so that a reader, or a run stopped there, sees the old file
or the new one.
"""

from __future__ import annotations

from collections.abc import Iterator
import contextlib
import os
from typing import IO

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
    if note := log.dropped_note(): ...warn...
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

  def dropped_note(self) -> str | None:
    """What to warn when a torn line was dropped at opening, else None."""
    if not self.dropped:
      return None
    return (
      f"{self.path} ended in a torn line, left by a run stopped while "
      f"writing it: dropped {self.dropped[:80]!r}"
    )

  def write(self, text: str) -> None:
    """Appends `text` (whole lines, ending in a newline), or nothing.

    Raises:
      OSError: it could not be written (e.g. ENOSPC); the file is as before.
    """
    data = memoryview(text.encode("utf-8"))
    size = os.fstat(self._fd).st_size
    try:
      while data:
        data = data[os.write(self._fd, data) :]
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


@contextlib.contextmanager
def replaced(path, mode: str = "w", *, sync: bool = False) -> Iterator[IO]:
  """An open file whose content replaces `path` whole, at the end of the
  `with` block (nothing changes if the block raises).

  Args:
    path: the file.
    mode: "w" (text, UTF-8) or "wb".
    sync: on disk (fsync) before the rename, e.g. before a commit that
      counts on it.
  """
  path = os.fspath(path)
  tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.tmp")
  try:
    with open(tmp, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
      yield f
      if sync:
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
  finally:
    with contextlib.suppress(FileNotFoundError):
      os.unlink(tmp)
