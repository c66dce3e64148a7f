"""The command line: `ppo-lightning fit` (`fit`: the run builder of `ppo_lightning.run`, its errors as
one line), `evaluate` (`evaluate`), `export-hf`, and the dispatcher (`main`), which hands ``study``
and ``tune`` to their packages' commands.

May import: everything (the top layer); nothing imports it.
"""

