import os
import warnings

import pytest
import torch

os.environ.setdefault("PYTHONWARNINGS", "ignore")
# trainer.precision auto by the ISA-flag rule in tests (no timing probe, no cache file in the user's
# folder); tests/test_precision.py turns the measurement on where it tests it.
os.environ.setdefault("PPO_LIGHTNING_PRECISION_PROBE_S", "0")
warnings.filterwarnings("ignore", category=DeprecationWarning)
warnings.filterwarnings("ignore", message=".*treespec.*")


@pytest.fixture(autouse=True)
def _single_thread():
    # Tests run on 2 shared cores; small nets gain nothing from intra-op threads.
    torch.set_num_threads(1)
    yield
