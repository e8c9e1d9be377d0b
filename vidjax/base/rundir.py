"""The run directory (WORKDIR): what a run keeps there, and one run at a time.

Everything a run writes is in its workdir, where this module says:

    config.json            the config of the run's latest start
                           (`write_config`)
    log.txt                the console's lines (vidjax.report.console)
    metrics.jsonl          one JSON object per logged step (vidjax.report.monitor),
    events.out.tfevents.*  and the same numbers for TensorBoard
    checkpoints/           Orbax checkpoints (vidjax.checkpoints.checkpoint), and
      best.json            the best evaluated step
    plots/                 training curves (vidjax.report.plot)
    embeddings/<set>/step_<N>.npz  evaluation embeddings, when asked for
                           (vidjax.evaluation.eval_sets)
    init_from.json         what `init_from` loaded (vidjax.weights.init_from)
    bad_rows_<split>.jsonl annotation rows left out at start-up
                           (vidjax.data.checks)
    synthetic/             the demo's corpus, when no data is given
                           (vidjax.data.synthetic)
    vidjax.lock            the run working here now (`claim`)

The modules that write these files ask this one where they go (`path`,
`checkpoints`, `bad_rows`, `embeddings`), and write JSON through it
(`write_json`: whole files, by process 0). Of vidjax, only errors,
stopping and whole_files are imported here, so every layer above can ask.

`claim(workdir)` opens a workdir for one run, first thing at start-up,
before any data is checked: the path made absolute (a relative one would
depend on the directory the command started in, and Orbax refuses it),
created if missing, checked writable, and locked. Every mistake there is a
`WorkdirError` (exit 2) of one line.

The lock, `WORKDIR/vidjax.lock`, lets one run at a time write a workdir,
also across the hosts of a shared file system: process 0 creates it
(O_EXCL) with its host, PID and start time, touches it every `HEARTBEAT_S`
seconds from a thread, and deletes it on the way out, on errors and signals
too (Ctrl-C pressed twice included). A second run is refused at start-up, naming the holder. A lock whose
holder is gone is taken over, saying so: on the same host when its process
no longer exists; from another host when it has not been touched for
`STALE_AFTER_S` seconds (the hosts' clocks are assumed to agree within a
minute). A lock deleted by hand while its run lives is taken back by the
run at its next heartbeat (a second run into the workdir is then refused);
one that another run took meanwhile is said as an error.
"""

from __future__ import annotations

from collections.abc import Iterator
import contextlib
import datetime
import json
import os
from pathlib import Path
import socket
import threading
import time
import uuid

from absl import logging
import numpy as np

from vidjax.base import errors, stopping, whole_files

CONFIG_JSON = "config.json"
LOG_FILE = "log.txt"
METRICS_FILE = "metrics.jsonl"
CHECKPOINTS = "checkpoints"
BEST_JSON = "best.json"  # In checkpoints/.
PLOTS = "plots"
EMBEDDINGS = "embeddings"
INIT_FROM_JSON = "init_from.json"
SYNTHETIC = "synthetic"
LOCK_FILE = "vidjax.lock"

HEARTBEAT_S = 30.0  # The lock's holder touches it this often.
STALE_AFTER_S = 300.0  # Untouched this long, from another host: taken over.
WRITING_S = 5.0  # An unreadable lock younger than this is being written.


def absolute(workdir: str | os.PathLike) -> Path:
  """WORKDIR as an absolute path, `~` expanded (symbolic links are kept)."""
  return Path(os.path.abspath(os.path.expanduser(os.fspath(workdir))))


def path(workdir: str | os.PathLike, name: str) -> Path:
  """WORKDIR/name, for one of the names above (e.g. `METRICS_FILE`)."""
  return Path(os.fspath(workdir)) / name


def checkpoints(workdir: str | os.PathLike) -> Path:
  """WORKDIR/checkpoints: Orbax's step directories and best.json."""
  return path(workdir, CHECKPOINTS)


