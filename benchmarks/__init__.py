"""benchmarks."""

# Every benchmark's --smoke: its smallest settings, to check in seconds that
# it runs (CI runs each one the docs name); its figures mean nothing.
SMOKE_HELP = "smallest settings, seconds: checks that it runs, measures nothing"
# Printed above a smoke run's figures: they are not measurements.
SMOKE_NOTE = "smallest settings: checks that it runs; the figures mean nothing"


def device_batch(batch: int) -> int:
  """`batch` rounded up to a multiple of this host's devices: a global batch
  splits evenly over 1, 2, 4 or 8 of them (a GPU machine, or the tests'
  `--xla_force_host_platform_device_count=8`)."""
  import jax  # Here: the benchmarks that time no device need no jax.

  devices = jax.local_device_count()
  return -(-max(batch, 1) // devices) * devices
