"""The chunker in shards: side by side as one, killed and rerun, locked,
reported (--status) and merged (--merge)."""

import json
import os
from pathlib import Path
import signal
import subprocess
import sys

import av
import pytest

import limits
import video_fixtures as vf
from vidjax.data import chunk, video
from vidjax.data.chunk import cli, manifest, parts, store

# mbtree=0: x264 then codes the same frames the same way every time (with
# MB-tree and the chunker's B-frames it does not: BENCHMARKS.md, chunking
# a corpus), so that two stores of the same videos are equal byte for byte.
OPTS = ["--chunk-seconds", "1", "--short-side", "64", "--gop", "8"]
OPTS += ["--x264-params", "mbtree=0"]


def _chunker(src, dst, *args):
  return subprocess.Popen(
    [sys.executable, "-m", "vidjax.data.chunk", str(src), str(dst), *args],
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )


def _store_files(dst: Path) -> dict[str, bytes]:
  """Every chunk of a store, by its path there."""
  return {
    p.relative_to(dst).as_posix(): p.read_bytes()
    for p in sorted(dst.rglob("*.mp4"))
  }


def _check_whole(dst: Path) -> dict[str, dict]:
  """Every manifest line whole and once, every listed chunk decodes to its
  frames, nothing half-written left; returns the entries."""
  entries = {}
  for path in manifest.manifest_files(dst):
    text = Path(path).read_text()
    assert text.endswith("\n"), f"{path}: a torn last line"
    for line in text.splitlines():
      entry = json.loads(line)
      assert entry["video_id"] not in entries, f"listed twice: {line}"
      entries[entry["video_id"]] = entry
  for vid, entry in entries.items():
    info = video.video_info(dst, vid)
    names = sorted(p.name for p in (dst / vid).iterdir())
    want = [
      chunk.chunk_name(k, info.chunk_seconds) for k in range(info.num_chunks)
    ]
    assert names == sorted(want), vid
    frames = 0
    for name in names:
      with av.open(str(dst / vid / name)) as c:
        frames += sum(1 for _ in c.decode(video=0))
    assert frames == entry["num_frames"], vid
  assert not list(dst.rglob("*.tmp*")), list(dst.rglob("*.tmp*"))
  return entries


def test_three_shards_side_by_side_make_the_one_store(tmp_path, capsys):
  src = tmp_path / "src"
  src.mkdir()
  for name, frames in (("a", 12), ("b", 31), ("c", 22), ("d", 17)):
    vf.write_numbered_video(src / f"{name}.mp4", frames, fps=10)
  vf.real_footage(src / "bikes.mp4", "bikes.mp4", num_frames=40)
  vf.real_footage(src / "bunny.mp4", "bigbuckbunny.mp4", num_frames=30)
  (src / "bad.mp4").write_text("not a video\n" * 40)
  one, three = tmp_path / "one", tmp_path / "three"
  assert cli.main([str(src), str(one), *OPTS]) == 1  # bad.mp4 failed.
  capsys.readouterr()
  runs = [_chunker(src, three, *OPTS, "--shard", f"{k}/3") for k in (1, 2, 3)]
  outputs = [limits.communicate(run, "a shard's end") for run in runs]
  codes = [run.returncode for run in runs]
  assert sorted(codes) == [0, 0, 1], outputs  # One shard has bad.mp4.
  sizes = {v: store.source_bytes(p) for v, p in store.sources(src).items()}
  shards = store.split(sizes, 3)
  assert set().union(*shards) == set(sizes) and all(shards)
  # The same chunks, byte for byte, and the same manifest rows.
  assert _store_files(three) == _store_files(one)
  assert _check_whole(three) == _check_whole(one)
  for k, ids in enumerate(shards, 1):
    part = three / "shards" / f"{k}-of-3" / "manifest.jsonl"
    assert {json.loads(line)["video_id"] for line in part.open()} == ids - {
      "bad"
    }
  assert video.manifest(three) == video.manifest(one)
  # --status: every shard, the failure named.
  assert cli.main(["--status", str(three)]) == 0
  status = capsys.readouterr().out
  assert status.count("finished") == 3, status
  assert "all: 6/7 videos (86%)" in status, status
  assert f"{src / 'bad.mp4'}: not a video" in status, status
  # --merge refuses a gap and a duplicate, then makes the one manifest.
  part2 = three / "shards" / "2-of-3"
  part2.rename(tmp_path / "away")
  with pytest.raises(SystemExit) as exit_info:
    cli.main(["--merge", str(three)])
  assert exit_info.value.code == 2
  assert "shard 2/3 (not started)" in capsys.readouterr().err
  (tmp_path / "away").rename(part2)
  first = (three / "shards" / "1-of-3" / "manifest.jsonl").read_text()
  with open(part2 / "manifest.jsonl", "a") as f:
    f.write(first.splitlines()[0] + "\n")
  with pytest.raises(SystemExit) as exit_info:
    cli.main(["--merge", str(three)])
  assert "listed twice" in capsys.readouterr().err
  lines = (part2 / "manifest.jsonl").read_text().splitlines()
  # Its last line lost: the shard's own count says so, nothing is merged.
  (part2 / "manifest.jsonl").write_text("\n".join(lines[:-2]) + "\n")
  with pytest.raises(SystemExit) as exit_info:
    cli.main(["--merge", str(three)])
  assert exit_info.value.code == 2 and (three / "shards").exists()
  assert f"shard 2/3 chunked {len(lines) - 1} videos but its manifest" in (
    capsys.readouterr().err
  )
  (part2 / "manifest.jsonl").write_text("\n".join(lines[:-1]) + "\n")
  assert cli.main(["--merge", str(three)]) == 0
  assert not (three / "shards").exists()
  assert _check_whole(three) == _check_whole(one)
  assert [
    json.loads(x)["video_id"] for x in (three / "errors.jsonl").open()
  ] == ["bad"]


