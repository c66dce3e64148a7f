"""``model.compile``: the loss's network forward and backward through ``torch.compile``.

The network the loss calls is replaced by ``torch.compile(network, dynamic=False)``, an
``OptimizedModule`` that shares the network's parameters (the optimizer, the EWMA, checkpoints and
the export see the same tensors). Collection keeps the eager network: its batch shapes vary (the
envs per step, the episode ends whose final observations GAE evaluates), which would compile a
graph per shape. Minibatches all have the same shape, so the graph is compiled once, during the
first gradient step (forward at the call, backward at the first backward), and never again: the
number of compiled graphs is logged (``train/compiled_graphs``) and tested constant.

Measured on MinAtar at c = 16 (docs/benchmarks/small-batch.md): inductor gives no gain on
CPU there, because a step of 32 samples is bound by per-call overhead, not by kernels; the switch
is for larger networks and GPUs.
"""

from __future__ import annotations

import time

import torch

from ppo_lightning.adapters import torch as torch_ops

BACKENDS_HINT = "true (inductor) or a torch.compile backend name such as 'aot_eager'"


def validate_compile(value, ppg: bool = False) -> None:
    """One-line errors for ``model.compile`` (false: off, nothing to check)."""
    if value is False:
        return
    if value is True:
        backend = "inductor"
    elif isinstance(value, str) and value:
        backend = value
    else:
        raise ValueError(f"model.compile must be false, {BACKENDS_HINT}; got {value!r}")
    if ppg:
        raise ValueError("model.compile is not supported with model.ppg yet (its phases call the network's other methods)")
    if backend not in torch.compiler.list_backends(exclude_tags=()):
        raise ValueError(f"model.compile: unknown torch.compile backend {backend!r}; known: {', '.join(torch.compiler.list_backends())}")


def _graphs() -> int:
    return torch_ops.compiled_graphs()


class CompiledLoss:
    """Puts a compiled network into ``loss_module`` and reports the compile time once."""

    def __init__(self, loss_module: torch.nn.Module, network: torch.nn.Module, value) -> None:
        backend = "inductor" if value is True else value
        self.backend = backend
        self.compiled = torch.compile(network, backend=backend, dynamic=False)
        loss_module.__dict__["network"] = self.compiled  # not a submodule: the LightningModule owns the network
        self._graphs0 = _graphs()
        self._t0: float | None = None
        self.compile_s: float | None = None

    def step_started(self) -> None:
        if self.compile_s is None:
            self._t0 = time.perf_counter()

    def step_ended(self) -> dict[str, float]:
        """Metrics for this iteration: the compile time (the first gradient step) once, and the
        number of graphs compiled so far."""
        out = {"train/compiled_graphs": float(self.graphs)}
        if self.compile_s is None and self._t0 is not None:
            self.compile_s = time.perf_counter() - self._t0
            print(f"model.compile ({self.backend}): first gradient step, compiling included, {self.compile_s:.1f} s", flush=True)
            out["time/compile_s"] = self.compile_s
        return out

    @property
    def graphs(self) -> int:
        return _graphs() - self._graphs0
