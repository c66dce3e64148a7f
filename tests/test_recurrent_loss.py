"""Training a recurrent network on sequences (issue 64): the loss, the proximal policy (PPO-EWMA),
PPG's auxiliary phase, micro-batches and ``--scale`` over ``[S, B, L]`` minibatches of segments.

Every oracle here unrolls the network one step at a time with ``step`` from each segment's stored
start state (zeroed by hand where ``is_init``) and writes the equations of DESIGN.md itself (log-probs,
ratios, clip, KL, value and entropy terms): nothing of `ppo_lightning.algos.objectives` or of the
loss module's sequence path is reused.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from jsonargparse import Namespace
from tensordict import TensorDict

from ppo_lightning.algos.loss import PPOFamilyLoss
from ppo_lightning.algos.ppg import PPG_DEFAULTS, PPGPhases
from ppo_lightning.algos.scaling import apply_scale, scale_segments
from ppo_lightning.nets.recurrent import IS_INIT_KEY, STATE_KEY, RecurrentActorCritic
from ppo_lightning.training.module import PPOLightningModule
from ppo_lightning.training.update import accumulate, check_micro_batch_size, micro_batches

OBS = {"shape": [4], "dtype": "float32"}
DISCRETE = {"type": "discrete", "n": 3}
CONTINUOUS = {"type": "continuous", "shape": [2]}
NETWORK = {"name": "mlp", "hidden_sizes": [8], "core": "lstm", "core_size": 6}
COEFS = dict(value_coef=0.5, entropy_coef=0.01)


def make_net(act=DISCRETE, core="lstm", seed=0, **kw) -> RecurrentActorCritic:
    torch.manual_seed(seed)
    return RecurrentActorCritic(OBS, act, hidden_sizes=(8,), core=core, core_size=6, **kw)


def perturbed(net, scale: float, seed: int):
    """A copy of ``net`` with noise on every weight (the behavior or a proximal network)."""
    g = torch.Generator().manual_seed(seed)
    other = copy.deepcopy(net)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))
    return other


def param_keys(act) -> tuple[str, ...]:
    return ("logits",) if act["type"] == "discrete" else ("loc", "scale")


def log_prob_of(act, params, action):
    """log pi(a), written out: log-softmax at the action; a diagonal Gaussian's density summed over dims."""
    if act["type"] == "discrete":
        return torch.log_softmax(params[0], -1).gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
    loc, scale = params
    return (-((action - loc) ** 2) / (2 * scale**2) - scale.log() - 0.5 * math.log(2 * math.pi)).sum(-1)


def entropy_of(act, params):
    if act["type"] == "discrete":
        logp = torch.log_softmax(params[0], -1)
        return -(logp.exp() * logp).sum(-1)
    return (0.5 + 0.5 * math.log(2 * math.pi) + params[1].log()).sum(-1)


def kl_of(act, anchor, params):
    """KL[anchor || current] per sample, written out."""
    if act["type"] == "discrete":
        a, b = torch.log_softmax(anchor[0], -1), torch.log_softmax(params[0], -1)
        return (a.exp() * (a - b)).sum(-1)
    (m0, s0), (m1, s1) = anchor, params
    return (torch.log(s1 / s0) + (s0**2 + (m0 - m1) ** 2) / (2 * s1**2) - 0.5).sum(-1)


def rollout(behav, act, envs=3, T=8, seed=0, resets=((0, 5), (1, 2), (2, 4))):
    """A rollout ``[envs, T]`` collected step by step by ``behav``: the state carried across steps,
    zeroed before every step with ``is_init`` (the first step, and the episode starts ``resets``:
    (env, t) pairs inside the rollout); stored as the data side stores it (the state INTO each step)."""
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(envs, T, 4, generator=g)
    is_init = torch.zeros(envs, T, dtype=torch.bool)
    is_init[:, 0] = True
    for e, t in resets:
        is_init[e, t] = True
    state = behav.initial_state(envs)
    states, actions, logps, params, values = [], [], [], [], []
    with torch.no_grad():
        for t in range(T):
            state = torch.where(is_init[:, t, None], torch.zeros_like(state), state)
            states.append(state)
            *p, v, state = behav.step(obs[:, t], state, is_init[:, t])
            if act["type"] == "discrete":
                a = torch.multinomial(torch.softmax(p[0], -1), 1, generator=g).squeeze(-1)
            else:
                a = p[0] + p[1] * torch.randn(p[0].shape, generator=g)
            actions.append(a)
            logps.append(log_prob_of(act, p, a))
            params.append(p)
            values.append(v)
    stack = lambda xs: torch.stack(xs, 1)  # noqa: E731
    data = {"observation": obs, "action": stack(actions), "action_log_prob": stack(logps),
            "state_value": stack(values), STATE_KEY: stack(states), IS_INIT_KEY: is_init,
            "advantage": torch.randn(envs, T, generator=g), "value_target": torch.randn(envs, T, 1, generator=g)}
    for j, key in enumerate(param_keys(act)):
        data[key] = stack([p[j] for p in params])
    return TensorDict(data, batch_size=[envs, T])


