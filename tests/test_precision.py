"""One precision switch, Lightning's (`ppo_lightning.training.precision`): ``auto`` resolves per
machine; under ``bf16-mixed`` the rollout, update and EWMA proximal forwards run under bf16 autocast
while weights, Adam state, normalizers and the networks' outputs stay float32."""

from __future__ import annotations

import warnings

import lightning.pytorch as pl
import pytest
import torch

from ppo_lightning.core import hardware
from ppo_lightning.training import precision as prec

AVX2 = frozenset({"avx", "avx2", "fma"})
AVX512_NO_AMX = AVX2 | {"avx512f", "avx512_vnni", "avx512_bf16"}
AMX = AVX512_NO_AMX | {"amx_bf16", "amx_tile"}


@pytest.fixture
def cpu(monkeypatch):
    """Pretend to be a CPU with the given flags (no emulation variables, no CUDA)."""
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)

    def set_cpu(flags, capability="AVX512"):
        monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset(flags))
        monkeypatch.setattr(hardware, "cpu_capability", lambda: capability)

    return set_cpu


@pytest.mark.parametrize("flags,capability,expected,why", [
    (AMX, "AVX512", "bf16-mixed", "amx_bf16"),
    (AVX512_NO_AMX, "AVX512", "32-true", "no AMX"),
    (AVX2, "AVX2", "32-true", "emulated"),
])
def test_auto_resolves_per_cpu(cpu, flags, capability, expected, why):
    cpu(flags, capability)
    for accelerator in ("auto", "cpu", None):
        choice, reason = hardware.resolve_trainer_precision("auto", accelerator)
        assert choice == expected and why in reason
    assert hardware.resolve_trainer_precision("bf16-mixed", "cpu") == ("bf16-mixed", "set in the config")
    assert hardware.resolve_trainer_precision(None, "cpu")[0] is None  # Lightning's default (32-true)


def test_a_pinned_bf16_mixed_on_a_cpu_with_emulated_bf16_is_kept_and_said_once(cpu, monkeypatch):
    lines = []
    monkeypatch.setattr(prec, "_emit", lines.append)
    monkeypatch.setattr(prec, "_logged", set())
    for flags, said in ((AMX, False), (AVX512_NO_AMX, False), (AVX2, True)):  # only where bf16 is emulated
        cpu(flags, "AVX512" if flags != AVX2 else "AVX2")
        lines.clear()
        for _ in range(2):
            assert prec.resolve("bf16-mixed", "cpu") == "bf16-mixed"
        assert len(lines) == int(said), flags
        if said:
            assert "kept as set" in lines[0] and "emulated" in lines[0] and "\n" not in lines[0]
    assert prec.resolve("32-true", "cpu") == "32-true" and not lines[1:]


def test_auto_on_an_amx_cpu_is_32_true_for_small_minibatches(cpu, monkeypatch):
    """bf16's per-step weight casts outweigh its faster matmuls below 128 samples per step on a CPU
    (measured, docs/benchmarks/small-batch.md); GPUs are not affected."""
    cpu(AMX)
    for size, expected in ((8, "32-true"), (127, "32-true"), (128, "bf16-mixed"), (2048, "bf16-mixed"), (None, "bf16-mixed")):
        choice, reason = hardware.resolve_trainer_precision("auto", "cpu", size)
        assert choice == expected, size
        assert ("minibatches of" in reason) == (expected == "32-true")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "GPU")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: (8, 0))
    assert hardware.resolve_trainer_precision("auto", "gpu", 8)[0] == "bf16-mixed"


def test_fit_resolves_auto_from_the_scaled_minibatch(cpu, tmp_path):
    """Without a measurement (the ISA-flag rule): ``--scale 16`` on MinAtar gives minibatches of 32,
    so auto is 32-true on an AMX CPU; c = 1 (512) bf16."""
    from ppo_lightning.run.builder import fit_main

    cpu(AMX)
    for scale, expected in ((16, "32-true"), (1, "bf16-mixed")):
        cli = fit_main(["fit", "--config", "ppo_lightning/configs/minatar/ppo.yaml", "--scale", str(scale),
                        "--data.total_frames", "1", "--mlflow.enabled", "false", "--run_dir", str(tmp_path),
                        "--trainer.enable_checkpointing", "false", "--video_every", "null",
                        "--trainer.max_epochs", "0", "--trainer.enable_progress_bar", "false"])
        assert cli.config.fit.trainer.precision == expected


