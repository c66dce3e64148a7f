"""The run API: a run as a typed value and a function that trains it (`spec`: `RunSpec`, `Members`,
`train`), the builder under it (`builder`: LightningCLI's parser and classes with the project's
defaults), and the checks every way of starting a run shares: code named by a file (`trust`), a
resume's settings (`resume`), a study's or a search's runs built before any trains (`preflight`).

May import: `core`, `envs`, `nets`, `algos`, `data`, `interop`, `training`; `studies`, `tuning` and
`cli` import it.
"""

from ppo_lightning.run.spec import Members, Run, RunSpec, train

__all__ = ["Members", "Run", "RunSpec", "train"]
