"""Procgen: env factory, IMPALA network, normalized return, held-out evaluation, a tiny training run."""

from __future__ import annotations

import math

import pytest
import torch
import yaml

from ppo_lightning.envs import check_env_id, env_spaces, make_env
from ppo_lightning.envs.procgen_env import auto_procgen_threads, check_procgen_game, make_procgen_env, procgen_spaces
from ppo_lightning.envs.procgen_scores import mean_normalized_return, normalized_return, return_range
from ppo_lightning.nets.impala import ImpalaActorCritic
from ppo_lightning.core import hardware

OBS, ACT = procgen_spaces()


# ---------------------------------------------------------------------------------------------- env
def test_unknown_game_names_the_field():
    with pytest.raises(ValueError, match="data.env_id"):
        check_procgen_game("pong")
    with pytest.raises(ValueError, match="data.env_id"):
        check_env_id("procgen:pong")
    check_env_id("procgen:coinrun")


def test_spaces():
    assert OBS == {"shape": [64, 64, 3], "dtype": "uint8"}
    assert ACT == {"type": "discrete", "n": 15}
    assert env_spaces("procgen:starpilot", {"distribution_mode": "easy"}) == (OBS, ACT)


def test_auto_threads_never_oversubscribe():
    import os

    cores = len(os.sched_getaffinity(0))  # the oracle: the affinity mask itself
    for n in (1, 4, 64, 1024):
        assert 0 <= auto_procgen_threads(n) <= max(0, cores - 1)


def test_seeds_and_levels():
    kw = {"distribution_mode": "easy", "num_levels": 50}
    a = make_procgen_env("coinrun", 4, seed=3, **kw).reset()["observation"]
    b = make_procgen_env("coinrun", 4, seed=3, **kw).reset()["observation"]
    c = make_procgen_env("coinrun", 4, seed=4, **kw).reset()["observation"]
    assert a.dtype == torch.uint8 and a.shape == (4, 64, 64, 3)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    # One level: every env starts in the same level; another start level is another level.
    one = make_procgen_env("coinrun", 3, seed=0, num_levels=1, start_level=7).reset()["observation"]
    assert torch.equal(one[0], one[1]) and torch.equal(one[0], one[2])
    other = make_procgen_env("coinrun", 1, seed=0, num_levels=1, start_level=8).reset()["observation"]
    assert not torch.equal(one[0], other[0])


def test_episode_stats_and_next_observation_consistency():
    env = make_env("procgen:coinrun", 16, 0, {"distribution_mode": "easy", "num_levels": 20})
    torch.manual_seed(0)
    td = env.rollout(250, break_when_any_done=False)  # random actions, TorchRL partial resets
    done = td["next", "done"].squeeze(-1)
    assert done.any(), "no coinrun episode ended in 250 random steps x 16 envs"
    assert torch.equal(td["next", "terminated"], td["next", "done"])
    assert not td["next", "truncated"].any()
    # Procgen's auto-reset: the observation after an end is the next episode's first one, and the
    # partial reset hands back exactly that observation.
    assert torch.equal(td["next", "observation"][:, :-1], td["observation"][:, 1:])
    reward, ep_ret, steps = (td["next", k].squeeze(-1) for k in ("reward", "episode_reward", "step_count"))
    for e, t in done.nonzero().tolist():
        start = 0
        prev = done[e, :t].nonzero()
        if len(prev):
            start = int(prev[-1]) + 1
        assert ep_ret[e, t] == pytest.approx(float(reward[e, start : t + 1].sum()))
        assert int(steps[e, t]) == t - start + 1


def test_full_reset_restarts_running_episodes():
    env = make_procgen_env("coinrun", 2, seed=0, distribution_mode="easy")
    td = env.reset()
    for _ in range(5):
        td = env.step(td.set("action", torch.zeros(2, dtype=torch.int64)))["next"]
    assert int(td["step_count"].max()) == 5
    td = env.reset()
    assert int(td["step_count"].max()) == 0
    out = env.step(td.set("action", torch.zeros(2, dtype=torch.int64)))
    assert int(out["next", "step_count"].max()) == 1


