"""The command line: `ppo-lightning fit` (LightningCLI, `fit`), `evaluate` (`evaluate`), `export-hf`,
and the dispatcher (`main`).

May import: everything; nothing imports it.
"""


def __getattr__(name):
    # 0.1 had a flat module here; its names still resolve (with a FutureWarning) until 0.2.
    from ppo_lightning._moved import forward_attribute

    return forward_attribute(__name__, name)