def test_auto_on_an_amx_cpu_with_amx_hidden_is_32_true(cpu, monkeypatch):
    cpu(AMX)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")  # the no-AMX emulation of the benchmarks
    choice, reason = hardware.resolve_trainer_precision("auto", "cpu")
    assert choice == "32-true" and "ONEDNN_MAX_CPU_ISA" in reason


@pytest.mark.parametrize("capability,expected", [((8, 0), "bf16-mixed"), ((9, 0), "bf16-mixed"), ((7, 5), "32-true")])
def test_auto_on_cuda_by_compute_capability(cpu, monkeypatch, capability, expected):
    cpu(AVX2, "AVX2")  # the host CPU does not matter for a GPU run
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "GPU")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: capability)
    for accelerator in ("auto", "gpu", "cuda"):
        assert hardware.resolve_trainer_precision("auto", accelerator)[0] == expected
    assert hardware.resolve_trainer_precision("auto", "cpu")[0] == "32-true"  # accelerator cpu: the CPU's


def test_aliases_map_onto_the_trainer_switch_with_one_warning_line():
    model = {"network": {"name": "impala_cnn", "precision": "fp32"}, "proximal_precision": "auto"}
    with pytest.warns(FutureWarning, match=r"--trainer.precision") as record:
        assert prec.take_precision_aliases(model) == "auto"
    assert all("\n" not in str(w.message) for w in record)
    assert "precision" not in model["network"] and model["proximal_precision"] is None  # they leave the config
    assert prec.take_precision_aliases({"network": {"precision": "bf16"}}, warn=False) == "bf16-mixed"
    assert prec.take_precision_aliases({"network": {"name": "mlp"}, "proximal_precision": None}) is None
    with pytest.raises(ValueError, match="trainer.precision"):
        prec.take_precision_aliases({"network": {"precision": "fp16"}}, warn=False)


# ------------------------------------------------------------------------------------ training
def _ewma_run(precision: str, normalize_observation: bool = True):
    """A tiny CartPole PPO-EWMA fit; records the dtype and autocast state seen by the first layer
    of the live network (rollout: no autograd; update: autograd) and of the EWMA proximal copy."""
    from ppo_lightning.data.datamodule import RolloutDataModule
    from ppo_lightning.training.module import PPOLightningModule

    seen: dict[str, set] = {"rollout": set(), "update": set(), "proximal": set()}

    def hook(kind):
        def record(module, inputs, output):
            where = kind if kind == "proximal" else ("update" if torch.is_grad_enabled() else "rollout")
            seen[where].add((output.dtype, torch.is_autocast_enabled("cpu")))
        return record

    class Hooks(pl.Callback):
        def on_train_start(self, trainer, pl_module):  # the proximal copy exists from on_fit_start
            pl_module.network.policy_body[0].register_forward_hook(hook("live"))
            pl_module.proximal_source.proximal.policy_body[0].register_forward_hook(hook("proximal"))

    pl.seed_everything(0)
    dm = RolloutDataModule(env_id="CartPole-v1", num_envs=4, rollout_steps=16, num_minibatches=2, update_epochs=2,
                           total_frames=128, normalize_reward=True, num_threads=1)
    model = PPOLightningModule(dm.observation_space, dm.action_space,
                               network={"name": "mlp", "normalize_observation": normalize_observation},
                               decoupled=True, proximal_com=4.0, lr=1e-3)
    trainer = pl.Trainer(max_epochs=-1, logger=False, enable_checkpointing=False, enable_model_summary=False,
                         enable_progress_bar=False, precision=precision, callbacks=[Hooks()])
    trainer.fit(model, dm)
    return seen, model, trainer, dm


@pytest.mark.parametrize("precision,dtype", [("bf16-mixed", torch.bfloat16), ("32-true", torch.float32)])
def test_rollout_update_and_proximal_forwards_follow_the_trainer_precision(precision, dtype):
    seen, model, trainer, dm = _ewma_run(precision)
    autocast = precision == "bf16-mixed"
    for where in ("rollout", "update", "proximal"):
        assert seen[where] == {(dtype, autocast)}, (where, seen[where])
    # What stays float32: weights, the EWMA average, Adam's state, the normalizers, and
    # the networks' outputs (so the ratios, GAE and the losses are float32).
    assert all(p.dtype == torch.float32 for p in model.network.parameters())
    assert all(p.dtype == torch.float32 for p in model.proximal_source.proximal.parameters())
    state = trainer.optimizers[0].state
    assert state and all(v.dtype == torch.float32 for s in state.values() for v in s.values() if v.is_floating_point())
    assert all(b.dtype == torch.float64 for b in model.network.obs_norm.buffers())  # its own float64 moments
    assert model.network.obs_norm.count > 0
    with trainer.precision_plugin.forward_context():
        out = model.network(torch.zeros(3, 4))
    assert all(t.dtype == torch.float32 for t in out)
    assert model.proximal_source.num_updates == trainer.global_step == 8


