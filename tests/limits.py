"""Limits that guard the tests against a hang, never against a slow machine.

A test that waits for a process or for a condition waits up to `HANG_S`:
many times what the wait takes on an idle 2-core machine, enough for one
running beside other work at load 10-20. A wait that passes costs nothing
more for it; one that hits the limit says that it is a hang.
"""

import subprocess
import time

HANG_S = 900.0


def _hang(what: str) -> str:
  return (
    f"{what} did not happen in {HANG_S:.0f} s: a hang (the limit is "
    "generous, made for a loaded machine)"
  )


def wait(proc: subprocess.Popen, what: str = "the process's end") -> int:
  """`proc.wait()`, up to `HANG_S`: its exit code."""
  try:
    return proc.wait(timeout=HANG_S)
  except subprocess.TimeoutExpired:
    raise AssertionError(_hang(what)) from None


def communicate(
  proc: subprocess.Popen, what: str = "the process's end"
) -> tuple:
  """`proc.communicate()`, up to `HANG_S`: (stdout, stderr)."""
  try:
    return proc.communicate(timeout=HANG_S)
  except subprocess.TimeoutExpired:
    raise AssertionError(_hang(what)) from None


def wait_for(condition, what: str, poll_s: float = 0.05):
  """Polls `condition()` until it is truthy, up to `HANG_S`: its value."""
  deadline = time.monotonic() + HANG_S
  while not (value := condition()):
    assert time.monotonic() < deadline, _hang(what)
    time.sleep(poll_s)
  return value
