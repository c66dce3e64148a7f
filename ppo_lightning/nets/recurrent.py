"""Recurrent actor-critics: an LSTM or GRU core between the observation encoder and the heads.

``model.network.core: lstm | gru`` (``core_size``: its hidden size, default 64) turns any network
(``name``: mlp, nature_cnn, small_cnn, minatar_cnn, impala_cnn, or auto) into a recurrent one: the
observation goes through that network's encoder (the MLP body over the packed observation of any
gymnasium space, or a convolutional trunk and its dense layer), then through the core, then the
policy and value heads (`RecurrentActorCritic`); ``post_core_sizes`` (default none) puts hidden layers
between the core and each head, one stack for the policy and one for the value (sb3-contrib's
``MlpLstmPolicy`` with ``net_arch=dict(pi=[64], vf=[64])``: a layer of 64 after the LSTM). ``arch`` keeps its meaning: ``dual`` gives the
policy and the value their own encoder and core, ``shared`` one of each for both heads, ``detach``
one of each with the value head reading the core through a stop-gradient (PPG).

The recurrent state of one env is one flat float32 vector of `RecurrentActorCritic.state_size`
numbers (each core's ``h``, then an LSTM's ``c``; the policy core's, then the value core's), so that
collection, checkpoints, exports and member groups carry it as any other tensor. It is reset to
zeros before the first step of every episode: ``is_init`` (True at an episode's first step) says
where.

Every method takes the state and ``is_init`` beside the observation:

- ``step(obs [*, ...], state [*, D], is_init [*]) -> (*dist_params, value, new_state)``: one step
  (collection, evaluation, an exported model);
- ``forward / policy / value / forward_aux(obs [*, B, L, ...], state [*, B, D], is_init [*, B, L])``:
  B sequences of L steps, each unrolled from its start state with resets where ``is_init`` is True
  (training: the loss's current, proximal and PPG's policies over the same segments). The outputs are
  ``[*, B, L, ...]``; the state at the end is not returned (training never needs it).

The cores (`RecurrentCore`) run torch's own LSTM and GRU op (``nn.LSTM``'s weight names and gate order;
`ppo_lightning.adapters.torch.rnn_layer`) over the stretches of a sequence between episode starts,
zeroing the state of the sequences that start one. TorchRL's ``LSTMModule`` is not used: it wraps an
``nn.LSTM`` module, whose one call unrolls a whole sequence from one state (TorchRL splits the
trajectories at the resets and pads them), and a member group runs each member's copy through
``torch.func.functional_call`` (`ppo_lightning.nets.seed_stack`). The tests compare the cores with the
LSTM and GRU equations written out.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ppo_lightning.adapters.torch import rnn_layer
from ppo_lightning.nets.actor_critic import OBS_KEY, ACTIVATIONS, _init_linear, mlp, orthogonal_init_, resolve_arch
from ppo_lightning.nets.composite import head_sizes, policy_params
from ppo_lightning.nets.encoders import ObservationEncoder
from ppo_lightning.nets.impala import ImpalaEncoder
from ppo_lightning.nets.minatar_cnn import MinAtarTrunk, minatar_input, minatar_nchw
from ppo_lightning.nets.obs_norm import RunningObservationNorm
from ppo_lightning.nets.pixel_cnn import NATURE_CONVS, SMALL_CONVS, ConvTrunk, image_batch, image_input

STATE_KEY = "recurrent_state"  # [.., D]: the state going into this step (zeros at an episode's first step)
IS_INIT_KEY = "is_init"  # [..]: this step is the first of an episode (the state is reset before it)
CORES = ("lstm", "gru")


class RecurrentCore(nn.Module):
    """An LSTM or GRU layer over sequences with resets (module docstring). Weights as ``nn.LSTM``'s
    layer 0 (``weight_ih [G H, in]``, ``weight_hh [G H, H]``, ``bias_ih``, ``bias_hh``; G = 4 or 3),
    initialised as CleanRL's ``ppo_atari_lstm.py``: orthogonal (gain 1), zero biases.

    The steps run in torch's own LSTM / GRU op with these weights (`ppo_lightning.adapters.torch.rnn_layer`:
    oneDNN's RNN on the CPU, whose forward and backward are 3-6x faster than the equations as a Python
    loop of tensor ops): one call over each stretch of steps without an episode start. A minibatch's
    time axis is cut where any of its sequences starts an episode; at each cut the rows that start one
    are zeroed."""

    def __init__(self, kind: str, in_dim: int, hidden: int) -> None:
        super().__init__()
        if kind not in CORES:
            raise ValueError(f"model.network.core must be one of {CORES} (or null), got {kind!r}")
        self.kind, self.hidden = kind, int(hidden)
        gates = 4 if kind == "lstm" else 3
        self.weight_ih = nn.Parameter(torch.empty(gates * hidden, in_dim))
        self.weight_hh = nn.Parameter(torch.empty(gates * hidden, hidden))
        self.bias_ih = nn.Parameter(torch.zeros(gates * hidden))
        self.bias_hh = nn.Parameter(torch.zeros(gates * hidden))
        orthogonal_init_(self.weight_ih, 1.0)
        orthogonal_init_(self.weight_hh, 1.0)

    @property
    def state_size(self) -> int:
        return 2 * self.hidden if self.kind == "lstm" else self.hidden

    def forward(self, x: Tensor, state: Tensor, is_init: Tensor) -> tuple[Tensor, Tensor]:
        """``x [*, L, in]``, ``state [*, state_size]``, ``is_init [*, L]`` -> (outputs ``[*, L, H]``,
        the state after the last step). The state is zeroed before every step where ``is_init``."""
        lead, L = x.shape[:-2], x.shape[-2]
        x = x.reshape(-1, L, x.shape[-1])
        is_init = is_init.reshape(-1, L).bool()
        state = state.reshape(-1, state.shape[-1]).to(x.dtype)
        h, c = (state[:, :self.hidden], state[:, self.hidden:]) if self.kind == "lstm" else (state, None)
        # the steps where some sequence starts an episode (one host read), then the stretches between them
        weights = [self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh]
        cuts = [0, *(t for t, any_init in enumerate(is_init.any(0).tolist()) if any_init and t > 0), L]
        outs = []
        for a, b in zip(cuts[:-1], cuts[1:]):
            keep = (~is_init[:, a]).unsqueeze(-1).to(h.dtype)
            h = h * keep
            c = None if c is None else c * keep
            out, h, c = rnn_layer(self.kind, x[:, a:b], h, c, weights)
            outs.append(out)
        out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)
        last = h if c is None else torch.cat((h, c), dim=-1)
        return out.reshape(*lead, L, self.hidden), last.reshape(*lead, last.shape[-1])


# model.network.name -> the settings of its encoder a recurrent network takes, with their defaults (the
# feed-forward network's, except the MLP's one hidden layer: the core adds the second)
ENCODER_SETTINGS = {
    "mlp": {"hidden_sizes": (64,), "activation": "tanh", "normalize_observation": False},
    "nature_cnn": {"dense": 512, "layout": None},
    "small_cnn": {"dense": 256, "layout": None},
    "minatar_cnn": {"channels": 16, "hidden": 128, "kernel_size": 3},
    "impala_cnn": {"channels": (16, 32, 32), "dense": 256, "nblock": 2, "inference_chunk": 64},
}


class RecurrentActorCritic(nn.Module):
    """Encoder -> LSTM/GRU core -> policy and value heads, for any action space (module docstring).

    ``encoder`` names the feed-forward network whose encoder reads the observations, built from that
    network's own building blocks with its settings (`ENCODER_SETTINGS`):

    - ``mlp``: `ppo_lightning.nets.encoders.ObservationEncoder` (a plain ``Box`` flattened, a packed
      space leaf by leaf, an action mask split off), ``normalize_observation`` (a plain ``Box``), and
      the MLP body (``hidden_sizes``, ``activation``);
    - ``nature_cnn`` / ``small_cnn``: `ppo_lightning.nets.pixel_cnn.ConvTrunk` (convolutions and the
      dense layer) over images in any layout;
    - ``minatar_cnn``: `ppo_lightning.nets.minatar_cnn.MinAtarTrunk`;
    - ``impala_cnn``: `ppo_lightning.nets.impala.ImpalaEncoder` (the stacks and the dense layer).

    ``arch`` defaults as the feed-forward network's (``dual`` for the MLP, ``shared`` for the
    convolutional ones). The heads read the core's output: orthogonal init, policy gain 0.01, value
    1.0, PPG's auxiliary value head (``aux_value_head``) on the policy core; outputs float32 under any
    autocast; the logits of actions an observation's mask forbids are masked."""

    recurrent = True

    def __init__(self, observation_space: dict, action_space: dict, encoder: str = "mlp", core: str = "lstm",
                 core_size: int = 64, arch: str | None = None, shared_trunk: bool | None = None,
                 aux_value_head: bool = False, post_core_sizes=(), **settings) -> None:
        super().__init__()
        if encoder not in ENCODER_SETTINGS:
            raise ValueError(f"model.network.core (a recurrent core) goes after the encoder of one of "
                             f"{', '.join(ENCODER_SETTINGS)}, got name {encoder!r}")
        if core not in CORES:
            raise ValueError(f"model.network.core must be one of {CORES} (or null), got {core!r}")
        if isinstance(core_size, bool) or not isinstance(core_size, int) or core_size <= 0:
            raise ValueError(f"model.network.core_size must be a positive integer, got {core_size!r}")
        unknown = sorted(set(settings) - set(ENCODER_SETTINGS[encoder]))
        if unknown:
            raise ValueError(f"model.network: {encoder} with a recurrent core takes "
                             f"{', '.join(ENCODER_SETTINGS[encoder])} (and core, core_size, post_core_sizes, arch, "
                             f"shared_trunk, aux_value_head), not {', '.join(unknown)}")
        post_core_sizes = tuple(post_core_sizes or ())
        if any(isinstance(w, bool) or not isinstance(w, int) or w <= 0 for w in post_core_sizes):
            raise ValueError(f"model.network.post_core_sizes must be a list of positive integers, got "
                             f"{list(post_core_sizes)!r}")
        settings = {**ENCODER_SETTINGS[encoder], **settings}
        self.encoder_name = encoder
        self.action_space = action_space
        if encoder == "mlp":
            self.arch = resolve_arch(arch, bool(shared_trunk))
        else:  # the convolutional networks' default: one trunk for both heads
            self.arch = resolve_arch(arch or ("dual" if shared_trunk is False else "shared"), bool(shared_trunk))
        self.shared_trunk = self.arch != "dual"
        kind = action_space["type"]
        self.discrete, self.composite = kind == "discrete", kind == "composite"
        if self.composite:
            out_dim, stds = head_sizes(action_space["space"])
        else:
            out_dim = action_space["n"] if self.discrete else int(math.prod(action_space["shape"]))
            stds = 0 if self.discrete else out_dim
        self.obs_ndim = len(observation_space["shape"])
        self.encoder, self.obs_norm, self.mask_size, self.layout = None, None, 0, None
        body = self._body_factory(observation_space, settings)
        self.policy_body, feat = body()
        self.policy_core = RecurrentCore(core, feat, core_size)
        if self.shared_trunk:
            self.value_body = self.value_core = None
        else:
            self.value_body, value_feat = body()
            self.value_core = RecurrentCore(core, value_feat, core_size)
        # hidden layers after the core, one stack per head (None: the heads read the core); the MLP's
        # activation, ReLU after a convolutional encoder
        self.post_core_sizes = post_core_sizes
        post_activation = settings["activation"] if encoder == "mlp" else "relu"
        self.policy_post = self.value_post = None
        head_in = core_size
        if post_core_sizes:
            self.policy_post, head_in = mlp(core_size, post_core_sizes, post_activation)
            self.value_post, _ = mlp(core_size, post_core_sizes, post_activation)
        self.policy_head = _init_linear(nn.Linear(head_in, out_dim), 0.01)
        self.value_head = _init_linear(nn.Linear(head_in, 1), 1.0)
        self.log_std = nn.Parameter(torch.zeros(stds)) if stds else None
        self.aux_value_head = _init_linear(nn.Linear(head_in, 1), 1.0) if aux_value_head else None

    def _body_factory(self, observation_space: dict, settings: dict):
        """A function that builds one encoder body: () -> (module, features). Sets what reading the
        observation needs (`_read`): the MLP's observation encoder and normalizer, an image layout."""
        name = self.encoder_name
        if name == "mlp":
            activation = settings["activation"]
            if activation not in ACTIVATIONS:
                raise ValueError(f"model.activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
            self.encoder = ObservationEncoder(observation_space)
            self.mask_size = self.encoder.mask_size
            if settings["normalize_observation"]:
                if observation_space.get("space") is not None or self.mask_size:
                    raise ValueError("model.network.normalize_observation normalizes Box observations without an "
                                     "action mask")
                self.obs_norm = RunningObservationNorm(self.encoder.out_dim)
            in_dim, hidden = self.encoder.out_dim, tuple(settings["hidden_sizes"])
            return lambda: mlp(in_dim, hidden, activation)
        if name in ("nature_cnn", "small_cnn"):
            convs = NATURE_CONVS if name == "nature_cnn" else SMALL_CONVS
            dense = settings["dense"]
            self.layout, h, w, c = image_input(observation_space, convs, dense, name, settings["layout"])
            return lambda: (ConvTrunk(h, w, c, convs, dense), dense)
        if name == "minatar_cnn":
            channels, hidden, kernel = settings["channels"], settings["hidden"], settings["kernel_size"]
            h, w, c = minatar_input(observation_space, channels, hidden, kernel)
            return lambda: (MinAtarTrunk(h, w, c, channels, kernel, hidden), hidden)
        impala = {k: settings[k] for k in ("dense", "nblock", "inference_chunk")}
        impala["channels"] = tuple(settings["channels"])
        return lambda: (ImpalaEncoder(observation_space, **impala), impala["dense"])

    # ---------------------------------------------------------------- state
    @property
    def state_size(self) -> int:
        """D: the numbers of one env's recurrent state."""
        cores = [self.policy_core] + ([self.value_core] if self.value_core is not None else [])
        return sum(c.state_size for c in cores)

    def initial_state(self, *batch_shape: int, device=None) -> Tensor:
        """Zeros ``[*batch_shape, D]`` (float32): the state before an episode's first step."""
        return torch.zeros((*batch_shape, self.state_size), dtype=torch.float32, device=device)

    # ---------------------------------------------------------------- the unrolled pass
    def _read(self, obs: Tensor) -> tuple[Tensor, Tensor | None, torch.Size | None]:
        """(the bodies' input, the action mask or None, the leading dimensions where the input is one
        flat image batch, else None) of observations ``[*lead, ...]``."""
        if self.encoder is not None:  # mlp
            x, mask = self.encoder(obs)
            return (x if self.obs_norm is None else self.obs_norm(x)), mask, None
        if self.layout is not None:  # nature_cnn, small_cnn
            x, lead = image_batch(obs, self.layout, self.policy_head.weight.dtype)
            return x, None, lead
        if self.encoder_name == "minatar_cnn":
            x, lead = minatar_nchw(obs)
            return x, None, lead
        return obs, None, None  # impala_cnn: ImpalaEncoder.features reads the observations

    @staticmethod
    def _features(body: nn.Module, x: Tensor, lead: torch.Size | None) -> Tensor:
        f = body.features(x) if isinstance(body, ImpalaEncoder) else body(x)
        return f if lead is None else f.reshape(*lead, f.shape[-1])

    def _unroll(self, obs: Tensor, state: Tensor, is_init: Tensor, policy: bool = True, value: bool = True
                ) -> tuple[Tensor | None, Tensor | None, Tensor | None, Tensor]:
        """(the policy head's inputs ``[*, L, H]`` or None, the value head's or None, mask, state after) for
        ``obs [*, L, ...]``; ``policy`` / ``value``: whether those outputs are needed (a core that is
        not run keeps its part of the state)."""
        x, mask, lead = self._read(obs)
        split = self.policy_core.state_size
        policy_state, value_state = state[..., :split], state[..., split:]
        policy = policy or self.value_core is None  # a shared core feeds the value too
        p_out = None
        if policy:
            p_out, policy_state = self.policy_core(self._features(self.policy_body, x, lead), policy_state, is_init)
        if self.value_core is None:
            v_out = (p_out.detach() if self.arch == "detach" else p_out) if value else None
            return self._post(p_out, v_out) + (mask, policy_state)
        v_out = None
        if value:
            v_out, value_state = self.value_core(self._features(self.value_body, x, lead), value_state, is_init)
        return self._post(p_out, v_out) + (mask, torch.cat((policy_state, value_state), dim=-1))

    def _post(self, p_out: Tensor | None, v_out: Tensor | None) -> tuple[Tensor | None, Tensor | None]:
        """The heads' inputs: the core outputs through the post-core layers, if any."""
        if self.policy_post is None:
            return p_out, v_out
        return (None if p_out is None else self.policy_post(p_out)), (None if v_out is None else self.value_post(v_out))

    def _params(self, features: Tensor, mask: Tensor | None) -> tuple[Tensor, ...]:
        # float32 under any autocast (the loss's ratios)
        return policy_params(self.action_space, self.policy_head(features).float(), self.log_std, mask)

    # ---------------------------------------------------------------- sequences (training)
    def forward(self, obs: Tensor, state: Tensor, is_init: Tensor) -> tuple[Tensor, ...]:
        """Distribution parameters and value ``[*, B, L, ...]`` of B sequences of L steps."""
        p, v, mask, _ = self._unroll(obs, state, is_init)
        return (*self._params(p, mask), self.value_head(v).float())

    def policy(self, obs: Tensor, state: Tensor, is_init: Tensor) -> tuple[Tensor, ...]:
        """Distribution parameters ``[*, B, L, ...]``."""
        p, _, mask, _ = self._unroll(obs, state, is_init, value=False)
        return self._params(p, mask)

    def value(self, obs: Tensor, state: Tensor, is_init: Tensor) -> Tensor:
        """Values ``[*, B, L, 1]``."""
        _, v, _, _ = self._unroll(obs, state, is_init, policy=False)
        return self.value_head(v).float()

    def forward_aux(self, obs: Tensor, state: Tensor, is_init: Tensor) -> tuple[Tensor, ...]:
        """Distribution parameters, value and the auxiliary value (PPG's auxiliary phase), ``[*, B, L, ...]``."""
        if self.aux_value_head is None:
            raise ValueError("this network has no auxiliary value head (model.network.aux_value_head)")
        p, v, mask, _ = self._unroll(obs, state, is_init)
        return (*self._params(p, mask), self.value_head(v).float(), self.aux_value_head(p).float())

    # ---------------------------------------------------------------- one step (collection, evaluation)
    def step(self, obs: Tensor, state: Tensor, is_init: Tensor) -> tuple[Tensor, ...]:
        """One step: ``obs [*, ...]``, ``state [*, D]``, ``is_init [*]`` -> (*dist params, value
        ``[*, 1]``, the state after the step ``[*, D]``)."""
        p, v, mask, last = self._unroll(obs.unsqueeze(-self.obs_ndim - 1), state, is_init.unsqueeze(-1))
        params = self._params(p.squeeze(-2), None if mask is None else mask.squeeze(-2))
        return (*params, self.value_head(v.squeeze(-2)).float(), last)


def is_recurrent(network: nn.Module) -> bool:
    """Whether ``network`` (or a group's stacked network of it) has a recurrent core."""
    return bool(getattr(network, "recurrent", False))


def sequence_inputs(batch) -> tuple[Tensor, Tensor, Tensor]:
    """(observations ``[*, B, L, ...]``, start states ``[*, B, D]``, ``is_init [*, B, L]``) of a
    minibatch of B segments of L steps (``batch_size [*, B, L]``): each segment's stored state at its
    first step."""
    return batch.get(OBS_KEY), batch.get(STATE_KEY)[..., 0, :], batch.get(IS_INIT_KEY)


def call(network: nn.Module, method: str, batch) -> tuple[Tensor, ...] | Tensor:
    """``network.<method>`` over a minibatch: the observations alone for a feed-forward network, the
    segments (`sequence_inputs`) for a recurrent one (``method``: forward, policy, value, forward_aux)."""
    fn = network if method == "forward" else getattr(network, method)
    if is_recurrent(network):
        return fn(*sequence_inputs(batch))
    return fn(batch.get(OBS_KEY))