def test_bf16_proximal_forward_of_the_impala_net_uses_its_bf16_weight_copy():
    """IMPALA (``BF16_WEIGHTS_EXACT``): under bf16-mixed the proximal forward runs on a bf16 copy of
    the float32 average; under 32-true on the average itself."""
    from ppo_lightning.algos.proximal import ProximalPolicyEWMA
    from ppo_lightning.nets.impala import ImpalaActorCritic

    net = ImpalaActorCritic({"shape": [64, 64, 3], "dtype": "uint8"}, {"type": "discrete", "n": 15},
                            channels=(4, 8), dense=16)
    for bf16 in (False, True):
        src = ProximalPolicyEWMA(com=4.0, bf16=bf16)
        src.start(net)
        assert (src._forward_net is not None) == bf16
        assert all(p.dtype == torch.float32 for p in src.proximal.parameters())
    mlp_src = ProximalPolicyEWMA(com=4.0, bf16=True)  # the MLP may hold a normalizer: plain autocast
    from ppo_lightning.nets.models import ActorCritic

    mlp_src.start(ActorCritic({"shape": [4]}, {"type": "discrete", "n": 2}, normalize_observation=True))
    assert mlp_src._forward_net is None


def test_cli_resolves_auto_before_the_trainer_and_maps_the_deprecated_aliases(tmp_path, cpu, caplog):
    from pathlib import Path

    from ppo_lightning.run.builder import fit_main

    cfg = Path(__file__).resolve().parents[1] / "ppo_lightning/configs/cartpole/ppo_ewma.yaml"
    tiny = ["--mlflow.enabled", "false", "--trainer.enable_progress_bar", "false", "--data.total_frames", "256",
            "--data.num_threads", "1"]
    prec._logged.clear()
    cpu(AVX512_NO_AMX)
    cli = fit_main(["fit", "--config", str(cfg), *tiny, "--run_dir", str(tmp_path / "a"), "--trainer.precision", "auto"])
    assert cli.trainer.precision == "32-true"
    cpu(AMX)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        cli = fit_main(["fit", "--config", str(cfg), *tiny, "--run_dir", str(tmp_path / "b"),
                        "--model.proximal_precision", "bf16"])  # the old switch, trainer.precision unset
    assert cli.trainer.precision == "bf16-mixed" and cli.model.proximal_source.bf16
    assert any("model.proximal_precision is deprecated" in str(w.message) and "--trainer.precision" in str(w.message)
               for w in record)
    assert "proximal_precision" not in cli.model.hparams or cli.model.hparams.get("proximal_precision") is None
    cli = fit_main(["fit", "--config", str(cfg), *tiny, "--run_dir", str(tmp_path / "c"), "--trainer.precision",
                    "32-true", "--model.network.precision", "bf16"])  # the explicit Lightning switch wins
    assert cli.trainer.precision == "32-true"
    saved = (tmp_path / "b" / "config.yaml").read_text()
    assert "precision: bf16-mixed" in saved  # what ran is what the run folder records


# ------------------------------------------------------------------------------------ measured auto
from ppo_lightning.training import precision_probe as probe_lib  # noqa: E402

MLP_OBS = {"shape": [4], "dtype": "float32"}


def _mlp():
    from ppo_lightning.nets.models import ActorCritic

    return ActorCritic(MLP_OBS, {"type": "discrete", "n": 2})


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """The probe on (default budget), its cache in a temporary file, a fixed machine."""
    path = tmp_path / "cache" / "precision.json"
    monkeypatch.setenv(probe_lib.CACHE_ENV, str(path))
    monkeypatch.delenv(prec.PROBE_ENV, raising=False)
    monkeypatch.setattr(hardware, "cpu_model", lambda: "Test CPU")
    monkeypatch.setattr(hardware, "cpu_flags", lambda: AVX2)
    monkeypatch.setattr(prec, "_logged", set())
    return path


