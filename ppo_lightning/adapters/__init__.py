"""Every reach into another library's private names, one module per library, each access with the
reason no public API serves and the release it was read against (``VERIFIED``; `check` names what
moved). The rest of the package uses the libraries' public APIs and these functions only
(`tests/test_layout.py` walks the code for private reads; `tests/test_adapters.py` fails loudly
when a pinned version moves).

- `ppo_lightning.adapters.torch`: fused Adam, the foreach ops, the non-finite check of
  ``GradScaler``, functorch's batched-tensor test, oneDNN's fused conv + ReLU, TorchDynamo's counters.
- `ppo_lightning.adapters.torchrl`: the step a collector carries to its next rollout; the gymnasium
  env inside TorchRL's ``GymWrapper``.
- `ppo_lightning.adapters.gymnasium`: one step of a ``SyncVectorEnv``'s sub-envs written into its
  own arrays.
- `ppo_lightning.adapters.lightning`: MLflow logger's run name; LightningCLI's subcommand parsers;
  the Trainer a module is attached to (public, but raising where none is).

The lowest layer: every other may import it. May import: the one library each module adapts (lazily
where the package's light commands must not load it), numpy and the standard library; nothing of
ppo_lightning.
"""
