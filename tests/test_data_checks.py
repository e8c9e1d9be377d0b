"""Data checked before the first step: annotations against the chunk manifest,
the vocabulary, the paths. Reads only a manifest: no video is decoded."""

import gzip
import importlib.util
import json
from pathlib import Path
import sys

import ml_collections
import numpy as np
import pytest

from video_fixtures import write_video
from vidjax import config as config_lib
from vidjax.base import errors
from vidjax.config import defaults
from vidjax.data import checks, loader, synthetic, tokenizer

REPO = Path(__file__).resolve().parents[1]

# Two videos as the chunker's manifest.jsonl lists them: 10 s and 4.004 s.
MANIFEST = [
  {
    "video_id": "bikes",
    "fps": 25.0,
    "frame_rate": "25",
    "num_frames": 250,
    "width": 170,
    "height": 72,
    "chunk_seconds": 15.0,
    "source": "/v/bikes.mp4",
  },
  {
    "video_id": "carphone",
    "fps": 29.97002997002997,
    "frame_rate": "30000/1001",
    "num_frames": 120,
    "width": 88,
    "height": 72,
    "chunk_seconds": 15.0,
    "source": "/v/carphone.mp4",
  },
]


def _config(tmp_path, train_rows, eval_rows=None, **data):
  (tmp_path / "chunks").mkdir(exist_ok=True)
  (tmp_path / "chunks" / "manifest.jsonl").write_text(
    "".join(json.dumps(m) + "\n" for m in MANIFEST)
  )
  for name, rows in (("train", train_rows), ("val", eval_rows or train_rows)):
    (tmp_path / f"{name}.jsonl").write_text(
      "".join(json.dumps(r) + "\n" for r in rows)
    )
  config = ml_collections.ConfigDict(
    {
      "data": defaults.data_config(),
      "model": {
        "num_classes": 0,
        "text": {"vocab_size": 0, "context_length": 77},
      },
    }
  )
  config.data.update(
    root=str(tmp_path / "chunks"),
    train_annotations=str(tmp_path / "train.jsonl"),
    eval_annotations=str(tmp_path / "val.jsonl"),
    **data,
  )
  return config


GOOD = [
  {
    "video_id": "bikes",
    "start": 0.0,
    "end": 4.0,
    "text": "two bikes",
    "label": 1,
  },
  {
    "video_id": "carphone",
    "start": 1.0,
    "end": 4.004,
    "text": "a call",
    "label": 0,
  },
  # Ends 2 s past the end: its frames are clamped, so it is fine.
  {
    "video_id": "carphone",
    "start": 2.0,
    "end": 6.0,
    "text": "a call",
    "label": 0,
  },
]
BAD = [
  {"video_id": "Bikes", "start": 0.0, "end": 2.0, "text": "bikes"},
  {"video_id": "bikes", "start": 1200.0, "end": 3400.0, "text": "bikes"},
  {"video_id": "bikes", "start": 0.0, "end": 2.0, "caption": "bikes"},
  {"video_id": "carphone", "start": 0.0, "end": 2.0, "text": "   "},
  {"video_id": "carphone", "start": 1.0, "end": 30.0, "text": "a call"},
]


def test_each_problem_found_with_a_hint(tmp_path):
  config = _config(tmp_path, GOOD + BAD)
  report = checks.check_annotations(
    config, ("train",), needs_text=True, needs_label=False
  )["train"]
  assert len(report.records) == 8 and sorted(report.bad) == [3, 4, 5, 6, 7]
  details = {
    row: [d for _, d in problems] for row, problems in report.bad.items()
  }
  assert details[3] == [
    "'Bikes' is not in the chunk store (did you mean 'bikes'?)"
  ]
  assert details[4] == ["1200-3400 s but 'bikes' has 10.0 s (milliseconds?)"]
  assert details[5] == [
    "no caption in 'text' (it has 'caption': the caption goes under 'text')"
  ]
  assert details[6] == ["no caption in 'text'"]
  assert details[7] == ["1-30 s but 'carphone' has 4.0 s"]
  assert report.good_records == report.records[:3]
  assert report.kept_records() == report.records[:3]  # Training drops them.