def segments(rollout_td, L):
    """A single run's minibatch ``[1, B, L]``: the rollout cut into segments of L steps, in order."""
    envs, T = rollout_td.batch_size
    return rollout_td.reshape(envs * T // L, L).unsqueeze(0)


def unroll(net, batch, method="forward"):
    """The oracle: ``net.step`` one step at a time over each segment of ``batch [1, B, L]`` from the
    state stored at its first step, zeroed by hand where ``is_init``. Outputs ``[1, B, L, ...]``."""
    obs, is_init = batch["observation"][0], batch[IS_INIT_KEY][0]
    state = batch[STATE_KEY][0, :, 0]
    outs = []
    for t in range(obs.shape[1]):
        state = torch.where(is_init[:, t, None], torch.zeros_like(state), state)
        *out, state = net.step(obs[:, t], state, torch.zeros_like(is_init[:, t]))
        outs.append(out)
    outs = [torch.stack(o, 1).unsqueeze(0) for o in zip(*outs)]
    if method == "policy":
        return outs[:-1]
    return outs


def oracle_loss(act, net, batch, objective, beta=1.0, eps=0.2, proximal=None):
    """The loss (objective + value + entropy terms, to minimize) from DESIGN.md's equations, per term."""
    *params, value = unroll(net, batch)
    action = batch["action"]
    logp = log_prob_of(act, params, action)
    behav_logp = batch["action_log_prob"]
    behav_params = [batch[k] for k in param_keys(act)]
    adv = batch["advantage"]
    if proximal is None:  # the behavior policy is the anchor
        anchor_params, anchor_logp = behav_params, behav_logp
    else:
        anchor_params = proximal
        anchor_logp = log_prob_of(act, proximal, action)
    if objective == "clip":  # (pi_prox / pi_behav) min(r A, clip(r) A), r = pi / pi_prox (= pi_behav when standard)
        r = torch.exp(logp - anchor_logp)
        surrogate = torch.exp(anchor_logp - behav_logp).detach() * torch.minimum(r * adv, r.clamp(1 - eps, 1 + eps) * adv)
    else:  # (pi / pi_behav) A - beta KL[pi_anchor, pi]
        surrogate = torch.exp(logp - behav_logp) * adv - beta * kl_of(act, [p.detach() for p in anchor_params], params)
    return {"loss_objective": -surrogate.mean(-1).mean(-1),
            "loss_critic": COEFS["value_coef"] * (value.squeeze(-1) - batch["value_target"].squeeze(-1)).pow(2).mean(-1).mean(-1),
            "loss_entropy": -COEFS["entropy_coef"] * entropy_of(act, params).mean(-1).mean(-1)}


def grads(net, loss):
    net.zero_grad()
    loss.sum().backward()
    return [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in net.parameters()]


def loss_sum(out):
    return out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]


CASES = [("clip", False), ("clip", True), ("kl", False), ("kl", True), ("adaptive_kl", False), ("adaptive_kl", True)]


