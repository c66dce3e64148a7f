"""The command line: `ppo-lightning fit` (`fit`: the run builder of `ppo_lightning.run`, its errors as
one line), `evaluate` (`evaluate`), `export-hf`, and the dispatcher (`main`), which hands ``study``
and ``tune`` to their packages' commands.

May import: everything (the top layer); nothing imports it.
"""


def __getattr__(name):
    # 0.1 had a flat module here; its names still resolve (with a FutureWarning) until 0.2.
    from ppo_lightning._moved import forward_attribute

    return forward_attribute(__name__, name)
