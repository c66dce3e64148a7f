"""The command line: `ppo-lightning fit` (LightningCLI, `fit`), `evaluate` (`evaluate`), `export-hf`,
and the dispatcher (`main`).

May import: everything; nothing imports it.
"""

