"""Mistakes a user can fix, how a run ends, and the command line's exit codes.

Every mistake a user can make on the command line, in a config or in the
data raises a `UserError`: `python -m vidjax.main` prints its message and
hint without a traceback and exits with its `exit_code`. Any other exception
is a bug in vidjax and keeps its traceback.

Exit codes of `python -m vidjax.main` (the kind of error decides, not when
it is found):

  0    finished: `total_steps` reached and the final evaluation done (or,
       with `--mode eval`, the evaluation done); a SIGTERM or Ctrl-C that
       comes during the final evaluation or the final save lets them finish
  1    failed: a `DataError` (an annotation, sentence, relevancy or
       vocabulary file that does not load or fit, more than
       `data.max_bad_row_fraction` bad rows, more than
       `data.max_skip_fraction` failed clip reads during training), a
       data worker process that died (`DataWorkerDied`: training saves its
       last completed step first), a non-finite loss, a device out of
       memory (XLA's RESOURCE_EXHAUSTED: two lines, `main.out_of_memory`),
       or a bug (with a traceback)
  2    refused: the command line or a `ConfigError` (a key, a value, a path,
       `init_from` weights that do not read or fit, a checkpoint that does
       not fit the run, a workdir that cannot be written or that another run
       is using). Found before anything is written to the workdir (a run on
       the synthetic corpus may have made WORKDIR/synthetic).
  74   a checkpoint or metrics.jsonl could not be written (a full disk, no
       permission to write): the run stops at once, naming the cause and
       the last checkpoint saved whole; free space, then run the same
       command to resume from it (EX_IOERR in sysexits.h)
  75   stopped by SIGTERM or Ctrl-C with nothing lost (`Stopped`): during
       start-up (before the first step, or before the evaluation of
       `--mode eval`) with nothing written; in training after saving a
       checkpoint of the current step (`Preempted`). Run the same command
       to continue (EX_TEMPFAIL in sysexits.h). See `vidjax.base.stopping`.
  130  stopped at once by Ctrl-C pressed again: a save under way is
       abandoned; the message names the newest checkpoint, which the same
       command resumes from
"""

from __future__ import annotations

import errno

EXIT_FINISHED, EXIT_FAILED, EXIT_USAGE, EXIT_PREEMPTED = 0, 1, 2, 75
EXIT_WRITE_FAILED = 74  # EX_IOERR
EXIT_INTERRUPTED = 130  # The shell's code for SIGINT.


class UserError(Exception):
  """A mistake the user can fix: a message naming it, and a hint.

  Attributes:
    hint: what to do about it ('' when the message says it all).
    exit_code: the command line's exit status for it.
  """

  exit_code = EXIT_FAILED

  def __init__(self, message: str, hint: str = ""):
    super().__init__(message)
    self.hint = hint

  def __str__(self) -> str:
    return str(self.args[0])  # KeyError would quote it.

  def describe(self) -> str:
    """The message, and the hint on its own line."""
    return f"{self}\n  hint: {self.hint}" if self.hint else str(self)


class ConfigError(UserError, ValueError):
  """A bad config: unknown key, bad value, inconsistent settings."""

  exit_code = EXIT_USAGE


class UnknownKeyError(ConfigError, KeyError):
  """An override names a key the config does not have."""


class PathError(ConfigError, FileNotFoundError):
  """A file or directory the config names is unset or missing."""


class WorkdirError(ConfigError):
  """The workdir does not fit the command: no checkpoint, another model,
  not writable, or in use by another run."""


class DataError(UserError):
  """Bad annotations, or too many clips that could not be read."""


class DataWorkerDied(DataError):
  """A data worker process died (killed, out of memory): the message says
  which and how."""


class DataFileError(DataError, ValueError):
  """An annotation, sentence, relevancy or vocabulary file that does not read
  as its format says, or does not fit the files it goes with."""


class InitFromError(ConfigError):
  """`init_from` weights that cannot be read, or do not fit the model."""


WRITE_HINT = (
  "free space on that disk (or make the workdir writable), then "
  "run the same command again to resume from the last checkpoint"
)


class WriteError(UserError):
  """A file of the run could not be written: a full disk, no permission."""

  exit_code = EXIT_WRITE_FAILED


# The system refusing a write (a full disk or quota, a read-only mount).
REFUSED_WRITES = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


def refused_write(
  error: OSError, where: str, hint: str = WRITE_HINT
) -> WriteError | None:
  """The two-line error for a write the system refused (`REFUSED_WRITES`),
  naming the file (else `where`); None for any other OSError (a bug)."""
  if error.errno not in REFUSED_WRITES:
    return None
  return WriteError(
    f"could not write {error.filename or f'in {where}'}: {error.strerror}",
    hint=hint,
  )


class Stopped(Exception):
  """A run stopped by SIGTERM or Ctrl-C with nothing lost: the same command
  continues it."""

  exit_code = EXIT_PREEMPTED


class Preempted(Stopped):
  """A run stopped by SIGTERM/SIGINT after saving its checkpoint.

  Not a failure: the same command resumes at `step`.
  """

  def __init__(self, step: int, checkpoint_dir: str):
    super().__init__(
      f"stopped at step {step}; checkpoint saved in "
      f"{checkpoint_dir}: run the same command to resume"
    )
    self.step = step