@pytest.fixture
def fake_probe(monkeypatch):
    """`precision_probe.probe` replaced by a recorder answering ``answer["choice"]``."""
    calls, answer = [], {"choice": "bf16-mixed", "ratio": 1.5}

    def fake(network, observation_space, minibatch, micro_batch=None, proximal=False, budget_s=2.0, clock=None):
        calls.append((type(network).__name__, minibatch, micro_batch, proximal))
        r = answer["ratio"]
        return probe_lib.ProbeResult(answer["choice"], r, 1.0, 1.0 / r, 0.5, minibatch, 1.0, False)

    monkeypatch.setattr(probe_lib, "probe", fake)
    return calls, answer


def test_the_probe_choice_is_cached_and_reused(cache, fake_probe):
    calls, _ = fake_probe
    choice, reason, entry = probe_lib.measured_choice(_mlp(), MLP_OBS, 64, None, True)
    assert choice == "bf16-mixed" and len(calls) == 1 and "measured" in reason and "1.50" in reason
    assert cache.exists() and entry["machine"]["cpu_model"] == "Test CPU"
    choice, reason, _ = probe_lib.measured_choice(_mlp(), MLP_OBS, 64, None, True)
    assert choice == "bf16-mixed" and len(calls) == 1 and "cached" in reason  # no second measurement
    # another workload (minibatch, proximal forward) is measured on its own
    probe_lib.measured_choice(_mlp(), MLP_OBS, 8, None, True)
    probe_lib.measured_choice(_mlp(), MLP_OBS, 64, None, False)
    assert len(calls) == 3


def test_a_changed_cpu_model_isa_or_library_version_invalidates_the_cache(cache, fake_probe, monkeypatch):
    import lightning

    calls, _ = fake_probe
    probe_lib.measured_choice(_mlp(), MLP_OBS, 64)
    assert len(calls) == 1
    monkeypatch.setattr(hardware, "cpu_model", lambda: "Another CPU")
    probe_lib.measured_choice(_mlp(), MLP_OBS, 64)
    assert len(calls) == 2
    monkeypatch.setattr(hardware, "cpu_flags", lambda: AVX512_NO_AMX)
    probe_lib.measured_choice(_mlp(), MLP_OBS, 64)
    assert len(calls) == 3
    monkeypatch.setattr(torch, "__version__", "9.9.9")
    probe_lib.measured_choice(_mlp(), MLP_OBS, 64)
    monkeypatch.setattr(lightning, "__version__", "9.9.9")
    probe_lib.measured_choice(_mlp(), MLP_OBS, 64)
    assert len(calls) == 5
    probe_lib.measured_choice(_mlp(), MLP_OBS, 64)  # nothing changed since: cached
    assert len(calls) == 5


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '{"format": 1, "entries": {"k": 3}}', "\x00\xff"])
def test_a_corrupt_cache_file_is_ignored_and_replaced(cache, fake_probe, content):
    calls, _ = fake_probe
    cache.parent.mkdir(parents=True)
    cache.write_text(content, errors="surrogateescape")
    choice, _, _ = probe_lib.measured_choice(_mlp(), MLP_OBS, 64)
    assert choice == "bf16-mixed" and len(calls) == 1
    import json

    assert json.loads(cache.read_text())["format"] == probe_lib.CACHE_FORMAT
    probe_lib.measured_choice(_mlp(), MLP_OBS, 64)
    assert len(calls) == 1


