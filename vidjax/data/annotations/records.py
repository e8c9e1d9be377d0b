"""What every annotation reader shares: the clip record and careful parsing.

`ClipRecord` is what the loaders return and the data pipeline consumes. The
helpers here read CSV headers, timestamps, numbers and (opt-in) pickles, and
report bad input as `ValueError: FILE:LINE: problem` so that a user can fix
the file without a traceback to read.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
import csv
import dataclasses
import os
import pickle
import re
from typing import Any

import numpy as np

from vidjax.base import errors

PathLike = str | os.PathLike

FIELDS = ("video_id", "start", "end", "text", "label")
_TIMESTAMP = re.compile(r"(\d+):([0-5]?\d):([0-5]?\d(?:\.\d*)?)")


@dataclasses.dataclass(frozen=True)
class ClipRecord:
  """One annotated clip.

  Attributes:
    video_id: the video's id in the chunk manifest.
    start: clip start in seconds on the video's timeline.
    end: clip end in seconds (>= start).
    text: caption/narration, if any.
    label: class id, if any.
    extra: dataset-specific fields (ids, verb/noun classes, alternative
      narrations `texts`, ...); not part of the hash.
  """

  video_id: str
  start: float
  end: float
  text: str | None = None
  label: int | None = None
  extra: dict = dataclasses.field(default_factory=dict, hash=False)


def error(where: str, message: str) -> errors.DataFileError:
  """`DataFileError('WHERE: message')`; WHERE is 'FILE:LINE' or 'FILE[index]'."""
  return errors.DataFileError(f"{where}: {message}" if where else message)


def parse_timestamp(
  value: str, where: str = "", column: str = "timestamp"
) -> float:
  """`HH:MM:SS.ff` (any number of decimals) -> seconds."""
  match = _TIMESTAMP.fullmatch(value.strip())
  if match is None:
    raise error(where, f"{column} {value!r} is not HH:MM:SS.ff")
  hours, minutes, seconds = match.groups()
  return int(hours) * 3600 + int(minutes) * 60 + float(seconds)


def to_int(value: str, where: str, column: str) -> int:
  try:
    return int(value)
  except (TypeError, ValueError):
    raise error(where, f"{column} {value!r} is not an integer") from None


def span(start: Any, end: Any, where: str) -> tuple[float, float]:
  """(start, end) as floats with 0 <= start <= end, or a clear error."""
  missing = [n for n, v in (("start", start), ("end", end)) if v in (None, "")]
  if missing:
    raise error(
      where,
      f"no {' and no '.join(map(repr, missing))}: every clip needs its "
      "start and end (seconds, e.g. 0.0 and 4.5)",
    )
  try:
    start, end = float(start), float(end)
  except (TypeError, ValueError):
    raise error(where, f"start/end {start!r}/{end!r} are not numbers") from None
  if not 0 <= start <= end:
    raise error(where, f"need 0 <= start <= end, got start={start} end={end}")
  return start, end


def read_csv(
  path: PathLike, required: Sequence[str]
) -> Iterator[tuple[str, dict]]:
  """Yields `('FILE:LINE', row)`, after checking the header for `required`
  (a row without one of them, cut short, is refused naming its line)."""
  with open(path, newline="", encoding="utf-8-sig") as f:
    reader = csv.DictReader(f)
    missing = [c for c in required if c not in (reader.fieldnames or [])]
    if missing:
      raise error(
        f"{os.fspath(path)}:1",
        f"missing column(s) {missing}; the header is {reader.fieldnames}",
      )
    for row in reader:
      where = f"{os.fspath(path)}:{reader.line_num}"
      if any(row.get(c) is None for c in required):  # A row cut short.
        fields = sum(v is not None for k, v in row.items() if k is not None)
        raise error(
          where,
          f"{fields} fields where the header has {len(reader.fieldnames)}: "
          "the row is cut short",
        )
      yield where, row


def read_lines(path: PathLike) -> Iterator[tuple[str, str]]:
  """Yields `('FILE:LINE', line)` for each line that is not blank (a
  byte-order mark and Windows line ends are accepted)."""
  with open(path, encoding="utf-8-sig") as f:
    for number, line in enumerate(f, start=1):
      if line.strip():
        yield f"{os.fspath(path)}:{number}", line


# All the Ego4D lists and relevancy matrices need: numpy arrays and scalars
# (old and new module paths), and `_codecs.encode` for protocol-2 bytes.
_SAFE_GLOBALS = {
  ("numpy", "ndarray"),
  ("numpy", "dtype"),
  ("_codecs", "encode"),
} | {
  (m, n)
  for m in ("numpy.core.multiarray", "numpy._core.multiarray")
  for n in ("_reconstruct", "scalar")
}


class _DataUnpickler(pickle.Unpickler):
  def find_class(self, module, name):
    if (module, name) in _SAFE_GLOBALS:
      return super().find_class(module, name)
    raise pickle.UnpicklingError(
      f"refusing to load {module}.{name}: only "
      "plain data and numpy arrays are expected"
    )


def load_pickle(path: PathLike, allow_pickle: bool, command: str) -> Any:
  """Unpickles `path` if allowed; even then only data and numpy arrays.

  Args:
    path: the pickle.
    allow_pickle: the caller's opt-in (unpickling can run code).
    command: the `python -m vidjax.data.annotations` conversion that makes a
      safe copy, named in the refusal.
  """
  name = os.fspath(path)
  if not allow_pickle:
    raise errors.DataFileError(
      f"{name}: unpickling can run code stored in the file; pass "
      "allow_pickle=True (data.allow_pickle) if you trust it, or convert it "
      f"once with `python -m vidjax.data.annotations {command} {name} OUT "
      "--allow-pickle`"
    )
  with open(path, "rb") as f:
    try:
      return _DataUnpickler(f).load()
    except (
      pickle.UnpicklingError,
      EOFError,
      AttributeError,
      ImportError,
      ValueError,
      TypeError,
      OverflowError,
    ) as e:  # Garbage bytes.
      raise errors.DataFileError(f"{name}: cannot unpickle ({e})") from e


def jsonable(value: Any, where: str) -> Any:
  """numpy scalars/arrays and tuples -> plain JSON values."""
  if isinstance(value, np.generic):
    return value.item()
  if isinstance(value, (list, tuple, np.ndarray)):
    return [jsonable(v, where) for v in value]
  if value is None or isinstance(value, (str, int, float, bool)):
    return value
  raise error(where, f"unexpected value of type {type(value).__name__}")
