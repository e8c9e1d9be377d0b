"""The chunk reads in progress in this process: what a stalled pipeline waits on.

`video.read_clip` registers each chunk file while it opens and decodes it
(`reading`). When no batch comes for `data.stall_warn_s`, the pipeline's
warning names them (`describe`): those of this process with
`data.workers=0`, else those each worker process publishes
(`vidjax.data.workers`). A read that never returns (a chunk on a stuck
mount) holds its thread for good, and a thread of Grain's would keep the
process from exiting: the command line ends a process with a read still
in progress (`in_progress`) without waiting for it.

Only the standard library: the command line reads this without loading
the pipeline.
"""

from __future__ import annotations

import contextlib
import threading
import time

_READS: dict[int, tuple[str, float]] = {}  # thread -> (path, time.time())


@contextlib.contextmanager
def reading(path: str):
  """Registers `path` as read by this thread for the duration."""
  thread = threading.get_ident()
  _READS[thread] = (path, time.time())
  try:
    yield
  finally:
    _READS.pop(thread, None)


def in_progress() -> list[tuple[str, float]]:
  """(path, wall-clock start) of each read in progress, oldest first."""
  return sorted(dict(_READS).values(), key=lambda read: read[1])


def describe(reads: list[tuple[str, float]], limit: int = 3) -> str:
  """'reading A for 59 s, B for 2 s' (at most `limit`), or that none is."""
  if not reads:
    return "reading no video file right now"
  reads = list(
    {path: (path, start) for path, start in reversed(reads)}.values()
  )[::-1]  # Each file once, at its oldest read.
  now = time.time()
  shown = ", ".join(
    f"{path} for {now - start:.0f} s" for path, start in reads[:limit]
  )
  more = f" and {len(reads) - limit} more" if len(reads) > limit else ""
  return f"reading {shown}{more}"
