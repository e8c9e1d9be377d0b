"""A part's report, and what the parts of a store say: --status, --merge.

Each part of a store (the whole store's files at DST, or a shard's in
DST/shards/K-of-N) has its report beside its manifest: `errors.jsonl` (the
videos that failed twice, with why) and `progress.json` (its videos and
bytes, done and in all; this run's rate; whether it finished), rewritten
whole after every video (`Report`).

`status(dst)` sums them up: videos done of all, hours of source, chunk
bytes, the failures named and an ETA from the measured rates. `merge(dst)`
joins a finished split's parts into DST/manifest.jsonl and DST/errors.jsonl.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
import shutil
import socket
import time

from vidjax.base import errors, rundir, whole_files
from vidjax.data.chunk import manifest as manifest_lib


class Report:
  """The part's errors.jsonl and progress.json, rewritten whole as videos
  finish (`--status` reads them; a killed run leaves them true)."""

  def __init__(self, dst, part, shard, by_id, sizes, finished):
    self.dst, self.part = dst, part
    self.failed: list[dict] = []
    done = [v for v in by_id if v in finished]
    try:
      before = json.loads((part / manifest_lib.PROGRESS).read_text())
    except (OSError, ValueError):
      before = {}
    now = time.time()
    self.blob = {
      "shard": None if shard is None else f"{shard[0]}/{shard[1]}",
      "videos": len(by_id),
      "source_bytes": sum(sizes[v] for v in by_id),
      "done": len(done),
      "done_source_bytes": sum(sizes[v] for v in done),
      "done_source_seconds": sum(source_seconds(finished[v]) for v in done),
      "chunk_bytes": before.get("chunk_bytes", 0),
      "left_source_bytes": sum(sizes[v] for v in by_id if v not in finished),
      "failed": 0,
      "finished": False,
      "run": {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": now,
        "updated": now,
        "videos": 0,
        "source_bytes": 0,
        "source_seconds": 0.0,
      },
    }
    self.sizes = sizes
    self._write_errors()
    self._write()

  def totals(self, videos: int, source_bytes: int, sources: str) -> None:
    """The whole store's source (every shard's), for --status, and a digest
    of its files and sizes (each shard of a split must start from them)."""
    self.blob["store_videos"] = videos
    self.blob["store_source_bytes"] = source_bytes
    self.blob["sources"] = sources
    self._write()

  def add(self, vid: str, path: Path, entry: dict | None, error: str | None):
    run = self.blob["run"]
    run["updated"] = time.time()
    run["videos"] += 1
    run["source_bytes"] += self.sizes[vid]
    self.blob["left_source_bytes"] -= self.sizes[vid]
    if entry:
      seconds = source_seconds(entry)
      run["source_seconds"] += seconds
      self.blob["done"] += 1
      self.blob["done_source_bytes"] += self.sizes[vid]
      self.blob["done_source_seconds"] += seconds
      self.blob["chunk_bytes"] += sum(
        f.stat().st_size for f in (self.dst / vid).iterdir()
      )
    else:
      self.failed.append({"source": str(path), "video_id": vid, "error": error})
      self.blob["failed"] = len(self.failed)
      self._write_errors()
    self._write()

  def finish(self) -> None:
    self.blob["finished"] = True
    self._write()

  def _write(self) -> None:
    with whole_files.replaced(self.part / manifest_lib.PROGRESS) as f:
      f.write(json.dumps(self.blob, indent=1) + "\n")

  def _write_errors(self) -> None:
    with whole_files.replaced(self.part / manifest_lib.ERRORS) as f:
      f.writelines(json.dumps(failure) + "\n" for failure in self.failed)


def source_seconds(entry: dict) -> float:
  """Seconds of video a manifest entry lists."""
  try:
    return entry["num_frames"] / entry["fps"]
  except (KeyError, TypeError, ZeroDivisionError):
    return 0.0


# ---------------------------------------------------------------------------
# --status
# ---------------------------------------------------------------------------
def read_progress(part: Path) -> dict | None:
  """A part's progress.json, or None (none yet, or unreadable)."""
  return _read_json(part / manifest_lib.PROGRESS)


