"""The data side: collector -> staleness queue -> GAE -> minibatches as a Lightning DataModule
(`datamodule`) over a rollout source (`source`) built from the rollout config (`config`) and one
state per seed (`seed_state`), device placement (`devices`), statistics pooled across ranks (`parallel`), and the
per-rank resume state of envs and RNGs (`resume_state`), rollouts of envs that step as one batch
without TorchRL's collector (`batched_rollout`), the data side of vectorized seed groups (`seed_group`).

May import: `adapters`, `core`, `envs`, `nets`, `algos`.
"""