def test_report_stops_past_the_limit_and_lists_the_rows(tmp_path):
  config = _config(tmp_path, GOOD + BAD[:2] + BAD[4:])
  reports = checks.check_annotations(
    config, ("train", "eval"), needs_text=True, needs_label=False
  )
  with pytest.raises(errors.DataError) as e:
    checks.stop_if_unusable(reports, config, tmp_path / "run")
  assert str(e.value).startswith(
    "data check: train train.jsonl: 3 of 6 rows are bad (50.0%; the limit is "
    "data.max_bad_row_fraction=0.01), listed in "
  )
  assert "1 unknown video id, e.g. row 4: 'Bikes'" in str(e.value)
  assert (
    "2 spans outside their video, e.g. row 5: 1200-3400 s but 'bikes' "
    "has 10.0 s (milliseconds?); row 6: 1-30 s" in str(e.value)
  )
  assert e.value.hint.endswith("--config.data.max_bad_row_fraction=0.5")
  rows = [
    json.loads(line)
    for line in (tmp_path / "run" / "bad_rows_train.jsonl")
    .read_text()
    .splitlines()
  ]
  assert [r["row"] for r in rows] == [4, 5, 6]
  assert rows[1]["problems"] == [
    "1200-3400 s but 'bikes' has 10.0 s (milliseconds?)"
  ]
  assert rows[1]["start"] == 1200.0
  # Raised: the run goes on without them; the evaluation keeps its rows.
  config.data.max_bad_row_fraction = 0.5
  checks.stop_if_unusable(reports, config, tmp_path / "run")
  checks.report(reports, config, tmp_path / "run")  # Accepted: the summary.
  assert len(reports["train"].kept_records()) == 3
  assert len(reports["eval"].kept_records()) == 6


def test_small_files_allow_two_bad_rows_and_unusable_files_say_why(
  tmp_path, monkeypatch
):
  # 74 rows: one or two bad rows pass the 1% limit, three do not.
  rows = [
    dict(GOOD[0], start=float(i % 8 + 1), end=float(i % 8 + 2))
    for i in range(74)
  ]
  config = _config(tmp_path, rows[:72] + BAD[:2])
  reports = checks.check_annotations(
    config, ("train",), needs_text=True, needs_label=False
  )
  checks.stop_if_unusable(reports, config, tmp_path / "run")
  assert len(reports["train"].kept_records()) == 72
  # Within the limit although 2.7% > 1%: a warning that says the rule.
  warned = []
  monkeypatch.setattr(
    checks.logging, "warning", lambda fmt, *a: warned.append(fmt % a)
  )
  checks.report(reports, config, tmp_path / "run")
  assert warned[0].startswith(
    "data check: train train.jsonl: 2 of 74 rows are bad (2.7%), listed in "
  )
  assert (
    warned[0]
    .split("\n")[0]
    .endswith(
      "; left out, training goes on: up to 2 bad rows are allowed here "
      "(data.max_bad_row_fraction=0.01 of the rows, at least 2)"
    )
  )
  config.data.max_bad_row_fraction = 0.0  # 0: none.
  with pytest.raises(errors.DataError, match="2 of 74 rows are bad") as e:
    checks.stop_if_unusable(reports, config, tmp_path / "run")
  assert e.value.exit_code == errors.EXIT_FAILED
  # Every span in milliseconds: no fraction would help, and none is hinted.
  config = _config(
    tmp_path,
    [dict(r, start=r["start"] * 1000, end=r["end"] * 1000) for r in rows],
  )
  reports = checks.check_annotations(
    config, ("train",), needs_text=True, needs_label=False
  )
  with pytest.raises(errors.DataError) as e:
    checks.stop_if_unusable(reports, config, tmp_path / "run")
  lines = e.value.describe().splitlines()
  assert lines[0].startswith(
    "data check: train train.jsonl: none of its 74 rows is usable, listed in "
  )
  assert lines[1] == (
    "  74 spans outside their video, e.g. row 1: 1000-2000 s but 'bikes' "
    "has 10.0 s (milliseconds?); row 2: 2000-3000 s but 'bikes' has 10.0 s "
    "(milliseconds?); row 3: 3000-4000 s but 'bikes' has 10.0 s "
    "(milliseconds?)"
  )
  assert lines[2:] == [
    "  hint: fix these rows in the file (see docs/own_videos.md for the format)"
  ]


