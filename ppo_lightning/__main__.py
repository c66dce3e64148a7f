"""``python -m ppo_lightning ...`` is the ``ppo-lightning`` command."""

import sys

from ppo_lightning.cli.main import main

sys.exit(main())
