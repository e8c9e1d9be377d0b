"""Chunking a store: every video of a source into DST, resumable.

`chunk_videos(src, dst, opts, workers)` chunks the videos under `src` that
the manifest does not list yet, appends a line per finished video to
`DST/manifest.jsonl`, and lists failures with their reason in
`DST/errors.jsonl`; the others go on (also when one crashes its worker
process).
"""

from __future__ import annotations

import collections
import concurrent.futures as futures
from concurrent.futures.process import BrokenProcessPool
import dataclasses
import json
import multiprocessing
import os
from pathlib import Path
import shutil
import sys

import tqdm

from vidjax import errors, whole_files
from vidjax.data.chunk import encode, manifest as manifest_lib

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


def _chunk_or_error(
  src: Path, dst: Path, video_id: str, opts: encode.ChunkOptions
):
  try:
    return encode.chunk_video(src, dst, video_id, opts), None
  except encode.ChunkError as e:
    shutil.rmtree(Path(dst) / video_id, ignore_errors=True)
    return None, str(e)
  except Exception as e:  # pylint: disable=broad-except  # One bad file never stops the rest.
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
  with futures.ProcessPoolExecutor(workers, mp_context=ctx) as pool:
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
) -> dict:
  """Chunks every video under `src` into `dst`, skipping finished ones.

  Returns:
    Summary dict: `done` (newly chunked), `skipped` (already in the manifest),
    `failed` (list of {"source", "video_id", "error"}).

  Raises:
    errors.UserError: `src` missing, two sources with the same video id, or
      a bad manifest in `dst` (before anything is chunked).
  """
  opts = opts or encode.ChunkOptions()
  by_id: dict[str, Path] = {}
  for path in find_videos(src):
    if path.stem in by_id:
      raise errors.DataError(
        f"two source videos map to video id "
        f"{path.stem!r}: {by_id[path.stem]} and {path}",
        hint="rename one of them",
      )
    by_id[path.stem] = path
  dst = Path(dst)
  finished = manifest_lib.read_manifest(dst)
  dst.mkdir(parents=True, exist_ok=True)
  todo = [(vid, path) for vid, path in by_id.items() if vid not in finished]
  failed, done = [], 0
  threads = opts.threads or max(1, (os.cpu_count() or 1) // max(workers, 1))
  opts = dataclasses.replace(opts, threads=threads)
  bar = tqdm.tqdm(
    total=len(todo),
    unit="video",
    desc="chunking",
    disable=not progress or not todo,
  )
  # Whole lines only: a torn last line (a killed run's) is dropped, and
  # its video, not listed, is redone.
  manifest = whole_files.LineFile(dst / manifest_lib.MANIFEST)
  if note := manifest.dropped_note():
    tqdm.tqdm.write(
      f"warning: {note}; its video is chunked again", file=sys.stderr
    )

  def finish(vid, path, entry, error):
    nonlocal done
    if entry:
      manifest.write(json.dumps(entry) + "\n")
      done += 1
    else:
      failed.append({"source": str(path), "video_id": vid, "error": error})
      tqdm.tqdm.write(f"FAILED {error}", file=sys.stderr)
    bar.update()

  try:
    if workers <= 1:
      for vid, path in todo:
        finish(vid, path, *_chunk_or_error(path, dst, vid, opts))
    else:
      _chunk_in_workers(todo, dst, opts, workers, finish)
  finally:
    manifest.close()
  bar.close()
  with open(dst / manifest_lib.ERRORS, "w") as f:
    for failure in failed:
      f.write(json.dumps(failure) + "\n")
  return {"done": done, "skipped": len(by_id) - len(todo), "failed": failed}
