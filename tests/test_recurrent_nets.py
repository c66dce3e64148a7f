"""Recurrent networks (`ppo_lightning.nets.recurrent`): the cells and the core against torch's own LSTM and
GRU, a sequence forward against step-by-step calls with an episode end inside, every encoder kind, masks
and composite actions, member groups (member k == seed k alone, bit for bit) and the config errors."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from ppo_lightning.nets.composite import MASKED_LOGIT
from ppo_lightning.nets.models import build_network, resolve_network
from ppo_lightning.nets.recurrent import RecurrentActorCritic, RecurrentCore, is_recurrent
from ppo_lightning.nets.seed_stack import SeedStack

DISCRETE = {"type": "discrete", "n": 3}
CONTINUOUS = {"type": "continuous", "shape": [2]}
# a Discrete(6) observation with a mask over Discrete(4) actions (Taxi's convention), packed: [index, 4 mask bits]
MASKED_OBS = {"shape": [5], "dtype": "float32", "space": {"type": "discrete", "n": 6}, "action_mask": 4}
MASKED_ACT = {"type": "discrete", "n": 4}
# a Dict observation (a Box(3) and a mask) over MultiDiscrete([2, 3]) actions: [3 values, 5 mask bits]
COMPOSITE_OBS = {"shape": [8], "dtype": "float32", "action_mask": 5,
                 "space": {"type": "dict", "parts": [["obs", {"type": "box", "shape": [3], "dtype": "float32"}]]}}
COMPOSITE_ACT = {"type": "composite", "shape": [2], "space": {"type": "multi_discrete", "nvec": [2, 3]}}

# id -> (observation space, action space, model.network without core/arch): one per encoder kind, tiny
CASES = {
    "mlp_masked": (MASKED_OBS, MASKED_ACT, {"name": "mlp", "hidden_sizes": [8]}),
    "mlp_composite": (COMPOSITE_OBS, COMPOSITE_ACT, {"name": "mlp", "hidden_sizes": [8]}),
    "mlp_box_normalized": ({"shape": [4], "dtype": "float32"}, CONTINUOUS,
                           {"name": "mlp", "hidden_sizes": [8], "normalize_observation": True}),
    "nature_cnn": ({"shape": [36, 36, 1], "dtype": "uint8"}, DISCRETE, {"name": "nature_cnn", "dense": 8}),
    "small_cnn": ({"shape": [6, 6, 2], "dtype": "float32"}, CONTINUOUS, {"name": "small_cnn", "dense": 8}),
    "minatar_cnn": ({"shape": [5, 5, 3], "dtype": "float32"}, DISCRETE,
                    {"name": "minatar_cnn", "channels": 2, "hidden": 8}),
    "impala_cnn": ({"shape": [8, 8, 3], "dtype": "uint8"}, DISCRETE,
                   {"name": "impala_cnn", "channels": [2], "dense": 8, "nblock": 1}),
    "auto_chw": ({"shape": [2, 8, 8], "dtype": "uint8"}, DISCRETE, {"name": "auto", "dense": 8}),
    # no encoder layer, two layers after the core (sb3-contrib's MlpLstmPolicy has one of 64)
    "mlp_post_core": (MASKED_OBS, MASKED_ACT, {"name": "mlp", "hidden_sizes": [], "activation": "relu",
                                               "post_core_sizes": [5, 4]}),
    "minatar_post_core": ({"shape": [5, 5, 3], "dtype": "float32"}, CONTINUOUS,
                          {"name": "minatar_cnn", "channels": 2, "hidden": 8, "post_core_sizes": [5]}),
}


def _observations(space: dict, *lead: int, gen: torch.Generator) -> torch.Tensor:
    """Observations ``[*lead, *shape]`` of ``space``: uint8 pixels, a packed space's values (a discrete
    index in range, a random legal subset as the mask, never empty), or floats."""
    shape = space["shape"]
    if space["dtype"] == "uint8":
        return torch.randint(0, 256, (*lead, *shape), generator=gen, dtype=torch.uint8)
    obs = torch.rand(*lead, *shape, generator=gen) * 2 - 1
    if space.get("space", {}).get("type") == "discrete":
        obs[..., 0] = torch.randint(0, space["space"]["n"], lead, generator=gen).float()
    mask = space.get("action_mask")
    if mask:
        bits = (torch.rand(*lead, mask, generator=gen) < 0.5).float()
        bits[..., 0] = 1.0  # at least one legal choice per categorical (the first of each)
        if mask == 5:  # MultiDiscrete([2, 3]): the second part starts at index 2
            bits[..., 2] = 1.0
        obs[..., -mask:] = bits
    return obs


def _net(case: str, core: str, arch: str, seed: int = 0, **extra) -> tuple[nn.Module, dict]:
    obs_space, act_space, network = CASES[case]
    torch.manual_seed(seed)
    network = {**network, "core": core, "core_size": 6, "arch": arch, **extra}
    return build_network(obs_space, act_space, network), obs_space


def _inputs(net, obs_space: dict, B: int = 3, L: int = 5, seed: int = 1):
    """B sequences of L steps from random (nonzero) start states: sequence 0 starts an episode at step 0,
    sequence 1 has an episode end inside (a new one at step 2), sequence 2 none."""
    gen = torch.Generator().manual_seed(seed)
    obs = _observations(obs_space, B, L, gen=gen)
    state = torch.randn(B, net.state_size, generator=gen)
    is_init = torch.zeros(B, L, dtype=torch.bool)
    is_init[0, 0] = is_init[1, 2] = True
    return obs, state, is_init


# ---------------------------------------------------------------------------------------- cells and cores
def lstm_equations(x, h, c, w_ih, w_hh, b_ih, b_hh):
    """The LSTM step as its paper writes it (gate order i, f, g, o): the oracle of `RecurrentCore`."""
    i, f, g, o = (x @ w_ih.T + b_ih + h @ w_hh.T + b_hh).chunk(4, dim=-1)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c), c


def gru_equations(x, h, w_ih, w_hh, b_ih, b_hh):
    """The GRU step (gate order r, z, n; the reset gate on W_hn h + b_hn, as cuDNN and torch compute it)."""
    xr, xz, xn = (x @ w_ih.T + b_ih).chunk(3, dim=-1)
    hr, hz, hn = (h @ w_hh.T + b_hh).chunk(3, dim=-1)
    r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
    return (1 - z) * torch.tanh(xn + r * hn) + z * h


def _core_case(kind: str, in_dim: int, hidden: int, seed: int, B: int, L: int, starts, biases: bool = False):
    """(a `RecurrentCore` built under seed 0, inputs ``[B, L, in_dim]`` and start states from ``seed``,
    ``is_init`` True at the (row, step) pairs of ``starts``); ``biases``: random biases (not zeros)."""
    torch.manual_seed(0)
    core = RecurrentCore(kind, in_dim, hidden)
    if biases:
        with torch.no_grad():
            core.bias_ih.normal_(), core.bias_hh.normal_()
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(B, L, in_dim, generator=gen)
    state = torch.randn(B, core.state_size, generator=gen)
    is_init = torch.zeros(B, L, dtype=torch.bool)
    for row, step in starts:
        is_init[row, step] = True
    return core, x, state, is_init


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_core_computes_the_equations_with_the_state_zeroed_at_episode_starts(kind):
    L = 7
    core, x, state, is_init = _core_case(kind, 5, 3, seed=2, B=4, L=L, starts=[(0, 0), (1, 3), (2, 6), (3, 3)], biases=True)
    out, last = core(x, state, is_init)
    w = (core.weight_ih, core.weight_hh, core.bias_ih, core.bias_hh)
    h, c = state[:, :3], state[:, 3:]
    outs = []
    for t in range(L):
        keep = (~is_init[:, t]).float().unsqueeze(-1)
        h, c = h * keep, c * keep
        if kind == "lstm":
            h, c = lstm_equations(x[:, t], h, c, *w)
        else:
            h = gru_equations(x[:, t], h, *w)
        outs.append(h)
    torch.testing.assert_close(out, torch.stack(outs, dim=1))
    torch.testing.assert_close(last, torch.cat((h, c), -1) if kind == "lstm" else h)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_a_sequence_cut_anywhere_gives_the_same_outputs(kind):
    """The core runs torch's kernel over the stretches between episode starts: cutting the time axis elsewhere
    (one step at a time, as collection steps) or running one row alone gives the same outputs (to float
    rounding: the kernel's matrix products over more or fewer rows may round differently)."""
    L = 9
    core, x, state, is_init = _core_case(kind, 6, 8, seed=3, B=5, L=L, starts=[(1, 4), (3, 7)])
    out, last = core(x, state, is_init)
    outs, s = [], state
    for t in range(L):
        y, s = core(x[:, t:t + 1], s, is_init[:, t:t + 1])
        outs.append(y)
    torch.testing.assert_close(torch.cat(outs, dim=1), out)
    torch.testing.assert_close(s, last)
    one, _ = core(x[3:4], state[3:4], is_init[3:4])
    torch.testing.assert_close(one, out[3:4])


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_core_over_a_sequence_is_torch_rnn_stepped_with_the_state_zeroed_at_episode_starts(kind):
    """`RecurrentCore` over [B, L] vs ``nn.LSTM`` / ``nn.GRU`` (same weights, loaded by name) run one step at
    a time, its state set to zeros before every step where is_init."""
    L = 6
    core, x, state, is_init = _core_case(kind, 5, 4, seed=1, B=3, L=L, starts=[(0, 0), (1, 3), (2, 1), (2, 4)])
    ref = (nn.LSTM if kind == "lstm" else nn.GRU)(5, 4, batch_first=True)
    ref.load_state_dict({f"{name}_l0": p for name, p in core.state_dict().items()})
    out, last = core(x, state, is_init)

    h, c = state[:, :4].clone(), state[:, 4:].clone()
    outs = []
    for t in range(L):
        keep = (~is_init[:, t]).float().unsqueeze(-1)
        h, c = h * keep, c * keep
        if kind == "lstm":
            y, (h1, c1) = ref(x[:, t:t + 1], (h.unsqueeze(0), c.unsqueeze(0)))
            h, c = h1[0], c1[0]
        else:
            y, h1 = ref(x[:, t:t + 1], h.unsqueeze(0))
            h = h1[0]
        outs.append(y[:, 0])
    torch.testing.assert_close(out, torch.stack(outs, dim=1))
    torch.testing.assert_close(last, torch.cat((h, c), -1) if kind == "lstm" else h)
    assert core.state_size == (8 if kind == "lstm" else 4)


# ---------------------------------------------------------------------------------------- sequences and steps
def _assert_masked(params: torch.Tensor, obs: torch.Tensor, mask: int) -> None:
    """The logits of the actions a mask forbids are MASKED_LOGIT, the others are not (the composite
    parameters of MultiDiscrete([2, 3]) are its 5 logits, in the mask's order)."""
    illegal = obs[..., -mask:] < 0.5
    logits = params[..., :mask]
    assert (logits[illegal] == MASKED_LOGIT).all() and (logits[~illegal] > MASKED_LOGIT / 2).all()


@pytest.mark.parametrize("arch", ["dual", "shared"])
@pytest.mark.parametrize("core", ["lstm", "gru"])
@pytest.mark.parametrize("case", list(CASES))
def test_a_sequence_forward_equals_step_by_step_calls_with_an_episode_end_inside(case, core, arch):
    net, obs_space = _net(case, core, arch)
    assert is_recurrent(net) and isinstance(net, RecurrentActorCritic)
    obs, state, is_init = _inputs(net, obs_space)
    with torch.no_grad():
        seq = net(obs, state, is_init)
        s, steps = state, []
        for t in range(obs.shape[1]):
            *out, s = net.step(obs[:, t], s, is_init[:, t])
            steps.append(out)
        # the episode that starts inside sequence 1 (step 2) is the one a fresh state starts there
        fresh, s1 = [], net.initial_state(1)
        for t in range(2, obs.shape[1]):
            *out, s1 = net.step(obs[1:2, t], s1, torch.zeros(1, dtype=torch.bool))
            fresh.append(out)
    assert len(seq) == len(steps[0])
    for i, seq_out in enumerate(seq):
        assert seq_out.dtype == torch.float32
        torch.testing.assert_close(seq_out, torch.stack([o[i] for o in steps], dim=1))
        torch.testing.assert_close(seq_out[1:2, 2:], torch.stack([o[i] for o in fresh], dim=1))
    assert seq[-1].shape == (*obs.shape[:2], 1)
    with torch.no_grad():  # the other entry points are forward's parts
        for a, b in zip(net.policy(obs, state, is_init), seq[:-1]):
            torch.testing.assert_close(a, b)
        torch.testing.assert_close(net.value(obs, state, is_init), seq[-1])
    mask = obs_space.get("action_mask")
    if mask:
        _assert_masked(seq[0], obs, mask)
        _assert_masked(net.policy(obs, state, is_init)[0], obs, mask)
        _assert_masked(torch.stack([o[0] for o in steps], dim=1), obs, mask)


@pytest.mark.parametrize("case", ["mlp_composite", "minatar_cnn"])
def test_detach_and_the_auxiliary_value_head(case):
    """``arch: detach``: one core; value losses reach the value head only. ``forward_aux`` adds PPG's
    auxiliary value on the policy core, masks kept."""
    net, obs_space = _net(case, "lstm", "detach", aux_value_head=True)
    assert net.value_core is None and net.value_body is None
    obs, state, is_init = _inputs(net, obs_space)
    *params, value, aux = net.forward_aux(obs, state, is_init)
    for a, b in zip(net(obs, state, is_init), (*params, value)):
        torch.testing.assert_close(a, b)
    assert aux.shape == value.shape and aux.dtype == torch.float32
    value.sum().backward()
    assert net.policy_core.weight_hh.grad is None and net.value_head.weight.grad is not None
    if obs_space.get("action_mask"):
        _assert_masked(params[0], obs, obs_space["action_mask"])
    with pytest.raises(ValueError, match="auxiliary value head"):
        _net(case, "lstm", "detach")[0].forward_aux(obs, state, is_init)


@pytest.mark.parametrize("case", ["mlp_masked", "small_cnn", "impala_cnn"])
def test_any_leading_dimensions(case):
    """Sequences ``[*, B, L, ...]`` and steps ``[*, ...]`` with two leading dimensions, and one step of a
    single observation, give what the flat batch gives."""
    net, obs_space = _net(case, "gru", "dual")
    obs, state, is_init = _inputs(net, obs_space, B=4)
    with torch.no_grad():
        flat = net(obs, state, is_init)
        nested = net(obs.view(2, 2, *obs.shape[1:]), state.view(2, 2, -1), is_init.view(2, 2, -1))
        for a, b in zip(flat, nested):
            torch.testing.assert_close(a, b.reshape(a.shape))
        step = net.step(obs[:, 0], state, is_init[:, 0])
        nested = net.step(obs[:, 0].view(2, 2, *obs.shape[2:]), state.view(2, 2, -1), is_init[:, 0].view(2, 2))
        single = net.step(obs[3, 0], state[3], is_init[3, 0])
        for a, b, c in zip(step, nested, single):
            torch.testing.assert_close(a, b.reshape(a.shape))
            torch.testing.assert_close(a[3], c)


# ---------------------------------------------------------------------------------------- member groups
@pytest.mark.parametrize("case,core,arch", [("mlp_composite", "lstm", "dual"), ("mlp_masked", "gru", "shared"),
                                            ("small_cnn", "lstm", "shared"), ("minatar_cnn", "gru", "dual"),
                                            ("impala_cnn", "lstm", "dual"), ("mlp_box_normalized", "gru", "detach"),
                                            ("mlp_post_core", "lstm", "shared")])
def test_member_k_of_a_group_is_seed_k_alone_bit_for_bit(case, core, arch):
    """`SeedStack` of recurrent networks: forward, policy, value, forward_aux and step with a leading [S],
    their outputs and the parameters' gradients member k's network's own, bit for bit."""
    S = 3
    nets, obs_space = zip(*(_net(case, core, arch, seed=s, aux_value_head=True) for s in range(S)))
    obs_space = obs_space[0]
    for s, net in enumerate(nets):
        if net.obs_norm is not None:  # each member's own statistics (buffers)
            net.obs_norm.update(torch.randn(50, *obs_space["shape"]) * (s + 1) + s)
    stack = SeedStack(list(nets))
    assert is_recurrent(stack) and stack.state_size == nets[0].state_size
    assert stack.initial_state(S, 4).shape == (S, 4, nets[0].state_size)
    members = [_inputs(nets[0], obs_space, seed=10 + s) for s in range(S)]
    obs, state, is_init = (torch.stack(parts) for parts in zip(*members))

    def alone(k):  # seed k's inputs in fresh tensors, as a single run has them
        return obs[k].clone(), state[k].clone(), is_init[k].clone()

    for method in ("forward", "policy", "value", "forward_aux"):
        group = getattr(stack, method)(obs, state, is_init)
        for k in range(S):
            own = (nets[k] if method == "forward" else getattr(nets[k], method))(*alone(k))
            own, out = (own, group) if isinstance(own, tuple) else ((own,), (group,))
            assert all(torch.equal(a, b[k]) for a, b in zip(own, out)), (method, k)
    with torch.no_grad():
        group = stack.step(obs[:, :, 0], state, is_init[:, :, 0])
        for k in range(S):
            own = nets[k].step(obs[k, :, 0].clone(), state[k].clone(), is_init[k, :, 0].clone())
            assert all(torch.equal(a, b[k]) for a, b in zip(own, group))
        torch.testing.assert_close(stack.value_of_seed(1, *alone(1)), nets[1].value(*alone(1)), rtol=0, atol=0)
        one = (obs[2, :, 0], state[2], is_init[2, :, 0])
        assert all(torch.equal(a, b) for a, b in zip(stack.call_seed(2, "step", *one), nets[2].step(*one)))
    # gradients: the loss of every member at once, each member's part its own network's
    sum(t.sum() for t in stack.forward_aux(obs, state, is_init)).backward()
    grads = {n: p.grad for n, p in stack.inner.named_parameters()}
    for k in range(S):
        sum(t.sum() for t in nets[k].forward_aux(*alone(k))).backward()
        for name, p in nets[k].named_parameters():
            assert (p.grad is None and grads[name] is None) or torch.equal(p.grad, grads[name][k]), (name, k)
        own = nets[k].state_dict()
        assert all(torch.equal(own[n], t) for n, t in stack.seed_state_dict(k).items())


@pytest.mark.parametrize("arch", ["dual", "shared", "detach"])
def test_post_core_layers_sit_between_each_core_and_its_head(arch):
    """``post_core_sizes``: one stack of Linear + activation per head after the core (the policy's and the
    value's own, whatever ``arch``); the heads read it. Oracle: the core's outputs through the layers by
    hand. With ``detach`` the value's losses reach its own layers and head, never the core."""
    net, obs_space = _net("mlp_post_core", "lstm", arch, aux_value_head=True)
    assert net.policy_post is not None and net.value_post is not None and net.policy_post is not net.value_post
    assert net.policy_head.in_features == net.value_head.in_features == net.aux_value_head.in_features == 4
    obs, state, is_init = _inputs(net, obs_space)

    def by_hand(post, core_out):
        (l1, _), (l2, _) = post[0:2], post[2:4]
        return torch.relu(l2(torch.relu(l1(core_out))))

    x, mask = net.encoder(obs)
    split = net.policy_core.state_size
    p_core, _ = net.policy_core(net.policy_body(x), state[..., :split], is_init)
    if net.value_core is None:
        v_core = p_core
    else:
        v_core, _ = net.value_core(net.value_body(x), state[..., split:], is_init)
    *params, value, aux = net.forward_aux(obs, state, is_init)
    torch.testing.assert_close(value, net.value_head(by_hand(net.value_post, v_core)))
    torch.testing.assert_close(aux, net.aux_value_head(by_hand(net.policy_post, p_core)))
    logits = net.policy_head(by_hand(net.policy_post, p_core))
    legal = mask.bool()
    torch.testing.assert_close(params[0][legal], logits[legal])
    _assert_masked(params[0], obs, obs_space["action_mask"])
    value.sum().backward()
    assert net.value_post[0].weight.grad is not None and net.policy_post[0].weight.grad is None
    assert (net.policy_core.weight_hh.grad is None) == (arch != "shared")
    # no post-core layers: the heads read the core (the parameters of the networks shipped before them)
    plain_net, _ = _net("mlp_masked", "lstm", arch)
    assert plain_net.policy_post is None and not any("post" in n for n in plain_net.state_dict())


# ---------------------------------------------------------------------------------------- configs
def test_built_from_network_dicts():
    image = {"shape": [2, 8, 8], "dtype": "uint8"}
    vector = {"shape": [4], "dtype": "float32"}
    auto = build_network(image, DISCRETE, {"name": "auto", "core": "gru", "core_size": 5, "dense": 8})
    assert isinstance(auto, RecurrentActorCritic) and auto.encoder_name == "small_cnn" and auto.layout == "chw"
    assert auto.arch == "shared" and auto.state_size == 5  # the convolutional networks' default layout
    mlp = build_network(vector, DISCRETE, {"name": "auto", "core": "lstm", "hidden_sizes": [8]})
    assert mlp.encoder_name == "mlp" and mlp.arch == "dual" and mlp.state_size == 4 * 64  # h and c of both cores
    assert not is_recurrent(build_network(vector, DISCRETE, {"name": "mlp", "core": None, "core_size": 5}))
    impala = build_network({"shape": [8, 8, 3], "dtype": "uint8"}, DISCRETE,
                           {"name": "impala_cnn", "channels": [2], "dense": 8, "core": "lstm", "core_size": 3,
                            "arch": "dual", "aux_value_head": True})
    assert impala.arch == "dual" and impala.state_size == 12 and impala.aux_value_head is not None
    assert [n for n, _ in impala.named_children()][:4] == ["policy_body", "policy_core", "value_body", "value_core"]
    # name: auto keeps the core whichever network it picks; the other kind's settings are named as unused
    _, line = resolve_network(image, {"name": "auto", "core": "lstm", "core_size": 8, "hidden_sizes": [8]})
    assert "hidden_sizes" in line and "core" not in line


@pytest.mark.parametrize("network,message", [
    ({"name": "mlp", "core": "rnn"}, "model.network.core must be one of"),
    ({"name": "mlp", "core": "lstm", "core_size": 0}, "core_size must be a positive integer"),
    ({"name": "transformer", "core": "lstm"}, "goes after the encoder of one of"),
    ({"name": "nature_cnn", "core": "lstm", "hidden_sizes": [8]}, "nature_cnn with a recurrent core takes"),
    ({"name": "mlp", "core": "gru", "activation": "sine"}, "model.activation must be one of"),
    ({"name": "mlp", "core": "lstm", "arch": "twin"}, "model.network.arch must be one of"),
    ({"name": "mlp", "core": "lstm", "post_core_sizes": [8, 0]}, "post_core_sizes must be a list of positive integers"),
    ({"name": "mlp", "post_core_sizes": [8]}, "post_core_sizes: layers after a recurrent core, which needs"),
])
def test_bad_recurrent_settings_are_one_line_errors(network, message):
    with pytest.raises(ValueError, match=message) as err:
        build_network({"shape": [40, 40, 3], "dtype": "uint8"} if network["name"] == "nature_cnn"
                      else {"shape": [4], "dtype": "float32"}, DISCRETE, network)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="normalizes Box observations without an action mask"):
        build_network(MASKED_OBS, MASKED_ACT, {"name": "mlp", "core": "lstm", "normalize_observation": True})