# ------------------------------------------------------------------------------------------ network
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_impala_shapes(precision):
    net = ImpalaActorCritic(OBS, ACT)
    obs = torch.randint(0, 256, (2, 3, 64, 64, 3), dtype=torch.uint8)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):  # as Lightning's bf16-mixed
        logits, value = net(obs)
        assert logits.shape == (2, 3, 15) and value.shape == (2, 3, 1)
        assert logits.dtype == torch.float32 and value.dtype == torch.float32  # float32 outputs under autocast
        (p,) = net.policy(obs[0])
        assert p.shape == (3, 15) and p.dtype == torch.float32
        assert net.value(obs[0, 0]).shape == (1,)
        torch.testing.assert_close(net.policy(obs)[0], logits)
        torch.testing.assert_close(net.value(obs), value)
    if precision == "fp32":  # float input is taken as already scaled
        torch.testing.assert_close(net(obs.float() / 255.0)[0], logits, atol=1e-5, rtol=1e-5)


def test_impala_reference_init():
    net = ImpalaActorCritic(OBS, ACT)
    row = lambda w: w.flatten(1).norm(dim=1)  # noqa: E731
    for head in (net.policy_head, net.value_head):
        torch.testing.assert_close(row(head.weight), torch.full((head.out_features,), 0.1))
        assert not head.bias.any()
    torch.testing.assert_close(row(net.dense.weight), torch.full((256,), 1.4))
    assert net.dense.in_features == 32 * 8 * 8
    block_scale = math.sqrt(1 / math.sqrt(3) / math.sqrt(2))
    for stack in net.stacks:
        torch.testing.assert_close(row(stack.firstconv.weight), torch.ones(stack.firstconv.out_channels))
        assert len(stack.blocks) == 2
        for block in stack.blocks:
            for conv in (block.conv0, block.conv1):
                torch.testing.assert_close(row(conv.weight), torch.full((conv.out_channels,), block_scale))
                assert not conv.bias.any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("size", [(64, 64), (8, 6), (7, 8), (2, 2), (1, 1)])
