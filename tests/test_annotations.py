"""Tests for vidjax.data.annotations on small files in the released layouts."""

import json
import pickle
import subprocess
import sys

import numpy as np
import pytest

from vidjax.data import annotations as ann
from vidjax.data.annotations import ClipRecord, ek100

EPIC_HEADER = (
  "narration_id,participant_id,video_id,narration_timestamp,start_timestamp,"
  "stop_timestamp,start_frame,stop_frame,narration,verb,verb_class,noun,"
  "noun_class,all_nouns,all_noun_classes"
)
EPIC_ROWS = [
  "P01_01_0,P01,P01_01,00:00:01.089,00:00:00.14,00:00:03.37,8,202,open door,open,3,door,3,"
  "['door'],[3]",
  "P01_01_1,P01,P01_01,00:00:02.629,00:00:04.37,00:00:06.17,262,370,turn on light,turn-on,6,"
  "light,114,['light'],[114]",
  "P01_01_2,P01,P01_01,00:00:05.349,00:00:06.98,00:00:09.49,418,569,close door,close,4,door,3,"
  "['door'],[3]",
  'P02_109_3,P02,P02_109,00:01:05.100,00:01:04.50,00:01:10.02,3870,6601,"put plate, cup in sink",'
  "put,1,plate,2,\"['plate', 'cup', 'sink']\",\"[2, 13, 27]\"",
  "P02_109_4,P02,P02_109,01:00:00.000,01:00:00.00,01:00:01.50,216000,216090,wash pan,wash,10,"
  "pan,5,['pan'],[5]",
]


def _write(path, lines):
  path.write_text("\n".join(lines) + "\n", encoding="utf-8")
  return path


@pytest.fixture
def epic_csv(tmp_path):
  return _write(tmp_path / "EPIC_100_train.csv", [EPIC_HEADER] + EPIC_ROWS)


def test_parse_timestamp():
  assert ann.parse_timestamp("00:00:03.37") == pytest.approx(3.37)
  assert ann.parse_timestamp("01:02:03.5") == pytest.approx(3723.5)
  assert ann.parse_timestamp("00:00:01.089") == pytest.approx(1.089)
  with pytest.raises(
    ValueError, match=r"x.csv:7: stop_timestamp '00:01:xx' is not HH:MM:SS.ff"
  ):
    ann.parse_timestamp("00:01:xx", "x.csv:7", "stop_timestamp")


def test_ek100_cls_records_and_labels(epic_csv):
  action_map = ann.ek100_action_map(epic_csv)
  records = ann.load_ek100_cls(epic_csv, action_map=action_map)
  assert len(records) == 5
  r = records[0]
  assert (r.video_id, r.text) == ("P01_01", "open door")
  assert (r.start, r.end) == pytest.approx((0.14, 3.37))
  assert (
    r.extra["narration_id"] == "P01_01_0" and r.extra["participant_id"] == "P01"
  )
  assert (r.extra["verb_class"], r.extra["noun_class"]) == (3, 3)
  assert records[3].text == "put plate, cup in sink"
  assert records[3].extra["all_noun_classes"] == [2, 13, 27]
  assert records[4].start == pytest.approx(3600.0)
  # Action ids: 'verb:noun' strings sorted as strings (LaViLa/AVION).
  keys = sorted(["3:3", "6:114", "4:3", "1:2", "10:5"])
  assert keys == ["10:5", "1:2", "3:3", "4:3", "6:114"]
  assert action_map == {
    (10, 5): 0,
    (1, 2): 1,
    (3, 3): 2,
    (4, 3): 3,
    (6, 114): 4,
  }
  assert [r.label for r in records] == [2, 4, 3, 1, 0]
  verbs = ann.load_ek100_cls(epic_csv, label="verb")
  assert [r.label for r in verbs] == [3, 6, 4, 1, 10]
  nouns = ann.load_records("ek100_cls", epic_csv, label="noun")
  assert [r.label for r in nouns] == [3, 114, 3, 2, 5]