def last_checkpoint_note(workdir: str | os.PathLike) -> str:
  """'the last checkpoint saved whole is step N' (or that none is), for a
  failed write's message. Orbax moves a step's directory to its number
  only once it is whole."""
  try:
    steps = [int(n) for n in os.listdir(checkpoints(workdir)) if n.isdigit()]
  except OSError:
    steps = []
  if not steps:
    return "no checkpoint was saved whole yet"
  return f"the last checkpoint saved whole is step {max(steps)}"


def bad_rows(workdir: str | os.PathLike, split: str) -> Path:
  """WORKDIR/bad_rows_<split>.jsonl."""
  return path(workdir, f"bad_rows_{split}.jsonl")


def embeddings(workdir: str | os.PathLike, set_name: str, step: int) -> Path:
  """WORKDIR/embeddings/<set>/step_<step>.npz."""
  return path(workdir, EMBEDDINGS) / set_name / f"step_{step}.npz"


def write_json(file: str | os.PathLike, blob, **json_kwargs) -> Path | None:
  """Writes `blob` as JSON, whole (`whole_files.replaced`), on process 0.

  Returns:
    The file, or None on the other processes.

  Raises:
    TypeError, ValueError: `blob` is not JSON, before anything is written.
  """
  import jax  # The lock alone needs none.

  if jax.process_index() != 0:
    return None
  text = json.dumps(blob, **json_kwargs)
  os.makedirs(os.path.dirname(os.fspath(file)), exist_ok=True)
  with whole_files.replaced(file) as f:
    f.write(text + "\n")
  return Path(file)


def write_config(config, workdir: str | os.PathLike) -> Path | None:
  """Writes WORKDIR/config.json (process 0 only); returns its path.

  Values JSON cannot hold (functions, classes) are written as strings.
  """
  return write_json(
    path(workdir, CONFIG_JSON),
    json.loads(config.to_json_best_effort()),
    indent=2,
    sort_keys=True,
  )


@contextlib.contextmanager
def claim(workdir: str | os.PathLike) -> Iterator[Path]:
  """Opens WORKDIR for this run: absolute, created, writable, locked.

  On every exit the lock is released; a workdir this call created and the
  run left empty (it was refused) is removed again.

  Yields:
    The workdir as an absolute path.

  Raises:
    errors.WorkdirError: the workdir is a file, cannot be created or
      written, or another run holds its lock (with several processes: on
      any of them).
  """
  import jax

  workdir = absolute(workdir)
  created = not os.path.lexists(workdir)
  lock, error = None, None
  try:
    _check_writable(workdir)
    if jax.process_index() == 0:
      lock = WorkdirLock(workdir)
      lock.acquire()
  except errors.WorkdirError as e:
    error = e
  if jax.process_count() > 1:  # All go on, or none.
    from jax.experimental import multihost_utils

    failed = multihost_utils.process_allgather(np.int32(error is not None))
    if np.any(failed) and error is None:
      error = errors.WorkdirError(
        f"workdir {workdir}: refused on another process (its log says why)"
      )
  try:
    if error is not None:
      raise error
    with stopping.on_abort(lock.release if lock else lambda: None):
      yield workdir
  finally:
    if lock is not None and lock.held:
      lock.release()
    if created:
      with contextlib.suppress(OSError):
        workdir.rmdir()  # Only if empty.


def _check_writable(workdir: Path) -> None:
  """Creates `workdir` if missing and writes (then removes) a file in it."""
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise errors.WorkdirError(f"workdir {workdir} is a file, not a directory")
  probe = workdir / f".vidjax-write-test-{socket.gethostname()}-{os.getpid()}"
  try:
    workdir.mkdir(parents=True, exist_ok=True)
    probe.touch()
    probe.unlink()
  except OSError as e:
    raise errors.WorkdirError(
      f"workdir {workdir}: cannot write there ({e.strerror or e})"
    ) from None


# ---------------------------------------------------------------------------
# The lock.
# ---------------------------------------------------------------------------
def _machine() -> str:
  """This kernel and PID namespace: where a lock's PID can be looked up."""
  parts = []
  for read in (
    lambda: Path("/proc/sys/kernel/random/boot_id").read_text().strip(),
    lambda: os.readlink("/proc/self/ns/pid"),
  ):
    try:
      parts.append(read())
    except OSError:
      parts.append("")
  return ":".join(parts)


