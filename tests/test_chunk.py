"""The chunker: constant-rate grid, sizes, rotation, failures, resume, CLI."""

import fractions
import json
import os
from pathlib import Path

import av
import numpy as np
import pytest

import video_fixtures as vf
from vidjax.base import errors
from vidjax.data import chunk, video
from vidjax.data.chunk import cli, store


def numbers(clip):
  return [vf.frame_number(frame) for frame in clip]


def test_manifest_and_chunk_files(tmp_path):
  vf.write_numbered_video(tmp_path / "a.mp4", 35, fps=10, width=200, height=120)
  opts = chunk.ChunkOptions(chunk_seconds=1.5, short_side=60)
  chunk.chunk_videos(tmp_path / "a.mp4", tmp_path / "out", opts, progress=False)
  (entry,) = chunk.read_manifest(tmp_path / "out").values()
  assert entry["video_id"] == "a" and entry["fps"] == 10
  assert entry["source"] == str((tmp_path / "a.mp4").absolute())
  assert entry["encoding"] == chunk.encoding(opts)
  assert entry["encoding"]["gop"] == 32 and entry["encoding"]["bframes"] == 7
  assert entry["num_frames"] == 35 and entry["chunk_seconds"] == 1.5
  assert (entry["width"], entry["height"]) == (100, 60)
  names = sorted(p.name for p in (tmp_path / "out" / "a").iterdir())
  assert names == ["0.mp4", "1.5.mp4", "3.mp4"]  # 15 + 15 + 5 frames.
  with av.open(str(tmp_path / "out" / "a" / "3.mp4")) as c:
    s = c.streams.video[0]
    assert (s.width, s.height, s.codec_context.pix_fmt) == (100, 60, "yuv420p")
    assert sum(1 for _ in c.decode(s)) == 5


def test_odd_rates_and_fractional_chunks():
  fps = fractions.Fraction(30000, 1001)
  starts = chunk.chunk_start_frames(2000, fps, 15)
  assert starts[:3] == [0, 450, 900]  # ceil(k * 15 * 29.97)
  assert chunk.chunk_name(3, 0.5) == "1.5.mp4"
  assert chunk.chunk_name(3, 15) == "45.mp4"


def test_keep_size_and_even_dimensions():
  assert chunk.output_size(201, 99, 0) == (200, 98)
  assert chunk.output_size(1920, 1080, 288) == (512, 288)
  assert chunk.output_size(1080, 1920, 288) == (288, 512)


def test_resampled_rate_picks_nearest_source_frames(tmp_path):
  vf.write_numbered_video(tmp_path / "v.mp4", 40, fps=20)
  opts = chunk.ChunkOptions(chunk_seconds=1, short_side=0, fps=10)
  chunk.chunk_videos(tmp_path / "v.mp4", tmp_path / "out", opts, progress=False)
  clip = video.read_clip(tmp_path / "out", "v", range(20))
  assert numbers(clip) == list(range(0, 40, 2))


def test_variable_frame_rate_placed_on_grid_by_timestamp(tmp_path):
  rng = np.random.default_rng(1)
  times = np.concatenate([[0], np.cumsum(rng.uniform(0.021, 0.07, 59))])
  times_ms = np.round(times * 1000).astype(int)  # The fixture stores ms.
  vf.write_numbered_video(tmp_path / "vfr.mp4", 60, times=times)
  opts = chunk.ChunkOptions(chunk_seconds=0.5, short_side=0, fps=25)
  chunk.chunk_videos(
    tmp_path / "vfr.mp4", tmp_path / "out", opts, progress=False
  )
  info = video.video_info(tmp_path / "out", "vfr")
  grid_ms = np.arange(info.num_frames) * 40
  # Nearest source frame; ties go to the earlier one (argmin's first).
  nearest = np.abs(times_ms[None, :] - grid_ms[:, None]).argmin(axis=1)
  clip = video.read_clip(tmp_path / "out", "vfr", range(info.num_frames))
  assert numbers(clip) == nearest.tolist()
  assert info.num_frames == times_ms[-1] // 40 + 1


