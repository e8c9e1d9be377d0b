"""The benchmarks' files as released (EGTEA Gaze+, Charades-Ego, EgoMCQ):
read into records, and every mistake refused naming the file, row and fix."""

import json
import math

import pytest

from vidjax.base import errors
from vidjax.data import annotations
from vidjax.data.annotations import benchmark_files

# EGTEA Gaze+ as released: split lines `clip_name action verb noun`
# (1-based), action_idx.txt `Action_Name idx`.
ACTION_IDX = "Close_fridge 1\nOpen_fridge 2\nTake_eating_utensil 3\n"
SPLIT = (
  "OP01-R01-PastaSalad-1002316-1004005-F024051-F024101 2 11 13\n"
  "P05-R03-BaconAndEggs-51123-52983-F001225-F001268 3 4 7\n"
)
# Charades-Ego as released (the header of CharadesEgo_v1_*_only1st.csv).
HEADER = (
  "id,subject,scene,quality,relevance,verified,script,objects,descriptions,"
  "actions,length,egocentric,charades_video\n"
)
ROWS = (
  '005BUEGO,HR43,Kitchen,6,7,Yes,"A person opens a fridge.",fridge,'
  '"They open it.","c001 0.00 5.10;c002 3.20 11.90",12.54,Yes,005BU\n'
  "0CSEQEGO,HR43,Bedroom,7,7,Yes,A person sits.,chair,Sits.,,20.10,Yes,0CSEQ\n"
)
CLASSES = "c000 Holding some clothes\nc001 Opening a refrigerator\nc002 Sitting in a chair\n"


def _egtea(tmp_path, split=SPLIT):
  (tmp_path / "action_idx.txt").write_text(ACTION_IDX)
  (tmp_path / "test_split1.txt").write_text(split)
  return tmp_path / "test_split1.txt"


def _charades(tmp_path, rows=ROWS):
  (tmp_path / "Charades_v1_classes.txt").write_text(CLASSES)
  path = tmp_path / "CharadesEgo_v1_test_only1st.csv"
  path.write_text(HEADER + rows)
  return path


def _mcq(n=2):
  def clip(uid, start):
    return {"video_uid": uid, "clip_start": start, "clip_end": start + 1.0}

  return {
    str(q): {
      "query": {**clip("uidA", 3.0), "clip_text": "#C C opens the fridge"},
      "choices": {str(k): clip(f"uid{k}", float(k)) for k in range(5)},
      "answer": q % 5,
      "types": 1 + q % 2,
    }
    for q in range(n)
  }


def test_egtea_split_and_action_names(tmp_path):
  records = annotations.load_records("egtea", _egtea(tmp_path))
  assert [r.video_id for r in records] == [
    "OP01-R01-PastaSalad-1002316-1004005-F024051-F024101",
    "P05-R03-BaconAndEggs-51123-52983-F001225-F001268",
  ]
  assert [(r.label, r.text) for r in records] == [
    (1, "open fridge"),
    (2, "take eating utensil"),
  ]  # 0-based ids; LaViLa's prompts: lower case, spaces.
  assert records[0].start == 0 and records[0].end == math.inf
  assert records[0].extra["video"] == "OP01-R01-PastaSalad"
  assert benchmark_files.class_names("egtea", tmp_path / "test_split1.txt") == [
    "close fridge",
    "open fridge",
    "take eating utensil",
  ]


def test_egtea_action_out_of_range_is_refused(tmp_path):
  path = _egtea(tmp_path, SPLIT + "OP01-R01-PastaSalad-1-2-F1-F2 107 1 1\n")
  with pytest.raises(errors.DataFileError) as e:
    annotations.load_records("egtea", path)
  message = str(e.value)
  assert f"{path}:3" in message and "action 107" in message
  assert "ids 1-3" in message and "fix the row" in message


