"""Base services every layer may use: typed errors and fault guards (`faults`), storage faults (a
folder that cannot be written, a full disk: `storage`), the machine's
CPU/GPU features and the precision choice (`hardware`), torch thread settings (`threads`).

May import: torch, numpy and the standard library only; nothing else of ppo_lightning.
"""
