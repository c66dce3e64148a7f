"""Issue 64, the data side of recurrent policies: collection carries every env's state, V(next
observation) bootstraps from the state after the step, rollouts are cut into segments of L steps, and
the carried state resumes exactly.

The oracles: the network stepped by hand over a rollout's observations, with the episode starts read
from the rollout's done flags (not from its ``is_init``); segments found in the rollout by their
observations; the single run's rollouts for a group member's."""

from __future__ import annotations

import io

import pytest
import torch
from tensordict import TensorDict

from ppo_lightning.algos.advantages import next_values
from ppo_lightning.data.datamodule import RolloutDataModule
from ppo_lightning.nets.models import OBS_KEY, VALUE_KEY, ActorCritic, build_network
from ppo_lightning.nets.recurrent import IS_INIT_KEY, STATE_KEY, call

LSTM = {"name": "mlp", "hidden_sizes": [16], "core": "lstm", "core_size": 8}
GRU = {"name": "mlp", "hidden_sizes": [16], "core": "gru", "core_size": 8, "arch": "shared"}


def recurrent_source(env_id="CartPole-v1", network=LSTM, num_envs=3, steps=40, seed=0, net_seed=0, **data_kwargs):
    data_kwargs = {"num_minibatches": 3, "update_epochs": 2, **data_kwargs}
    dm = RolloutDataModule(env_id=env_id, num_envs=num_envs, rollout_steps=steps, seed=seed, num_threads=1,
                           **data_kwargs)
    torch.manual_seed(net_seed)
    net = build_network(dm.observation_space, dm.action_space, network)
    return dm, net, dm.make_source(net)


def episode_starts(rollouts: list) -> torch.Tensor:
    """``[envs, T]`` over consecutive rollouts of a run: True at the run's first step and after every done."""
    done = torch.cat([r.get(("next", "done")).squeeze(-1) for r in rollouts], dim=1)
    starts = torch.ones_like(done)
    starts[:, 1:] = done[:, :-1]
    return starts


CASES = [("CartPole-v1", {}, "BatchedRollout"), ("CartPole-v1", {"batched_rollout": False}, "LockstepRollout"),
         ("minatar:breakout", {"env_kwargs": {"max_episode_steps": 25}}, "BatchedRollout")]


@pytest.mark.parametrize("env_id, kwargs, loop", CASES)
def test_rollouts_carry_the_state_into_every_step_as_the_network_steps_it(env_id, kwargs, loop):
    """Three consecutive rollouts: the keys and shapes of the contract; ``is_init`` True at the run's
    first step and exactly after every done (inside a rollout and across rollouts); the stored state
    into step t, the state after it and the stored outputs equal the network stepped by hand from zeros,
    reset where an episode starts."""
    dm, net, source = recurrent_source(env_id, **kwargs)
    assert type(source.collector).__name__ == loop
    rollouts = [source._next_rollouts()[0] for _ in range(3)]
    n, T, D = 3, 40, net.state_size
    for r in rollouts:
        assert r.batch_size == (n, T)
        assert r.get(STATE_KEY).shape == (n, T, D) and r.get(STATE_KEY).dtype == torch.float32
        assert r.get(IS_INIT_KEY).shape == (n, T) and r.get(IS_INIT_KEY).dtype == torch.bool
        assert r.get(("next", STATE_KEY)).shape == (n, T, D)
    starts = episode_starts(rollouts)
    assert torch.equal(torch.cat([r.get(IS_INIT_KEY) for r in rollouts], dim=1), starts)
    assert starts[:, 1:].sum() >= 2  # episode ends inside the rollouts
    assert starts[:, T::T].any() or env_id != "minatar:breakout"  # an episode starts a rollout after a done (MinAtar)
    state = torch.zeros(n, D)
    for i, r in enumerate(rollouts):
        obs = r.get(OBS_KEY)
        for t in range(T):
            init = starts[:, i * T + t]
            state = torch.where(init[:, None], torch.zeros(()), state)
            assert torch.equal(r.get(STATE_KEY)[:, t], state), (i, t)
            with torch.no_grad():  # as collection steps (torch's LSTM kernel takes another path with autograd)
                *params, value, state = net.step(obs[:, t], state, init)
            assert torch.equal(r.get(("next", STATE_KEY))[:, t], state), (i, t)
            assert torch.equal(r.get(VALUE_KEY)[:, t], value) and torch.equal(r.get(source.param_keys[0])[:, t], params[0])
    assert bool(state.abs().sum() > 0)
    source.shutdown()