def test_an_unwritable_cache_folder_still_gives_the_measured_choice(cache, fake_probe, monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(probe_lib.CACHE_ENV, str(blocker / "precision.json"))  # a folder that cannot be made
    choice, reason, _ = probe_lib.measured_choice(_mlp(), MLP_OBS, 64)
    assert choice == "bf16-mixed" and "not cached" in reason


class _Data:
    minibatch_size, num_threads, env_id, observation_space = 64, 1, "CartPole-v1", MLP_OBS


class _Model:
    def __init__(self, proximal=True):
        self.network, self.hparams = _mlp(), {"micro_batch_size": None}
        self.proximal_source = object() if proximal else None


def test_a_forced_precision_is_never_overridden(cache, fake_probe):
    calls, answer = fake_probe
    for forced in ("32-true", "bf16-mixed"):
        for answer["choice"] in ("32-true", "bf16-mixed"):
            assert prec.resolve_auto(forced, "cpu", _Model(), _Data()) == (forced, "set in the config")
    assert not calls
    assert prec.resolve_auto("auto", "cpu", _Model(), _Data())[0] == "bf16-mixed" and calls == [("ActorCritic", 64, None, True)]


def test_several_processes_use_the_cache_or_the_flag_rule_never_a_new_measurement(cache, fake_probe):
    calls, _ = fake_probe
    choice, reason = prec.resolve_auto("auto", "cpu", _Model(), _Data(), processes=2)
    assert (choice, calls) == ("32-true", []) and "ISA-flag rule: 2 processes" in reason  # AVX2: the rule's 32-true
    prec.resolve_auto("auto", "cpu", _Model(), _Data())  # a single-process run measures and caches
    choice, reason = prec.resolve_auto("auto", "cpu", _Model(), _Data(), processes=2)
    assert choice == "bf16-mixed" and "cached" in reason and len(calls) == 1
    assert prec.planned_processes("auto", 1) == 1 and prec.planned_processes(2, 1) == 2
    assert prec.planned_processes([0, 1]) == 2 and prec.planned_processes("1", 2) == 2 and prec.planned_processes(-1) > 1


def test_no_measurement_where_it_is_turned_off_or_on_a_gpu(cache, fake_probe, monkeypatch):
    calls, _ = fake_probe
    monkeypatch.setenv(prec.PROBE_ENV, "0")
    choice, reason = prec.resolve_auto("auto", "cpu", _Model(), _Data())
    assert choice == "32-true" and f"{prec.PROBE_ENV}=0" in reason
    monkeypatch.delenv(prec.PROBE_ENV)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "GPU")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: (9, 0))
    choice, reason = prec.resolve_auto("auto", "gpu", _Model(), _Data())
    assert choice == "bf16-mixed" and "known, not measured" in reason and not calls


class _FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


@pytest.mark.parametrize("bf16_x,expected,stopped", [(0.5, "bf16-mixed", False), (0.99, "32-true", False),
                                                     (1.3, "32-true", False), (12.0, "32-true", True)])
def test_the_probe_picks_by_its_margin_and_stops_a_slow_bf16_early(monkeypatch, bf16_x, expected, stopped):
    """Chunk times by precision on a fake clock: 32-true 0.1 s; bf16 2x faster, 1% faster (within the
    3% margin: 32-true), 1.3x slower (timed to the end: 32-true), 12x slower (emulated: stopped after
    its first chunk)."""
    clock = _FakeClock()
    times = {"32-true": 0.1, "bf16-mixed": bf16_x * 0.1}

    def chunk(self, obs, clk):
        clock.t += times[self.precision]
        return times[self.precision], 0.0

    monkeypatch.setattr(probe_lib._Side, "chunk", chunk)
    r = probe_lib.probe(_mlp(), MLP_OBS, 64, None, True, budget_s=2.0, clock=clock)
    assert (r.choice, r.bf16_stopped) == (expected, stopped)
    assert r.probe_s <= 2.0  # bounded by time (a fake chunk cannot be cut: the real test checks that)
    if stopped:  # two 32-true chunks and one bf16 chunk, then the answer
        assert r.probe_s == pytest.approx(0.2 + times["bf16-mixed"]) and r.ratio <= 1 / probe_lib.SLOWER
    else:
        assert r.ratio == pytest.approx(1 / bf16_x)
        pairs = 2 if abs(bf16_x - 1) > 0.15 else probe_lib.MAX_PAIRS  # a clear answer after two timed pairs
        assert r.probe_s == pytest.approx(0.2 + times["bf16-mixed"] + pairs * (0.1 + times["bf16-mixed"]))


def test_the_probe_gives_no_answer_when_32_true_alone_exceeds_its_budget(monkeypatch):
    clock = _FakeClock()

    def chunk(self, obs, clk):
        clock.t += 5.0 * obs.shape[0] / 64  # a chunk of the minibatch (64 rows) takes 5 s
        return 5.0, 0.0

    monkeypatch.setattr(probe_lib._Side, "chunk", chunk)
    r = probe_lib.probe(_mlp(), MLP_OBS, 64, None, False, budget_s=2.0, clock=clock)
    assert r.choice is None and "exceed" in r.note and r.fp32_step_s is None
    assert r.probe_s <= 2.0 + 5.0  # a fake chunk cannot be cut short (the real test below checks that)


