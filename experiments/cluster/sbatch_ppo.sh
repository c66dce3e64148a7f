#!/usr/bin/env bash
# PPO-EWMA on SLURM: N nodes x T tasks (one data-parallel rank per task), preemptible and requeued.
#   sbatch experiments/cluster/sbatch_ppo.sh [extra ppo-lightning fit arguments]
# SIGUSR1 arrives 120 s before the time limit: each rank finishes its iteration, last.ckpt is
# written, the job requeues itself (scontrol requeue) and exits 138; the requeued job (same job id)
# finds runs/<experiment>/slurm-<job id>/checkpoints/last.ckpt and continues there, in the same
# MLflow run. Give --signal enough time for one iteration plus a checkpoint write.
#SBATCH --job-name=ppo-ewma
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=2
#SBATCH --cpus-per-task=1
#SBATCH --time=00:30:00
#SBATCH --signal=USR1@120
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=slurm-%j.out
set -euo pipefail
cd "${SLURM_SUBMIT_DIR:-.}"
export OMP_NUM_THREADS="${SLURM_CPUS_PER_TASK:-1}"
CONFIG="${CONFIG:-ppo_lightning/configs/cartpole/ppo_ewma.yaml}"
# srun starts one process per task; Lightning's SLURMEnvironment reads ranks and the head node from
# SLURM's variables (no torchrun under SLURM).
srun .venv/bin/ppo-lightning fit --config "$CONFIG" \
  --trainer.num_nodes "$SLURM_NNODES" --trainer.devices "$SLURM_NTASKS_PER_NODE" \
  --trainer.accelerator cpu --trainer.strategy ddp --data.num_threads 1 "$@"
