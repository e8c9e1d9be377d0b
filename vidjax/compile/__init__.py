"""A run's own steps compiled by XLA's GPU compiler, on any machine
(`python -m vidjax.compile`; docs/training.md).

  targets.py   the GPU targets (text protos shipped in targets/, or a file)
  compiler.py  the run's steps compiled for a target: memory, calls, time
  hlo.py       what a compiled program calls (cuDNN attention per tower, ...)
  __main__.py  the command line

Importing the package starts no runtime: the command line sets up JAX for
a GPU it does not see before `compiler` imports it.
"""
