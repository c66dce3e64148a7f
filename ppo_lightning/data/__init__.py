"""The data side: collector -> staleness queue -> GAE -> minibatches as a Lightning DataModule
(`datamodule`), device placement (`devices`), statistics pooled across ranks (`parallel`), and the
per-rank resume state of envs and RNGs (`resume_state`).

May import: `core`, `envs`, `nets`, `algos`.
"""

