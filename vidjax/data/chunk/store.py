"""Chunking a store: every video of a source into DST, resumable, sharded.

`chunk_videos(src, dst, opts, workers, shard=(K, N))` chunks the videos of
`src` (of shard K of N: `split`) that no manifest part of the store lists
yet, appends a line per finished video to its part's manifest (DST's own,
or DST/shards/K-of-N's: see `manifest`), and lists the videos that failed
twice with their reason in the part's errors.jsonl; the others go on (also
when one crashes its worker process). The part is locked while it runs
(`vidjax.base.rundir.WorkdirLock`): a second chunker of the same part is refused.

What two shards side by side write is disjoint: each its own part folder
and the chunk folders DST/<video_id> of its own videos.
"""

from __future__ import annotations

import collections
import concurrent.futures as futures
from concurrent.futures.process import BrokenProcessPool
import contextlib
import dataclasses
import hashlib
import heapq
import json
import multiprocessing
import os
from pathlib import Path
import shutil
import sys
import threading
import time

import tqdm

from vidjax.base import errors, rundir, whole_files
from vidjax.data.chunk import encode, manifest as manifest_lib, parts

VIDEO_EXTENSIONS = (
  ".mp4",
  ".mkv",
  ".mov",
  ".avi",
  ".webm",
  ".m4v",
  ".mpg",
  ".mpeg",
  ".flv",
  ".wmv",
  ".ts",
  ".3gp",
)
# How soon a pool worker notices that its chunker is gone (`_end_with`).
_WATCH_S = 0.5


def find_videos(src: str | os.PathLike) -> list[Path]:
  """Source videos: one file, a folder (searched recursively) or a list file.

  A `.txt` file lists one path per line (blank lines and `#` comments skipped).
  """
  src = Path(src)
  if src.is_dir():
    return sorted(
      p
      for p in src.rglob("*")
      if p.is_file() and p.suffix.lower() in VIDEO_EXTENSIONS
    )
  if not src.is_file():
    raise errors.PathError(f"{src}: no such file or folder")
  if src.suffix.lower() == ".txt":
    lines = (line.strip() for line in src.read_text().splitlines())
    return [Path(line) for line in lines if line and not line.startswith("#")]
  return [src]


def sources(src: str | os.PathLike) -> dict[str, Path]:
  """The source videos of `src` by video id (the file name's stem).

  Raises:
    errors.UserError: `src` missing, two sources with one id, or an id that
      names one of the store's own files.
  """
  by_id: dict[str, Path] = {}
  for path in find_videos(src):
    if path.stem in by_id:
      raise errors.DataError(
        f"two source videos map to video id "
        f"{path.stem!r}: {by_id[path.stem]} and {path}",
        hint="rename one of them",
      )
    if path.stem in manifest_lib.RESERVED:
      raise errors.DataError(
        f"{path}: its video id {path.stem!r} is the name of one of the "
        "chunk store's own files",
        hint="rename it",
      )
    by_id[path.stem] = path
  if not by_id:
    raise errors.PathError(
      f"{src}: no videos there",
      hint="give a video, a folder or a .txt list of videos ("
      + ", ".join(VIDEO_EXTENSIONS[:4])
      + ", ...)",
    )
  return by_id


def source_bytes(path: Path) -> int:
  """The size of a source (0 if it cannot be read: it fails when chunked)."""
  try:
    return os.stat(path).st_size
  except OSError:
    return 0


def split(sizes: dict[str, int], n: int) -> list[set[str]]:
  """The video ids of each of `n` shards, about equal in bytes.

  Largest first, each to the shard with the fewest bytes so far (ties: the
  lower shard, then the video id): the same files give the same split on
  every machine.

  Args:
    sizes: bytes of every source video, by video id.
    n: the number of shards.
  """
  heap = [(0, k) for k in range(n)]
  shards: list[set[str]] = [set() for _ in range(n)]
  for vid in sorted(sizes, key=lambda v: (-sizes[v], v)):
    load, k = heapq.heappop(heap)
    shards[k].add(vid)
    heapq.heappush(heap, (load + sizes[vid], k))
  return shards


def _chunk_or_error(
  src: Path, dst: Path, video_id: str, opts: encode.ChunkOptions
):
  try:
    return encode.chunk_video(src, dst, video_id, opts), None
  except encode.ChunkError as e:
    shutil.rmtree(Path(dst) / video_id, ignore_errors=True)
    return None, str(e)
  except Exception as e:  # One bad file never stops the rest.
    shutil.rmtree(Path(dst) / video_id, ignore_errors=True)
    return None, f"{src}: {type(e).__name__}: {e}"


