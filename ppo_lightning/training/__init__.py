"""The training runtime: the LightningModule (`module`), callbacks (`callbacks`), atomic checkpoint
writing (`checkpointing`), small-batch diagnostics (`diagnostics`), the gradient noise scale
(`noise_scale`), MLflow tracking (`tracking`), vectorized seed groups (`seed_group`), ``model.compile``
(`compiled`).

May import: every layer below it (`core`, `envs`, `nets`, `algos`, `data`, `interop`); never `cli`.
"""