def test_ek100_action_map_unions_files_and_rejects_unknown_pairs(
  tmp_path, epic_csv
):
  new_pair = EPIC_ROWS[0].replace(",3,door,3,", ",3,door,7,")
  val = _write(tmp_path / "EPIC_100_validation.csv", [EPIC_HEADER, new_pair])
  action_map = ann.ek100_action_map([epic_csv, val])
  assert len(action_map) == 6 and (3, 7) in action_map
  with pytest.raises(
    ValueError, match=r"EPIC_100_validation.csv:2: verb/noun pair \(3, 7\)"
  ):
    ann.load_ek100_cls(val, action_map=ann.ek100_action_map(epic_csv))
  with pytest.raises(ValueError, match="needs action_map"):
    ann.load_ek100_cls(val)


def test_ek100_bad_rows_name_file_and_line(tmp_path):
  rows = list(EPIC_ROWS)
  rows[5 - 2] = rows[5 - 2].replace("00:01:10.02", "00:01:xx")
  bad = _write(tmp_path / "ann.csv", [EPIC_HEADER] + rows)
  with pytest.raises(
    ValueError, match=r"ann.csv:5: stop_timestamp '00:01:xx' is not HH:MM:SS.ff"
  ):
    ann.load_ek100_mir(bad)
  rows = [EPIC_ROWS[0].replace(",3,door,3,", ",three,door,3,")]
  with pytest.raises(
    ValueError, match=r"verbs.csv:2: verb_class 'three' is not an integer"
  ):
    ann.load_ek100_cls(
      _write(tmp_path / "verbs.csv", [EPIC_HEADER] + rows), label="verb"
    )
  with pytest.raises(ValueError, match=r"short.csv:1: missing column\(s\)"):
    ann.load_ek100_mir(
      _write(tmp_path / "short.csv", ["narration_id,video_id", "a,b"])
    )


def test_ek100_test_timestamps_load_without_labels(tmp_path):
  header = (
    "narration_id,participant_id,video_id,narration_timestamp,start_timestamp,"
    "stop_timestamp,start_frame,stop_frame"
  )
  path = _write(
    tmp_path / "EPIC_100_test_timestamps.csv",
    [
      header,
      "P01_101_0,P01,P01_101,00:00:02.851,00:00:02.86,00:00:03.87,143,193",
    ],
  )
  (r,) = ann.load_ek100_mir(path)
  assert (r.video_id, r.text, r.label) == ("P01_101", None, None)
  with pytest.raises(ValueError, match="verb_class/noun_class missing"):
    ann.load_ek100_cls(path, label="verb")


def test_ek100_sentence_files_of_both_splits_and_releases(tmp_path):
  train = _write(
    tmp_path / "EPIC_100_retrieval_train_sentence.csv",
    [
      "narration_id,narration,verb_class,noun_classes,verb,nouns",
      "P01_01_0,open door,3,[3],open,['door']",
      'P01_01_1,"put plate, cup in sink",1,"[2, 13]",put,"[\'plate\', \'cup\']"',
    ],
  )
  assert ann.load_ek100_mir_sentences(train) == [
    ("P01_01_0", "open door"),
    ("P01_01_1", "put plate, cup in sink"),
  ]
  old = _write(
    tmp_path / "old_sentence.csv", ["index,sentence", "P01_11_0,take plate"]
  )
  assert ann.load_ek100_mir_sentences(old) == [("P01_11_0", "take plate")]


def test_relevancy_shape_errors_name_both_files(tmp_path):
  matrix = np.zeros((5, 3))
  with pytest.raises(
    ValueError,
    match=r"rel.pkl is 5 x 3 but test.csv has 5 clips and "
    r"test_sentence.csv has 4 captions",
  ):
    ann.check_relevancy_shape(
      matrix, tmp_path / "rel.pkl", 5, "test.csv", 4, "test_sentence.csv"
    )
  with pytest.raises(
    ValueError,
    match=r"rel.pkl is 5 x 3 but test.csv has 5 clips; without a "
    r"sentence file it must be 5 x 5",
  ):
    ann.check_relevancy_shape(
      matrix, tmp_path / "rel.pkl", 5, "test.csv", 5, None
    )
  ann.check_relevancy_shape(
    matrix, "rel.pkl", 5, "test.csv", 3, "test_sentence.csv"
  )


