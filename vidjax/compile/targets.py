"""The GPUs `python -m vidjax.compile` compiles for, as XLA needs them.

A target is a `stream_executor.GpuTargetConfigProto` in text format: what
XLA's GPU compiler would ask a GPU it does not see (its SM count, memory,
shared memory, compute capability) and the library versions it would ask
the CUDA runtime and cuDNN. The package ships one per GPU users train on
(`targets/NAME.txtpb`, each naming its source in a comment); `--gpu FILE`
takes a user's own, in the same format (e.g. one of XLA's
`xla/backends/gpu/target_config/specs/*.txtpb`, less the fields an older
jaxlib does not parse).

The text goes to XLA as it is; the few facts vidjax needs itself (the
memory to compare the program with, the compute capability and cuDNN
version to trace cuDNN attention for) are read from it here.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
import re

from vidjax.base import errors

TARGETS_DIR = Path(__file__).parent / "targets"
# Short names for the files' names.
ALIASES = {"h100": "h100_sxm", "a100": "a100_80"}


@dataclasses.dataclass(frozen=True)
class Target:
  """One GPU target.

  Attributes:
    name: the device's name as the driver reports it (e.g. 'NVIDIA H100
      80GB HBM3').
    source: the file it was read from.
    memory_bytes: the device's memory (`device_memory_size`).
    compute_capability: (major, minor), e.g. (9, 0).
    cudnn_version: e.g. 91000 for cuDNN 9.10.0 (JAX's numbering).
    text: the file's text, for `get_topology_desc(target_config=...)`.
  """

  name: str
  source: Path
  memory_bytes: int
  compute_capability: tuple[int, int]
  cudnn_version: int
  text: str


class TargetError(errors.ConfigError):
  """A `--gpu` that names no shipped target and no readable file."""


def names() -> list[str]:
  """The shipped targets' names (and their aliases), sorted."""
  return sorted([p.stem for p in TARGETS_DIR.glob("*.txtpb")] + list(ALIASES))


def of_device(device_kind: str) -> Target | None:
  """The shipped target a GPU's name (JAX's `device_kind`, e.g. 'NVIDIA
  H100 80GB HBM3') names, or None."""
  for path in sorted(TARGETS_DIR.glob("*.txtpb")):
    target = load(str(path))
    if target.name == device_kind:
      return target
  return None


def _path(gpu: str) -> Path:
  shipped = TARGETS_DIR / f"{ALIASES.get(gpu, gpu)}.txtpb"
  if shipped.is_file():
    return shipped
  path = Path(gpu).expanduser()
  if path.is_file():
    return path
  raise TargetError(
    f"--gpu {gpu!r} is neither a shipped target nor a file",
    hint=f"one of {', '.join(names())}, or a GpuTargetConfigProto text file",
  )


def _field(text: str, pattern: str, path: Path, what: str) -> re.Match:
  found = re.search(pattern, text, re.S)
  if not found:
    raise TargetError(
      f"{path}: no {what} in the target file",
      hint="a stream_executor.GpuTargetConfigProto in text format, as "
      f"{TARGETS_DIR / 'h100_sxm.txtpb'}",
    )
  return found


def load(gpu: str, cudnn_version: int = 0) -> Target:
  """The target `gpu` names: a shipped one's name, or a file.

  Args:
    gpu: e.g. 'h100', 'h200', 'a5000', or a path to a text proto.
    cudnn_version: overrides the file's cuDNN version (JAX's numbering,
      e.g. 90800); 0: the file's.

  Raises:
    TargetError: no such target, or a file without the fields needed.
  """
  path = _path(gpu)
  text = path.read_text()
  body = re.sub(r"#[^\n]*", "", text)  # Comments may name anything.
  memory = _field(body, r"device_memory_size:\s*(\d+)", path, "memory size")
  capability = _field(
    body,
    r"cuda_compute_capability\s*\{([^}]*)\}",
    path,
    "cuda_compute_capability",
  ).group(1)
  major = re.search(r"major:\s*(\d+)", capability)
  minor = re.search(r"minor:\s*(\d+)", capability)
  if not cudnn_version:
    dnn = _field(
      body, r"dnn_version_info\s*\{([^}]*)\}", path, "dnn_version_info"
    ).group(1)
    parts = [
      int(m.group(1)) if m else 0
      for m in (re.search(rf"{k}:\s*(\d+)", dnn) for k in ("major", "minor"))
    ]
    patch = re.search(r"patch:\s*(\d+)", dnn)
    cudnn_version = (
      parts[0] * 10000 + parts[1] * 100 + (int(patch.group(1)) if patch else 0)
    )
  name = re.search(r'device_description_str:\s*"([^"]*)"', body)
  return Target(
    name=name.group(1) if name else path.stem,
    source=path,
    memory_bytes=int(memory.group(1)),
    compute_capability=(
      int(major.group(1)) if major else 0,
      int(minor.group(1)) if minor else 0,
    ),
    cudnn_version=cudnn_version,
    text=text,
  )