def _process_start(pid: int) -> int | None:
  """When process `pid` started (clock ticks since boot); None if unknown."""
  try:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[19])
  except (OSError, ValueError, IndexError):
    return None


def _alive(pid: int, started: int | None) -> bool:
  """Whether process `pid` (of this machine) is the one that started then."""
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    pass  # Another user's: it exists.
  now = _process_start(pid)
  return started is None or now is None or now == started  # Else reused.


def _read(path: Path) -> tuple[dict | None, float | None]:
  """(the lock's holder, or None if unreadable; its age in seconds, or None
  if there is no lock)."""
  try:
    age = time.time() - os.stat(path).st_mtime
    data = path.read_bytes()
  except FileNotFoundError:
    return None, None
  except OSError:
    return None, 0.0
  try:
    holder = json.loads(data)  # Bytes: not UTF-8 is a ValueError too.
  except ValueError:
    return None, age  # Being written, torn by a kill, or damaged.
  return (holder if isinstance(holder, dict) else None), age


def holder_gone(lock: str | os.PathLike) -> bool:
  """Whether the run holding a lock file is known to be gone: no lock, or a
  lock of this host whose process no longer exists (another host's run is
  not known here: its heartbeat's age tells)."""
  holder, age = _read(Path(lock))
  if age is None:
    return True
  if (
    not holder
    or (holder.get("host"), holder.get("machine"))
    != (socket.gethostname(), _machine())
    or not isinstance(holder.get("pid"), int)
  ):
    return False
  return not _alive(holder["pid"], holder.get("process_start"))


