"""`read_clip` timed where the pipeline calls it: in its worker.

`python -m benchmarks.pipeline` hands `make_pipeline(read_clip=
TimedReadClip(folder))`: the worker's clip loader then calls `read_clip`
through it, and the CPU time of each read (its thread's: decoding runs on
one thread), the clips and the decoded and delivered frames add up in a
file per process in `folder`, which the benchmark reads while the pipeline
runs (`totals`). So `read_clip` alone and the whole pipeline are measured
on the same reads, at the same time: a machine whose speed drifts (clock,
neighbours) moves both alike.

No jax here: the lean worker unpickles this module.
"""

from __future__ import annotations

import dataclasses
import operator
import os
from pathlib import Path
import struct
import threading
import time

from vidjax.data import video

_RECORD = struct.Struct("dqqq")  # CPU seconds, clips, decoded, delivered.


@dataclasses.dataclass(frozen=True)
class ReadTotals:
  cpu_s: float = 0.0
  clips: int = 0
  decoded: int = 0
  delivered: int = 0

  def _combine(self, other: ReadTotals, op) -> ReadTotals:
    pairs = zip(dataclasses.astuple(self), dataclasses.astuple(other))
    return ReadTotals(*(op(a, b) for a, b in pairs))

  def __add__(self, other: ReadTotals) -> ReadTotals:
    return self._combine(other, operator.add)

  def __sub__(self, other: ReadTotals) -> ReadTotals:
    return self._combine(other, operator.sub)


class TimedReadClip:
  """`video.read_clip`, its reads counted in FOLDER/<pid> (see the module
  docstring); pickled as its folder alone."""

  def __init__(self, folder: str | os.PathLike):
    self.folder = os.fspath(folder)
    self._lock = threading.Lock()
    self._fd = None
    self._totals = ReadTotals()

  def __getstate__(self):
    return {"folder": self.folder}

  def __setstate__(self, state):
    self.__init__(state["folder"])

  def __call__(self, *args, **kwargs):
    stats = video.DecodeStats()
    start = time.thread_time()
    clip = video.read_clip(*args, **kwargs, stats=stats)
    read = ReadTotals(
      time.thread_time() - start, 1, stats.decoded, stats.delivered
    )
    with self._lock:
      if self._fd is None:
        path = os.path.join(self.folder, str(os.getpid()))
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
      self._totals += read
      os.pwrite(self._fd, _RECORD.pack(*dataclasses.astuple(self._totals)), 0)
    return clip


def totals(folder: str | os.PathLike) -> ReadTotals:
  """The reads counted so far in `folder`, all processes together."""
  sums = ReadTotals()
  for path in Path(folder).iterdir():
    data = path.read_bytes()
    if len(data) == _RECORD.size:  # Else not yet written.
      sums += ReadTotals(*_RECORD.unpack(data))
  return sums