@pytest.mark.parametrize("act,core", [(DISCRETE, "lstm"), (CONTINUOUS, "gru")], ids=["lstm-discrete", "gru-continuous"])
@pytest.mark.parametrize("objective,decoupled", CASES, ids=[f"{o}{'-decoupled' if d else ''}" for o, d in CASES])
def test_loss_on_segments_equals_the_step_by_step_oracle(act, core, objective, decoupled):
    """Values and gradients of every term, for every objective and its decoupled form, over segments
    whose start states are the behavior network's stored carries (second segments of a rollout) and
    with episode starts inside segments."""
    net = make_net(act, core)
    behav = perturbed(net, 0.3, seed=1)
    batch = segments(rollout(behav, act, envs=3, T=8), L=4)  # [1, 6, 4]
    assert batch.batch_size == (1, 6, 4) and not batch[IS_INIT_KEY][0, 1::2, 0].all()  # stored starts mid-rollout
    proximal = None
    if decoupled:
        with torch.no_grad():
            proximal = unroll(perturbed(net, 0.4, seed=2), batch, "policy")
        batch.set("proximal", TensorDict(dict(zip(param_keys(act), proximal)), batch_size=batch.batch_size))
    loss = PPOFamilyLoss(net, act, objective=objective, decoupled=decoupled, clip_eps=0.2, kl_beta=0.7, **COEFS)
    out = loss(batch.clone())
    want = oracle_loss(act, net, batch, "clip" if objective == "clip" else "kl", beta=0.7, proximal=proximal)
    for key, value in want.items():
        torch.testing.assert_close(out[key], value.detach(), rtol=1e-5, atol=1e-6)
    for a, b in zip(grads(net, loss_sum(loss(batch.clone()))), grads(net, loss_sum(want))):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert out["loss_objective"].shape == (1,)  # one value per member
    if objective == "clip":
        assert 0 < float(out["clip_fraction"]) < 1  # the case exercises the clip


def test_bptt_flows_within_a_segment_but_not_across_an_episode_start():
    """d loss / d obs: the loss of step t+1 alone reaches the input of step t through the core, unless
    step t+1 starts an episode (the state is zeroed before it)."""
    net = make_net()
    behav = perturbed(net, 0.3, seed=1)
    t = 2

    def grad_at_t(reset: bool):
        data = rollout(behav, DISCRETE, envs=1, T=6, resets=((0, t + 1),) if reset else ())
        batch = segments(data, L=6)
        adv = torch.zeros_like(batch["advantage"])
        adv[0, 0, t + 1] = 1.0  # only step t+1 counts
        batch.set("advantage", adv)
        obs = batch["observation"].clone().requires_grad_(True)
        batch.set("observation", obs)
        loss = PPOFamilyLoss(net, DISCRETE, objective="clip", value_coef=0.0, entropy_coef=0.0)
        loss(batch)["loss_objective"].sum().backward()
        return obs.grad[0, 0]

    flowing, cut = grad_at_t(False), grad_at_t(True)
    assert flowing[t].abs().sum() > 0 and flowing[t - 1].abs().sum() > 0  # BPTT across the segment's steps
    assert torch.equal(cut[: t + 1], torch.zeros_like(cut[: t + 1]))  # nothing before the reset
    assert cut[t + 1].abs().sum() > 0
    assert torch.equal(cut[t + 2:], torch.zeros_like(cut[t + 2:]))  # the future never feeds the past


def ewma_oracle(params0, steps, com):
    """DESIGN.md's EWMA: W' = beta W + 1; prox = prox beta W / W' + theta / W'; from a copy, W = 1."""
    beta = com / (1 + com)
    prox, w = [p.clone() for p in params0], 1.0
    for theta in steps:
        w_new = beta * w + 1
        prox = [q * beta * w / w_new + p / w_new for q, p in zip(prox, theta)]
        w = w_new
    return prox


def module(**kw):
    return PPOLightningModule(OBS, DISCRETE, network=dict(NETWORK), **{**COEFS, **kw})


def test_ewma_proximal_policy_is_the_averaged_network_unrolled_over_the_same_segments():
    """PPO-EWMA: after a few optimizer steps the module's proximal parameters on a minibatch are an
    EWMA-averaged copy of the network (the oracle's own average) unrolled step by step over the
    minibatch's segments from their stored start states; the loss is the decoupled oracle's."""
    m = module(decoupled=True, proximal_com=2.0)
    net = m.network
    m.proximal_source.start(net)
    start = [p.detach().clone() for p in net.parameters()]
    seen = []
    g = torch.Generator().manual_seed(3)
    for _ in range(3):  # "optimizer steps": the network moves, the EWMA follows
        with torch.no_grad():
            for p in net.parameters():
                p.add_(0.2 * torch.randn(p.shape, generator=g))
        seen.append([p.detach().clone() for p in net.parameters()])
        m.proximal_source.update()
    average = copy.deepcopy(net)
    with torch.no_grad():
        for q, v in zip(average.parameters(), ewma_oracle(start, seen, 2.0)):
            q.copy_(v)
    for q, v in zip(m.proximal_source.proximal.parameters(), average.parameters()):
        torch.testing.assert_close(q, v, rtol=1e-6, atol=1e-7)

    batch = segments(rollout(perturbed(net, 0.3, seed=1), DISCRETE, envs=3, T=8), L=4)
    with torch.no_grad():
        want = unroll(average, batch, "policy")
    filled = m.add_proximal(batch.clone())
    torch.testing.assert_close(filled["proximal", "logits"], want[0], rtol=1e-5, atol=1e-6)
    loss, _ = m.loss_and_stats(batch.clone())
    expected = oracle_loss(DISCRETE, net, batch, "clip", proximal=want)
    torch.testing.assert_close(loss, loss_sum(expected).detach(), rtol=1e-5, atol=1e-6)


