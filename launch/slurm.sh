#!/usr/bin/env bash
# Train on several machines under SLURM: one process per node, each driving
# all of its node's GPUs, joined by jax.distributed.
#
#   sbatch --nodes=4 launch/slurm.sh CONFIG WORKDIR [--config.key=value ...]
#
# Submit from the repository root (or set VIDJAX_REPO). WORKDIR must be on a
# file system every node sees: each process writes its part of every
# checkpoint there, and process 0 writes metrics.jsonl and config.json. The
# data (config.data.root and the annotations) must be readable at the same
# path on every node; each process reads only its own slice of each batch.
# `config.batch_size` is the global batch over all GPUs of all nodes.
#
# Each task runs launch/local.sh (same XLA/GPU environment as on one
# machine); vidjax.main sees SLURM_NTASKS > 1 and calls
# jax.distributed.initialize(), which reads the coordinator (first node of
# the step, port from the job id), process count and rank from SLURM, and
# hands each one-per-node task all of its node's GPUs.
#
# Resuming: the job gets SIGTERM 5 minutes before its time limit
# (--signal), every process saves the same step and exits; submit the same
# command again (or chain: sbatch --dependency=afterany:JOBID ...) and it
# continues from the workdir's latest checkpoint. Preemption with requeue
# works the same way.
#
# Edit the header for your cluster (partition, account, time); options
# given to sbatch on the command line override it.
#SBATCH --job-name=vidjax
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --exclusive
#SBATCH --mem=0
#SBATCH --time=24:00:00
#SBATCH --signal=TERM@300
#SBATCH --output=%x-%j.out
##SBATCH --partition=gpu
##SBATCH --account=my-account
set -euo pipefail

if [[ $# -lt 2 || "$1" == -* ]]; then
  echo "usage: sbatch [--nodes=N] $0 CONFIG[:ARG] WORKDIR [--config.key=value ...]" >&2
  exit 2
fi

# sbatch runs a copy of this script from its spool directory: find the
# repository from where the job was submitted.
repo=${VIDJAX_REPO:-}
if [[ -z "${repo}" ]]; then
  for candidate in "${SLURM_SUBMIT_DIR:-}" "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"; do
    if [[ -n "${candidate}" && -f "${candidate}/launch/local.sh" ]]; then
      repo=${candidate}
      break
    fi
  done
fi
if [[ -z "${repo}" ]]; then
  echo "$0: cannot find launch/local.sh; submit from the vidjax repository or set VIDJAX_REPO" >&2
  exit 2
fi

# Site-specific NCCL settings (NCCL_SOCKET_IFNAME, NCCL_IB_HCA, ...) go here
# if your cluster documents them; NCCL picks the network itself otherwise.

echo "vidjax: job ${SLURM_JOB_ID:-?} on ${SLURM_JOB_NUM_NODES:-?} nodes: ${SLURM_JOB_NODELIST:-?}" >&2
# --cpus-per-task: the task decodes video for all of the node's GPUs, so it
#   gets every CPU of the node (srun does not always inherit it from sbatch).
# --kill-on-bad-exit: one failed process stops the others at once instead of
#   leaving them blocked in a collective.
srun --ntasks-per-node=1 --cpus-per-task="${SLURM_CPUS_ON_NODE:-1}" \
  --kill-on-bad-exit=1 \
  "${repo}/launch/local.sh" "$@"