def test_a_shard_killed_mid_video_resumes_and_a_second_is_refused(tmp_path):
  src, dst = tmp_path / "src", tmp_path / "dst"
  src.mkdir()
  vf.write_numbered_video(src / "a.mp4", 15, fps=10)
  for name in ("long1", "long2"):
    vf.write_numbered_video(
      src / f"{name}.mp4", 1000, fps=25, width=96, height=64
    )
  sizes = {v: store.source_bytes(p) for v, p in store.sources(src).items()}
  k = next(k for k, ids in enumerate(store.split(sizes, 2), 1) if "a" in ids)
  (long,) = store.split(sizes, 2)[k - 1] - {"a"}
  part = manifest.part_dir(dst, (k, 2))
  args = ["--chunk-seconds", "0.4", "--short-side", "0", "--shard", f"{k}/2"]
  first = _chunker(src, dst, *args)
  limits.wait_for(  # Mid-video: a chunk written.
    lambda: (dst / long / "0.mp4").exists() or first.poll() is not None,
    "the first chunk of the long video",
    poll_s=0.005,
  )
  assert first.poll() is None
  os.kill(first.pid, signal.SIGSTOP)
  try:
    listed = (part / "manifest.jsonl").read_text()
    assert '"a"' in listed and long not in listed  # Truly mid-video.
    second = _chunker(src, dst, *args)
    out, err = limits.communicate(second, "the refusal")
    assert second.returncode == 2
    assert err.count("\n") == 1, err  # One line, naming the holder.
    assert f"shard {k}/2 of {dst} is being chunked by another process" in err
    assert f"PID {first.pid} on " in err
    status = parts.status(dst)  # Its rate so far, the other not started.
    assert f"shard {k}/2    running   1/2 videos" in status, status
    assert "source-h/h, ETA " in status, status
    assert f"shard {3 - k}/2    not started" in status, status
  finally:
    os.kill(first.pid, signal.SIGKILL)
    first.communicate()
  assert first.returncode == -signal.SIGKILL
  assert (part / "vidjax.lock").exists()  # Left by the kill: taken over.
  # Its lock is fresh, but its PID is gone on this host: stopped, no ETA.
  status = parts.status(dst)
  assert f"shard {k}/2    stopped" in status and ", ETA" not in status, status
  rerun = _chunker(src, dst, *args)
  out, err = limits.communicate(rerun, "the rerun's end")
  assert rerun.returncode == 0, err
  assert "chunked 1, already done 1, failed 0" in out
  entries = _check_whole(dst)
  assert sorted(entries) == ["a", long]
  assert not (part / "vidjax.lock").exists()
  frames = video.read_clip(dst, long, [0, 499, 999])
  assert [vf.frame_number(f) for f in frames] == [0, 499, 999]
  # A video added meanwhile would change the split: the other shard refuses.
  vf.write_numbered_video(src / "new.mp4", 5, fps=10)
  other = _chunker(src, dst, *args[:-1], f"{3 - k}/2")
  out, err = limits.communicate(other, "the refusal")
  assert other.returncode == 2
  assert f"the sources are not those shard {k}/2 of {dst} started from" in err


def _children(pid: int) -> list[int]:
  """The live child processes of `pid` (from /proc)."""
  out = []
  for stat in Path("/proc").glob("[0-9]*/stat"):
    try:
      fields = stat.read_text().rsplit(")", 1)[1].split()
    except OSError:
      continue
    if int(fields[1]) == pid and fields[0] != "Z":
      out.append(int(stat.parent.name))
  return out


def test_the_workers_end_with_a_chunker_killed_by_sigkill(tmp_path):
  src, dst = tmp_path / "src", tmp_path / "dst"
  src.mkdir()
  for name in ("long1", "long2"):
    vf.write_numbered_video(
      src / f"{name}.mp4", 1000, fps=25, width=96, height=64
    )
  chunker = _chunker(src, dst, "--chunk-seconds", "0.4", "--workers", "2")
  limits.wait_for(  # Both workers at work: a chunk written.
    lambda: list(dst.glob("long*/0.mp4")) or chunker.poll() is not None,
    "the first chunk",
    poll_s=0.005,
  )
  workers = _children(chunker.pid)
  assert chunker.poll() is None and workers
  os.kill(chunker.pid, signal.SIGKILL)
  chunker.communicate()
  limits.wait_for(lambda: not any(map(_alive, workers)), "the workers' end")


def _alive(pid: int) -> bool:
  try:
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
  except OSError:
    return False
  return state != "Z"  # A zombie has ended (its parent reaps it).
