"""Tests for vidjax.report.tfevents: CRC, records as tensorboardX writes them."""

import math
import re
import socket
import struct
import time

import numpy as np
import pytest

from vidjax.report import monitor, tfevents


def read_records(path) -> list[bytes]:
  """The records of a TFRecord file; both masked CRCs of each checked."""
  data, pos, records = path.read_bytes(), 0, []
  while pos < len(data):
    length = data[pos : pos + 8]
    body = data[pos + 12 : pos + 12 + struct.unpack("<Q", length)[0]]
    end = pos + 12 + len(body)
    crcs = struct.unpack("<II", data[pos + 8 : pos + 12] + data[end : end + 4])
    assert crcs == (
      tfevents.masked_crc32c(length),
      tfevents.masked_crc32c(body),
    )
    records.append(body)
    pos = end + 4
  return records


def proto_fields(data: bytes) -> list[tuple[int, int | bytes]]:
  """Protobuf wire format -> [(field number, int or raw bytes)]."""
  fields, pos = [], 0

  def varint():
    nonlocal pos
    value = shift = 0
    while True:
      byte, pos = data[pos], pos + 1
      value, shift = value | (byte & 0x7F) << shift, shift + 7
      if byte < 0x80:
        return value

  while pos < len(data):
    key = varint()
    number, wire_type = key >> 3, key & 7
    if wire_type == 0:
      fields.append((number, varint()))
      continue
    size = varint() if wire_type == 2 else {1: 8, 5: 4}[wire_type]
    fields.append((number, data[pos : pos + size]))
    pos += size
  return fields


def decode_event(data: bytes):
  """Event bytes -> (wall_time, step, file_version, [(tag, value)])."""
  fields = dict(proto_fields(data))
  assert set(fields) <= {1, 2, 3, 5}, fields
  scalars = []
  for number, value in proto_fields(fields.get(5, b"")):
    tag_and_value = dict(proto_fields(value))
    assert number == 1 and set(tag_and_value) == {1, 2}
    scalars.append(
      (tag_and_value[1].decode(), struct.unpack("<f", tag_and_value[2])[0])
    )
  version = fields[3].decode() if 3 in fields else None
  return (struct.unpack("<d", fields[1])[0], fields.get(2, 0), version, scalars)


def test_crc32c_known_answer():
  assert tfevents.crc32c(b"123456789") == 0xE3069283
  assert tfevents.crc32c(b"") == 0


# Values as a run logs them: a zero step, int metrics, float32 rounding, a
# zero, a number beyond float32 (inf), several numbers at one step.
STEPS = [
  (0, {"train/loss": 2.5}),
  (1, {"train/loss": 0.1, "train/lr": 3e-4, "data/skipped": 3}),
  (300, {"eval/ek100_mir/mAP_avg": 0.0}),
  (123456, {"perf/clips_per_s": 1e39, "perf/mfu": -1.25}),
]


def test_same_events_as_tensorboardx(tmp_path):
  tensorboardx = pytest.importorskip("tensorboardX")
  start = time.time()
  with tensorboardx.SummaryWriter(str(tmp_path / "x")) as writer:
    for step, values in STEPS:
      for tag, value in values.items():
        writer.add_scalar(tag, value, step, walltime=1.7e9 + step / 7)
  with tfevents.EventWriter(str(tmp_path / "ours")) as writer:
    for step, values in STEPS:
      writer.scalars(step, values, wall_time=1.7e9 + step / 7)

  name = r"events\.out\.tfevents\.\d{10}\." + re.escape(socket.gethostname())
  files = [list((tmp_path / d).iterdir()) for d in ("x", "ours")]
  assert [len(f) for f in files] == [1, 1]
  assert all(re.fullmatch(name, f[0].name) for f in files), files
  theirs, ours = (read_records(f[0]) for f in files)

  # First the file version, stamped now.
  for record in theirs[0], ours[0]:
    wall_time, step, version, scalars = decode_event(record)
    assert (step, version, scalars) == (0, "brain.Event:2", [])
    assert start <= wall_time <= time.time()
  assert ours[0][9:] == theirs[0][9:]  # All but the wall time.

  # tensorboardX writes one Event per value, ours one per step: the same
  # (wall time, step, tag, float32 value) rows; byte for byte where a
  # step has one value.
  assert len(ours) == 1 + len(STEPS) and len(theirs) == 1 + 7

  def rows(records):
    return [
      (w, s, tag, v)
      for w, s, _, scalars in map(decode_event, records)
      for tag, v in scalars
    ]

  assert rows(ours[1:]) == rows(theirs[1:])
  assert [v for *_, v in rows(ours[1:])] == [
    2.5,
    np.float32(0.1),
    np.float32(3e-4),
    3.0,
    0.0,
    math.inf,
    -1.25,
  ]
  assert ours[1] == theirs[1] and ours[3] == theirs[5]


def test_metric_writer_writes_numbers_as_events(tmp_path):
  with monitor.MetricWriter(tmp_path) as writer:
    writer.write(
      1,
      {
        "train/loss": np.float32(0.5),
        "data/skipped": np.int64(3),
        "eval/name": "ek100",
        "train/nan": float("nan"),
        "train/flag": True,
      },
    )
    writer.write(2, {"eval/name": "ek100"})  # No numbers: no event.
  events = [p for p in tmp_path.iterdir() if p.name != "metrics.jsonl"]
  assert [p.name[:20] for p in events] == ["events.out.tfevents."]
  records = [decode_event(r) for r in read_records(events[0])]
  assert [r[1:] for r in records] == [
    (0, "brain.Event:2", []),
    (1, None, [("data/skipped", 3.0), ("train/loss", 0.5)]),
  ]

  with monitor.MetricWriter(tmp_path / "jsonl", tensorboard=False) as writer:
    writer.write(1, {"train/loss": 0.5})
  assert [p.name for p in (tmp_path / "jsonl").iterdir()] == ["metrics.jsonl"]
