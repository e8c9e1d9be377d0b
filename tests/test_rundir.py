"""The run directory: absolute paths, unwritable workdirs, one run at a time."""

import json
import os
from pathlib import Path
import re
import socket
import subprocess
import sys
import time

import pytest

import debug_runs
import limits
from vidjax import config as config_lib, main
from vidjax.base import errors, rundir

REPO = Path(__file__).resolve().parents[1]


def _unwritable(kind: str, tmp_path: Path) -> Path:
  if kind == "a file":
    (tmp_path / "run").write_text("not a directory")
    return tmp_path / "run"
  if kind == "under /proc":
    return Path(f"/proc/vidjax-test-{os.getpid()}/run")
  # Immutable: even root cannot write into it (tests run as root).
  frozen = tmp_path / "frozen"
  frozen.mkdir()
  if subprocess.run(
    ["chattr", "+i", str(frozen)], capture_output=True, check=False
  ).returncode:
    pytest.skip("chattr +i is not available here")
  return frozen


@pytest.mark.parametrize("kind", ["a file", "under /proc", "immutable"])
def test_an_unwritable_workdir_is_refused_in_one_line_before_the_data(
  kind, tmp_path
):
  workdir = _unwritable(kind, tmp_path)
  try:
    with pytest.raises(errors.WorkdirError) as e:
      # Missing data paths: the workdir is checked before them.
      main.run(
        str(REPO / "configs/own_videos.py:cpu"),
        str(workdir),
        overrides=["--config.data.root=/no/such/chunks"],
      )
  finally:
    subprocess.run(
      ["chattr", "-i", str(workdir)], capture_output=True, check=False
    )
  assert e.value.exit_code == errors.EXIT_USAGE
  message = e.value.describe()
  assert len(message.splitlines()) == 1, message
  assert str(workdir) in message
  assert ("is a file" if kind == "a file" else "cannot write there") in message


def test_a_full_disk_at_start_up_says_so_and_leaves_no_lock(
  small_disk, tmp_path_factory
):
  """No room for the lock: refused in one line. Room for the lock only: the
  command stops at its first write (config.json), exit 74 in two lines.
  Neither leaves a lock behind that would refuse the rerun."""
  demo = str(debug_runs.CONFIGS / "demo.py:debug")
  workdir = debug_runs.prepare(
    debug_runs.load("demo"), small_disk.path / "run", tmp_path_factory
  )
  small_disk.leave_free(0)
  with pytest.raises(errors.WorkdirError) as e:
    main.run(demo, str(workdir))
  assert e.value.describe().splitlines() == [
    f"workdir {workdir}: cannot write its lock (No space left on device)",
    "  hint: free space (or choose another --workdir), then run the same "
    "command",
  ]
  assert not (workdir / rundir.LOCK_FILE).exists()

  small_disk.free_up()
  small_disk.leave_free(4096)  # One page: the lock's.
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "vidjax.main",
      "--config",
      demo,
      "--workdir",
      str(workdir),
    ],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=limits.HANG_S,
  )
  assert proc.returncode == errors.EXIT_WRITE_FAILED, proc.stderr[-3000:]
  assert "Traceback" not in proc.stderr
  error = proc.stderr[proc.stderr.index("error: ") :].splitlines()
  assert error[:2] == [
    f"error: could not write in {workdir}: No space left on device",
    f"  hint: {errors.WRITE_HINT}",
  ], proc.stderr[-3000:]
  assert not (workdir / rundir.LOCK_FILE).exists()
  assert not (workdir / rundir.CONFIG_JSON).exists()