def test_the_exported_network_code_builds_every_recurrent_encoder():
    """``export-hf``'s generated network file (`ppo_lightning.interop.hf.bundle.network_source`, pure torch)
    builds each recurrent network with the same parameters and outputs."""
    from ppo_lightning.interop.hf.bundle import network_source

    bundled: dict = {}
    exec(compile(network_source(), "networks_ppo_lightning.py", "exec"), bundled)
    for case, (obs_space, act_space, network) in CASES.items():
        net, _ = _net(case, "lstm", "dual")
        network = {**network, "core": "lstm", "core_size": 6, "arch": "dual"}
        copy = bundled["build_network"](obs_space, act_space, network)
        copy.load_state_dict(net.state_dict())
        obs, state, is_init = _inputs(net, obs_space)
        for a, b in zip(net.step(obs[:, 0], state, is_init[:, 0]), copy.step(obs[:, 0], state, is_init[:, 0])):
            assert torch.equal(a, b), case


def test_the_lightning_module_acts_with_a_state_as_an_exported_model_does():
    """``PPOLightningModule.act`` with a recurrent network: ``(actions, new_state)``; no state starts
    every episode (zeros, is_init True); the mode is the step's most likely legal action; a feed-forward
    module takes no state."""
    from ppo_lightning.training.module import PPOLightningModule

    obs_space, act_space, network = CASES["mlp_masked"]
    torch.manual_seed(0)
    module = PPOLightningModule(obs_space, act_space, network={**network, "core": "gru", "core_size": 6})
    net = module.network
    obs, state, is_init = _inputs(net, obs_space, B=4)
    first = obs[:, 0]
    action, new_state = module.act(first, deterministic=True)
    logits, _value, expected = net.step(first, net.initial_state(4), torch.ones(4, dtype=torch.bool))
    assert torch.equal(new_state, expected) and torch.equal(action, logits.argmax(-1))
    legal = first[:, -obs_space["action_mask"]:].bool()
    for _ in range(20):  # sampled actions are legal ones
        sampled, _ = module.act(first, state=state, is_init=is_init[:, 0])
        assert legal.gather(-1, sampled.unsqueeze(-1)).all()
    carried, after = module.act(obs[:, 1], deterministic=True, state=new_state)  # is_init defaults to False
    logits, _value, expected = net.step(obs[:, 1], new_state, torch.zeros(4, dtype=torch.bool))
    assert torch.equal(after, expected) and torch.equal(carried, logits.argmax(-1))
    feed_forward = PPOLightningModule(obs_space, act_space, network=network)
    assert feed_forward.act(first).shape == (4,)
    with pytest.raises(ValueError, match="feed-forward: act takes no state"):
        feed_forward.act(first, state=state)