def _read_json(path: Path) -> dict | None:
  try:
    blob = json.loads(path.read_text())
  except (OSError, ValueError):
    return None
  return blob if isinstance(blob, dict) else None


def _failures(part: Path) -> list[dict]:
  try:
    lines = (part / manifest_lib.ERRORS).read_text().splitlines()
  except OSError:
    return []
  out = []
  for line in lines:
    try:
      out.append(json.loads(line))
    except ValueError:
      continue  # A torn line of an older chunker.
  return out


def _parts(dst: Path) -> list[tuple[tuple[int, int] | None, Path]]:
  """The store's parts: its own files (if any), then its shards."""
  names = (manifest_lib.MANIFEST, manifest_lib.PROGRESS)
  whole = [(None, dst)] if any((dst / n).exists() for n in names) else []
  return whole + list(manifest_lib.shard_parts(dst).items())


def _size(n: float) -> str:
  for unit in ("B", "kB", "MB", "GB", "TB"):
    if n < 1000 or unit == "TB":
      return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
    n /= 1000
  return ""


def _source(seconds: float) -> str:
  """An amount of source video: hours, or seconds when under 0.1 h."""
  return f"{seconds / 3600:.1f} h" if seconds >= 360 else f"{seconds:.0f} s"


def _duration(seconds: float) -> str:
  minutes = round(seconds / 60)
  if minutes < 1:
    return f"{seconds:.0f} s"
  return (
    f"{minutes // 60} h {minutes % 60} min"
    if minutes >= 60
    else f"{minutes} min"
  )


def _state(part: Path, blob: dict, now: float) -> str:
  """finished, running (its lock touched lately: the holder does so every
  HEARTBEAT_S seconds, and on this host its process lives) or stopped."""
  if blob["finished"]:
    return "finished"
  lock = part / manifest_lib.LOCK
  try:
    idle = now - lock.stat().st_mtime
  except FileNotFoundError:
    idle = math.inf
  if idle < 2.5 * rundir.HEARTBEAT_S and not rundir.holder_gone(lock):
    return "running"
  return "stopped"


def _rate(blob: dict, state: str, now: float) -> tuple[str, float | None]:
  """This run's rate (source hours per hour) and, if running, the seconds
  left at that rate (bytes of source left over bytes per second so far)."""
  run = blob.get("run") or {}
  wall = run.get("updated", 0) - run.get("started", 0)
  if not run.get("source_bytes") or wall <= 0:
    return "", None
  text = f"  {run['source_seconds'] / wall:.1f} source-h/h"
  if state != "running":
    return text, None
  left = blob["left_source_bytes"] * wall / run["source_bytes"]
  eta = max(0.0, left - (now - run["updated"]))
  return f"{text}, ETA {_duration(eta)}", eta


