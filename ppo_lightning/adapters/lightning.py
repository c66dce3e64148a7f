"""Lightning where its public API has no reader for what the package needs.

Read against Lightning 2.6 (pyproject pins ``lightning>=2.6,<2.7``); `check` names what moved.
Lightning is imported only by `check`: the functions read the objects they are given.
"""

from __future__ import annotations

from typing import Any

VERIFIED = "2.6."

# The private attributes read here (`check`).
PRIVATE = ("_run_name", "_subcommands_action", "_name_parser_map")


def attached_trainer(module: Any) -> Any:
    """The Trainer ``module`` is attached to, or None: Lightning's public ``trainer`` property raises
    when none is (and a plain torch module has none). No private read."""
    try:
        return module.trainer
    except (RuntimeError, AttributeError):
        return None


def attached_datamodule(module: Any) -> Any:
    """The datamodule of the Trainer ``module`` is attached to, or None."""
    trainer = attached_trainer(module)
    return trainer.datamodule if trainer is not None else None


def mlflow_run_name(logger: Any) -> str | None:
    """The run name an ``MLFlowLogger`` was built with (``run_name=``), without asking the tracking
    server: the logger keeps it as ``_run_name`` and has no reader (its ``run_id`` creates the run)."""
    return getattr(logger, "_run_name", None)


def subcommand_parsers(parser: Any) -> list[Any]:
    """The subcommands' parsers of a LightningCLI (jsonargparse) parser, none without subcommands:
    argparse keeps them in the subcommands action's ``_name_parser_map`` and has no reader."""
    action = getattr(parser, "_subcommands_action", None)
    return list(getattr(action, "_name_parser_map", {}).values())


def check() -> list[str]:
    """What moved: a different Lightning release than ``VERIFIED``, or a private name gone."""
    import lightning
    from lightning.pytorch.cli import LightningArgumentParser
    from lightning.pytorch.loggers import MLFlowLogger

    moved = [] if lightning.__version__.startswith(VERIFIED) else [f"lightning {lightning.__version__} (read against {VERIFIED}x)"]
    if "_run_name" not in MLFlowLogger.__init__.__code__.co_names:
        moved.append("lightning.pytorch.loggers.MLFlowLogger._run_name")
    parser = LightningArgumentParser()
    parser.add_subcommands()
    if not hasattr(getattr(parser, "_subcommands_action", None), "_name_parser_map"):
        moved.append("jsonargparse ArgumentParser._subcommands_action._name_parser_map")
    return moved