def test_mir_positives_are_the_captions_above_the_threshold():
  relevancy = np.array(
    [[1.0, 0.1, 0.5, 0.0], [0.0, 0.0, 0.0, 0.0], [0.11, 1.0, 0.05, 1.0]]
  )
  positives = ek100.CaptionPositives.from_relevancy(
    relevancy, ["a", "b", "c", "d"]
  )
  rng = np.random.default_rng(0)
  draws = [[positives.draw(i, rng) for _ in range(200)] for i in range(3)]
  assert (
    set(draws[0]) == {"a", "c"}
    and set(draws[1]) == {None}
    and set(draws[2]) == {"a", "b", "d"}
  )
  assert abs(draws[0].count("a") - 100) < 30  # Uniform among the positives.
  again = np.random.default_rng(0)
  assert [positives.draw(0, again) for _ in range(200)] == draws[0]
  wide = ek100.CaptionPositives.from_relevancy(relevancy, "abcd", threshold=0.0)
  assert list(np.diff(wide.offsets)) == [3, 0, 4]
  # Clips with the same positives share one stored set.
  same = ek100.CaptionPositives.from_relevancy(
    relevancy[[0, 2, 0, 1, 2]], "abcd"
  )
  assert list(same.row_of) == [0, 1, 0, 2, 1] and len(same.columns) == 5


def test_ek100_mir_sentences_and_relevancy(tmp_path, epic_csv):
  records = ann.load_records("ek100_mir", epic_csv)
  assert [r.text for r in records][:2] == ["open door", "turn on light"]
  assert all(r.label is None for r in records)
  sentences = _write(
    tmp_path / "EPIC_100_retrieval_test_sentence.csv",
    [
      "narration_id,narration",
      "P01_01_0,open door",
      "P01_01_1,turn on light",
      "P01_01_2,close door",
      'P02_109_3,"put plate, cup in sink"',
      "P02_109_4,wash pan",
    ],
  )
  assert ann.load_ek100_mir_sentences(sentences)[3] == (
    "P02_109_3",
    "put plate, cup in sink",
  )
  relevancy = np.eye(5)
  relevancy[0, 2] = 0.5
  pkl = tmp_path / "caption_relevancy_EPIC_100_retrieval_test.pkl"
  pkl.write_bytes(pickle.dumps(relevancy))
  with pytest.raises(ValueError, match="allow_pickle=True.*convert-relevancy"):
    ann.load_relevancy(pkl)
  np.testing.assert_array_equal(
    ann.load_relevancy(pkl, allow_pickle=True), relevancy
  )
  np.save(tmp_path / "rel.npy", relevancy)
  np.testing.assert_array_equal(
    ann.load_relevancy(tmp_path / "rel.npy"), relevancy
  )
  np.savez(tmp_path / "rel.npz", relevancy=relevancy, other=np.zeros(2))
  np.testing.assert_array_equal(
    ann.load_relevancy(tmp_path / "rel.npz"), relevancy
  )
  # Protocol 2 (Python 2 era) pickles store array bytes through _codecs.encode.
  pkl.write_bytes(pickle.dumps(relevancy.astype(np.float32), protocol=2))
  assert ann.load_relevancy(pkl, allow_pickle=True).dtype == np.float32


class _Evil:
  def __reduce__(self):
    return (print, ("owned",))


def test_pickles_need_opt_in_and_refuse_code(tmp_path):
  path = tmp_path / "ego4d_train.pkl"
  path.write_bytes(pickle.dumps([("vid", 1.0, 2.0, "x"), _Evil()]))
  with pytest.raises(
    ValueError, match="convert-ego4d .*ego4d_train.pkl OUT --allow-pickle"
  ):
    ann.load_ego4d(path)
  with pytest.raises(ValueError, match="refusing to load builtins.print"):
    ann.load_ego4d(path, allow_pickle=True)