def status(dst: str | os.PathLike, now: float | None = None) -> str:
  """What the store's parts say, as lines to print (see the module doc).

  Raises:
    errors.PathError: `dst` is not a chunk store.
  """
  dst, now = Path(dst), time.time() if now is None else now
  found = _parts(dst)
  if not found:
    raise errors.PathError(
      f"{dst}: not a chunk store (no {manifest_lib.MANIFEST}, no "
      f"{manifest_lib.SHARDS}/)"
    )
  shards = {kn for kn, _ in found if kn}
  splits = sorted({n for _, n in shards})
  missing = [(k, n) for n in splits for k in range(1, n + 1)]
  missing = [kn for kn in missing if kn not in shards]
  lines, failures, etas, blobs = [f"{dst}:"], [], [], []
  for kn, part in found:
    name = "whole store" if kn is None else f"shard {kn[0]}/{kn[1]}"
    failed = _failures(part)
    failures += failed
    blob = read_progress(part)
    if blob is None:  # No report (an older chunker): its manifest only.
      listed = part / manifest_lib.MANIFEST
      entries = (
        [e for _, e in manifest_lib.manifest_lines(listed)]
        if listed.exists()
        else []
      )
      seconds = sum(source_seconds(e) for e in entries)
      blobs.append(
        dict.fromkeys(_COUNTS, 0)
        | {
          "videos": len(entries),
          "done": len(entries),
          "done_source_seconds": seconds,
        }
      )
      lines.append(
        f"  {name:<12} {len(entries)} videos, {_source(seconds)} of source (no {manifest_lib.PROGRESS})"
      )
      continue
    # A shard counts its videos done in any part: with shards, the whole
    # store's earlier lines are in their counts already.
    if kn or not shards:
      blobs.append(blob)
    state = _state(part, blob, now)
    rate, eta = _rate(blob, state, now)
    if eta is not None:
      etas.append(eta)
    lines.append(
      f"  {name:<12} {state:<9} {blob['done']}/{blob['videos']} videos, "
      f"{_source(blob['done_source_seconds'])} of source, "
      f"{_size(blob['chunk_bytes'])} of chunks, {len(failed)} failed{rate}"
    )
  lines += [f"  {f'shard {k}/{n}':<12} not started" for k, n in missing]
  lines.append(_totals(blobs, len(failures), missing, etas))
  if failures:
    lines.append(f"failed ({len(failures)}):")
    lines += [f"  {f.get('error', f)}" for f in failures]
  return "\n".join(lines)


# The counts of progress.json that add up over parts.
_COUNTS = (
  "videos",
  "done",
  "done_source_seconds",
  "done_source_bytes",
  "source_bytes",
  "chunk_bytes",
)


def _totals(blobs: list[dict], failed: int, missing: list, etas: list) -> str:
  """The last line of --status: the whole store's counts and its ETA."""
  total = sum(b["videos"] for b in blobs)
  total = max([total] + [b.get("store_videos", 0) for b in blobs])
  done = sum(b["done"] for b in blobs)
  seconds = sum(b["done_source_seconds"] for b in blobs)
  done_bytes = sum(b["done_source_bytes"] for b in blobs)
  source_bytes = max(
    [sum(b["source_bytes"] for b in blobs)]
    + [b.get("store_source_bytes", 0) for b in blobs]
  )
  share = f" ({100 * done / total:.0f}%)" if total else ""
  in_all = (
    f" (~{_source(seconds * source_bytes / done_bytes)} in all)"
    if done_bytes and source_bytes > done_bytes
    else ""
  )
  if missing:
    eta = f"ETA unknown: {len(missing)} shard(s) not started"
  elif etas:
    eta = f"ETA {_duration(max(etas))} at the measured rates"
  else:
    eta = "nothing running"
  chunk_bytes = _size(sum(b["chunk_bytes"] for b in blobs))
  return (
    f"all: {done}/{total} videos{share}, {_source(seconds)} of source"
    f"{in_all}, {chunk_bytes} of chunks, {failed} failed; {eta}"
  )


