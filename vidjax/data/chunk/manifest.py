"""A chunk store's files: where its manifest lines are, and reading them.

    DST/<video_id>/<start_second>.mp4   a video's chunks
    DST/manifest.jsonl                  one line per finished video
    DST/errors.jsonl                    the videos that failed, with why
    DST/progress.json                   counts and rates, for --status
    DST/vidjax.lock                     the chunker writing these now
    DST/shards/<K>-of-<N>/              shard K of N's own manifest.jsonl,
                                        errors.jsonl, progress.json and lock

A store is chunked whole (the files at the top) or in the N shards of one
split, side by side; its manifest is the union of `DST/manifest.jsonl` and
every shard's (`manifest_files`), until `--merge` makes them one. A line is
appended only once all of its video's chunks are complete; a video listed
twice is read from the last line that lists it.
"""

from __future__ import annotations

from collections.abc import Iterator
import json
import os
from pathlib import Path
import re

from absl import logging

from vidjax.base import errors

MANIFEST = "manifest.jsonl"
ERRORS = "errors.jsonl"
PROGRESS = "progress.json"
LOCK = "vidjax.lock"  # The name vidjax.base.rundir gives a lock in its folder.
SHARDS = "shards"
# Names of the store's own files: no video may take one as its id.
RESERVED = (MANIFEST, ERRORS, PROGRESS, LOCK, SHARDS)
_SHARD = re.compile(r"(\d+)-of-(\d+)")


def part_dir(dst: str | os.PathLike, shard: tuple[int, int] | None) -> Path:
  """The folder of a part's manifest: DST itself, or DST/shards/K-of-N."""
  if shard is None:
    return Path(dst)
  return Path(dst) / SHARDS / f"{shard[0]}-of-{shard[1]}"


def shard_parts(dst: str | os.PathLike) -> dict[tuple[int, int], Path]:
  """The shard folders under DST/shards, by (K, N), in order."""
  try:
    names = os.listdir(os.path.join(dst, SHARDS))
  except (FileNotFoundError, NotADirectoryError):
    return {}
  found = {}
  for name in names:
    if m := _SHARD.fullmatch(name):
      found[int(m.group(1)), int(m.group(2))] = Path(dst) / SHARDS / name
  return {k: found[k] for k in sorted(found, key=lambda kn: (kn[1], kn[0]))}


def manifest_files(dst: str | os.PathLike) -> list[str]:
  """The files whose union is the store's manifest, in reading order.

  (Paths as strings: every clip read looks them up, `os.path` is a few
  times faster than `pathlib` here.)
  """
  parts = [os.path.join(dst, MANIFEST)]
  parts += [os.path.join(f, MANIFEST) for f in shard_parts(dst).values()]
  return [p for p in parts if os.path.isfile(p)]


_TORN_SEEN: set[tuple[str, str]] = set()  # Torn lines warned about.


def manifest_lines(path: str | os.PathLike) -> Iterator[tuple[str, dict]]:
  """Yields `('FILE:LINE', entry)` for each entry of a manifest file.

  A last line without its newline that is not JSON is a line still being
  written (a chunker appending to a live store) or a killed run's: it is
  skipped, with a warning (once per process).

  Raises:
    errors.DataFileError: a line that is not a JSON object with a
      `video_id`.
  """
  try:
    with open(path, encoding="utf-8") as f:
      lines = f.read().split("\n")
  except UnicodeDecodeError:
    raise errors.DataFileError(f"{path}: not a manifest (not text)") from None
  for lineno, line in enumerate(lines, 1):
    if line.strip():
      where = f"{os.fspath(path)}:{lineno}"
      try:
        entry = json.loads(line)
      except json.JSONDecodeError as e:
        if lineno == len(lines):  # No newline after it: not finished.
          if (where, line) not in _TORN_SEEN:
            _TORN_SEEN.add((where, line))
            logging.warning(
              "%s: skipped: the last line is incomplete (being "
              "written, or cut short by a killed chunker)",
              where,
            )
          continue
        raise errors.DataFileError(
          f"{where}: not JSON ({e.msg}): not a manifest line",
          hint="delete the line; chunking again redoes its video",
        ) from None
      if not isinstance(entry, dict) or not isinstance(
        entry.get("video_id"), str
      ):
        raise errors.DataFileError(
          f"{where}: not a manifest entry (a JSON object with a video_id)"
        )
      yield where, entry


def read_manifest(dst: str | os.PathLike) -> dict[str, dict]:
  """The store's manifest entries by video id, from every part ({} when
  there is none yet); raises as `manifest_lines`."""
  entries: dict[str, dict] = {}
  for path in manifest_files(dst):
    for _, entry in manifest_lines(path):
      entries[entry["video_id"]] = entry  # The last line listing it.
  return entries
