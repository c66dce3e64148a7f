"""``--trainer.precision auto`` on a CPU: time the run's own training step in 32-true and bf16-mixed.

ISA flags do not tell which precision is faster: on two CPUs with the same flags (AVX-512 +
AVX512_BF16, no AMX) bf16-mixed was 1.3x slower (a Xeon) and 1.55x faster (an AMD EPYC) for the
same Procgen PPO (docs/benchmarks/procgen.md). So ``auto`` measures, once per machine and workload:

- **what** (`probe`): the run's step on a copy of its network, at its minibatch: forward and
  backward of one chunk (the run's ``model.micro_batch_size``, else the minibatch, at most
  `MAX_ROWS` samples) under each precision's Lightning context (``MixedPrecision("bf16-mixed")``:
  autocast; 32-true: none), the EWMA proximal no-grad forward of that chunk where the run has one
  (`ProximalPolicyEWMA`, with its bf16 weight copy under bf16-mixed, as in training) and one fused
  Adam step; the step's estimate is chunks x (chunk's time) + Adam's. Random observations of the
  run's observation space; the loss is the mean of the network's outputs (the loss arithmetic is
  small beside the network). Interleaved (32-true, bf16, 32-true, ...), the fastest of each side.
- **the rule**: bf16-mixed only if its step is at least `MIN_SPEEDUP` (3%) faster; below that the
  difference is in the noise of a shared machine and 32-true (exact, the default) is kept.
- **bounded by time, not iterations** (`BUDGET_S`): every chunk runs against a deadline, checked
  by hooks on every module's forward and every parameter's gradient, so a chunk that overruns
  stops within one layer. bf16 stops early once it is clearly slower: its warm-up chunk is stopped
  at `WARMUP_SLOWER` x the 32-true chunk, a timed chunk at `SLOWER` x (where bf16 is emulated,
  8-12x slower, the probe ends there). A probe whose 32-true chunks alone do not fit the budget
  gives no answer (the caller falls back to the ISA-flag rule).
- **cached** (`cached_choice` / `store`): a JSON file in the user's cache folder
  (``platformdirs.user_cache_dir("ppo-lightning")/precision.json``, or the file
  ``$PPO_LIGHTNING_PRECISION_CACHE``), one entry per key of the machine (CPU model, all ISA flags,
  torch's CPU capability and ISA limits, cores, torch threads, torch and Lightning versions) and the
  workload (network class and parameter shapes, observation space, seeds, minibatch, chunk,
  proximal forward): any change is a new key, so a new CPU or library measures again. An unreadable
  or malformed file is ignored (and replaced on the next write).
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import hashlib
import json
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from ppo_lightning.algos.proximal import ProximalPolicyEWMA
from ppo_lightning.core import hardware
from ppo_lightning.core.storage import atomic_replace, user_cache_folder

BUDGET_S = 2.0  # wall seconds for the whole probe (both precisions)
MIN_SPEEDUP = 1.03  # bf16-mixed is picked only when 32-true's step takes >= 1.03x bf16's
WARMUP_SLOWER = 3.0  # bf16's first chunk (oneDNN primitives are created then) may take this x 32-true's
SLOWER = 2.5  # a timed bf16 sample stopped at this x 32-true's: clearly slower
MAX_ROWS = 512  # samples per timed chunk at most (a larger minibatch is timed in chunks of this)
MIN_ROWS = 8  # a chunk whose timed 32-true run takes over an eighth of the budget is cut by 4, down to this
MIN_SAMPLE_S = 0.05  # a timed sample repeats a short chunk to last about this long (timer and load noise)
HOOKS_FROM_S = 0.01  # per-layer deadline checks only for chunks at least this long (their cost is per call)
MAX_PAIRS = 8  # timed (bf16, 32-true) samples at most
CLEAR = 1.15  # after two pairs, a chunk-time ratio beyond 1.15x either way ends the probe
CACHE_ENV = "PPO_LIGHTNING_PRECISION_CACHE"
CACHE_FORMAT = 1
MAX_ENTRIES = 64


class _Overrun(Exception):
    """A chunk passed its deadline (raised from a hook; the chunk is abandoned)."""


@dataclass
class ProbeResult:
    choice: str | None  # "bf16-mixed" / "32-true"; None: the probe could not decide within its budget
    ratio: float | None  # 32-true step time / bf16-mixed step time (> 1: bf16 faster); a bound if stopped early
    fp32_step_s: float | None  # estimated seconds of one optimizer step of the run's minibatch
    bf16_step_s: float | None
    probe_s: float  # wall seconds the probe took
    rows: int  # samples per timed chunk
    chunks: float  # chunks per minibatch
    bf16_stopped: bool  # the bf16 side was stopped early (clearly slower)
    note: str = ""

    def summary(self) -> str:
        """One phrase: what was measured (for the log line and the run's ``precision_reason``)."""
        if self.choice is None:
            return f"probe gave no answer in {self.probe_s:.1f} s ({self.note})"
        if self.bf16_stopped:
            speed = f"bf16-mixed >= {1 / self.ratio:.1f}x slower (stopped early)"
        elif self.ratio >= 1:
            speed = f"bf16-mixed {self.ratio:.2f}x faster"
        else:
            speed = f"bf16-mixed {1 / self.ratio:.2f}x slower"
        return (f"measured: {speed} than 32-true (32-true/bf16 step time {self.ratio:.2f}, pick bf16 at >= "
                f"{MIN_SPEEDUP:.2f}; probe {self.probe_s:.1f} s on {self.rows}-sample chunks)")


# ------------------------------------------------------------------------------------ timing
def _random_observations(observation_space: dict, rows: int, seeds: int | None) -> torch.Tensor:
    shape = [*([seeds] if seeds else []), rows, *observation_space["shape"]]
    dtype = str(observation_space.get("dtype", "float32"))
    g = torch.Generator().manual_seed(0)
    if dtype == "bool":
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.startswith("uint") or dtype.startswith("int"):
        return torch.randint(0, 256 if dtype == "uint8" else 8, shape, generator=g).to(getattr(torch, dtype))
    return torch.randn(shape, generator=g)


def _scalar(out: Any) -> torch.Tensor:
    tensors = [out] if isinstance(out, torch.Tensor) else [t for t in (out if isinstance(out, (tuple, list)) else ())
                                                            if isinstance(t, torch.Tensor)]
    return sum(t.float().mean() for t in tensors if t.is_floating_point())


class _Deadline:
    """Hooks on a network's modules (forward) and parameters (gradient) that raise `_Overrun` once
    ``clock`` passes ``at`` or ``wall`` passes ``end`` (None: no limit)."""

    def __init__(self, clock: Callable[[], float], wall: Callable[[], float]) -> None:
        self.clock, self.wall, self.at, self.end, self.handles = clock, wall, None, None, []

    def passed(self) -> bool:
        return (self.at is not None and self.clock() > self.at) or (self.end is not None and self.wall() > self.end)

    def check(self) -> None:
        if self.passed():
            raise _Overrun

    def watch(self, net: nn.Module) -> None:
        for m in net.modules():
            self.handles.append(m.register_forward_hook(lambda *_: self.check()))
        for p in net.parameters():
            if p.requires_grad:
                self.handles.append(p.register_hook(lambda g: (self.check(), g)[1]))

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []


class _Side:
    """One precision's copy of the step: network, Adam, proximal source, forward context."""

    def __init__(self, precision: str, network: nn.Module, proximal: bool, deadline: _Deadline) -> None:
        from lightning.pytorch.plugins.precision import MixedPrecision

        self.precision = precision
        self.net = copy.deepcopy(network).float().train()
        self.context = (MixedPrecision("bf16-mixed", "cpu").forward_context if precision == "bf16-mixed"
                        else contextlib.nullcontext)
        params = [p for p in self.net.parameters() if p.requires_grad]
        self.optimizer = torch.optim.Adam(params, lr=1e-5, fused=True)
        self.proximal = None
        if proximal:

            self.proximal = ProximalPolicyEWMA(com=8.0, bf16=precision == "bf16-mixed")
            self.proximal.start(self.net)
            for net in (self.proximal.proximal, self.proximal._forward_net):
                if net is not None:
                    deadline.watch(net)
        deadline.watch(self.net)

    def chunk(self, obs: torch.Tensor, clock: Callable[[], float]) -> tuple[float, float]:
        """(seconds of one chunk's proximal forward + forward + backward, seconds of the Adam step)."""
        t0 = clock()
        with self.context():
            if self.proximal is not None:
                self.proximal.proximal_policy(obs)
            loss = _scalar(self.net(obs))
        loss.backward()
        t1 = clock()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return t1 - t0, clock() - t1


def probe(network: nn.Module, observation_space: dict, minibatch: int, micro_batch: int | None = None,
          proximal: bool = False, budget_s: float = BUDGET_S, clock: Callable[[], float] = time.process_time,
          wall: Callable[[], float] | None = None) -> ProbeResult:
    """Time the run's training step (see the module) in 32-true and bf16-mixed on the CPU, within
    ``budget_s`` seconds of ``wall`` (default the wall clock; overrun: at most one layer), and pick by
    `MIN_SPEEDUP`. Chunks are timed by ``clock`` (default this process's CPU seconds: other jobs on
    a shared machine slow the wall clock of both sides unevenly, not the work each side does)."""
    import lightning.pytorch.plugins.precision  # noqa: F401 - imports before the clock starts
    import ppo_lightning.algos.proximal  # noqa: F401

    wall = wall or (clock if clock is not time.process_time else time.perf_counter)
    start = wall()
    end = start + budget_s
    seeds = getattr(network, "members", None)  # a seed group's stacked network: [S, rows, ...]
    rows = max(1, min(minibatch, micro_batch or minibatch, MAX_ROWS))
    deadline = _Deadline(clock, wall)
    fp32 = bf16 = None
    state = {"obs": None, "hooked": True}

    def run(side: _Side, reps: int, cpu_limit: float | None = None, wall_limit: float | None = None):
        """Mean (chunk, Adam) ``clock`` seconds of ``reps`` chunks, or None past ``cpu_limit`` (by
        ``clock``) or ``wall_limit`` (by ``wall``; never past the budget's end)."""
        deadline.at, deadline.end = cpu_limit, min(end, wall_limit or end)
        hooks_at = (deadline.at, deadline.end)
        if not state["hooked"]:  # tiny chunks: checked between them only
            deadline.at = deadline.end = None
        fb = adam = 0.0
        try:
            for _ in range(reps):
                deadline.at, deadline.end = hooks_at
                if deadline.passed():
                    return None
                if not state["hooked"]:
                    deadline.at = deadline.end = None
                a, b = side.chunk(state["obs"], clock)
                fb, adam = fb + a, adam + b
            deadline.at, deadline.end = hooks_at
            return None if deadline.passed() else (fb / reps, adam / reps)
        except _Overrun:
            side.optimizer.zero_grad(set_to_none=True)
            return None
        finally:
            deadline.at = deadline.end = None

    def result(choice, ratio, t32, tb, stopped, note=""):
        chunks = minibatch / rows
        step = lambda t: None if t is None else chunks * t[0] + t[1]  # noqa: E731
        return ProbeResult(choice, ratio, step(t32), step(tb), wall() - start, rows, chunks, stopped, note)

    try:
        with torch.random.fork_rng(devices=[]):  # the run's seeded RNG is left as it was
            fp32 = _Side("32-true", network, proximal, deadline)
            while True:  # 32-true: a warm-up chunk (a new shape: oneDNN primitives), then a timed one; a
                # chunk over an eighth of the budget is cut by 4 (the probe times per sample: same ratio)
                state["obs"] = _random_observations(observation_space, rows, seeds)
                warm32 = run(fp32, 1, wall_limit=wall() + budget_s / 3)
                first = None if warm32 is None else run(fp32, 1, wall_limit=wall() + budget_s / 8)
                if first is not None or rows <= MIN_ROWS or wall() > end:
                    break
                rows = max(MIN_ROWS, rows // 4)
            if first is None:
                return result(None, None, None, None, False, f"32-true chunks of {rows} samples alone exceed the budget")
            if sum(first) < HOOKS_FROM_S:  # tiny chunks: an overrun is short without per-layer checks
                deadline.remove()
                state["hooked"] = False
            reps = max(1, min(1000, math.ceil(MIN_SAMPLE_S / max(sum(first), 1e-6))))
            if reps > 1:
                first = run(fp32, reps) or first
            t32 = [first]
            bf16 = _Side("bf16-mixed", network, proximal, deadline)
            if not state["hooked"]:
                deadline.remove()
            t0 = clock()
            warm = run(bf16, 1, cpu_limit=t0 + WARMUP_SLOWER * max(sum(first), sum(warm32)))
            if warm is None:  # stopped: by its limit (clearly slower), or by the budget's end
                took = clock() - t0
                if took < SLOWER * sum(first):
                    return result(None, None, first, None, False, "bf16's first chunk did not fit the budget")
                return result("32-true", sum(first) / took, first, None, True)
            tb: list[tuple[float, float]] = []
            pair_s = 0.0  # wall seconds of the last timed pair
            while len(tb) < MAX_PAIRS and wall() + pair_s < end:
                fastest = min(t32, key=sum)
                w0, t0 = wall(), clock()
                timed = run(bf16, reps, cpu_limit=t0 + SLOWER * reps * sum(fastest))
                if timed is None:  # clearly slower, or the budget's end
                    took = clock() - t0
                    if took >= SLOWER * reps * sum(fastest):
                        return result("32-true", reps * sum(fastest) / took, fastest, None, True)
                    break
                tb.append(timed)
                again = run(fp32, reps)
                if again is None:
                    break
                t32.append(again)
                pair_s = wall() - w0
                if len(tb) >= 2 and abs(math.log(sum(min(t32, key=sum)) / sum(min(tb, key=sum)))) > math.log(CLEAR):
                    break  # two pairs far from the margin: the answer is clear
            best32, bestb = min(t32, key=sum), min(tb or [warm], key=sum)  # no timed bf16 sample: its warm-up (slower)
            chunks = minibatch / rows
            ratio = (chunks * best32[0] + best32[1]) / (chunks * bestb[0] + bestb[1])
            return result("bf16-mixed" if ratio >= MIN_SPEEDUP else "32-true", ratio, best32, bestb, False,
                          "" if tb else "bf16 timed by its warm-up chunk only")
    finally:
        deadline.remove()
        del fp32, bf16


# ------------------------------------------------------------------------------------ cache
def cache_path() -> Path:
    """``$PPO_LIGHTNING_PRECISION_CACHE``, else ``precision.json`` in the user's cache folder
    (platformdirs: ``$XDG_CACHE_HOME/ppo-lightning`` or ``~/.cache/ppo-lightning`` on Linux)."""
    override = os.environ.get(CACHE_ENV)
    if override:
        return Path(override)
    return user_cache_folder() / "precision.json"


def machine_key() -> dict[str, Any]:
    """What of the machine and libraries decides which precision is faster (a change: measure again)."""
    import lightning

    flags = sorted(hardware.cpu_flags())
    return {
        "cpu_model": hardware.cpu_model(),
        "isa": [f for f in hardware.ISA_FLAGS if f in flags],
        "flags_sha": hashlib.sha256(" ".join(flags).encode()).hexdigest()[:16],
        "torch_cpu_capability": hardware.cpu_capability(),
        "isa_limits": {k: os.environ.get(k) for k in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")
                       if os.environ.get(k)},
        "cores": hardware.core_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "lightning": lightning.__version__,
    }


def workload_key(network: nn.Module, observation_space: dict, minibatch: int, micro_batch: int | None,
                 proximal: bool) -> dict[str, Any]:
    shapes = ";".join(f"{n}:{tuple(p.shape)}" for n, p in network.named_parameters())
    inner = getattr(network, "inner", network)
    return {
        "network": type(inner).__name__,
        "params_sha": hashlib.sha256(shapes.encode()).hexdigest()[:16],
        "observation": {"shape": list(observation_space.get("shape", [])), "dtype": str(observation_space.get("dtype", ""))},
        "seeds": getattr(network, "members", None),
        "minibatch": int(minibatch),
        "rows": max(1, min(minibatch, micro_batch or minibatch, MAX_ROWS)),
        "proximal": bool(proximal),
    }


def entry_key(machine: dict, workload: dict) -> str:
    return hashlib.sha256(json.dumps([machine, workload], sort_keys=True).encode()).hexdigest()[:24]


def _read(path: Path) -> dict:
    """The cache's entries ({} for a missing, unreadable or malformed file)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return {}
    if not isinstance(data, dict) or data.get("format") != CACHE_FORMAT or not isinstance(data.get("entries"), dict):
        return {}
    return {k: v for k, v in data["entries"].items()
            if isinstance(v, dict) and v.get("choice") in ("32-true", "bf16-mixed")}


def cached_choice(key: str, path: Path | None = None) -> dict | None:
    """The cached entry for ``key`` (its ``choice``, ``reason``, figures), or None."""
    return _read(path or cache_path()).get(key)


def store(key: str, entry: dict, path: Path | None = None) -> bool:
    """Write ``entry`` under ``key`` (atomically: a temporary file swapped in); False if the folder
    is not writable (the choice then holds for this run only)."""
    path = path or cache_path()
    entries = _read(path)
    entries[key] = entry
    if len(entries) > MAX_ENTRIES:  # the oldest go
        for k in sorted(entries, key=lambda k: str(entries[k].get("measured_at", "")))[:len(entries) - MAX_ENTRIES]:
            del entries[k]
    text = json.dumps({"format": CACHE_FORMAT, "entries": entries}, indent=1, sort_keys=True)
    try:
        atomic_replace(path, lambda f: f.write(text.encode()), tmp_suffix=".json")
        return True
    except OSError:
        return False


def measured_choice(network: nn.Module, observation_space: dict, minibatch: int, micro_batch: int | None = None,
                    proximal: bool = False, measure: bool = True, budget_s: float = BUDGET_S
                    ) -> tuple[str | None, str, dict | None]:
    """``(choice, reason, entry)`` for this machine and workload: the cached measurement, else (with
    ``measure``) a new `probe`, cached. ``choice`` None: no measurement (``measure`` False and none
    cached, or the probe gave no answer; ``reason`` says which)."""
    machine, workload = machine_key(), workload_key(network, observation_space, minibatch, micro_batch, proximal)
    key, path = entry_key(machine, workload), cache_path()
    entry = cached_choice(key, path)
    if entry is not None:
        return entry["choice"], f"{entry.get('summary', 'measured')} [cached {str(entry.get('measured_at', ''))[:10]}]", entry
    if not measure:
        return None, "no cached measurement for this machine and workload", None
    result = probe(network, observation_space, minibatch, micro_batch, proximal, budget_s)
    if result.choice is None:
        return None, result.summary(), None
    entry = {**asdict(result), "summary": result.summary(), "machine": machine, "workload": workload,
             "measured_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    stored = store(key, entry, path)
    return result.choice, result.summary() + ("" if stored else f" [not cached: {path} not writable]"), entry