def test_rows_without_what_the_task_needs(tmp_path):
  # Training drops them (within the limit); an evaluation cannot score them.
  no_label = {k: v for k, v in GOOD[1].items() if k != "label"}
  rows = [GOOD[0], GOOD[1]] * 20
  config = _config(tmp_path, rows + [no_label], rows + [no_label, no_label])
  reports = checks.check_annotations(
    config, ("train", "eval"), needs_text=False, needs_label=True
  )
  assert reports["train"].bad == {40: [("no_label", "no 'label'")]}
  with pytest.raises(errors.DataError) as e:
    checks.stop_if_unusable(reports, config, tmp_path / "run")
  assert e.value.describe().splitlines() == [
    "data check: eval val.jsonl: 2 of 42 rows cannot be scored, listed in "
    f"{tmp_path / 'run' / 'bad_rows_eval.jsonl'}",
    "  2 rows without a label, e.g. row 41: no 'label'; row 42: no 'label'",
    "  hint: fix these rows in the file (see docs/own_videos.md for the format)",
  ]


def test_labels_checked_and_num_classes_from_the_training_labels(
  tmp_path, caplog
):
  # Training labels 0 and 1; the evaluation also has 5, which no training
  # row has: num_classes is 2, and a warning names the class.
  rows = GOOD + [{"video_id": "bikes", "start": 0.0, "end": 1.0, "class": 2}]
  config = _config(tmp_path, rows, GOOD + [dict(GOOD[0], label=5)] * 2)
  reports = checks.check_annotations(
    config, ("train", "eval"), needs_text=False, needs_label=True
  )
  assert config.model.num_classes == 2
  assert reports["train"].bad == {
    3: [
      ("no_label", "no 'label' (it has 'class': the class goes under 'label')")
    ]
  }
  assert reports["eval"].bad == {}  # Scored: as wrong.
  checks.stop_if_unusable(reports, config, tmp_path / "run")
  with caplog.at_level("WARNING"):
    checks.report(reports, config, tmp_path / "run")
  assert caplog.messages[0].startswith(
    "data check: train train.jsonl: 1 of 4 rows is bad (25.0%)"
  )
  assert caplog.messages[1:] == [
    "data check: eval val.jsonl: 2 rows have labels that never occur in "
    "train.jsonl (5): the model cannot predict them, they count as wrong"
  ]
  config.model.num_classes = 1  # Set: training labels past it are bad rows.
  report = checks.check_annotations(
    config, ("train",), needs_text=False, needs_label=True
  )["train"]
  assert report.bad[0] == [("bad_label", "label 1 is not in [0, 1)")]


def test_manifest_lines_against_the_chunk_files(tmp_path, caplog):
  """10 frames at 10 fps in 0.5 s chunks: 0.mp4 and 0.5.mp4, 5 frames each."""
  entry = dict(
    MANIFEST[0], fps=10.0, frame_rate="10", num_frames=10, chunk_seconds=0.5
  )
  config = _config(tmp_path, [dict(GOOD[0], end=1.0)])
  (tmp_path / "chunks" / "bikes").mkdir()
  for name in ("0.mp4", "0.5.mp4"):
    write_video(
      tmp_path / "chunks" / "bikes" / name,
      [np.zeros((16, 16, 3), np.uint8)] * 5,
      fps=10,
    )
  manifest = tmp_path / "chunks" / "manifest.jsonl"
  say = f"{manifest}:2: 'bikes' has num_frames"
  for changes, message in (
    (
      dict(num_frames=10**12),
      f"{say} 1000000000000 at 10 fps (200000000000 "
      "chunks of 0.5 s), but its last chunk bikes/99999999999.5.mp4 is "
      "missing (2 chunk files in ",
    ),
    (
      dict(num_frames=5),
      f"{say} 5 at 10 fps (1 chunks of 0.5 s), but "
      "bikes/0.5.mp4 follows its last chunk",
    ),
    (
      dict(num_frames=9),
      f"{say} 9 at 10 fps (2 chunks of 0.5 s), so its "
      "last chunk bikes/0.5.mp4 should hold 4 frames at that rate, but it "
      "holds 5 frames at 10 fps",
    ),
    (
      dict(fps=12.5, frame_rate="25/2", num_frames=12),
      f"{say} 12 at 12.5 "
      "fps (2 chunks of 0.5 s), so its last chunk bikes/0.5.mp4 should hold "
      "5 frames at that rate, but it holds 5 frames at 10 fps",
    ),
    ({}, None),
  ):
    manifest.write_text(
      json.dumps(MANIFEST[1]) + "\n" + json.dumps(entry | changes) + "\n"
    )
    reports = checks.check_annotations(
      config, ("train",), needs_text=True, needs_label=False
    )
    if message is None:
      checks.check_chunk_files(config, reports)
      continue
    with pytest.raises(errors.DataError) as e:
      checks.check_chunk_files(config, reports)
    assert str(e.value).startswith(message), str(e.value)
    assert len(e.value.describe().splitlines()) == 2
  # A chunker still writing the store: its unfinished last line is skipped.
  manifest.write_text(manifest.read_text() + '{"video_id": "new", "fps"')
  with caplog.at_level("WARNING"):
    reports = checks.check_annotations(
      config, ("train",), needs_text=True, needs_label=False
    )
  assert reports["train"].bad == {}
  assert caplog.messages == [
    f"{manifest}:3: skipped: the last line is incomplete "
    "(being written, or cut short by a killed chunker)"
  ]


