"""Entry point of the ``ppo-lightning`` command: dispatches before importing anything heavy, so that
``export-hf`` does not pay for (or print from) Lightning's CLI, TorchRL's collectors and the envs."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "export-hf":
        from ppo_lightning.export import export_main

        return export_main(args[1:])
    from ppo_lightning.cli import main as fit_cli_main

    return fit_cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
