"""The data side: collector -> staleness queue -> GAE -> minibatches as a Lightning DataModule
(`datamodule`) over a rollout source (`source`), device placement (`devices`), statistics pooled across ranks (`parallel`), and the
per-rank resume state of envs and RNGs (`resume_state`), rollouts of envs that step as one batch
without TorchRL's collector (`batched_rollout`), the data side of vectorized seed groups (`seed_group`).

May import: `adapters`, `core`, `envs`, `nets`, `algos`.
"""


def __getattr__(name):
    # 0.1 had a flat module here; its names still resolve (with a FutureWarning) until 0.2.
    from ppo_lightning._moved import forward_attribute

    return forward_attribute(__name__, name)
