"""The synthetic corpus's clips in the field's benchmark layouts.

`vidjax.data.synthetic.make_corpus` writes, beside its other files:

  raw/cropped_clips/<video>/<clip>.mp4   EGTEA Gaze+'s cropped clips: one per
                                        segment of the first `EGTEA_VIDEOS`
                                        training and validation videos,
                                        named as EGTEA's
                                        (`P01-R03-Synthetic-2000-4000-F000016-
                                        F000032`), chunked with the rest
  egtea/action_idx.txt                  the 48 classes ('A_red_square_moves_left
                                        1'), train_split1.txt / test_split1.txt
                                        (`clip action verb noun`, 1-based)
  charades_ego/Charades_v1_classes.txt  'c000 a red square moves left', ...
  charades_ego/CharadesEgo_v1_{train,test}_only1st.csv
                                        one row per video: its script, its
                                        segments as `cNNN start end;...`, its
                                        length
  egomcq.json                           EgoMCQ over the validation segments:
                                        each narration against its clip and 4
                                        others, of other videos (types 1) or
                                        of its own video (types 2)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
import csv
import json
from pathlib import Path

import numpy as np

from vidjax.data.annotations.records import ClipRecord

EGTEA_VIDEOS = 12  # Videos per split whose segments become EGTEA clips.
CHARADES_COLUMNS = (
  "id",
  "subject",
  "scene",
  "quality",
  "relevance",
  "verified",
  "script",
  "objects",
  "descriptions",
  "actions",
  "length",
  "egocentric",
  "charades_video",
)


def egtea_clip(r: ClipRecord, fps: int) -> tuple[str, str]:
  """(folder, clip name) of a segment in EGTEA's naming."""
  folder = f"P01-R{int(r.video_id[3:]):02d}-Synthetic"
  ms = f"{round(r.start * 1000)}-{round(r.end * 1000)}"
  frames = f"F{round(r.start * fps):06d}-F{round(r.end * fps):06d}"
  return folder, f"{folder}-{ms}-{frames}"


def egtea_videos(num_videos: int, num_val: int) -> set[str]:
  """The video ids whose segments are written as EGTEA clips."""
  train = range(min(EGTEA_VIDEOS, num_videos - num_val))
  val = range(num_videos - min(EGTEA_VIDEOS, num_val), num_videos)
  return {f"vid{v:03d}" for v in [*train, *val]}


def write_cropped_clips(
  raw: Path,
  segments: Sequence[ClipRecord],
  frames: Sequence[np.ndarray],
  fps: int,
  write_h264,
) -> None:
  """Each segment's frames as raw/cropped_clips/<folder>/<clip>.mp4."""
  for r, part in zip(segments, frames):
    folder, clip = egtea_clip(r, fps)
    (raw / "cropped_clips" / folder).mkdir(parents=True, exist_ok=True)
    write_h264(raw / "cropped_clips" / folder / f"{clip}.mp4", part, fps)


def _write_egtea(root: Path, splits, names, fps: int, chosen: set) -> None:
  out = root / "egtea"
  out.mkdir(exist_ok=True)
  with open(out / "action_idx.txt", "w") as f:
    for i, name in enumerate(names):
      f.write(f"{name[0].upper()}{name[1:].replace(' ', '_')} {i + 1}\n")
  for split, file in (
    ("train", "train_split1.txt"),
    ("val", "test_split1.txt"),
  ):
    with open(out / file, "w") as f:
      for r in splits[split]:
        if r.video_id in chosen:
          e = r.extra
          clip = egtea_clip(r, fps)[1]
          f.write(
            f"{clip} {r.label + 1} {e['verb_class'] + 1} {e['noun_class'] + 1}\n"
          )


def _write_charades(root: Path, splits, names) -> None:
  out = root / "charades_ego"
  out.mkdir(exist_ok=True)
  with open(out / "Charades_v1_classes.txt", "w") as f:
    f.writelines(f"c{i:03d} {name}\n" for i, name in enumerate(names))
  for split, file in (("train", "train"), ("val", "test")):
    videos: dict[str, list[ClipRecord]] = {}
    for r in splits[split]:
      videos.setdefault(r.video_id, []).append(r)
    with open(out / f"CharadesEgo_v1_{file}_only1st.csv", "w", newline="") as f:
      writer = csv.writer(f)
      writer.writerow(CHARADES_COLUMNS)
      for video_id, segs in videos.items():
        actions = ";".join(
          f"c{r.label:03d} {r.start:.2f} {r.end:.2f}" for r in segs
        )
        script = ", then ".join(r.text for r in segs)
        writer.writerow(
          [video_id, "S1", "Kitchen", 7, 7, "Yes", script, "shape", script]
          + [actions, f"{max(r.end for r in segs):.2f}", "Yes", video_id]
        )


def _write_egomcq(root: Path, segments: Sequence[ClipRecord], rng) -> None:
  """Questions alternate inter-video (1) and intra-video (2) candidates."""
  items = {}
  for q, r in enumerate(segments):
    kind = 1 + q % 2
    if kind == 1:
      # Other videos' segments and their halves (few videos: enough).
      others = [
        (s.video_id, a, b, s.text)
        for s in segments
        if s.video_id != r.video_id
        for a, b in ((s.start, s.end), (s.start, (s.start + s.end) / 2))
      ]
      spans = [others[i] for i in rng.permutation(len(others))[:4]]
    else:  # Four windows of the same video, outside the query's segment.
      rest = [s for s in segments if s.video_id == r.video_id and s is not r]
      other = rest[0] if rest else r
      step = (other.end - other.start) / 4
      spans = [
        (r.video_id, other.start + i * step, other.start + (i + 1) * step, "")
        for i in range(4)
      ]
    if len(spans) < 4:
      continue
    answer = int(rng.integers(5))
    spans.insert(answer, (r.video_id, r.start, r.end, r.text))
    items[str(len(items))] = {
      "query": {
        "clip_text": r.text,
        "video_uid": r.video_id,
        "clip_start": r.start,
        "clip_end": r.end,
      },
      "choices": {
        str(k): {
          "video_uid": v,
          "clip_start": s,
          "clip_end": e,
          "clip_text": t,
        }
        for k, (v, s, e, t) in enumerate(spans)
      },
      "answer": answer,
      "types": kind,
    }
  (root / "egomcq.json").write_text(json.dumps(items, indent=1))


def write_benchmark_files(
  root: Path,
  splits: Mapping[str, Sequence[ClipRecord]],
  names: Sequence[str],
  fps: int,
  chosen: set[str],
  seed: int = 0,
) -> None:
  """Writes the annotation files of the module docstring under `root`.

  Args:
    root: the corpus root.
    splits: 'train' and 'val' segments (with `label` and `extra`'s
      `verb_class`, `noun_class`).
    names: the class names by label.
    fps: the videos' frame rate.
    chosen: the videos written as EGTEA clips (`egtea_videos`).
    seed: for EgoMCQ's candidates.
  """
  root = Path(root)
  _write_egtea(root, splits, names, fps, chosen)
  _write_charades(root, splits, names)
  _write_egomcq(root, splits["val"], np.random.default_rng(seed))