class WorkdirLock:
  """WORKDIR/vidjax.lock, held by one run (see the module docstring)."""

  def __init__(self, workdir: Path):
    self.path = Path(workdir) / LOCK_FILE
    self.held = False
    self._me = {
      "host": socket.gethostname(),
      "pid": os.getpid(),
      "started": datetime.datetime.now()
      .astimezone()
      .isoformat(timespec="seconds"),
      "machine": _machine(),
      "process_start": _process_start(os.getpid()),
      "token": uuid.uuid4().hex,
    }
    self._stop = threading.Event()
    self._thread = None

  def acquire(self) -> None:
    """Takes the lock, or a stale one over (saying so).

    Raises:
      errors.WorkdirError: a live run holds it.
    """
    for _ in range(3):  # A lock that went or changed as it was looked at.
      if self._create():
        return
      holder, age = _read(self.path)
      if age is None:
        continue  # Released meanwhile.
      gone = self._gone(holder, age)
      if gone is None:
        raise self._in_use(holder, age)
      if self._remove_stale(holder):
        logging.warning("took over the workdir lock %s: %s", self.path, gone)
    raise errors.WorkdirError(
      f"workdir {self.path.parent}: its lock "
      f"{self.path} keeps changing; another run is "
      "starting there"
    )

  def _create(self) -> bool:
    """Creates the lock (O_EXCL) and starts its heartbeat; False if a lock
    exists."""
    if not self._write():
      return False
    self._thread = threading.Thread(
      target=self._heartbeat, daemon=True, name="vidjax-workdir-lock"
    )
    self._thread.start()
    return True

  def _write(self) -> bool:
    try:
      fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
      return False
    except OSError as e:
      raise errors.WorkdirError(
        f"workdir {self.path.parent}: cannot create "
        f"its lock ({e.strerror or e})"
      ) from None
    try:
      with os.fdopen(fd, "w") as f:
        f.write(json.dumps(self._me) + "\n")
        f.flush()
        os.fsync(f.fileno())
    except OSError as e:  # A full disk: the empty lock is not left behind.
      self.path.unlink(missing_ok=True)
      raise errors.WorkdirError(
        f"workdir {self.path.parent}: cannot write its lock "
        f"({e.strerror or e})",
        hint="free space (or choose another --workdir), then run the same "
        "command",
      ) from None
    self.held = True
    return True

  def _gone(self, holder: dict | None, age: float) -> str | None:
    """Why the holder is gone, or None if it may be alive."""
    me = self._me
    if (
      holder
      and (holder.get("host"), holder.get("machine"))
      == (me["host"], me["machine"])
      and isinstance(holder.get("pid"), int)
    ):
      if _alive(holder["pid"], holder.get("process_start")):
        return None
      return (
        f"its run (PID {holder['pid']} on this host, started "
        f"{holder.get('started')}) is gone"
      )
    if age <= STALE_AFTER_S:
      return None
    who = (
      f"PID {holder.get('pid')} on {holder.get('host')}, started "
      f"{holder.get('started')},"
      if holder
      else "it is unreadable and"
    )
    return f"{who} untouched for {age:.0f} s (> {STALE_AFTER_S:.0f} s)"

  def _in_use(self, holder: dict | None, age: float) -> errors.WorkdirError:
    workdir = self.path.parent
    if not holder and age <= WRITING_S:
      return errors.WorkdirError(
        f"workdir {workdir} is being claimed by another run (its lock "
        f"{self.path} is being written)",
        hint="use another --workdir",
      )
    if not holder:  # Not a lock's JSON, and written a while ago: damaged.
      return errors.WorkdirError(
        f"workdir {workdir}: its lock {self.path} is unreadable (not a "
        f"vidjax lock; last touched {age:.0f} s ago)",
        hint="if no run is using this workdir, delete the lock; it is "
        f"taken over {STALE_AFTER_S:.0f} s after its last touch",
      )
    return errors.WorkdirError(
      f"workdir {workdir} is in use by another run: PID {holder.get('pid')} "
      f"on host {holder.get('host')}, started {holder.get('started')} (its "
      f"lock, last touched {age:.0f} s ago: {self.path})",
      hint="wait for it to end, or use another --workdir. If that run is "
      "gone, its lock is taken over at once on its host, from other hosts "
      f"{STALE_AFTER_S:.0f} s after its last touch; or delete the lock",
    )

  def _remove_stale(self, holder: dict | None) -> bool:
    """Removes the stale lock unless another run replaced it meanwhile."""
    grave = self.path.with_name(f"{LOCK_FILE}.stale-{self._me['token']}")
    try:
      os.rename(self.path, grave)  # Atomic: one of two racing runs gets it.
    except FileNotFoundError:
      return False
    if _read(grave)[0] != holder:  # A newer lock: put it back.
      with contextlib.suppress(OSError):
        os.link(grave, self.path)
      os.unlink(grave)
      return False
    os.unlink(grave)
    return True

  def _heartbeat(self) -> None:
    while not self._stop.wait(HEARTBEAT_S):
      holder, age = _read(self.path)
      if age is None:  # Deleted by hand: taken back, before a second run.
        with contextlib.suppress(errors.WorkdirError):
          if self._write():
            logging.warning(
              "the workdir lock %s was deleted while this run held it: "
              "taken back (a second run into this workdir is refused)",
              self.path,
            )
            continue
        holder, _ = _read(self.path)  # Another run's, created meanwhile.
      if not holder or holder.get("token") != self._me["token"]:
        logging.error(
          "the workdir lock %s was %s: another run may now write this workdir",
          self.path,
          "deleted"
          if holder is None
          else f"taken by PID {holder.get('pid')} on {holder.get('host')}",
        )
        return
      with contextlib.suppress(OSError):
        os.utime(self.path)

  def release(self) -> None:
    """Stops the heartbeat and deletes the lock if it is still this run's.

    Never raises: a lock that cannot be deleted (the workdir is no longer
    writable) is warned about, and whatever error ended the run is kept.
    """
    self._stop.set()
    self.held = False
    holder, _ = _read(self.path)
    if holder and holder.get("token") == self._me["token"]:
      try:
        os.unlink(self.path)
      except FileNotFoundError:
        pass
      except OSError as e:
        logging.warning(
          "could not delete the workdir lock %s (%s): the next run here "
          "takes it over (its process is gone), or delete it",
          self.path,
          e.strerror or e,
        )
