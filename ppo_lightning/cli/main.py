"""Entry point of the ``ppo-lightning`` command: dispatches before importing anything heavy, so that
``export-hf`` and ``evaluate`` do not pay for (or print from) Lightning's CLI."""

from __future__ import annotations

import os
import signal
import sys

# light: no torch, Lightning or TorchRL (study and tune load the training stack only in their workers)
from ppo_lightning.core.configs import configs_dir, resolve_config_args, shipped_configs
from ppo_lightning.studies.command import main as study_main
from ppo_lightning.tuning.command import main as tune_main

USAGE = """usage: ppo-lightning {fit,export-hf,evaluate,configs,study,tune} ...

commands:
  fit        train from a YAML config (LightningCLI), a path or a shipped name: ppo-lightning fit --config cartpole/ppo_ewma
  export-hf  write a Hugging Face folder (weights, self-contained model code, model card with the
             measured mean return, replay.mp4): ppo-lightning export-hf CKPT OUT_DIR
  evaluate   score a checkpoint or an exported folder over N episodes, optionally record a video:
             ppo-lightning evaluate SOURCE [--episodes 10] [--deterministic] [--video OUT.mp4] [--json PATH]
  configs    list the configs shipped with the package (the names --config takes) and where they are
  study      run, follow and report a study file (arms x envs x seeds, with its comparisons):
             ppo-lightning study run|status|report experiments/studies/minatar_fig4_500k.yaml
  tune       search settings with Optuna, trials packed as members of vectorized groups:
             ppo-lightning tune --space experiments/tuning/minatar_breakout_500k.yaml

ppo-lightning COMMAND --help shows the options of a command."""


def main(argv: list[str] | None = None) -> int:
    try:
        return _dispatch(list(sys.argv[1:] if argv is None else argv))
    except BrokenPipeError:  # output piped into a reader that stopped (`| head`): end quietly, as `cat` does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's own flush at exit would raise again
        return 128 + signal.SIGPIPE


def _dispatch(args: list[str]) -> int:
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if args else 2
    if args[0] == "configs":
        print("\n".join(shipped_configs()))
        print(f"(in {configs_dir()}; ppo-lightning fit --config NAME, or a path)", file=sys.stderr)
        return 0
    # start-up cost: each command imports only its own module (fit pulls Lightning's CLI and TorchRL)
    if args[0] == "export-hf":
        from ppo_lightning.interop.hf.writer import export_main

        return export_main(args[1:])
    if args[0] == "study":
        return study_main(args[1:])
    if args[0] == "tune":
        return tune_main(args[1:])
    if args[0] == "evaluate":  # start-up cost, as above
        from ppo_lightning.cli.evaluate import evaluate_main

        return evaluate_main(args[1:])
    # the --config files first, bounded (an alias bomb, a missing file: one line before Lightning loads)
    try:
        resolve_config_args(args[1:] if args[0] == "fit" else args)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    # start-up cost, as above: Lightning's CLI and TorchRL load only for fit
    from ppo_lightning.cli.fit import main as fit_cli_main

    return fit_cli_main(args)


if __name__ == "__main__":
    sys.exit(main())