def test_relative_paths_become_absolute(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  config = config_lib.load_config(
    str(REPO / "configs/clip_vitb16_ego4d.py"),
    [
      "--config.data.root=chunks",
      "--config.data.train_annotations=a.pkl,b.pkl",
      "--config.init_from=weights/ViT-B-16.pt",
      "--config.data.vocab=gs://v/x.gz",
      "--config.eval.sets.ek100_mir.relevancy=rel.pkl",
    ],
  )
  config_lib.make_paths_absolute(config)
  assert config.data.root == str(tmp_path / "chunks")
  assert (
    config.data.train_annotations
    == f"{tmp_path / 'a.pkl'},{tmp_path / 'b.pkl'}"
  )
  assert config.init_from == str(tmp_path / "weights/ViT-B-16.pt")
  assert config.data.vocab == "gs://v/x.gz"  # Not a local path.
  assert config.eval.sets.ek100_mir.relevancy == str(tmp_path / "rel.pkl")
  assert config.resume == "" and config.data.eval_annotations == ""
  assert rundir.absolute("runs/mine") == tmp_path / "runs/mine"


def _lock(workdir: Path) -> dict:
  return json.loads((workdir / rundir.LOCK_FILE).read_text())


def test_a_second_claim_is_refused_naming_the_holder(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  with rundir.claim("run") as workdir:  # Relative: made absolute.
    assert workdir == tmp_path / "run"
    holder = _lock(workdir)
    assert (holder["pid"], holder["host"]) == (
      os.getpid(),
      socket.gethostname(),
    )
    with pytest.raises(
      errors.WorkdirError,
      match=re.escape(
        f"workdir {workdir} is in use by another run: PID {os.getpid()} on "
        f"host {socket.gethostname()}, started {holder['started']}"
      ),
    ):
      with rundir.claim(workdir):
        pass
    assert _lock(workdir) == holder  # The holder's lock is untouched.
    (workdir / "metrics.jsonl").write_text("")
  assert os.listdir(workdir) == ["metrics.jsonl"]  # The lock is released.
  with pytest.raises(RuntimeError):  # On errors too.
    with rundir.claim(workdir):
      raise RuntimeError("a bug")
  assert os.listdir(workdir) == ["metrics.jsonl"]
  with pytest.raises(errors.PathError):  # A run refused before writing
    with rundir.claim(tmp_path / "new"):  # leaves no directory it made.
      raise errors.PathError("data.root = '/no/such/chunks' (not found)")
  assert not (tmp_path / "new").exists()


def test_a_lock_whose_holder_is_gone_is_taken_over(tmp_path, caplog):
  workdir = tmp_path / "run"
  workdir.mkdir()
  lock = workdir / rundir.LOCK_FILE
  dead = subprocess.Popen([sys.executable, "-c", "pass"])
  dead.wait()
  here = rundir.WorkdirLock(workdir)._me
  lock.write_text(json.dumps(dict(here, pid=dead.pid, token="dead")))
  with rundir.claim(workdir):
    assert _lock(workdir)["pid"] == os.getpid()
  assert (
    f"PID {dead.pid} on this host" in caplog.text and "is gone" in caplog.text
  )

  # Another host's: taken over once untouched for STALE_AFTER_S, not before.
  other = dict(
    here, host="gpu-node-7", machine="elsewhere", pid=4242, token="other"
  )
  lock.write_text(json.dumps(other))
  with pytest.raises(errors.WorkdirError, match="PID 4242 on host gpu-node-7"):
    with rundir.claim(workdir):
      pass
  old = time.time() - rundir.STALE_AFTER_S - 60
  os.utime(lock, (old, old))
  with rundir.claim(workdir):
    assert _lock(workdir)["pid"] == os.getpid()
  assert "PID 4242 on gpu-node-7" in caplog.text
  assert not lock.exists()


def test_a_lock_that_cannot_be_deleted_keeps_the_run_s_error(tmp_path, caplog):
  """The workdir stops being writable mid-run: the write error that ends
  the run is what comes out (exit 74), the lock left behind is warned of."""
  workdir = tmp_path / "run"
  with pytest.raises(errors.WriteError):
    with rundir.claim(workdir):
      if subprocess.run(
        ["chattr", "+i", str(workdir)], capture_output=True, check=False
      ).returncode:
        pytest.skip("chattr +i is not available here")
      try:  # Even root cannot write into an immutable directory.
        (workdir / rundir.METRICS_FILE).write_text("")
      except PermissionError as e:
        raise errors.WriteError(f"could not write {e.filename}") from e
  subprocess.run(["chattr", "-i", str(workdir)], check=True)
  assert "could not delete the workdir lock" in caplog.text
  assert (workdir / rundir.LOCK_FILE).exists()


def test_a_damaged_lock_is_refused_then_taken_over(tmp_path):
  """A lock of bytes that are not its JSON (not even UTF-8): refused in a
  line naming it while it may be another run's, taken over once stale."""
  workdir = tmp_path / "run"
  workdir.mkdir()
  lock = workdir / rundir.LOCK_FILE
  lock.write_bytes(b"\xff\xfe\x00garbage\x80")
  old = time.time() - 60
  os.utime(lock, (old, old))
  with pytest.raises(errors.WorkdirError) as e:
    with rundir.claim(workdir):
      pass
  assert e.value.describe().startswith(
    f"workdir {workdir}: its lock {lock} is unreadable (not a vidjax lock; "
    "last touched 60 s ago)\n  hint: if no run is using this workdir, "
    "delete the lock"
  ), e.value.describe()
  old = time.time() - rundir.STALE_AFTER_S - 60
  os.utime(lock, (old, old))
  with rundir.claim(workdir):
    assert _lock(workdir)["pid"] == os.getpid()
  assert not lock.exists()


def test_a_lock_deleted_by_hand_is_taken_back_by_its_run(
  tmp_path, caplog, monkeypatch
):
  monkeypatch.setattr(rundir, "HEARTBEAT_S", 0.05)
  workdir = tmp_path / "run"
  workdir.mkdir()
  lock = workdir / rundir.LOCK_FILE
  with rundir.claim(workdir):
    token = _lock(workdir)["token"]
    lock.unlink()
    limits.wait_for(
      lambda: "was deleted while this run held it: taken back" in caplog.text,
      "the deleted lock taken back",
      poll_s=0.01,
    )
    assert _lock(workdir)["token"] == token
    # So a second run is refused, as while the lock was never touched.
    with pytest.raises(errors.WorkdirError, match="in use by another run"):
      rundir.WorkdirLock(workdir).acquire()
  assert not lock.exists()