def test_kinetics_lists_whole_video_records_pass(tmp_path):
  """AVION's `path num_frames label` lists: each row spans its whole video
  (end = inf), which is no span outside the video."""
  config = _config(tmp_path, GOOD, format="kinetics_list")
  for name, lines in (
    ("train", "train_320px/bikes.mp4 250 3\ntrain_320px/carphone.mp4 120 1\n"),
    ("val", "val_320px/carphone.mp4 120 1\n"),
  ):
    (tmp_path / f"{name}.txt").write_text(lines)
    config.data[f"{name if name == 'train' else 'eval'}_annotations"] = str(
      tmp_path / f"{name}.txt"
    )
  reports = checks.check_annotations(
    config, ("train", "eval"), needs_text=False, needs_label=True
  )
  assert {s: r.bad for s, r in reports.items()} == {"train": {}, "eval": {}}
  checks.stop_if_unusable(reports, config, tmp_path / "run")
  assert len(reports["train"].kept_records()) == 2
  assert config.model.num_classes == 4


def test_unloadable_file_and_missing_manifest_are_user_errors(tmp_path):
  config = _config(tmp_path, GOOD)
  (tmp_path / "train.jsonl").write_text(
    '{"video_id": "bikes", "start": -1, "end": 2}\n'
  )
  with pytest.raises(errors.DataError, match=r"train.jsonl:1: need 0 <= start"):
    checks.check_annotations(
      config, ("train",), needs_text=False, needs_label=False
    )
  # A file in another format than data.format: the format's columns named.
  config.data.format = "ek100_cls"
  with pytest.raises(errors.DataError) as e:
    checks.check_annotations(
      config, ("train",), needs_text=False, needs_label=True
    )
  assert str(e.value).startswith(
    f"{tmp_path / 'train.jsonl'}:1: missing "
    "column(s) ['verb_class', 'noun_class']"
  )
  assert e.value.hint.startswith(
    "data.format='ek100_cls' reads EPIC-Kitchens-100's EPIC_100_train.csv / "
    "EPIC_100_validation.csv (columns video_id, start_timestamp, "
  )
  assert e.value.exit_code == errors.EXIT_FAILED
  config.data.format = "jsonl"
  # An id that would read chunks outside data.root: the manifest is refused.
  manifest = tmp_path / "chunks" / "manifest.jsonl"
  for video_id in ("../../home/x", "/etc"):
    manifest.write_text(json.dumps(dict(MANIFEST[0], video_id=video_id)))
    with pytest.raises(errors.DataError) as e:
      checks.check_annotations(
        config, ("eval",), needs_text=False, needs_label=False
      )
    assert str(e.value) == (
      f"{manifest}:1: video_id {video_id!r} is not a "
      "plain name: its chunks would be read outside the "
      "chunk store"
    )
    assert e.value.exit_code == errors.EXIT_FAILED
  manifest.unlink()
  with pytest.raises(errors.DataError, match="no manifest; chunk the videos"):
    checks.check_annotations(
      config, ("eval",), needs_text=False, needs_label=False
    )


def test_empty_file_of_any_split_stops_at_start_up(tmp_path):
  config = _config(tmp_path, GOOD)
  (tmp_path / "val.jsonl").write_text("\n")
  with pytest.raises(
    errors.DataFileError,
    match=r"val.jsonl: no annotation "
    "rows",
  ) as e:
    checks.check_annotations(
      config, ("train", "eval"), needs_text=True, needs_label=False
    )
  assert e.value.hint == "data.eval_annotations should name a file with clips"
  config.data.eval_annotations = ""  # No main evaluation set: nothing to read.
  checks.check_annotations(
    config, ("train", "eval"), needs_text=True, needs_label=False
  )
  with pytest.raises(errors.DataFileError, match="annotation file is empty"):
    loader.ClipLoader([], config.data.root, loader.ClipSpec())