UID1, UID2 = (
  "000786a7-3f9d-4fe6-bfb3-045b368f7d44",
  "000a3525-6c98-4650-aaab-be7d2c7b9402",
)
EGO4D = [  # 4-tuples, numpy numbers, and a rephrased list with a trailing score
  (UID1, 12.3, 13.1, "#C C picks a bag of clothes from the floor"),
  (UID2, np.float64(1.5), np.float32(2.5), "C cuts a carrot"),
  (
    UID2,
    3.0,
    4.0,
    ["c opens the tap", "c turns on the tap"],
    np.float32(-0.25),
  ),
]


def test_ego4d_pickle_variants_and_conversion_round_trip(tmp_path):
  src = tmp_path / "ego4d_train.pkl"
  src.write_bytes(pickle.dumps(EGO4D))
  records = ann.load_records("ego4d", src, allow_pickle=True)
  assert records[0] == ClipRecord(
    UID1, 12.3, 13.1, "#C C picks a bag of clothes from the floor"
  )
  assert (records[1].start, records[1].end) == (1.5, 2.5)
  assert records[2].text == "c opens the tap"
  assert records[2].extra == {
    "texts": ["c opens the tap", "c turns on the tap"],
    "score": -0.25,
  }
  dst = tmp_path / "ego4d_train.jsonl"
  result = subprocess.run(
    [
      sys.executable,
      "-m",
      "vidjax.data.annotations",
      "convert-ego4d",
      str(src),
      str(dst),
      "--allow-pickle",
    ],
    capture_output=True,
    text=True,
  )
  assert result.returncode == 0, result.stderr
  assert "wrote 3 records" in result.stdout
  assert ann.load_ego4d(dst) == records == ann.load_jsonl(dst)
  refused = subprocess.run(
    [
      sys.executable,
      "-m",
      "vidjax.data.annotations",
      "convert-ego4d",
      str(src),
      str(tmp_path / "x.jsonl"),
    ],
    capture_output=True,
    text=True,
  )
  assert refused.returncode != 0 and "--allow-pickle" in refused.stderr


def test_convert_relevancy_cli(tmp_path):
  src = tmp_path / "rel.pkl"
  src.write_bytes(pickle.dumps(np.arange(6.0).reshape(2, 3)))
  assert (
    ann.main(
      [
        "convert-relevancy",
        str(src),
        str(tmp_path / "rel.npy"),
        "--allow-pickle",
      ]
    )
    == 0
  )
  np.testing.assert_array_equal(
    ann.load_relevancy(tmp_path / "rel.npy"), np.arange(6.0).reshape(2, 3)
  )


def test_convert_cli_bad_input_exits_2_naming_the_file(tmp_path, capsys):
  (tmp_path / "garbage.pkl").write_bytes(
    b"garbage\n"
  )  # Unpickling: ValueError.
  (tmp_path / "dict.pkl").write_bytes(pickle.dumps({"a": 1}))
  for command, src, problem in (
    ("convert-ego4d", "missing.pkl", "No such file"),
    ("convert-ego4d", "garbage.pkl", "cannot unpickle"),
    ("convert-ego4d", "dict.pkl", "expected a list of tuples"),
    ("convert-relevancy", "dict.pkl", "expected a 2-D numeric matrix"),
  ):
    with pytest.raises(SystemExit) as exit_info:
      ann.main(
        [command, str(tmp_path / src), str(tmp_path / "out"), "--allow-pickle"]
      )
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert src in err and problem in err, err
  assert not (tmp_path / "out").exists()


def test_ego4d_bad_entries_name_the_index(tmp_path):
  path = tmp_path / "bad.pkl"
  path.write_bytes(pickle.dumps([EGO4D[0], ("vid", 5.0, 4.0, "backwards")]))
  with pytest.raises(ValueError, match=r"bad.pkl\[1\]: need 0 <= start <= end"):
    ann.load_ego4d(path, allow_pickle=True)
  path.write_bytes(pickle.dumps([("vid", 1.0, 2.0)]))
  with pytest.raises(ValueError, match=r"bad.pkl\[0\]: expected \(video_uid"):
    ann.load_ego4d(path, allow_pickle=True)