class _Hparams(dict):
    __getattr__ = dict.__getitem__


@pytest.mark.parametrize("decoupled", [False, True])
def test_micro_batches_of_whole_segments_give_the_minibatch_gradient(decoupled):
    """``model.micro_batch_size`` 2 L over 6 segments: 3 chunks of 2 whole segments, whose weighted
    gradients add up to the whole minibatch's (and their weighted diagnostics to its)."""
    kw = dict(decoupled=True, proximal_com=2.0) if decoupled else {}
    m = module(**kw)
    if decoupled:
        m.proximal_source.start(m.network)
        with torch.no_grad():
            for p in m.network.parameters():
                p.add_(0.05)
        m.proximal_source.update()
    batch = segments(rollout(perturbed(m.network, 0.3, seed=1), DISCRETE, envs=3, T=8), L=4)
    if decoupled:
        batch = m.add_proximal(batch)
    results = []
    for micro in (None, 8, 12):  # one chunk; 3 chunks of 2 segments; chunks of 3 segments
        m.hparams.micro_batch_size = micro
        m.network.zero_grad()
        _, total, stats = accumulate(m, batch.clone(), m.loss_and_stats, lambda loss: loss.sum().backward())
        results.append((total, stats, [p.grad.clone() for p in m.network.parameters()]))
    (loss0, stats0, grads0) = results[0]
    for loss, stats, gr in results[1:]:
        torch.testing.assert_close(loss, loss0, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(stats["entropy"], stats0["entropy"], rtol=1e-5, atol=1e-6)
        for a, b in zip(gr, grads0):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    chunks, weights = micro_batches(batch, 8, recurrent=True)
    assert [c.batch_size for c in chunks] == [torch.Size([1, 2, 4])] * 3 and weights == [1 / 3] * 3


def test_micro_batch_size_not_a_multiple_of_the_segment_length_is_one_line():
    batch = segments(rollout(make_net(), DISCRETE), L=4)
    with pytest.raises(ValueError, match=r"^model.micro_batch_size 6 must be a multiple of the sequence length 4 ") as err:
        micro_batches(batch, 6, recurrent=True)
    assert "\n" not in str(err.value)
    check_micro_batch_size(8, 4)
    check_micro_batch_size(6, None)  # feed-forward: any size
    assert micro_batches(batch, 6 * 4, recurrent=True) is None  # at least the minibatch: one chunk


def test_fit_refuses_a_micro_batch_size_that_cuts_segments(capsys, tmp_path):
    from ppo_lightning.cli.fit import main

    code = main(["fit", "--config", "cartpole/ppo", "--model.network", "{name: mlp, core: lstm}", "--data.rollout_steps", "16",
                 "--model.micro_batch_size", "20", "--mlflow.enabled", "false", "--data.total_frames", "64", "--run_dir", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert err[0].startswith("error: model.micro_batch_size 20 must be a multiple of the sequence length 16")


# ----------------------------------------------------------------------------------------------- PPG
def test_ppg_old_outputs_and_auxiliary_minibatches_run_over_segments_from_stored_states():
    """PPG with a recurrent network: the phase buffer keeps the stored states; the old policy's outputs
    are the network unrolled over segments of L steps from their stored start states (the oracle's);
    the auxiliary minibatches are those segments ``[S, k T / L, L]``, on which the current network
    starts at KL 0 from the old policy and the value terms are the oracle's."""
    net = make_net(aux_value_head=True)
    phases = PPGPhases({**PPG_DEFAULTS, "aux_mbsize": 2}, DISCRETE, state_size=net.state_size)
    assert phases.stored_keys == ("observation", "value_target", STATE_KEY, IS_INIT_KEY)
    data = rollout(perturbed(net, 0.3, seed=1), DISCRETE, envs=3, T=8)
    phases.buffer = [data.select(*phases.stored_keys).unsqueeze(0)]  # [S, envs, T]
    phases.sequence_length = 4
    phases.compute_old_outputs(net, torch.device("cpu"))
    with torch.no_grad():
        want = unroll(net, segments(data, 4), "policy")[0]
    torch.testing.assert_close(phases.buffer[0]["old_logits"], want.reshape(1, 3, 8, 3), rtol=1e-5, atol=1e-6)

    batch = phases.gather(torch.tensor([[[0, 2], [0, 0]]]), torch.device("cpu"))
    assert batch.batch_size == (1, 4, 4)
    loss, stats = phases.aux_loss_and_stats(net, PPOFamilyLoss(net, DISCRETE), batch)
    assert float(stats["pol_distance"]) == pytest.approx(0.0, abs=1e-6)
    trajectories = torch.cat([data[2:3], data[0:1]])
    *_, value = unroll(net, segments(trajectories, 4))
    with torch.no_grad():
        want_vf = 0.5 * (value.squeeze(-1) - segments(trajectories, 4)["value_target"].squeeze(-1)).pow(2).mean()
    torch.testing.assert_close(stats["vf_true"], want_vf.reshape(1), rtol=1e-5, atol=1e-6)


def test_ppg_feed_forward_phases_store_what_they_stored():
    phases = PPGPhases(dict(PPG_DEFAULTS), DISCRETE)
    assert phases.stored_keys == ("observation", "value_target") and not phases.recurrent


# --------------------------------------------------------------------------------------------- --scale
def scaled(num_envs, rollout_steps, sequence_length, num_minibatches, c, core="lstm"):
    cfg = Namespace(data=Namespace(num_envs=num_envs, rollout_steps=rollout_steps, sequence_length=sequence_length,
                                   num_minibatches=num_minibatches, advantage_norm_span=1.0),
                    model=Namespace(lr=1e-3, proximal_com=8.0, optimizer="adam", adam_betas=[0.9, 0.999],
                                    network={"name": "mlp", "core": core}))
    report = apply_scale(cfg, c)
    return cfg, report


def test_scale_divides_the_segments_per_minibatch_never_their_length():
    cfg, report = scaled(4, 32, 8, 2, 8)  # 16 segments of 8 -> 2: envs 4 -> 1, then segments per env 4 -> 2
    assert (cfg.data.num_envs, cfg.data.rollout_steps, cfg.data.sequence_length) == (1, 16, 8)
    assert report["data.segments_per_minibatch"] == {"from": 8, "to": 1}
    assert report["data.minibatch_size"] == {"from": 64, "to": 8}
    assert cfg.model.lr == pytest.approx(1e-3 / math.sqrt(8)) and cfg.model.proximal_com == 64.0  # the same rules
    cfg, report = scaled(2, 16, None, 1, 2)  # L null = 16: envs 2 -> 1, the rollout length stays, L stays null
    assert (cfg.data.num_envs, cfg.data.rollout_steps, cfg.data.sequence_length) == (1, 16, None)
    cfg, report = scaled(2, 16, 4, 2, 0.5)  # c < 1: more envs, the same segments
    assert (cfg.data.num_envs, cfg.data.rollout_steps, cfg.data.sequence_length) == (4, 16, 4)
    assert report["data.segments_per_minibatch"] == {"from": 4, "to": 8}


def test_scale_refuses_what_would_cut_a_segment_in_one_line():
    with pytest.raises(ValueError, match="does not divide the segments") as err:
        scale_segments(2, 16, 16, 1, 4)  # L = the rollout (null): 2 envs cannot give a factor 4
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="does not split into data.num_minibatches=2"):
        scale_segments(4, 32, 8, 2, 16)
    assert scale_segments(4, 32, 8, 2, 4) == (1, 32)
    # a feed-forward config is scaled as ever (the rollout length may be divided)
    cfg, _ = scaled(2, 16, None, 1, 4, core=None)
    assert (cfg.data.num_envs, cfg.data.rollout_steps) == (1, 8)