def test_no_grad_max_pool_is_max_pool2d_bit_for_bit(dtype, size):
    from ppo_lightning.nets.impala import max_pool_3x3_s2

    torch.manual_seed(0)
    x = torch.randint(-3, 4, (4, 5, *size)).to(dtype)  # small integers: many ties and equal windows
    x[0, 0, 0, 0] = -float("inf")
    for layout in (torch.contiguous_format, torch.channels_last):
        xl = x.contiguous(memory_format=layout)
        with torch.no_grad():
            assert torch.equal(max_pool_3x3_s2(xl), torch.nn.functional.max_pool2d(xl, 3, 2, 1))
    xr = torch.randn(2, 3, *size, requires_grad=True)  # with autograd: max_pool2d itself
    assert max_pool_3x3_s2(xr).grad_fn is not None


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_impala_no_grad_path_equals_training_path(precision):
    torch.manual_seed(0)
    net = ImpalaActorCritic(OBS, ACT, channels=(8, 16, 16), dense=64)
    obs = torch.randint(0, 256, (2, 5, 64, 64, 3), dtype=torch.uint8)
    obs[:, :, :20] = 7  # flat regions: tied maxima in the first pool
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
        logits, value = net(obs)  # autograd: F.max_pool2d, out-of-place sums
        with torch.no_grad():
            fast_logits, fast_value = net(obs)  # separable pool, in-place sums: bit for bit
            net.inference_chunk = 3
            chunked_logits, chunked_value = net(obs)  # chunks of 3: only float rounding may differ
        with torch.inference_mode():
            inf_logits = net.policy(obs)[0]
    assert logits.requires_grad and not fast_logits.requires_grad
    assert torch.equal(fast_logits, logits.detach()) and torch.equal(fast_value, value.detach())
    torch.testing.assert_close(chunked_logits, logits.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(chunked_value, value.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(inf_logits, chunked_logits, rtol=0, atol=0)
    with pytest.raises(ValueError, match="inference_chunk"):
        ImpalaActorCritic(OBS, ACT, inference_chunk=0)


def test_build_network_dispatch():
    from ppo_lightning.nets.models import build_network

    net = build_network(OBS, ACT, {"name": "impala_cnn", "channels": [8, 16], "dense": 32})
    assert isinstance(net, ImpalaActorCritic)
    assert net(torch.zeros(5, 64, 64, 3, dtype=torch.uint8))[0].shape == (5, 15)


# -------------------------------------------------------------------------------- normalized return
def test_normalized_return_arithmetic():
    assert normalized_return("coinrun", "hard", 5.0) == 0.0
    assert normalized_return("coinrun", "easy", 10.0) == 1.0
    assert normalized_return("starpilot", "easy", 64.0) == pytest.approx(1.0)
    assert normalized_return("starpilot", "hard", 18.25) == pytest.approx(0.5)
    assert normalized_return("fruitbot", "easy", -1.5) == pytest.approx(0.0)
    assert normalized_return("bigfish", "hard", 10.0) == pytest.approx(0.25)
    assert return_range("maze", "extreme") == (4.0, 10.0)  # non-easy modes use the hard constants
    t = normalized_return("jumper", "easy", torch.tensor([1.0, 5.5, 10.0]))
    torch.testing.assert_close(t, torch.tensor([0.0, 0.5, 1.0]))
    assert mean_normalized_return({"coinrun": 10.0, "bigfish": 0.0, "maze": float("nan")}, "hard") == pytest.approx(0.5)
    with pytest.raises(ValueError):
        normalized_return("pong", "hard", 1.0)


def test_iteration_metrics_report_normalized_return():
    from ppo_lightning.data.datamodule import RolloutDataModule

    dm = RolloutDataModule(env_id="procgen:coinrun", env_kwargs={"distribution_mode": "easy"}, num_envs=2,
                           rollout_steps=4, num_minibatches=1, update_epochs=1)
    from ppo_lightning.core.members import name_members

    dm.states[0].advantage_moments.update(torch.randn(8))  # as after one iteration
    logged = lambda: name_members(dm.iteration_metrics(), 1)[0]  # noqa: E731  (what the loggers get)
    assert "episode/normalized_return_mean20" not in logged()
    dm.states[0].episodes.returns.extend([5.0, 10.0])
    m = logged()
    assert m["episode/return_mean20"] == 7.5 and m["episode/normalized_return_mean20"] == pytest.approx(0.5)


# ------------------------------------------------------------------------------------ evaluation
def test_held_out_levels_are_disjoint():
    from types import SimpleNamespace

    from ppo_lightning.interop.evaluation import HeldOutEvaluation

    dm = SimpleNamespace(env_id="procgen:coinrun", env_kwargs={"distribution_mode": "easy", "num_levels": 200})
    splits = HeldOutEvaluation().split_kwargs(dm)
    assert splits["train"] == dm.env_kwargs
    assert splits["test"] == {"distribution_mode": "easy", "num_levels": 0, "start_level": 200}
    with pytest.raises(ValueError, match="inside the training levels"):
        HeldOutEvaluation(env_kwargs={"start_level": 10}).split_kwargs(dm)


# ---------------------------------------------------------------------------------------- training
@pytest.mark.parametrize("precision,micro", [("bf16-mixed", 12), ("32-true", None)])
def test_procgen_training_smoke(precision, micro):
    import lightning.pytorch as pl

    from ppo_lightning.data.datamodule import RolloutDataModule
    from ppo_lightning.interop.evaluation import HeldOutEvaluation
    from ppo_lightning.training.module import PPOLightningModule

    dm = RolloutDataModule(env_id="procgen:coinrun", env_kwargs={"distribution_mode": "easy", "num_levels": 10},
                           num_envs=4, rollout_steps=16, num_minibatches=2, update_epochs=2, total_frames=128,
                           gamma=0.999, normalize_reward=True, seed=0)
    model = PPOLightningModule(dm.observation_space, dm.action_space,
                               network={"name": "impala_cnn", "channels": [8, 16, 16], "dense": 64},
                               decoupled=True, proximal_com=8.0, micro_batch_size=micro)
    evaluation = HeldOutEvaluation(every_n_iterations=1, num_envs=2, num_steps=4)
    before = [p.detach().clone() for p in model.network.parameters()]
    # The anchor at every micro-batch: the float32 EWMA average's own forward under the Trainer's
    # precision (whatever copy or kernel path computes it), which moves away from the policy.
    src, anchors = model.proximal_source, []
    fast_policy = src.proximal_policy

    def checked_policy(obs):
        out = fast_policy(obs)
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16-mixed"):
            anchors.append((torch.equal(out[0], src.proximal.policy(obs)[0]),
                            torch.equal(out[0], model.network.policy(obs)[0])))
        return out

    src.proximal_policy = checked_policy
    trainer = pl.Trainer(max_epochs=-1, logger=False, enable_checkpointing=False, enable_model_summary=False,
                         enable_progress_bar=False, callbacks=[evaluation], precision=precision)
    trainer.fit(model, dm)
    assert (model.proximal_source._forward_net is not None) == (precision == "bf16-mixed")  # bf16 weight copy
    assert len(anchors) == trainer.global_step and all(a for a, _ in anchors)  # one per minibatch
    assert not all(same_as_policy for _, same_as_policy in anchors)
    m = trainer.callback_metrics
    assert dm.frames == 128 and dm.iteration == 2 and trainer.global_step == 8
    assert math.isfinite(float(m["train/loss_objective"])) and float(m["proximal/com"]) == 8.0
    assert "eval/test/episodes" in m and "eval/train/episodes" in m
    assert [h["iteration"] for h in evaluation.history] == [1.0, 2.0]
    assert any(not torch.equal(a, b) for a, b in zip(before, model.network.parameters()))


@pytest.mark.parametrize("fuse_relu", [True, False])
@pytest.mark.parametrize("shape,chunk", [((64, 64, 3), 64), ((21, 17, 3), 2)])
def test_bf16_copy_no_grad_forward_on_onednn_tensors_is_bit_for_bit(monkeypatch, shape, chunk, fuse_relu):
    """The bf16 copy's no-grad forward (the EWMA anchor under bf16-mixed) on oneDNN tensors gives the
    values of the dense path and of the float32 network under bf16 autocast, bit for bit; with the
    residual blocks' conv + ReLU fused into one oneDNN op or not."""
    import ppo_lightning.nets.impala as impala

    one = torch.ones(1, 1, 3, 3, dtype=torch.bfloat16)
    try:
        torch.mkldnn_convolution(one.to_mkldnn(), one, None, [1, 1], [1, 1], [1, 1], 1)
    except RuntimeError as e:  # a torch/CPU without oneDNN bf16 kernels: the path is off there anyway
        pytest.skip(f"no oneDNN bf16 convolution here: {e}")
    torch.manual_seed(0)
    net = ImpalaActorCritic({"shape": list(shape), "dtype": "uint8"}, ACT, channels=(8, 16, 16), dense=64,
                            inference_chunk=chunk)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn_like(p), alpha=0.05)  # non-zero biases, trained-size logits
    copy16 = __import__("copy").deepcopy(net).to(torch.bfloat16)
    obs = torch.randint(0, 256, (5, *shape), dtype=torch.uint8)
    obs[:, :10] = 7  # flat regions: tied maxima
    calls, fused = [], []
    real = ImpalaActorCritic._trunk_onednn
    monkeypatch.setattr(ImpalaActorCritic, "_trunk_onednn", lambda *a: calls.append(1) or real(*a))
    if fuse_relu:
        if not hasattr(torch.ops.mkldnn, "_convolution_pointwise"):
            pytest.skip("this torch has no torch.ops.mkldnn._convolution_pointwise")
        real_op = torch.ops.mkldnn._convolution_pointwise
        monkeypatch.setattr(torch.ops.mkldnn, "_convolution_pointwise", lambda *a: fused.append(a[7]) or real_op(*a))
    monkeypatch.setattr(impala, "_FUSE_CONV_RELU", fuse_relu)
    outputs = {}
    for path in (True, False):
        monkeypatch.setattr(impala, "_ONEDNN_BF16", path)
        calls.clear()
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            outputs[path] = copy16.policy(obs)[0]
        assert bool(calls) == path
    # the fused op ran once per residual block and chunk (3 stacks x 2 blocks), only on oneDNN tensors
    assert fused == (["relu"] * 6 * -(-5 // chunk) if fuse_relu else [])
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        autocast = net.policy(obs)[0]
        with_value = copy16(obs)  # forward and value() take the same path
    assert outputs[True].dtype == torch.float32 and torch.equal(outputs[True], outputs[False])
    assert torch.equal(outputs[True], autocast) and torch.equal(with_value[0], autocast)
    assert with_value[1].dtype == torch.float32
    assert copy16.policy(obs)[0].abs().max() > 0.1  # positive control: non-trivial logits


def test_bf16_proximal_forward_is_close_and_keeps_float32_weights():
    from ppo_lightning.algos.proximal import ProximalPolicyEWMA

    torch.manual_seed(0)
    net = ImpalaActorCritic(OBS, ACT, channels=(8, 16, 16), dense=64)
    with torch.no_grad():
        net.policy_head.weight.mul_(20)  # logits of a trained policy's magnitude, not the 0.1-scaled init
    obs = torch.randint(0, 256, (32, 64, 64, 3), dtype=torch.uint8)
    exact, bf16 = ProximalPolicyEWMA(com=4.0), ProximalPolicyEWMA(com=4.0, bf16=True)
    exact.reset(net), bf16.reset(net)
    lp32 = exact.proximal_policy(obs)[0].log_softmax(-1)
    lp16 = bf16.proximal_policy(obs)[0].log_softmax(-1)
    assert lp16.dtype == torch.float32 and all(p.dtype == torch.float32 for p in bf16.proximal.parameters())
    assert all(p.dtype == torch.float32 for p in net.parameters())  # the policy itself is untouched
    err = (lp32 - lp16).abs()
    assert 0 < err.max() < 0.1 and err.mean() < 0.02  # far inside the clip range (0.2)
    # The bf16 weight copy that runs the forward follows the float32 average through updates and a
    # state reload, and gives exactly the bf16-autocast forward of that average.
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn_like(p), alpha=0.05)
    for _ in range(3):
        bf16.update()
    restored = ProximalPolicyEWMA(com=4.0, bf16=True)
    restored.load_state_dict(bf16.state_dict())  # before fit: applied at on_fit_start
    restored.start(net)
    for src in (bf16, restored):
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            autocast = src.proximal.policy(obs)[0]  # float32 weights under bf16 autocast (bf16-mixed)
            assert torch.equal(src.proximal_policy(obs)[0], autocast)  # the copy, also inside autocast
        assert torch.equal(src.proximal_policy(obs)[0], autocast)  # and outside it
    assert not torch.equal(restored.proximal_policy(obs)[0].log_softmax(-1), lp16)  # the updates moved it


@pytest.mark.parametrize("config", ["ppo_hard.yaml", "ppo_ewma_hard.yaml", "ppo_easy_short.yaml"])
def test_procgen_configs_parse_validate_and_the_ewma_one_trains_one_small_iteration(config, tmp_path):
    """Every shipped Procgen config parses and builds its model and data module with its model settings
    intact (full-size IMPALA CNN, micro-batches, EWMA, precision auto). PPO-EWMA, the superset of the
    others' training path, trains one small iteration of one epoch: minibatches of 256 in two
    micro-batches (each IMPALA update costs seconds here, so the others only build)."""
    from pathlib import Path

    from ppo_lightning.run.builder import fit_main
    from ppo_lightning.run.preflight import _check_cli_class

    path = Path(__file__).resolve().parents[1] / "ppo_lightning/configs/procgen" / config
    train = config == "ppo_ewma_hard.yaml"
    if train:  # the held-out evaluation as configured, on 2 envs x 16 steps instead of 64 x 256 (38 s here)
        cfg = yaml.safe_load(path.read_text())
        (held_out,) = cfg["trainer"]["callbacks"]
        held_out["init_args"].update(num_envs=2, num_steps=16)
        path = tmp_path / config
        path.write_text(yaml.safe_dump(cfg))
    cli = fit_main(["fit", "--config", str(path), "--mlflow.enabled", "false", "--run_dir", str(tmp_path),
                    "--trainer.enable_progress_bar", "false", "--data.num_envs", "2", "--data.rollout_steps", "256",
                    "--data.num_minibatches", "2", "--data.total_frames", "512", "--data.num_threads", "1",
                    "--data.update_epochs", "1"], cli_class=None if train else _check_cli_class())
    h = cli.model.hparams
    assert h.network["name"] == "impala_cnn" and h.network["channels"] == [16, 32, 32] and h.micro_batch_size == 128
    assert h.decoupled == ("ewma" in config) and cli.datamodule.env_id.startswith("procgen:")
    if train:
        assert cli.datamodule.frames == 512 and cli.trainer.global_step == cli.datamodule.update_epochs * 2
        src = cli.model.proximal_source
        assert h.proximal_com == 8.0 and src.num_updates == cli.trainer.global_step
        # trainer.precision auto: bf16-mixed (and the bf16 weight copy of the anchor) only where bf16 is fast
        auto = hardware.resolve_trainer_precision("auto", "cpu")[0]
        assert cli.trainer.precision == auto and (src._forward_net is not None) == (auto == "bf16-mixed")