# ---------------------------------------------------------------------------
# --merge
# ---------------------------------------------------------------------------
def merge(dst: str | os.PathLike) -> dict:
  """Joins a finished split's parts into DST/manifest.jsonl, DST/errors.jsonl
  and DST/progress.json, then removes DST/shards.

  Returns:
    {"shards": N, "videos": listed in the manifest now, "failed": count}.

  Raises:
    errors.DataError: no shards, a missing or unfinished shard (a gap), a
      shard whose manifest lists fewer videos than it counted done (a lost
      line), or a video listed by two parts (a duplicate); nothing is
      changed then.
  """
  dst = Path(dst)
  shards = manifest_lib.shard_parts(dst)
  splits = sorted({n for _, n in shards})
  if not shards:
    raise errors.DataError(
      f"{dst}: no shards to merge ({dst / manifest_lib.SHARDS} holds none)"
    )
  if len(splits) > 1:
    raise errors.DataError(
      f"{dst / manifest_lib.SHARDS} holds the parts of {' and '.join(map(str, splits))} shards",
      hint="finish one split; remove the other's folders (their videos are chunked again)",
    )
  n = splits[0]
  gaps = [
    f"shard {k}/{n} (not started)"
    for k in range(1, n + 1)
    if (k, n) not in shards
  ]
  blobs = {}
  for (k, _), part in shards.items():
    blob = _read_json(part / manifest_lib.PROGRESS)
    if (
      blob is None
      or not blob.get("finished")
      or (part / manifest_lib.LOCK).exists()
    ):
      done = (
        f"{blob['done']} of {blob['videos']} videos done"
        if blob
        else "no progress.json"
      )
      gaps.append(f"shard {k}/{n} (not finished: {done})")
    blobs[k] = blob
  if gaps:
    raise errors.DataError(
      f"{dst}: cannot merge: " + ", ".join(gaps),
      hint="run those shards to the end (the same command resumes one), then merge",
    )
  # A shard's manifest against its own count of the videos it finished: a
  # lost line would drop a video from the store without a word.
  lost = []
  for (k, _), part in sorted(shards.items()):
    path = part / manifest_lib.MANIFEST
    listed = len(
      {e["video_id"] for _, e in manifest_lib.manifest_lines(path)}
      if path.exists()
      else set()
    )
    if listed < blobs[k]["done"]:
      lost.append(
        f"shard {k}/{n} chunked {blobs[k]['done']} videos but its "
        f"{manifest_lib.MANIFEST} lists {listed}"
      )
  if lost:
    raise errors.DataError(
      f"{dst}: cannot merge: " + "; ".join(lost) + " (lines lost)",
      hint="run those shards again (the same --shard command chunks the "
      "videos their manifest lacks), then merge",
    )
  whole = dst / manifest_lib.MANIFEST
  existing = {}
  if whole.exists():
    existing = {
      e["video_id"]: (w, e) for w, e in manifest_lib.manifest_lines(whole)
    }
  merged, added, duplicates = dict(existing), [], []
  for part in shards.values():
    for where, entry in manifest_lib.manifest_lines(
      part / manifest_lib.MANIFEST
    ):
      vid = entry["video_id"]
      if vid in merged:
        if vid in existing and existing[vid][1] == entry:
          continue  # Merged before, by a merge stopped before the end.
        duplicates.append(f"{vid!r} in {merged[vid][0]} and {where}")
        continue
      merged[vid] = (where, entry)
      added.append(entry)
  if duplicates:
    raise errors.DataError(
      f"{dst}: cannot merge: {len(duplicates)} video(s) listed twice: "
      + "; ".join(duplicates[:3]),
      hint="delete the wrong line(s), then merge",
    )
  failed = [
    f
    for part in shards.values()
    for f in _failures(part)
    if f.get("video_id") not in merged
  ]
  old = whole.read_text() if whole.exists() else ""
  with whole_files.replaced(whole) as f:
    f.write(
      old if not old or old.endswith("\n") else old[: old.rfind("\n") + 1]
    )
    f.writelines(json.dumps(entry) + "\n" for entry in added)
  with whole_files.replaced(dst / manifest_lib.ERRORS) as f:
    f.writelines(json.dumps(failure) + "\n" for failure in failed)
  keys = (*_COUNTS, "left_source_bytes")
  summed = {k: sum(b[k] for b in blobs.values()) for k in keys}
  summed.update(
    shard=None,
    failed=len(failed),
    finished=True,
    run=None,
    store_videos=len(merged) + len(failed),
  )
  with whole_files.replaced(dst / manifest_lib.PROGRESS) as f:
    f.write(json.dumps(summed, indent=1) + "\n")
  shutil.rmtree(dst / manifest_lib.SHARDS)
  return {"shards": n, "videos": len(merged), "failed": len(failed)}
