#!/usr/bin/env bash
# Train on one machine with all of its GPUs: one process drives every GPU.
#
#   launch/local.sh CONFIG WORKDIR [--config.key=value ...]
#   launch/local.sh configs/clip_vitb16_ego4d.py /runs/clip --config.batch_size=512
#
# Runs `python -m vidjax.main --config CONFIG --workdir WORKDIR ...` with the
# environment below, in the directory it is started from: WORKDIR and the
# paths in the overrides may be relative to it (vidjax makes them absolute).
# Rerunning the same command resumes from the workdir's latest checkpoint;
# SIGTERM/SIGINT (Ctrl-C) save a checkpoint first.
# Every variable set here keeps a value you export yourself.
#
# Several machines: launch/slurm.sh runs this script once per node under
# SLURM. Without SLURM, run it on every machine with JAX_COORDINATOR_ADDRESS
# (machine 0's host:port), JAX_NUM_PROCESSES and JAX_PROCESS_ID exported;
# vidjax.main then joins the processes with jax.distributed.
set -euo pipefail

if [[ $# -lt 2 || "$1" == -* ]]; then
  echo "usage: $0 CONFIG[:ARG] WORKDIR [--config.key=value ...]" >&2
  exit 2
fi
config=$1
workdir=$2
shift 2

# Run from a clone without `pip install -e .` too, from any directory:
# a CONFIG path not found here is looked up in the repository.
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export PYTHONPATH="${repo}${PYTHONPATH:+:${PYTHONPATH}}"
if [[ ! -f "${config%%:*}" && -f "${repo}/${config%%:*}" ]]; then
  config="${repo}/${config}"
fi

# --- GPU memory -------------------------------------------------------------
# JAX preallocates 75% of each GPU's memory by default. Video decoding runs
# on the host, so little besides XLA needs GPU memory: give it 90% (NVIDIA's
# JAX-Toolbox suggests 0.8-0.9), room for larger per-device batches or less
# rematerialisation. Lower it if another process shares the GPUs.
# Not measured in this repo yet.
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.90}"

# --- XLA --------------------------------------------------------------------
# The latency-hiding scheduler reorders the step so that collectives (the
# gradient all-reduce; FSDP's all-gathers and reduce-scatters) run while
# independent compute continues, instead of stalling it. Recommended in
# JAX's "GPU performance tips" and set in NVIDIA's JAX containers.
# Not measured in this repo yet. Your own XLA_FLAGS come after ours and win.
export XLA_FLAGS="--xla_gpu_enable_latency_hiding_scheduler=true${XLA_FLAGS:+ ${XLA_FLAGS}}"

# --- Start-up ---------------------------------------------------------------
# Persistent compilation cache: a resumed or repeated run loads the compiled
# train step instead of compiling it again. Only start-up time changes, not
# step time. On CPU, configs/demo.py:debug took 15 s with a warm cache
# against 43 s without; not measured on GPUs yet.
export JAX_COMPILATION_CACHE_DIR="${JAX_COMPILATION_CACHE_DIR:-${HOME}/.cache/vidjax/jax}"

# Not set on purpose: JAX_PLATFORMS (JAX picks the GPU when one is there and
# the CUDA wheels are installed: pip install -e ".[cuda12]"), and the number
# of data workers, which is a config key (--config.data.workers=N,
# --config.data.threads=N); measure them with python -m benchmarks.pipeline.

echo "vidjax: $(command -v "${PYTHON:-python}") -m vidjax.main --config ${config} --workdir ${workdir} $*" >&2
echo "vidjax: XLA_FLAGS=${XLA_FLAGS}" >&2
# exec: the signals of a scheduler or Ctrl-C reach Python, which checkpoints.
exec "${PYTHON:-python}" -m vidjax.main --config "${config}" --workdir "${workdir}" "$@"