def _chunk_in_workers(
  todo: list[tuple[str, Path]],
  dst: Path,
  opts: encode.ChunkOptions,
  workers: int,
  finish,
) -> None:
  """Chunks the (video id, source) pairs `todo` in `workers` processes and
  calls `finish(video_id, source, entry, error)` for each.

  A worker process that dies (an FFmpeg crash, the out-of-memory killer)
  breaks the pool and ends every video in flight, and which of them killed
  it is not known: those are retried one at a time, and one that kills its
  worker alone fails. The other videos go on.
  """
  queue, suspects = collections.deque(todo), collections.deque()
  while queue or suspects:
    if suspects:
      lost = _chunk_in_pool(suspects, dst, opts, 1, finish)
    else:
      lost = _chunk_in_pool(queue, dst, opts, workers, finish)
    if len(lost) == 1:  # Alone in flight, it killed its worker.
      ((vid, path),) = lost
      shutil.rmtree(dst / vid, ignore_errors=True)
      finish(
        vid,
        path,
        None,
        f"{path}: the worker process chunking it died "
        "(an FFmpeg crash, or out of memory?)",
      )
    else:
      suspects.extend(lost)


def _end_with(parent: int) -> None:
  """A pool worker's start: a thread that ends the worker once the chunker
  that started it is gone (a `kill -9` leaves none to stop the workers,
  which would go on encoding their videos)."""

  def watch():
    while os.getppid() == parent:
      time.sleep(_WATCH_S)
    os._exit(1)

  threading.Thread(target=watch, daemon=True, name="vidjax-chunk-watch").start()


def _chunk_in_pool(
  queue: collections.deque,
  dst: Path,
  opts: encode.ChunkOptions,
  workers: int,
  finish,
) -> list[tuple[str, Path]]:
  """Chunks videos from `queue` in a new pool until the queue is empty or a
  worker dies; returns the videos that were in flight when it died."""
  running: dict[futures.Future, tuple[str, Path]] = {}
  ctx = multiprocessing.get_context("spawn")
  with futures.ProcessPoolExecutor(
    workers, mp_context=ctx, initializer=_end_with, initargs=(os.getpid(),)
  ) as pool:
    try:
      while queue or running:
        while queue and len(running) < workers:  # A crash loses no more.
          vid, path = queue[0]
          running[pool.submit(_chunk_or_error, path, dst, vid, opts)] = (
            queue.popleft()
          )
        done, _ = futures.wait(running, return_when=futures.FIRST_COMPLETED)
        for job in done:
          finish(*running[job], *job.result())
          del running[job]
    except BrokenProcessPool:
      pass  # Shutting the pool down ends every job still in `running`.
    except BaseException:  # Stopped (SIGTERM, Ctrl-C): end the workers now.
      pool.shutdown(wait=False, cancel_futures=True)
      for child in multiprocessing.active_children():
        child.terminate()
      raise
  lost = []
  for job, (vid, path) in running.items():
    if isinstance(job.exception(), BrokenProcessPool):
      lost.append((vid, path))
    else:  # Finished before the crash.
      finish(vid, path, *job.result())
  return lost