def test_a_single_runs_two_gymnasium_loops_give_the_same_rollouts_bitwise():
    """A recurrent CartPole run stepped directly (`VectorGames` in `BatchedRollout`) and through TorchRL's
    env (`LockstepRollout`): the same rollouts key by key, and torch's generator ends where it ends."""
    out = []
    for batched in (True, False):
        dm, net, source = recurrent_source(batched_rollout=batched, network=GRU)
        rollouts = [source._next_rollouts()[0] for _ in range(3)]
        out.append((rollouts, torch.get_rng_state()))
    (ref, ref_rng), (got, got_rng) = out
    for a, b in zip(ref, got):
        for key in a.keys(True, True):
            assert torch.equal(a.get(key), b.get(key)), key
    assert torch.equal(ref_rng, got_rng)


def test_next_values_bootstrap_from_the_state_after_the_step():
    """By hand: V(next observation) reuses the next step's value inside an episode; at an episode's end
    and at the rollout's last step it is ``value_fn(final observation, state after the step)``."""
    T = 4
    value = torch.arange(T, dtype=torch.float32).reshape(1, T, 1)
    done = torch.tensor([False, True, False, False]).reshape(1, T, 1)
    next_state = torch.tensor([1.0, 2.0, 3.0, 4.0]).reshape(1, T, 1)
    rollout = TensorDict({VALUE_KEY: value, "next": {"done": done, OBS_KEY: 10 * torch.ones(1, T, 1),
                                                     STATE_KEY: next_state}}, batch_size=[1, T])
    nxt = next_values(rollout, lambda obs, state: obs + state)
    assert nxt.flatten().tolist() == [1.0, 12.0, 3.0, 14.0]


def test_a_rollouts_bootstrap_values_are_the_networks_with_the_episodes_own_state():
    dm, net, source = recurrent_source(steps=60)
    rollout = source.rollouts()[0]
    done = rollout.get(("next", "done")).squeeze(-1)
    need = done.clone()
    need[:, -1] = True
    assert done.any()
    obs, state = rollout.get(("next", OBS_KEY))[need], rollout.get(("next", STATE_KEY))[need]
    expected = net.step(obs, state, torch.zeros(len(obs), dtype=torch.bool))[-2]
    torch.testing.assert_close(rollout.get(("next", VALUE_KEY))[need], expected, rtol=0, atol=0)
    reset = net.step(obs, state, torch.ones(len(obs), dtype=torch.bool))[-2]
    assert not torch.allclose(expected, reset)  # the reset state would give other values
    inside = ~need
    assert torch.equal(rollout.get(("next", VALUE_KEY))[:, :-1][inside[:, :-1]], rollout.get(VALUE_KEY)[:, 1:][inside[:, :-1]])