def test_a_real_probe_on_a_tiny_network_is_bounded_by_its_time(tmp_path):
    """A real measurement (this machine's CPU): an answer within the budget and one layer."""
    import time

    import lightning.pytorch.plugins.precision  # noqa: F401 - a run has imported it before its probe
    import ppo_lightning.algos.proximal  # noqa: F401

    t0 = time.perf_counter()
    r = probe_lib.probe(_mlp(), MLP_OBS, 64, None, True, budget_s=1.0)
    wall = time.perf_counter() - t0
    assert r.choice in ("32-true", "bf16-mixed", None) and r.probe_s <= wall
    assert wall < 1.0 + 0.5, r  # the budget and one chunk at most (a loaded machine's scheduling included)
    if r.choice is not None:
        assert r.ratio > 0 and r.fp32_step_s > 0 and ("bf16-mixed" if r.ratio >= probe_lib.MIN_SPEEDUP else "32-true") == r.choice
    # a chunk of 512 through 16 layers of 1024: ~50 GFLOP forward + backward, over a second on any CPU
    # here; the per-layer checks stop it after a layer (~1 GFLOP)
    big = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(16)])
    t0 = time.perf_counter()
    r = probe_lib.probe(big, {"shape": [1024]}, 512, None, False, budget_s=0.05)
    assert r.choice is None and time.perf_counter() - t0 < 1.0, r


def test_the_cli_records_the_measured_choice_and_its_reason(tmp_path, cache, fake_probe, monkeypatch):
    from pathlib import Path

    from ppo_lightning.run.builder import fit_main

    calls, answer = fake_probe
    cfg = Path(__file__).resolve().parents[1] / "ppo_lightning/configs/cartpole/ppo_ewma.yaml"
    tiny = ["--mlflow.enabled", "false", "--trainer.enable_progress_bar", "false", "--data.total_frames", "256",
            "--data.num_threads", "1", "--trainer.enable_checkpointing", "false", "--video_every", "null"]
    cli = fit_main(["fit", "--config", str(cfg), *tiny, "--run_dir", str(tmp_path / "a"), "--trainer.precision", "auto"])
    assert cli.trainer.precision == "bf16-mixed" and len(calls) == 1 and calls[0][3]  # PPO-EWMA: proximal forward timed
    assert cli.precision_params["precision"] == "bf16-mixed" and "measured" in cli.precision_params["precision_reason"]
    assert "precision: bf16-mixed" in (tmp_path / "a" / "config.yaml").read_text()  # what ran
    answer["choice"] = "32-true"  # a second run of the same workload: the cached answer, no new measurement
    cli = fit_main(["fit", "--config", str(cfg), *tiny, "--run_dir", str(tmp_path / "b"), "--trainer.precision", "auto"])
    assert cli.trainer.precision == "bf16-mixed" and len(calls) == 1 and "cached" in cli.precision_params["precision_reason"]
    cli = fit_main(["fit", "--config", str(cfg), *tiny, "--run_dir", str(tmp_path / "c"), "--trainer.precision", "32-true"])
    assert cli.trainer.precision == "32-true" and len(calls) == 1
    assert cli.precision_params == {"precision": "32-true", "precision_reason": "set in the config"}


def test_a_python_built_ppo_trainer_measures_auto_at_fit(cache, fake_probe):
    from ppo_lightning.data.datamodule import RolloutDataModule
    from ppo_lightning.training.module import PPOLightningModule

    calls, _ = fake_probe
    dm = RolloutDataModule(env_id="CartPole-v1", num_envs=2, rollout_steps=16, num_minibatches=2, update_epochs=1,
                           total_frames=32, num_threads=1)
    model = PPOLightningModule(dm.observation_space, dm.action_space, network={"name": "mlp"}, lr=1e-3)
    trainer = prec.PPOTrainer(max_epochs=-1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                              enable_model_summary=False, precision="auto", accelerator="cpu")
    assert trainer.precision == "32-true"  # the ISA-flag rule (AVX2) until fit measures
    trainer.fit(model, dm)  # the datamodule as Lightning takes it in either place
    assert trainer.precision == "bf16-mixed" and "measured" in trainer.precision_reason and len(calls) == 1
    assert prec.PPOTrainer(precision="32-true", logger=False).precision == "32-true"
