import os
import warnings

import pytest
import torch

os.environ.setdefault("PYTHONWARNINGS", "ignore")
warnings.filterwarnings("ignore", category=DeprecationWarning)
warnings.filterwarnings("ignore", message=".*treespec.*")


@pytest.fixture(autouse=True)
def _single_thread():
    # Tests run on 2 shared cores; small nets gain nothing from intra-op threads.
    torch.set_num_threads(1)
    yield