def test_charades_videos_and_trimmed_spans(tmp_path):
  path = _charades(tmp_path)
  videos = annotations.load_records("charades_ego", path)
  assert [(r.video_id, r.start, r.end) for r in videos] == [
    ("005BUEGO", 0.0, 12.54),
    ("0CSEQEGO", 0.0, 20.10),
  ]
  assert [r.extra["labels"] for r in videos] == [[1, 2], []]  # No label.
  assert videos[0].text == "A person opens a fridge."
  spans = annotations.load_records("charades_ego_trimmed", path)
  assert [(r.start, r.end, r.label, r.text) for r in spans] == [
    (0.0, 5.1, 1, "Opening a refrigerator"),
    (3.2, 11.9, 2, "Sitting in a chair"),
  ]


def test_charades_row_cut_short_is_refused_naming_its_line(tmp_path):
  path = _charades(tmp_path, ROWS + "X1EGO,S,K,7,7,Yes,script,o,d,c001 0 1\n")
  with pytest.raises(errors.DataFileError) as e:
    annotations.load_records("charades_ego", path)
  assert f"{path}:4: 10 fields where the header has 13" in str(e.value)


@pytest.mark.parametrize(
  "cell, problem",
  [
    ("c009 0.00 5.10", "class 'c009' is not in"),
    ("c001 0.00", "is not 'cNNN start end'"),
    ("c001 5.0 1.0", "start <= end"),
  ],
)
def test_charades_bad_actions_cell_is_refused(tmp_path, cell, problem):
  rows = f"X1EGO,S,K,7,7,Yes,script,o,d,{cell},9.0,Yes,X1\n"
  path = _charades(tmp_path, rows)
  with pytest.raises(errors.DataFileError) as e:
    annotations.load_records("charades_ego", path)
  assert f"{path}:2" in str(e.value) and problem in str(e.value)


def test_egomcq_questions_become_five_records_each(tmp_path):
  path = tmp_path / "egomcq.json"
  path.write_text(json.dumps(_mcq()))
  records = annotations.load_records("egomcq", path)
  assert len(records) == 10
  r = records[5 + 3]  # Question 1, candidate 3.
  assert (r.video_id, r.start, r.end, r.text) == (
    "uid3",
    3.0,
    4.0,
    "#C C opens the fridge",
  )
  assert r.extra == {"question": 1, "choice": 3, "answer": 1, "types": 2}


def test_egomcq_clips_before_the_start_are_read_from_0_as_egovlp(
  tmp_path, caplog
):
  items = _mcq()
  items["1"]["choices"]["2"].update(clip_start=-0.5, clip_end=0.4)
  items["1"]["choices"]["3"].update(clip_start=-2.0, clip_end=-1.0)
  path = tmp_path / "egomcq.json"
  path.write_text(json.dumps(items))
  caplog.set_level("INFO")
  records = annotations.load_records("egomcq", path)
  assert [(r.start, r.end) for r in records[7:9]] == [(0.0, 0.4), (0.0, 0.0)]
  assert "2 candidate clips start before 0 s: read from 0 s" in caplog.text


@pytest.mark.parametrize(
  "change, problem",
  [
    (lambda d: d.pop("1"), 'keyed "0" .. "N-1"'),
    (lambda d: d["1"].update(types=3), "types 3 is not 1"),
    (lambda d: d["1"].update(answer=5), "answer 5 is not 0 .. 4"),
    (lambda d: d["1"]["choices"].pop("4"), 'keyed "0" .. "4"'),
    (lambda d: d["1"]["choices"]["2"].pop("video_uid"), 'choice "2" needs'),
  ],
)
def test_egomcq_mistakes_are_refused(tmp_path, change, problem):
  items = _mcq(3)
  change(items)
  path = tmp_path / "egomcq.json"
  path.write_text(json.dumps(items))
  with pytest.raises(errors.DataFileError, match=problem) as e:
    annotations.load_records("egomcq", path)
  assert str(path) in str(e.value)
