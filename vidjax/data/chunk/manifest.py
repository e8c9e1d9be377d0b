"""A chunk store's manifest: where its lines are, and reading them.

    DST/manifest.jsonl     one line per finished video (`chunk.encode`)

A line is appended only once all of its video's chunks are complete.
"""

from __future__ import annotations

from collections.abc import Iterator
import json
import os
from pathlib import Path

from absl import logging

from vidjax import errors

MANIFEST = "manifest.jsonl"
ERRORS = "errors.jsonl"

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
  """Manifest entries of the store `dst` by video id ({} when there is no
  manifest yet); raises as `manifest_lines`."""
  path = Path(dst) / MANIFEST
  if not path.exists():
    return {}
  return {entry["video_id"]: entry for _, entry in manifest_lines(path)}
