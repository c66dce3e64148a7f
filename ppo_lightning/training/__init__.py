"""The training runtime: the LightningModule (`module`), its update (`update`) and its optional parts behind one
interface (`parts`: the proximal anchor, PPG's phases, the compiled loss), callbacks (`callbacks`), atomic checkpoint
writing (`checkpointing`), small-batch diagnostics (`diagnostics`), the gradient noise scale
(`noise_scale`), MLflow tracking (`tracking`) and its background sender that outlives a tracking
server's outage (`mlflow_sender`), the run's storage faults: pre-flight and resume hint
(`storage_faults`), vectorized seed groups (`seed_group`), ``model.compile`` (`compiled`),
preemption by signals and SLURM requeue (`preemption`), atomic FSDP2 sharded checkpoints
(`sharded`), resuming on another batch geometry (`rescale`).

May import: every layer below it (`core`, `envs`, `nets`, `algos`, `data`, `interop`); never `cli`.
"""
