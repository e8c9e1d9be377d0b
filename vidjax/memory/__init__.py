"""What a training step holds per device, known before anything compiles.

    estimate = step_memory(config)        # StepMemory: fixed + kept per clip
    check_step_fits(config)               # start-up: refuse what cannot fit
    check_attention(config)               # start-up: 'cudnn' that cannot run;
                                          # a warning for 'auto' without it

`estimate` holds the estimate (`StepMemory`, `step_memory`: fixed + kept
per clip); `check` the start-up checks. The names below are what other
modules use.
"""

from vidjax.memory.check import (
  CPU_VARIANT,
  HEADROOM,
  REMAT_ORDER,
  StepTooLarge,
  check_attention,
  check_step_fits,
  compiled_step_bytes,
  usable_bytes,
)
from vidjax.memory.estimate import (
  XLA_KEEPS,
  GiB,
  MiB,
  StepMemory,
  clips_per_device,
  compiled_bytes,
  step_memories,
  step_memory,
)

__all__ = [
  "CPU_VARIANT",
  "GiB",
  "HEADROOM",
  "MiB",
  "REMAT_ORDER",
  "StepMemory",
  "StepTooLarge",
  "XLA_KEEPS",
  "check_attention",
  "check_step_fits",
  "clips_per_device",
  "compiled_bytes",
  "compiled_step_bytes",
  "step_memories",
  "step_memory",
  "usable_bytes",
]
