"""``ppo-lightning fit``: trains one run from a config and flags (`ppo_lightning.run.builder`), and
turns what stops it into one line and an exit code: 2 for a configuration the parser or a check
refuses (before training), a fault's own code (`ppo_lightning.core.faults`), 128 + N for signal N.

    ppo-lightning fit --config cartpole/ppo_ewma [--model.lr 1e-3 ...] [--ckpt_path X]
"""

from __future__ import annotations

import os
import sys

import jsonargparse

from ppo_lightning.core.errors import TrainingFault
from ppo_lightning.run import builder
from ppo_lightning.run.builder import close_process_group, fit_main
from ppo_lightning.run.trust import parse_error_line
from ppo_lightning.training.storage_faults import storage_hint


def main(argv: list[str] | None = None) -> int:
    builder._TRAINING_STARTED = False
    from lightning.pytorch.utilities.exceptions import SIGTERMException  # Lightning is loaded by now (builder)

    try:
        cli = fit_main(argv)
    except SIGTERMException:  # Lightning's own SIGTERM path (a signal before training started)
        print("error: stopped by SIGTERM before training started (no new checkpoint)", file=sys.stderr)
        return 128 + 15
    except TrainingFault as err:  # a bad checkpoint file, a numerical or an environment fault
        local_rank = os.environ.get("LOCAL_RANK", os.environ.get("SLURM_LOCALID", "0"))
        if not err.all_ranks or local_rank == "0":  # a fault all ranks share: one line per node
            print(f"error: {err}{storage_hint(err, sys.argv[1:] if argv is None else argv)}", file=sys.stderr)
        if err.all_ranks:
            close_process_group()
        return err.exit_code
    except ValueError as err:  # invalid configuration: one clear line, before training
        if builder._TRAINING_STARTED:
            raise
        print(f"error: {err}", file=sys.stderr)
        return 2
    except jsonargparse.ArgumentError as err:  # a value the parser refuses (NaN, a wrong type): one line
        print(f"error: {parse_error_line(str(err))}", file=sys.stderr)
        return 2
    close_process_group()
    return getattr(cli, "exit_code", None) or 0


if __name__ == "__main__":
    sys.exit(main())