@pytest.mark.parametrize("rotation", [90, -90, 180])
def test_rotated_input_comes_out_upright(tmp_path, rotation):
  upright = np.zeros((64, 96, 3), np.uint8)
  upright[:16, :16] = 255  # Marker in the top-left corner.
  # Store the picture turned so that the display matrix turns it back.
  stored = np.ascontiguousarray(np.rot90(upright, -rotation // 90))
  vf.write_video(tmp_path / "r.mp4", [stored] * 3, rotation=rotation)
  chunk.chunk_videos(
    tmp_path / "r.mp4",
    tmp_path / "out",
    chunk.ChunkOptions(short_side=0),
    progress=False,
  )
  entry = chunk.read_manifest(tmp_path / "out")["r"]
  assert (entry["width"], entry["height"]) == (96, 64)
  frame = video.read_clip(tmp_path / "out", "r", [1])[0].mean(axis=2)
  assert frame[:16, :16].mean() > 200 and frame[-16:, -16:].mean() < 50
  assert frame[:16, -16:].mean() < 50 and frame[-16:, :16].mean() < 50


def _bad_inputs(folder):
  vf.write_numbered_video(folder / "good1.mp4", 12, fps=10)
  vf.write_numbered_video(folder / "good2.mp4", 12, fps=10)
  vf.write_numbered_video(folder / "full.mp4", 300, fps=30)
  data = (folder / "full.mp4").read_bytes()
  (folder / "truncated.mp4").write_bytes(data[: len(data) // 2])
  (folder / "full.mp4").unlink()
  (folder / "empty.mp4").write_bytes(b"")
  (folder / "notes.mp4").write_text("not a video\n" * 50)
  vf.write_audio_only(folder / "audio.mp4")


def test_failures_are_reported_and_listed_and_others_go_on(tmp_path, capsys):
  src = tmp_path / "src"
  src.mkdir()
  _bad_inputs(src)
  summary = chunk.chunk_videos(src, tmp_path / "out", progress=False)
  assert summary["done"] == 2
  failed = {f["video_id"]: f["error"] for f in summary["failed"]}
  assert set(failed) == {"truncated", "empty", "notes", "audio"}
  assert "audio-only" in failed["audio"]
  assert failed["empty"] == f"{src / 'empty.mp4'}: empty file (0 bytes)"
  assert failed["notes"] == (
    f"{src / 'notes.mp4'}: not a video (no format FFmpeg knows)"
  )
  assert all(str(src) in error for error in failed.values())
  listed = [
    json.loads(line)
    for line in (tmp_path / "out" / "errors.jsonl").read_text().splitlines()
  ]
  assert {f["video_id"] for f in listed} == set(failed)
  assert set(chunk.read_manifest(tmp_path / "out")) == {"good1", "good2"}
  assert not (tmp_path / "out" / "audio").exists()
  err = capsys.readouterr().err
  assert err.count("FAILED") == err.count("failed, tried again later") == 4


def test_interrupted_run_resumes_cleanly(tmp_path):
  src = tmp_path / "src"
  src.mkdir()
  for name in "abc":
    vf.write_numbered_video(src / f"{name}.mp4", 25, fps=10)
  out = tmp_path / "out"
  opts = chunk.ChunkOptions(chunk_seconds=1, short_side=0)
  chunk.chunk_videos(src, out, opts, progress=False)
  # Simulate a kill while "c" was being written: its manifest line is cut
  # short, one chunk is finished, one is half-written under its temporary
  # name. Readers meanwhile skip the torn line.
  lines = (out / "manifest.jsonl").read_text().splitlines()
  kept = [line for line in lines if json.loads(line)["video_id"] != "c"]
  torn = next(line for line in lines if json.loads(line)["video_id"] == "c")[
    :30
  ]
  (out / "manifest.jsonl").write_text("\n".join(kept) + "\n" + torn)
  assert sorted(chunk.read_manifest(out)) == ["a", "b"]
  (out / "c" / "2.mp4").unlink()
  (out / "c" / "2.tmp.mp4").write_bytes(b"\x00" * 100)
  summary = chunk.chunk_videos(src, out, opts, progress=False)
  assert (summary["done"], summary["skipped"]) == (1, 2)
  entries = chunk.read_manifest(out)
  assert sorted(entries) == ["a", "b", "c"]
  assert len((out / "manifest.jsonl").read_text().splitlines()) == 3
  assert sorted(p.name for p in (out / "c").iterdir()) == [
    "0.mp4",
    "1.mp4",
    "2.mp4",
  ]
  assert numbers(video.read_clip(out, "c", [3, 14, 24])) == [3, 14, 24]
  again = chunk.chunk_videos(src, out, opts, progress=False)
  assert (again["done"], again["skipped"]) == (0, 3)


def test_cli_options_all_have_help_and_show_their_default(capsys):
  with pytest.raises(SystemExit):
    cli.main(["--help"])
  out = capsys.readouterr().out
  text = " ".join(out[out.index("--help") :].split())  # The options' list.
  options = [
    "--chunk-seconds",
    "--short-side",
    "--fps",
    "--gop",
    "--bframes",
    "--crf",
    "--preset",
    "--tune",
    "--x264-params",
    "--workers",
  ]
  for option, after in zip(options, options[1:] + ["$"]):
    entry = text[text.index(option + " ") :]
    entry = entry[: entry.index(after)] if after in entry else entry
    assert "(default:" in entry, entry


def test_chunks_of_no_length_are_refused(tmp_path, capsys):
  with pytest.raises(ValueError, match="chunk_seconds"):
    chunk.ChunkOptions(chunk_seconds=0)
  for seconds in ("0", "-15", "nan"):
    with pytest.raises(SystemExit) as exit_info:
      cli.main(
        [str(tmp_path), str(tmp_path / "out"), "--chunk-seconds", seconds]
      )
    assert exit_info.value.code == 2
    assert "--chunk-seconds) must be a positive number, not" in (
      capsys.readouterr().err
    )
  assert not (tmp_path / "out").exists()


def test_cli_with_list_file_and_workers(tmp_path, capsys):
  for name in "xy":
    vf.write_numbered_video(tmp_path / f"{name}.mp4", 15, fps=10)
  (tmp_path / "list.txt").write_text(
    f"# videos\n{tmp_path / 'x.mp4'}\n\n{tmp_path / 'y.mp4'}\n"
  )
  rc = cli.main(
    [
      str(tmp_path / "list.txt"),
      str(tmp_path / "out"),
      "--chunk-seconds",
      "1",
      "--short-side",
      "48",
      "--workers",
      "2",
      "--gop",
      "4",
    ]
  )
  assert rc == 0
  assert "chunked 2, already done 0, failed 0" in capsys.readouterr().out
  assert numbers(video.read_clip(tmp_path / "out", "y", [0, 7, 14])) == [
    0,
    7,
    14,
  ]


class _KillsItsWorker(type(Path())):
  """A source path whose unpickling in a worker process kills it at once, as
  an FFmpeg segfault or the out-of-memory killer would."""

  def __reduce__(self):
    return os._exit, (1,)


def test_a_worker_that_dies_fails_only_its_video(tmp_path, monkeypatch, capsys):
  vf.write_numbered_video(tmp_path / "good.mp4", 5, fps=10, width=64, height=48)
  monkeypatch.setattr(
    store,
    "find_videos",
    lambda src: [
      tmp_path / "good.mp4",
      _KillsItsWorker(tmp_path / "crash.mp4"),
    ],
  )
  summary = chunk.chunk_videos(
    tmp_path, tmp_path / "out", workers=2, progress=False
  )
  assert [f["video_id"] for f in summary["failed"]] == ["crash"]
  assert "worker process chunking it died" in summary["failed"][0]["error"]
  assert set(chunk.read_manifest(tmp_path / "out")) == {"good"}
  listed = (tmp_path / "out" / "errors.jsonl").read_text().splitlines()
  assert [json.loads(line)["video_id"] for line in listed] == ["crash"]
  assert "FAILED" in capsys.readouterr().err


def test_duplicate_video_ids_are_refused(tmp_path, capsys):
  for sub in ("p", "q"):
    (tmp_path / sub).mkdir()
    vf.write_numbered_video(tmp_path / sub / "same.mp4", 5, fps=10)
  with pytest.raises(errors.DataError, match="same"):
    chunk.chunk_videos(tmp_path, tmp_path / "out", progress=False)
  with pytest.raises(SystemExit) as exit_info:
    cli.main([str(tmp_path), str(tmp_path / "out")])
  assert exit_info.value.code == 2
  assert "hint: rename one" in capsys.readouterr().err


def test_cli_bad_input_exits_2_naming_the_file(tmp_path, capsys):
  (tmp_path / "src").mkdir()
  (tmp_path / "out").mkdir()  # A line that is no manifest line.
  (tmp_path / "out" / "manifest.jsonl").write_text('{"video_id": "a"}\n{"vi\n')
  (tmp_path / "one.txt").write_text("a.mp4\n")
  for src, dst, message in (
    ("nope", "o", "nope: no such file or folder"),
    ("list.txt", "o", "list.txt: no such file or folder"),
    ("src", "o", "src: no videos there"),  # An empty folder.
    ("one.txt", "out", "manifest.jsonl:2: not JSON"),
  ):
    with pytest.raises(SystemExit) as exit_info:
      cli.main([str(tmp_path / src), str(tmp_path / dst)])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
  assert not (tmp_path / "o").exists()  # Refused before writing anything.
  (tmp_path / "empty.mp4").write_bytes(b"")  # Tried, and said plainly.
  assert cli.main([str(tmp_path / "empty.mp4"), str(tmp_path / "o")]) == 1
  assert f"FAILED {tmp_path / 'empty.mp4'}: empty file (0 bytes)\n" in (
    capsys.readouterr().err
  )


def test_millisecond_timestamps_keep_every_frame(tmp_path):
  # MKV stores milliseconds: at 29.97 fps frame 44 is stamped 1468 ms, just
  # before its grid time 1468.13 ms.
  fps = fractions.Fraction(30000, 1001)
  vf.write_numbered_video(tmp_path / "ms.mkv", 45, fps=fps)
  with av.open(str(tmp_path / "ms.mkv")) as c:
    assert c.streams.video[0].time_base == fractions.Fraction(1, 1000)
  chunk.chunk_videos(
    tmp_path / "ms.mkv",
    tmp_path / "out",
    chunk.ChunkOptions(chunk_seconds=1, short_side=0),
    progress=False,
  )
  info = video.video_info(tmp_path / "out", "ms")
  assert info.frame_rate == fps and info.num_frames == 45
  assert numbers(video.read_clip(tmp_path / "out", "ms", range(45))) == list(
    range(45)
  )


@pytest.mark.parametrize("full_range", [False, True])
def test_bt709_colours_come_back_as_in_the_source(tmp_path, full_range):
  # HD cameras tag BT.709 (phones often full range too); the chunks must not
  # shift colours: red and green halves read back as the source decodes.
  image = np.zeros((96, 160, 3), np.uint8)
  image[:, :80], image[:, 80:] = (220, 30, 30), (30, 200, 60)
  reformatter = av.video.reformatter
  with av.open(str(tmp_path / "hd.mp4"), "w") as out:
    stream = out.add_stream("libx264", rate=25)
    stream.width, stream.height, stream.pix_fmt = 160, 96, "yuv420p"
    stream.codec_context.colorspace = reformatter.Colorspace.ITU709
    stream.codec_context.color_range = 2 if full_range else 1
    stream.codec_context.options = {
      "crf": "10",
      "x264-params": (
        f"colormatrix=bt709:fullrange={'on' if full_range else 'off'}"
      ),
    }
    for k in range(5):
      frame = av.VideoFrame.from_ndarray(image, format="rgb24").reformat(
        format="yuv420p",
        dst_colorspace=reformatter.Colorspace.ITU709,
        dst_color_range=reformatter.ColorRange.JPEG
        if full_range
        else reformatter.ColorRange.MPEG,
      )
      frame.pts = k
      out.mux(stream.encode(frame))
    out.mux(stream.encode(None))
  with av.open(str(tmp_path / "hd.mp4")) as c:
    frame = next(c.decode(video=0))
    assert frame.colorspace == 1 and frame.color_range == (
      2 if full_range else 1
    )
    want = frame.to_ndarray(format="rgb24")
  chunk.chunk_videos(
    tmp_path / "hd.mp4",
    tmp_path / "out",
    chunk.ChunkOptions(short_side=0),
    progress=False,
  )
  got = video.read_clip(tmp_path / "out", "hd", [2])[0]
  for x in (40, 120):
    np.testing.assert_allclose(
      got[40:56, x - 8 : x + 8].mean(axis=(0, 1)),
      want[40:56, x - 8 : x + 8].mean(axis=(0, 1)),
      atol=5,
    )