KINETICS = [
  "label,youtube_id,time_start,time_end,split",
  "abseiling,--GkrdYZ9Tc,0,10,train",
  '"air drumming",--nQbRBEz2s,104,114,train',
  "zumba,-0aR1-Q0w1k,9,19,train",
  "abseiling,-3B32lodo2M,59,69,train",
]


def test_kinetics_records_video_ids_and_label_map(tmp_path):
  path = _write(tmp_path / "train.csv", KINETICS)
  records = ann.load_records("kinetics", path)
  assert [r.video_id for r in records] == [
    "--GkrdYZ9Tc_000000_000010",
    "--nQbRBEz2s_000104_000114",
    "-0aR1-Q0w1k_000009_000019",
    "-3B32lodo2M_000059_000069",
  ]
  assert [r.label for r in records] == [0, 1, 2, 0]  # sorted class names
  assert (records[1].start, records[1].end) == (0.0, 10.0)
  assert records[1].extra == {
    "youtube_id": "--nQbRBEz2s",
    "split": "train",
    "label_name": "air drumming",
  }
  untrimmed = ann.load_kinetics(
    path, video_id_format="{youtube_id}", trimmed=False
  )
  r = untrimmed[1]
  assert (r.video_id, r.start, r.end) == ("--nQbRBEz2s", 104.0, 114.0)
  (tmp_path / "classes.txt").write_text("zumba\nair drumming\nabseiling\n")
  records = ann.load_kinetics(path, label_map=tmp_path / "classes.txt")
  assert [r.label for r in records] == [2, 1, 0, 2]
  (tmp_path / "map.json").write_text(
    json.dumps({"abseiling": 7, "air drumming": 8, "zumba": 9})
  )
  records = ann.load_kinetics(path, label_map=str(tmp_path / "map.json"))
  assert [r.label for r in records] == [7, 8, 9, 7]
  with pytest.raises(
    ValueError, match=r"train.csv:4: label 'zumba' is not in the label map"
  ):
    ann.load_kinetics(path, label_map={"abseiling": 0, "air drumming": 1})


def test_kinetics_test_split_without_labels_and_bad_rows(tmp_path):
  path = _write(
    tmp_path / "test.csv",
    ["youtube_id,time_start,time_end,split", "abc,3,13,test"],
  )
  (r,) = ann.load_kinetics(path)
  assert (r.video_id, r.label) == ("abc_000003_000013", None)
  bad = _write(tmp_path / "bad.csv", KINETICS[:3] + ["zumba,xyz,9,nine,train"])
  with pytest.raises(ValueError, match=r"bad.csv:4: start/end"):
    ann.load_kinetics(bad)


def test_kinetics_video_lists_as_avion_ships_them(tmp_path):
  path = _write(
    tmp_path / "k400_320p_train_list.txt",
    [
      "train_320px/0074cdXclLU_000047_000057.mp4 300 104",
      "train_320px/my videos/0083lvylGBs_000165_000175.mp4 250 7",
      "",
    ],
  )
  records = ann.load_records("kinetics_list", path)
  assert [(r.video_id, r.label, r.start) for r in records] == [
    ("0074cdXclLU_000047_000057", 104, 0.0),
    ("0083lvylGBs_000165_000175", 7, 0.0),
  ]
  assert records[0].end == float("inf")  # The whole video.
  assert records[1].extra == {
    "path": "train_320px/my videos/0083lvylGBs_000165_000175.mp4",
    "num_frames": 250,
  }
  _write(path, ["a.mp4 300 104", "b.mp4 three 1"])
  with pytest.raises(
    ValueError, match=r"k400_320p_train_list.txt:2: num_frames 'three'"
  ):
    ann.load_kinetics_list(path)
  _write(path, ["a.mp4 300"])
  with pytest.raises(
    ValueError, match=r'train_list.txt:1: expected "path num_frames label"'
  ):
    ann.load_kinetics_list(path)


