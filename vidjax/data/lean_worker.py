"""The first code a data worker runs: it keeps jax out of the worker.

A spawned process first runs its parent's main module again (Python's
`multiprocessing` does, so that what the parent pickled by reference to it
resolves), and Grain imports jax wherever jax is installed (its profiler
hooks, `from jax import profiler`, inside `try: ... except ImportError`).
A trainer's main module imports all of vidjax, jax and flax; a worker needs
none of it: it decodes clips with PyAV and numpy. `vidjax.data.workers`
starts Grain's workers with this module as their main module instead, and
this module makes `import jax` fail at once there, so Grain takes its path
without jax; the warning Grain gives then, in every worker, is kept off the
console. (`python -m benchmarks.pipeline` prints a worker's start-up time
and memory both ways.)
"""

import logging
import sys

from vidjax.base import internals  # Standard library only.

if "jax" not in sys.modules:
  sys.modules["jax"] = None  # `import jax` raises ImportError.
  logging.getLogger("absl").addFilter(
    lambda record: not internals.is_grain_no_jax_warning(record)
  )
