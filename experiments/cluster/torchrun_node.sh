#!/usr/bin/env bash
# One node of a multi-node run through torchrun (run this on every node, NODE_RANK 0..NNODES-1).
#   NNODES=2 NODE_RANK=0 HEAD=node0.cluster:29500 experiments/cluster/torchrun_node.sh   # on node0
#   NNODES=2 NODE_RANK=1 HEAD=node0.cluster:29500 experiments/cluster/torchrun_node.sh   # on node1
# Every node must see the same run folder (a shared file system): rank 0 writes the checkpoints,
# every rank reads them on resume. Extra arguments go to `ppo-lightning fit`.
set -euo pipefail
: "${NNODES:?number of nodes}" "${NODE_RANK:?this node's rank}" "${HEAD:?host:port of node 0}"
NPROC="${NPROC:-1}"                    # processes (data-parallel ranks) per node
CONFIG="${CONFIG:-ppo_lightning/configs/cartpole/ppo_ewma.yaml}"
RUN_DIR="${RUN_DIR:-runs/cluster/torchrun}"
exec torchrun --nnodes "$NNODES" --nproc-per-node "$NPROC" --node-rank "$NODE_RANK" \
  --rdzv-backend static --rdzv-endpoint "$HEAD" --no-python \
  ppo-lightning fit --config "$CONFIG" --run_dir "$RUN_DIR" \
  --trainer.num_nodes "$NNODES" --trainer.devices "$NPROC" --trainer.accelerator cpu \
  --trainer.strategy ddp --data.num_threads 1 "$@"