def chunk_videos(
  src: str | os.PathLike,
  dst: str | os.PathLike,
  opts: encode.ChunkOptions | None = None,
  workers: int = 1,
  progress: bool = True,
  shard: tuple[int, int] | None = None,
) -> dict:
  """Chunks every video of `src` (or of shard K of N) into `dst`, skipping
  the videos the store's manifest lists. A video that fails is tried once
  more after the others, then recorded as failed.

  Args:
    shard: (K, N), 1 <= K <= N: only shard K of the N of `split`, its lines
      in DST/shards/K-of-N/; None: every video, its lines in DST.

  Returns:
    Summary dict: `done` (newly chunked), `skipped` (already in the manifest),
    `failed` (list of {"source", "video_id", "error"}).

  Raises:
    errors.UserError: `src` missing or without videos, two sources with the
      same video id, a bad manifest in `dst`, a store split another way, or
      another chunker on the same part (all before anything is chunked).
  """
  opts = opts or encode.ChunkOptions()
  by_id = sources(src)
  sizes = {vid: source_bytes(path) for vid, path in by_id.items()}
  dst = Path(dst)
  if shard is not None:
    mine = split(sizes, shard[1])[shard[0] - 1]
    by_id_all, by_id = by_id, {v: p for v, p in by_id.items() if v in mine}
  else:
    by_id_all = by_id
  _check_split(dst, shard)
  digest = hashlib.sha256(
    json.dumps(sorted(sizes.items())).encode()
  ).hexdigest()
  if shard is not None:
    _check_sources(dst, shard, digest[:16])
  manifest_lib.read_manifest(dst)  # A bad line refuses before any write.
  part = manifest_lib.part_dir(dst, shard)
  part.mkdir(parents=True, exist_ok=True)
  # The cores this process may use (SLURM's, a container's), shared out:
  # one thread per video when there are as many workers as cores.
  if hasattr(os, "sched_getaffinity"):
    cores = len(os.sched_getaffinity(0))
  else:  # macOS
    cores = os.cpu_count() or 1
  threads = opts.threads or max(1, cores // max(workers, 1))
  opts = dataclasses.replace(opts, threads=threads)
  with _locked(dst, part, shard):
    finished = manifest_lib.read_manifest(dst)
    todo = [(vid, path) for vid, path in by_id.items() if vid not in finished]
    report = parts.Report(dst, part, shard, by_id, sizes, finished)
    report.totals(len(by_id_all), sum(sizes.values()), digest[:16])
    bar = tqdm.tqdm(
      total=len(todo),
      unit="video",
      desc="chunking"
      if shard is None
      else f"chunking shard {shard[0]}/{shard[1]}",
      disable=not progress or not todo,
    )
    # Whole lines only: a torn last line (a killed run's) is dropped, and
    # its video, not listed, is redone.
    manifest = whole_files.LineFile(part / manifest_lib.MANIFEST)
    if note := manifest.dropped_note():
      tqdm.tqdm.write(
        f"warning: {note}; its video is chunked again", file=sys.stderr
      )
    retry, done = [], 0

    def record(vid, path, entry, error):
      nonlocal done
      if entry:
        manifest.write(json.dumps(entry) + "\n")
        done += 1
      else:
        tqdm.tqdm.write(f"FAILED {error}", file=sys.stderr)
      report.add(vid, path, entry, error)
      bar.update()

    def first_try(vid, path, entry, error):
      if entry:
        record(vid, path, entry, error)
      else:
        tqdm.tqdm.write(f"failed, tried again later: {error}", file=sys.stderr)
        retry.append((vid, path))

    try:
      _chunk_all(todo, dst, opts, workers, first_try)
      _chunk_all(retry, dst, opts, workers, record)
      report.finish()
    finally:
      manifest.close()
      bar.close()
  return {
    "done": done,
    "skipped": len(by_id) - len(todo),
    "failed": report.failed,
  }


def _chunk_all(todo, dst, opts, workers, finish) -> None:
  if workers <= 1:
    for vid, path in todo:
      finish(vid, path, *_chunk_or_error(path, dst, vid, opts))
  elif todo:
    _chunk_in_workers(todo, dst, opts, workers, finish)


def _check_split(dst: Path, shard: tuple[int, int] | None) -> None:
  """Refuses to mix a whole-store run with shards, or two splits."""
  splits = sorted({n for _, n in manifest_lib.shard_parts(dst)})
  if not splits or (shard is not None and splits == [shard[1]]):
    return
  merge = f"python -m vidjax.data.chunk --merge {dst}"
  if shard is None:
    raise errors.DataError(
      f"{dst} is being chunked in {splits[0]} shards "
      f"({dst / manifest_lib.SHARDS})",
      hint=f"chunk it with --shard K/{splits[0]}, or join the shards first: "
      f"{merge}",
    )
  raise errors.DataError(
    f"{dst} is being chunked in {' and '.join(map(str, splits))} shards "
    f"({dst / manifest_lib.SHARDS}), not {shard[1]}",
    hint=f"use --shard K/{splits[0]}, or join the shards first: {merge}",
  )


def _check_sources(dst: Path, shard: tuple[int, int], digest: str) -> None:
  """Refuses a shard whose sources (their names and sizes) differ from
  those the split's other shards started from: its split would differ, and
  two shards could chunk one video into the same folder."""
  for (k, n), folder in manifest_lib.shard_parts(dst).items():
    blob = parts.read_progress(folder) or {}
    if n == shard[1] and blob.get("sources", digest) != digest:
      raise errors.DataError(
        f"the sources are not those shard {k}/{n} of {dst} started from "
        "(files added, removed or still growing): the split into shards "
        "would differ",
        hint="let the copies finish; or join the shards first (--merge, once "
        "they are finished) and chunk the rest as a new split",
      )


@contextlib.contextmanager
def _locked(dst: Path, part: Path, shard: tuple[int, int] | None):
  """Holds the part's lock (`rundir.WorkdirLock`) while it is chunked.

  Raises:
    errors.WorkdirError: another chunker holds it (one line, naming it).
  """
  lock = rundir.WorkdirLock(part)
  try:
    lock.acquire()
  except errors.WorkdirError as e:
    what = (
      str(dst) if shard is None else f"shard {shard[0]}/{shard[1]} of {dst}"
    )
    try:
      holder = json.loads(lock.path.read_text())
      who = (
        f"PID {holder['pid']} on {holder['host']}, started {holder['started']}"
      )
    except (OSError, ValueError, TypeError, KeyError):
      raise errors.WorkdirError(f"{what}: {e}") from None
    raise errors.WorkdirError(
      f"{what} is being chunked by another process ({who}; its lock: "
      f"{lock.path})"
    ) from None
  try:
    yield
  finally:
    lock.release()