@pytest.mark.parametrize("length, minibatches", [(8, 3), (None, 3), (5, 4)])
def test_segment_minibatches_are_consecutive_steps_of_one_env_from_their_stored_state(length, minibatches):
    """Minibatches ``[S, B, L]``; every epoch holds each segment of L consecutive steps of one env
    exactly once (found in the rollout by its observations), with the rollout's states and ``is_init``;
    the network unrolled over a segment from its stored start state gives the collected outputs; the
    advantages are normalized over the whole batch."""
    steps = 40
    dm, net, source = recurrent_source(steps=steps, num_envs=3 if minibatches == 3 else 4, sequence_length=length,
                                       num_minibatches=minibatches)
    L = length or steps
    source.progress.start_iteration()
    rollout = source.rollouts()[0]
    flats = [source.prepare(rollout.clone(), source.states[0])]
    batches = list(source._epoch_minibatches(flats, 2))
    envs = rollout.batch_size[0]
    B = envs * steps // L // minibatches
    assert len(batches) == 2 * minibatches and all(b.batch_size == (1, B, L) for b in batches)
    obs = rollout.get(OBS_KEY)
    for e in range(2):
        seen = []
        for b in batches[e * minibatches:(e + 1) * minibatches]:
            for seg in b[0].unbind(0):
                where = [(i, j) for i in range(envs) for j in range(0, steps, L)
                         if torch.equal(obs[i, j:j + L], seg.get(OBS_KEY))]
                assert len(where) == 1
                i, j = where[0]
                seen.append((i, j))
                for key in (STATE_KEY, IS_INIT_KEY, "action", "action_log_prob", VALUE_KEY):
                    assert torch.equal(seg.get(key), rollout.get(key)[i, j:j + L]), key
        assert sorted(seen) == [(i, j) for i in range(envs) for j in range(0, steps, L)]
        adv = torch.cat([b.get("advantage").flatten() for b in batches[e * minibatches:(e + 1) * minibatches]])
        assert adv.mean().abs() < 1e-5 and adv.std(unbiased=False) == pytest.approx(1.0, abs=1e-3)
    if length is not None:  # the two epochs' orders differ (a shuffle of segments)
        first = [b.get(OBS_KEY) for b in batches[:minibatches]]
        assert not all(torch.equal(a, c.get(OBS_KEY)) for a, c in zip(first, batches[minibatches:]))
    for b in batches:
        logits, value = call(net, "forward", b)
        torch.testing.assert_close(logits, b.get("logits"), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(value, b.get(VALUE_KEY), rtol=1e-5, atol=1e-5)


def test_ppg_keeps_the_states_with_its_stored_rollouts():
    class Phases:  # PPG's interface to the source (ppo_lightning.algos.ppg.PPGPhases), recording what it gets
        stored_keys = (OBS_KEY,)

        def iteration_batches(self, stored, generators, epoch_minibatches, data):
            self.stored = stored()
            yield from epoch_minibatches(1)

    dm, net, source = recurrent_source()
    source.phases = phases = Phases()
    for _ in iter(source):
        pass
    assert phases.stored.batch_size == (1, 3, 40)
    assert phases.stored.get(STATE_KEY).shape == (1, 3, 40, net.state_size)
    assert phases.stored.get(IS_INIT_KEY)[0, :, 0].all()


@pytest.mark.parametrize("kwargs, match", [
    ({"sequence_length": 7}, r"data.sequence_length=7 does not divide data.rollout_steps=40"),
    ({"sequence_length": 0}, r"data.sequence_length must be a positive integer"),
    ({"sequence_length": True}, r"data.sequence_length must be a positive integer"),
    ({"sequence_length": 8, "num_minibatches": 4}, r"data.num_minibatches=4 does not split the 15 sequences"),
])
def test_bad_sequence_lengths_are_one_line_errors(kwargs, match):
    with pytest.raises(ValueError, match=match) as err:
        RolloutDataModule(num_envs=3, rollout_steps=40, **{"num_minibatches": 3, **kwargs})
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("kwargs, recurrent, match", [
    ({"sequence_length": 8}, False, r"data.sequence_length cuts rollouts into sequences for a recurrent network"),
    ({"num_minibatches": 4}, True, r"data.num_minibatches=4 does not split the 3 sequences"),  # L = rollout_steps
    ({"staleness": 1, "staleness_mode": "behavior"}, True, r"data.staleness=1 is not supported with a recurrent network"),
])
def test_settings_a_network_cannot_take_are_one_line_errors(kwargs, recurrent, match):
    dm = RolloutDataModule(num_envs=3, rollout_steps=40, **{"num_minibatches": 3, **kwargs})
    net = (build_network(dm.observation_space, dm.action_space, LSTM) if recurrent
           else ActorCritic(dm.observation_space, dm.action_space, hidden_sizes=(8,)))
    with pytest.raises(ValueError, match=match) as err:
        dm.make_source(net)
    assert "\n" not in str(err.value)


def roundtrip(state):
    """Through a checkpoint's bytes, loaded as ``torch.load(weights_only=True)`` loads it."""
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


@pytest.mark.parametrize("env_id, kwargs", [(e, k) for e, k, _ in CASES])
def test_a_single_run_resumes_its_carried_states_exactly(env_id, kwargs):
    """A source stopped after two rollouts (episodes and states mid-way) and a fresh one loaded with its
    resume state (and the RNGs, as a checkpoint restores them) collect the same next rollouts bitwise."""
    from ppo_lightning.data import resume_state

    dm, net, source = recurrent_source(env_id, **kwargs)
    for _ in range(2):
        source._next_rollouts()
    saved = roundtrip(resume_state.capture(source, {}))
    assert not saved["collector"]["carrier"][IS_INIT_KEY].all()  # episodes in progress
    assert saved["collector"]["carrier"][STATE_KEY].abs().sum() > 0
    ref = [source._next_rollouts()[0] for _ in range(2)]
    dm2, net2, fresh = recurrent_source(env_id, seed=1, **kwargs)
    net2.load_state_dict(net.state_dict())
    resume_state.apply(fresh, {}, saved)
    got = [fresh._next_rollouts()[0] for _ in range(2)]
    for a, b in zip(ref, got):
        for key in a.keys(True, True):
            assert torch.equal(a.get(key), b.get(key)), key


class PerMember(torch.nn.Module):
    """A group's network for ``[S, n, ...]`` inputs as the contract gives it (``step`` with a leading S),
    running each member's own network on its slice: the single run's kernels, so that rollouts compare
    bitwise."""

    recurrent = True

    def __init__(self, nets):
        super().__init__()
        self.nets = torch.nn.ModuleList(nets)
        self.state_size = nets[0].state_size

    def step(self, obs, state, is_init):
        return tuple(torch.stack(x) for x in zip(*(n.step(*a) for n, *a in zip(self.nets, obs, state, is_init))))

    def call_seed(self, k, method, *inputs):
        return getattr(self.nets[k], method)(*inputs)


@pytest.mark.parametrize("loop", ["BatchedRollout", "LockstepRollout"])
def test_a_members_recurrent_rollouts_are_its_single_runs_bitwise(loop):
    """Member k of a group's loop (its envs seeded as seed k's single run, its actions on a generator at
    the single run's state) collects the single run's rollouts, states included, bitwise."""
    from ppo_lightning.data.batched_rollout import BatchedRollout
    from ppo_lightning.data.lockstep import LockstepRollout, vector_games
    from ppo_lightning.envs import make_env

    refs, nets, generators, envs = [], [], [], []
    for k in range(2):
        dm, net, source = recurrent_source(seed=k, net_seed=k)
        generator = torch.Generator()
        generator.set_state(torch.get_rng_state())
        refs.append([source._next_rollouts()[0] for _ in range(3)])
        nets.append(net), generators.append(generator), envs.append(make_env("CartPole-v1", 3, k, {}))
    args = (envs, PerMember(nets), dm.action_space, 120, generators)
    rollout = BatchedRollout(*args, games=vector_games) if loop == "BatchedRollout" else LockstepRollout(*args)
    got = [rollout.rollouts() for _ in range(3)]
    for k in range(2):
        for a, members in zip(refs[k], got):
            b = members[k]
            for key in (STATE_KEY, IS_INIT_KEY, ("next", STATE_KEY), OBS_KEY, "action", ("next", "done")):
                assert torch.equal(a.get(key), b.get(key)), (k, key)


def test_a_refilled_members_carried_step_starts_its_episodes():
    from ppo_lightning.data.batched_rollout import BatchedRollout
    from ppo_lightning.data.lockstep import vector_games
    from ppo_lightning.envs import make_env

    dm = RolloutDataModule(num_envs=3, rollout_steps=8, num_minibatches=3)
    nets = [build_network(dm.observation_space, dm.action_space, LSTM) for _ in range(2)]
    gens = [torch.Generator().manual_seed(k) for k in range(2)]
    rollout = BatchedRollout([make_env("CartPole-v1", 3, k, {}) for k in range(2)], PerMember(nets),
                             dm.action_space, 24, gens, games=vector_games)
    rollout.rollouts()
    rollout.reset_member(1, make_env("CartPole-v1", 3, 7, {}), torch.Generator())
    carrier = rollout._carrier
    assert carrier.get(IS_INIT_KEY)[1].all() and not carrier.get(STATE_KEY)[1].any()
    assert carrier.get(STATE_KEY)[0].any()


def group_source(rng_states, nets, seed=0):
    dm = RolloutDataModule(num_envs=3, rollout_steps=40, num_minibatches=3, seed=seed, num_seeds=2, num_threads=1)
    for st, rng in zip(dm.states, rng_states):
        st.set_action_rng_state(rng)
    return dm, dm.make_source(PerMember(nets))


def test_a_group_bootstraps_and_resumes_each_members_states_as_its_single_run():
    """A group's source (`SeedGroupSource`): member k's rollouts, bootstrap values and advantages are seed
    k's single run's bitwise; stopped after two iterations and loaded into a fresh group, its carried
    states (the resume state's ``carriers``) continue the same rollouts bitwise."""
    from ppo_lightning.data import resume_state

    refs, nets, rngs = [], [], []
    for k in range(2):
        dm, net, source = recurrent_source(seed=k, net_seed=k)
        rngs.append(torch.get_rng_state())
        refs.append([source.rollouts()[0] for _ in range(3)])
        nets.append(net)
    gdm, group = group_source(rngs, nets)
    got = [group.rollouts() for _ in range(2)]
    saved = roundtrip(resume_state.capture(group, {}))
    got.append(group.rollouts())
    carriers = saved["seed_group"]["carriers"]
    assert all(STATE_KEY in c and IS_INIT_KEY in c for c in carriers)
    for k in range(2):
        for a, members in zip(refs[k], got):
            for key in a.keys(True, True):
                assert torch.equal(a.get(key), members[k].get(key)), (k, key)
    _, fresh = group_source([torch.Generator().get_state()] * 2, nets)
    fresh.rollouts()  # its own carried states, which the resume replaces
    resume_state.apply(fresh, {}, saved)
    again = fresh.rollouts()
    for k in range(2):
        for key in got[2][k].keys(True, True):
            assert torch.equal(got[2][k].get(key), again[k].get(key)), (k, key)


@pytest.mark.parametrize("env_id, kwargs, loop", CASES)
def test_a_stacked_groups_rollouts_are_its_members_single_runs_bitwise(env_id, kwargs, loop):
    """The group's own stacked network (`ppo_lightning.nets.seed_stack.SeedStack`, member by member for a
    recurrent network) in every group loop: member k's rollouts with bootstrap values and advantages are
    seed k's single run's, key by key, bitwise."""
    from ppo_lightning.nets.seed_stack import SeedStack

    refs, nets, rngs = [], [], []
    for k in range(2):
        dm, net, source = recurrent_source(env_id, seed=k, net_seed=k, **kwargs)
        rngs.append(torch.get_rng_state())
        refs.append([source.rollouts()[0] for _ in range(2)])
        nets.append(net)
    gdm = RolloutDataModule(env_id=env_id, num_envs=3, rollout_steps=40, num_minibatches=3, seed=0, num_seeds=2,
                            num_threads=1, **kwargs)
    for st, rng in zip(gdm.states, rngs):
        st.set_action_rng_state(rng)
    group = gdm.make_source(SeedStack(nets))
    assert type(group.collector).__name__ == loop
    got = [group.rollouts() for _ in range(2)]
    for k in range(2):
        for a, members in zip(refs[k], got):
            for key in a.keys(True, True):
                assert torch.equal(a.get(key), members[k].get(key)), (k, key)


# ---------------------------------------------------------------------------- whole runs (the loss of issue 64's training side)

RECURRENT_RUN = ["--config", "ppo_lightning/configs/cartpole/ppo_ewma.yaml",
                 "--model.network", '{"name": "mlp", "hidden_sizes": [16], "core": "lstm", "core_size": 8}',
                 "--mlflow.enabled", "false", "--video_every", "null", "--trainer.enable_progress_bar", "false",
                 "--checkpoint_every", "1", "--data.num_envs", "4", "--data.rollout_steps", "16",
                 "--data.sequence_length", "8", "--data.num_minibatches", "2", "--data.update_epochs", "2",
                 "--data.num_threads", "1"]


def test_a_recurrent_run_killed_mid_rollout_resumes_bitwise(tmp_path):
    """An LSTM run SIGKILLed inside an env step of a rollout (episodes and states mid-way), resumed from
    last.ckpt, ends with bitwise the uninterrupted run's weights
    and optimizer state: the carried states and ``is_init`` are in the checkpoint."""
    import signal
    import subprocess
    import sys

    from test_robust import ENV, ROOT, final_state

    from ppo_lightning.run.builder import fit_main

    args = ["fit", *[str(ROOT / a) if a.endswith(".yaml") else a for a in RECURRENT_RUN], "--data.total_frames", str(8 * 64)]
    fit_main([*args, "--run_dir", str(tmp_path / "reference")])
    ckpt = tmp_path / "killed/checkpoints/last.ckpt"
    # killed inside an env step of iteration 3's rollout (a kill after an optimizer step resumes through the
    # same checkpoint entries: tests/test_robust.py kills feed-forward runs there)
    killer = {"class_path": "robust_helpers.KillAt", "init_args": {"phase": "collect", "iteration": 3}}
    out = subprocess.run([sys.executable, "-m", "ppo_lightning.cli.main", *args, "--run_dir", str(tmp_path / "killed"),
                          f"--trainer.callbacks+={killer}".replace("'", '"')],
                         env=ENV, capture_output=True, text=True, timeout=600)
    assert out.returncode == -signal.SIGKILL, out.stderr[-3000:]
    carrier = torch.load(ckpt, weights_only=True)["RolloutDataModule"]["per_rank"][0]["resume"]["collector"]["carrier"]
    assert not carrier[IS_INIT_KEY].all() and carrier[STATE_KEY].abs().sum() > 0  # states mid-episode
    out = subprocess.run([sys.executable, "-m", "ppo_lightning.cli.main", *args, "--run_dir", str(tmp_path / "killed"),
                          "--ckpt_path", str(ckpt)], env=ENV, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    ref, got = final_state(tmp_path / "reference/checkpoints/last.ckpt"), final_state(ckpt)
    assert ref[0].keys() == got[0].keys() and all(torch.equal(ref[0][k], got[0][k]) for k in ref[0])
    for k, state in ref[1].items():
        assert all(torch.equal(v, got[1][k][name]) for name, v in state.items())
    assert all(torch.equal(v, got[2]["proximal"][k]) for k, v in ref[2]["proximal"].items())


def test_a_recurrent_group_resumes_exactly(tmp_path):
    """A group of 2 LSTM members stopped after 2 iterations and resumed to 4 ends bitwise as the
    uninterrupted group (each member's carried states in the checkpoint's ``carriers``)."""
    from test_seed_group import assert_same_training_state, uninterrupted_and_resumed

    a, b = uninterrupted_and_resumed(["fit", *RECURRENT_RUN, "--seeds", "2", "--trainer.precision", "32-true"], tmp_path, 4 * 64)
    assert_same_training_state(a, b)
    carriers = a["RolloutDataModule"]["per_rank"][0]["resume"]["seed_group"]["carriers"]
    assert len(carriers) == 2 and all(c[STATE_KEY].abs().sum() > 0 for c in carriers)