def test_paths_named_all_at_once(tmp_path):
  config = _config(tmp_path, GOOD)
  config.data.update(root=str(tmp_path / "nope"), eval_annotations="")
  with pytest.raises(errors.PathError) as e:
    checks.check_paths(
      config, ["data.root", "data.train_annotations", "data.eval_annotations"]
    )
  assert str(e.value).splitlines()[1:] == [
    f"  data.root = '{tmp_path / 'nope'}' (not found)",
    "  data.eval_annotations = '' (unset)",
  ]


def test_vocabulary_found_and_its_size_taken(tmp_path, monkeypatch):
  config = _config(tmp_path, GOOD)
  path = synthetic.write_vocab(tmp_path / "vocab.txt.gz")
  monkeypatch.setattr(tokenizer, "find_clip_vocab", lambda: str(path))
  tok = checks.load_tokenizer(config)
  assert config.data.vocab == ""  # Unset stays unset: config.json can move.
  assert config.model.text.vocab_size == tok.vocab_size == 560
  assert tok("two bikes").shape == (1, 77)
  config.model.text.context_length = 16  # The text tower's: any length.
  assert checks.load_tokenizer(config)("two bikes").shape == (1, 16)
  config.model.text.vocab_size = 100
  with pytest.raises(
    errors.ConfigError, match="has 560 tokens but model.text.vocab_size is 100"
  ) as e:
    checks.load_tokenizer(config)
  assert "--config.model.text.vocab_size=560" in e.value.hint
  monkeypatch.setattr(tokenizer, "find_clip_vocab", lambda: None)
  config.data.vocab = ""
  with pytest.raises(
    errors.PathError, match="CLIP's vocabulary is not in this install"
  ) as e:
    checks.load_tokenizer(config)
  assert "reinstall vidjax" in e.value.hint
  (tmp_path / "bad.gz").write_bytes(b"not gzip")
  config.data.vocab = str(tmp_path / "bad.gz")
  with pytest.raises(errors.ConfigError, match="cannot read a gzip BPE"):
    checks.load_tokenizer(config)
  (tmp_path / "empty.gz").write_bytes(b"")
  with gzip.open(tmp_path / "header.gz", "wt") as f:
    f.write("#version: 0.2\n")
  for name, message in (
    (
      "empty.gz",
      "empty.gz:1: an empty file: expected a BPE vocabulary such "
      "as CLIP's bpe_simple_vocab_16e6.txt.gz",
    ),
    ("header.gz", "header.gz: no merges after the header line"),
  ):
    config.data.vocab = str(tmp_path / name)
    with pytest.raises(errors.ConfigError) as e:
      checks.load_tokenizer(config)
    assert str(e.value).startswith(f"data.vocab: {tmp_path / message}")
    assert len(e.value.describe().splitlines()) == 2


def test_own_videos_captions_need_no_vocabulary_flag(monkeypatch):
  # `pip install -e .` alone (no OpenCLIP, no torch): CLIP's vocabulary is
  # vidjax's own, and the run's config keeps naming no path for it.
  for name in ("open_clip", "clip", "torch"):
    monkeypatch.setitem(sys.modules, name, None)
  config = config_lib.load_config(
    str(REPO / "configs/own_videos.py:captions,cpu")
  )
  assert config.data.vocab == "" and config.model.text.vocab_size == 0
  tok = checks.load_tokenizer(config)
  assert config.data.vocab == "" and config.model.text.vocab_size == 49408
  assert tok(["a diagram"])[0, :4].tolist() == [49406, 320, 22697, 49407]


@pytest.mark.parity
def test_shipped_clip_vocab_is_open_clips_and_found_there_without_it(
  monkeypatch,
):
  spec = importlib.util.find_spec("open_clip")  # Not imported: no torch.
  if spec is None:
    pytest.skip("open_clip_torch is not installed")
  theirs = f"{spec.submodule_search_locations[0]}/{tokenizer.CLIP_VOCAB_FILE}"
  shipped = Path(tokenizer.find_clip_vocab())
  assert shipped.read_bytes() == Path(theirs).read_bytes()
  # A trimmed install without vidjax's copy: OpenCLIP's is found.
  monkeypatch.setattr(tokenizer, "SHIPPED_VOCAB", "/nowhere")
  assert tokenizer.find_clip_vocab() == theirs
