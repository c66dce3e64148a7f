"""Base services every layer may use: the typed errors that end a command in one line (`errors`, no
torch: a command names them before the training stack loads), the fault guards (`faults`), storage faults (a
folder that cannot be written, a full disk: `storage`), the machine's
CPU/GPU features and the precision choice (`hardware`), torch thread settings (`threads`).

May import: torch, numpy, the standard library and `adapters` (torch's private ops); nothing else of
ppo_lightning, and nothing of Lightning.
"""
