"""TensorBoard scalar event files, written with the standard library.

An events file is a sequence of TFRecords, each holding one serialized
`Event` protocol buffer. Scalars need only these fields, encoded by hand
(no protobuf, nor tensorboardX, whose import pulls in torch: seconds at
every start):

  Event   {double wall_time = 1; int64 step = 2;
           oneof {string file_version = 3; Summary summary = 5; ...}}
  Summary {repeated Value value = 1;}
  Value   {string tag = 1; oneof {float simple_value = 2; ...}}
"""

from __future__ import annotations

from collections.abc import Mapping
import os
import socket
import struct
import time

import numpy as np


def _crc32c_of_byte(crc: int) -> int:
  for _ in range(8):  # Castagnoli, reflected polynomial.
    crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
  return crc


_CRC32C_TABLE = [_crc32c_of_byte(byte) for byte in range(256)]


def crc32c(data: bytes) -> int:
  """CRC-32C of `data` (records are small: a table lookup per byte will do)."""
  crc = 0xFFFFFFFF
  for byte in data:
    crc = _CRC32C_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
  return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
  """The CRC as TFRecord stores it (masked: CRCs of CRCs are weak)."""
  crc = crc32c(data)
  return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecord(data: bytes) -> bytes:
  """One TFRecord: length, its masked CRC, the data, the data's masked CRC."""
  length = struct.pack("<Q", len(data))
  return (
    length
    + struct.pack("<I", masked_crc32c(length))
    + data
    + struct.pack("<I", masked_crc32c(data))
  )


def _varint(value: int) -> bytes:
  value &= 0xFFFFFFFFFFFFFFFF  # A negative int64 is sent as 10 bytes.
  out = bytearray()
  while value > 0x7F:
    out.append(value & 0x7F | 0x80)
    value >>= 7
  out.append(value)
  return bytes(out)


def _bytes_field(number: int, payload: bytes) -> bytes:
  return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def event(
  wall_time: float,
  step: int = 0,
  *,
  file_version: str | None = None,
  scalars: Mapping[str, float] | None = None,
) -> bytes:
  """A serialized `Event`: a file version, or scalars as `simple_value`s.

  Fields come in field-number order and a zero step is left out, as the
  protobuf library writes them. Values become float32 (TensorBoard's type).
  """
  out = b"\x09" + struct.pack("<d", wall_time)  # Field 1, 64-bit.
  if step:
    out += b"\x10" + _varint(int(step))  # Field 2, varint.
  if file_version is not None:
    out += _bytes_field(3, file_version.encode())
  if scalars:
    with np.errstate(over="ignore"):  # Beyond float32's range: inf.
      values = [
        _bytes_field(1, tag.encode())
        + b"\x15"  # Field 2, 32-bit.
        + np.array(value, "<f4").tobytes()
        for tag, value in scalars.items()
      ]
    out += _bytes_field(5, b"".join(_bytes_field(1, v) for v in values))
  return out


class EventWriter:
  """Writes scalars to `LOGDIR/events.out.tfevents.<time>.<hostname>`.

    with EventWriter(workdir) as events:
      events.scalars(step, {"train/loss": 0.7, "train/lr": 1e-4})

  Each call is one `Event` holding all its values, flushed at once so a
  killed run keeps what it logged.
  """

  def __init__(self, logdir):
    os.makedirs(logdir, exist_ok=True)
    now = time.time()
    self.path = os.path.join(
      logdir, f"events.out.tfevents.{int(now)}.{socket.gethostname()}"
    )
    # Appended to: a second writer started in the same second keeps the
    # first one's events (TensorBoard reads both runs' records in order).
    self._file = open(self.path, "ab")
    self._write(event(now, file_version="brain.Event:2"))

  def _write(self, data: bytes):
    self._file.write(tfrecord(data))
    self.flush()

  def scalars(
    self,
    step: int,
    values: Mapping[str, float],
    *,
    wall_time: float | None = None,
  ):
    """Writes `values` (tag -> number) at `step`; wall time defaults to now."""
    if values:
      self._write(
        event(
          time.time() if wall_time is None else wall_time, step, scalars=values
        )
      )

  def flush(self):
    self._file.flush()

  def close(self):
    self._file.close()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()
