"""`read_clip` timed where the pipeline calls it: in its worker.

`python -m vidjax.bench.pipeline` hands `make_pipeline(read_clip=
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

  def __sub__(self, other: ReadTotals) -> ReadTotals:
    return ReadTotals(
      *(
        a - b
        for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other))
      )
    )


class TimedReadClip:
  """`video.read_clip`, its reads counted in FOLDER/<pid> (see the module
  docstring); pickled as its folder alone."""

  def __init__(self, folder: str | os.PathLike):
    self.folder = os.fspath(folder)
    self._lock = threading.Lock()
    self._fd = None
    self._totals = [0.0, 0, 0, 0]

  def __getstate__(self):
    return {"folder": self.folder}

  def __setstate__(self, state):
    self.__init__(state["folder"])

  def __call__(self, *args, **kwargs):
    stats = video.DecodeStats()
    start = time.thread_time()
    clip = video.read_clip(*args, **kwargs, stats=stats)
    cpu = time.thread_time() - start
    with self._lock:
      if self._fd is None:
        path = os.path.join(self.folder, str(os.getpid()))
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
      t = self._totals
      t[0] += cpu
      t[1] += 1
      t[2] += stats.decoded
      t[3] += stats.delivered
      os.pwrite(self._fd, _RECORD.pack(*t), 0)
    return clip


def totals(folder: str | os.PathLike) -> ReadTotals:
  """The reads counted so far in `folder`, all processes together."""
  sums = ReadTotals()
  for path in Path(folder).iterdir():
    data = path.read_bytes()
    if len(data) == _RECORD.size:  # Else not yet written.
      sums = ReadTotals(
        *(
          a + b for a, b in zip(dataclasses.astuple(sums), _RECORD.unpack(data))
        )
      )
  return sums