LAVILA_REPHRASED = [
  (UID1, 1.0, 2.0, ["c opens the tap", "c turns the tap on", "tap opened"])
]
LAVILA_NARRATED = [
  (UID1, 1.0, 2.0, ["#C C opens a tap", "#C C washes"], [0.31, 0.78]),
  (UID2, 4.0, 5.0, ["#C C cuts a carrot"], [np.float32(0.5)]),
]


def test_lavila_llm_files_concatenated_with_list_narrations(tmp_path):
  paths = [
    tmp_path / "ego4d_train.rephraser.no_punkt_top3.pkl",
    tmp_path / "ego4d_train.narrator_63690737.return_10.pkl",
  ]
  for path, entries in zip(paths, (LAVILA_REPHRASED, LAVILA_NARRATED)):
    path.write_bytes(pickle.dumps(entries))
  records = ann.load_records("ego4d", paths, allow_pickle=True)
  assert len(records) == 3  # In order: the rephraser's, then the narrator's.
  assert records[0].extra == {"texts": LAVILA_REPHRASED[0][3]}
  assert records[1].extra == {
    "texts": ["#C C opens a tap", "#C C washes"],
    "score": [0.31, 0.78],
  }
  assert records[2].extra["score"] == [0.5] and records[2].video_id == UID2
  for path in paths:  # The one-time conversion keeps the lists.
    assert (
      ann.main(
        [
          "convert-ego4d",
          str(path),
          str(path.with_suffix(".jsonl")),
          "--allow-pickle",
        ]
      )
      == 0
    )
  assert (
    ann.load_records("ego4d", [p.with_suffix(".jsonl") for p in paths])
    == records
  )


def test_jsonl_records_and_errors(tmp_path):
  path = _write(
    tmp_path / "clips.jsonl",
    [
      json.dumps(
        {
          "video_id": "v1",
          "start": 0,
          "end": 2.5,
          "text": "a cat",
          "source": "x",
        }
      ),
      "",
      json.dumps({"video_id": "v2", "start": 1, "end": 3, "label": 4}),
    ],
  )
  records = ann.load_records("jsonl", path)
  assert records == [
    ClipRecord("v1", 0.0, 2.5, "a cat", None, {"source": "x"}),
    ClipRecord("v2", 1.0, 3.0, None, 4),
  ]
  out = tmp_path / "copy.jsonl"
  assert ann.write_jsonl(records, out) == 2
  assert ann.load_jsonl(out) == records
  good = json.dumps({"video_id": "v1", "start": 0, "end": 1})
  _write(path, [good, '{"video_id": "v2", "start": 0,'])
  with pytest.raises(ValueError, match=r"clips.jsonl:2: not JSON"):
    ann.load_jsonl(path)
  _write(
    path, [json.dumps({"video_id": "v1", "start": 0, "end": 1, "label": "cat"})]
  )
  with pytest.raises(
    ValueError, match=r"clips.jsonl:1: label 'cat' is not an integer"
  ):
    ann.load_jsonl(path)
  _write(path, [good, json.dumps({"video_id": "v1", "end": 2.5})])
  with pytest.raises(ValueError, match=r"clips.jsonl:2: no 'start': every"):
    ann.load_jsonl(path)  # The field named, not "None/2.5 are not numbers".
  # Saved by a Windows editor: a byte-order mark and CRLF line ends.
  path.write_bytes(b"\xef\xbb\xbf" + (good + "\r\n").encode() * 2)
  assert [r.video_id for r in ann.load_jsonl(path)] == ["v1", "v1"]


def test_records_are_hashable_and_dispatcher_rejects_unknown_kinds(tmp_path):
  assert (
    len(
      {
        ClipRecord("v", 0, 1, extra={"a": 1}),
        ClipRecord("v", 0, 1, extra={"a": 1}),
      }
    )
    == 1
  )
  with pytest.raises(ValueError, match="unknown annotation kind 'epic'"):
    ann.load_records("epic", tmp_path / "x")
