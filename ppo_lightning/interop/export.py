"""Checkpoints to Hugging Face folders and back: the names other modules import from here.

The code lives by concern: `ppo_lightning.interop.checkpoint_io` (reading ``.ckpt`` files and sharded
folders safely), `ppo_lightning.interop.hf.writer` (``export-hf``), `ppo_lightning.interop.hf.loader`
(``load_pretrained``, ``init_from``), `ppo_lightning.interop.hf.card` and `ppo_lightning.interop.hf.bundle`.
"""

from ppo_lightning.interop.checkpoint_io import (  # noqa: F401
    DATA_STATE_KEY,
    SHARDED_META,
    WEIGHTS_PREFIX,
    ExportError,
    load_network,
    network_state_dict,
    read_checkpoint,
)
from ppo_lightning.interop.hf.loader import (  # noqa: F401
    DTYPES,
    MODEL_TYPE,
    load_pretrained,
    load_pretrained_weights,
    read_pretrained_config,
)
from ppo_lightning.interop.hf.writer import AUTO_MAP, FORMAT_VERSION, build_config, export_hf, export_main  # noqa: F401
