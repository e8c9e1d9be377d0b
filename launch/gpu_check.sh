#!/usr/bin/env bash
# One-shot GPU check: environment, cuDNN vs XLA attention, the CLIP ViT-B/16
# 4-frame training step at the largest batch that fits (per remat policy),
# and whether the input pipeline keeps up. Writes one JSON file and prints
# it (compact) at the end. See vidjax/bench/gpu_check.py for every field.
#
#   launch/gpu_check.sh [--dry] [--out FILE] [--remat none,full] [--budget-s S]
#   launch/gpu_check.sh --wheels      # download the wheels below into .whl/
#
# --dry: tiny shapes on CPU (JAX_PLATFORMS=cpu), under a minute; no cuDNN.
# Without --dry, on one NVIDIA GPU it takes about 6-8 minutes.
#
# On the device tool's GPU machine (nvidia-h200: no network; python3 is 3.12
# with jax 0.11 for CUDA 13, flax, optax, orbax, absl, numpy, cloudpickle,
# etils, protobuf, psutil, PyYAML, but NO ml_collections, grain or av):
#
#   1. On this (networked) machine, in the repository root, once:
#        launch/gpu_check.sh --wheels
#      fetches cp312 manylinux x86_64 wheels into .whl/ (git-ignored), 39 MiB
#      (the tool carries 64 MiB with the tree): ml-collections, grain and the
#      two of its requirements missing there (array-record, portpicker), av
#      (18.1: chunk.py's av.open(metadata_errors=...) is gone in av 19), and
#      flax 0.12.12 (the image's flax version is not recorded).
#   2. One call of the device tool (about 6-8 minutes; the timeout leaves a
#      margin, and the JSON is rewritten after each section):
#        run(command="set -o pipefail; bash launch/gpu_check.sh
#                     --out $OUT/gpu_check.json 2>&1 | tee $OUT/gpu_check.log",
#            carry=[".whl"], timeout_s=540)
#      This script installs .whl/ into /tmp/vidjax_site when ml_collections,
#      grain or av cannot be imported, then runs the check. The JSON and the
#      log come back under files_at; the compact JSON ends output_tail.
#      Without grain/av the data section is skipped with a note; without
#      ml_collections nothing but this message runs.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=${PYTHON:-python3}
wheels="${repo}/.whl"

# Exact versions, checked to exist for cp312 manylinux x86_64 (2026-11).
# grain's other requirements (absl-py, cloudpickle, etils[epath,epy], numpy,
# protobuf) and portpicker's (psutil) are on the GPU machine already.
WHEELS=(ml-collections==1.1.0 grain==0.2.18 array-record==0.8.6
        portpicker==1.6.0 av==18.1.0 flax==0.12.12)

if [[ "${1:-}" == "--wheels" ]]; then
  mkdir -p "${wheels}"
  "${python}" -m pip download --no-deps --only-binary=:all: \
      --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
      --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
      -d "${wheels}" "${WHEELS[@]}"
  du -ch "${wheels}"/*.whl | tail -n 1
  exit 0
fi

export PYTHONPATH="${repo}${PYTHONPATH:+:${PYTHONPATH}}"
export PYTHONUNBUFFERED=1
# GPU memory and XLA flags as launch/local.sh sets them, so the batch found
# here is one a training run can use: 90% of the card for JAX's allocator,
# the latency-hiding scheduler. No compilation cache: compile times are cold.
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.90}
export XLA_FLAGS="--xla_gpu_enable_latency_hiding_scheduler=true${XLA_FLAGS:+ ${XLA_FLAGS}}"
for arg in "$@"; do
  if [[ "${arg}" == "--dry" ]]; then
    export JAX_PLATFORMS=${JAX_PLATFORMS:-cpu}
  fi
done

if ! "${python}" -c "import ml_collections, grain, av" 2>/dev/null; then
  if compgen -G "${wheels}/*.whl" >/dev/null; then
    echo "installing the wheels of .whl/ into /tmp/vidjax_site"
    "${python}" -m pip install -q --no-index --no-deps --no-compile \
        --no-cache-dir --upgrade --target /tmp/vidjax_site "${wheels}"/*.whl
    export PYTHONPATH="/tmp/vidjax_site:${PYTHONPATH}"
  fi
fi
if ! "${python}" -c "import ml_collections" 2>/dev/null; then
  echo "ml_collections cannot be imported: run 'launch/gpu_check.sh --wheels'" \
       "on a machine with network and carry .whl (see this script's header)" >&2
  exit 1
fi

exec "${python}" -m vidjax.bench.gpu_check "$@"
