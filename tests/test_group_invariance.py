"""A cell's floats do not depend on its group (issue 63): member k of any group and the seed trained alone
end on the same bits (32-true, one CPU type), whatever the group's size and the member's place in it.

Each member runs its single run's kernels on its own slices (`ppo_lightning.nets.mlp_stacked`,
`ppo_lightning.training.seed_group.MemberAdam`, `SeedGroup.clip_grad_norm_`,
`ppo_lightning.algos.proximal.ewma_update_`); the kernel-level checks below name what a call over
the stacked tensors would round otherwise, in a few tensor calls each.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ppo_lightning.run import Members, RunSpec, train

# 128 frames an iteration, 2 epochs x 4 minibatches of 32 rows (the shipped CartPole minibatch)
SMALL = {"num_envs": 4, "rollout_steps": 32, "num_minibatches": 4, "update_epochs": 2, "num_threads": 1}


def _fit(config: str, seeds: list[int], frames: int, data: dict, tmp_path) -> list[dict[str, torch.Tensor]]:
    """Train ``seeds`` (one: a single run; more: a group) and return each member's tensors: network,
    EWMA proximal weights, Adam's moments and step counts."""
    spec = RunSpec(configs=[config], seed=seeds[0], frames=frames, data=data,
                   trainer={"precision": "32-true", "logger": False, "enable_checkpointing": False},
                   options={"run_dir": str(tmp_path / f"{config.replace('/', '_')}-{'-'.join(map(str, seeds))}"),
                            "video_every": None, "mlflow.enabled": False},
                   members=Members(seeds=seeds) if len(seeds) > 1 else None)
    model = train(spec).model
    group = len(seeds) > 1
    net = model.network.inner if group else model.network
    prox = model.proximal_source
    opt = model.optimizers(use_pl_optimizer=False)
    out = []
    for k in range(len(seeds)):
        def cut(t, k=k):
            return t[k] if group else t
        d = {f"net/{n}": cut(t) for n, t in net.state_dict().items()}
        if prox is not None:
            d |= {f"ewma/{n}": cut(t) for n, t in (prox.proximal.inner if group else prox.proximal).state_dict().items()}
        for i, p in enumerate(model.network.parameters()):
            d |= {f"adam/{i}/{n}": (t if n == "step" else cut(t)) for n, t in opt.state[p].items()}
        out.append(d)
    return out


def _assert_bitwise(a: dict, b: dict, what: str) -> None:
    assert a.keys() == b.keys()
    differ = {n: (a[n].double() - b[n].double()).abs().max().item() for n in a if not torch.equal(a[n], b[n])}
    assert not differ, f"{what}: {len(differ)} of {len(a)} tensors differ, e.g. {list(differ.items())[:3]}"


@pytest.mark.parametrize("config", ["cartpole/ppo", "cartpole/ppo_ewma"])
def test_a_member_of_a_group_of_2_or_3_is_its_seed_alone_bitwise(config, tmp_path):
    """16 iterations (128 gradient steps, clipped at 0.5): seed 1 alone, as member 1 of a group of 2 and as
    member 2 of a group of 3, and seed 0 as member 0 and member 1, end on the same bits (weights, EWMA,
    Adam); the seeds differ."""
    frames = 16 * 128
    alone = _fit(config, [1], frames, SMALL, tmp_path)[0]
    two = _fit(config, [0, 1], frames, SMALL, tmp_path)
    three = _fit(config, [2, 0, 1], frames, SMALL, tmp_path)
    _assert_bitwise(two[1], alone, "member 1 of [0, 1] against seed 1 alone")
    _assert_bitwise(three[2], alone, "member 2 of [2, 0, 1] against seed 1 alone")
    _assert_bitwise(three[1], two[0], "member 1 of [2, 0, 1] against member 0 of [0, 1]")
    assert not torch.equal(two[0]["net/policy_head.weight"], two[1]["net/policy_head.weight"])


def test_a_hopper_member_is_its_seed_alone_bitwise(tmp_path):
    """``mujoco/ppo_hopper`` (observation and reward normalization, value clipping, a linear lr schedule),
    shrunk to 2 envs x 64 steps, 2 epochs x 2 minibatches of 64: 3 iterations, seed 1 alone and as
    member 1 of a group of 2, bitwise."""
    data = {"num_envs": 2, "rollout_steps": 64, "num_minibatches": 2, "update_epochs": 2, "num_threads": 1}
    alone = _fit("mujoco/ppo_hopper", [1], 3 * 128, data, tmp_path)[0]
    two = _fit("mujoco/ppo_hopper", [0, 1], 3 * 128, data, tmp_path)
    _assert_bitwise(two[1], alone, "member 1 of [0, 1] against seed 1 alone")


# ------------------------------------------------------------------ the kernels a stacked call rounds otherwise
def test_a_batched_matmul_rounds_a_member_otherwise_than_its_linear_layer():
    """Why the stacked MLP calls ``F.linear`` per member: one ``baddbmm`` over the members computes a
    64 -> 1 head (a matrix-vector product in ``F.linear``) or a few rows in another summation order.
    The difference is rounding (bounded here), but training grows it."""
    from ppo_lightning.nets.mlp_stacked import _stacked_linear

    torch.manual_seed(0)
    differ = 0
    for _ in range(10):
        x, w, b = torch.randn(2, 32, 64), torch.randn(2, 1, 64) * 0.1, torch.randn(2, 1)
        batched = torch.baddbmm(b.unsqueeze(1), x, w.transpose(1, 2))
        alone = F.linear(x[0], w[0], b[0])
        differ += not torch.equal(batched[0], alone)
        assert (batched[0] - alone).abs().max() < 1e-5
        assert torch.equal(_stacked_linear(x, w, b)[0], alone)
    assert differ


def _step_together(optimizer, stacked, alone, steps: int) -> None:
    """``steps`` random gradient steps: ``optimizer`` on the stacked ``[S, 1]`` tensor, fused Adam on each
    member's copy, each member given its row of the same gradient."""
    opts = [torch.optim.Adam([a], lr=2e-3, eps=1e-5, fused=True) for a in alone]
    for _ in range(steps):
        g = torch.randn(len(alone), 1) * 1e-2
        stacked.grad = g.clone()
        for k, a in enumerate(alone):
            a.grad = g[k].clone()
        optimizer.step()
        for o in opts:
            o.step()


def test_fused_adam_rounds_a_tensors_tail_otherwise():
    """Why `MemberAdam` hands the fused kernel each member's own slices: the kernel's vectorized loop and
    its scalar loop for a tensor's last ``numel % 16`` elements round an update otherwise, so a [16, 1] bias
    (one vector) steps otherwise than each member's [1] (the scalar loop) on some steps; within 1 ulp-ish
    rounding of the update here."""
    torch.manual_seed(0)
    S, steps, differ = 16, 40, 0
    stacked = torch.randn(S, 1, requires_grad=True)
    alone = [stacked[k].detach().clone().requires_grad_() for k in range(S)]
    _step_together(torch.optim.Adam([stacked], lr=2e-3, eps=1e-5, fused=True), stacked, alone, steps)
    differ = sum(not torch.equal(stacked[k], alone[k]) for k in range(S))
    assert differ > 0
    assert max((stacked[k] - alone[k]).abs().item() for k in range(S)) < 1e-6

    from ppo_lightning.training.seed_group import MemberAdam

    stacked2 = torch.nn.Parameter(torch.randn(S, 1))
    alone2 = [torch.nn.Parameter(stacked2[k].detach().clone()) for k in range(S)]
    _step_together(MemberAdam([stacked2], [2e-3] * S, eps=1e-5), stacked2, alone2, steps)
    assert all(torch.equal(stacked2[k], alone2[k]) for k in range(S))


def test_members_with_their_own_centers_of_mass_move_as_their_single_runs_ewma():
    """`ewma_update_` with one beta per member (a lerp by a tensor of weights over the stacked tensors)
    moves member k's slices as its single run's update (a lerp by a number) does, bit for bit."""
    from ppo_lightning.algos.proximal import ewma_update_

    torch.manual_seed(0)
    S = 16
    for shape in [(1,), (2,), (7,), (64, 4)]:
        q, p = torch.randn(S, *shape), torch.randn(S, *shape)
        betas = [0.5 + 0.02 * k for k in range(S)]
        weights = [1.0 + 0.3 * k for k in range(S)]
        prox = q.clone()
        ewma_update_([prox], [p], betas, weights)
        for k in range(S):
            one = q[k].clone()
            ewma_update_([one], [p[k].clone()], betas[k], weights[k])
            assert torch.equal(prox[k], one), (shape, k)


def test_the_per_member_gradient_norm_is_torchs_for_the_single_run():
    """`SeedGroup.clip_grad_norm_`: each member's norm is torch's ``get_total_norm`` of its own gradients
    (one norm over every member's stacked gradients sums in another order for many small tensors)."""
    from ppo_lightning.training.seed_group import SeedGroup

    torch.manual_seed(0)
    S = 3
    params = [torch.nn.Parameter(torch.zeros(S, 3)) for _ in range(9)]
    differ = 0
    for _ in range(50):
        grads = [torch.randn(S, 3) for _ in params]
        one_pass = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g, dim=1) for g in grads]), dim=0)
        alone = [torch.nn.utils.get_total_norm([g[k].clone() for g in grads]) for k in range(S)]
        differ += any(not torch.equal(one_pass[k], alone[k]) for k in range(S))
    assert differ
    for p, g in zip(params, grads):
        p.grad = g
    group = SeedGroup.__new__(SeedGroup)
    group.members = S
    singles = [[torch.nn.Parameter(torch.zeros(3)) for _ in params] for _ in range(S)]
    for k in range(S):
        for q, p in zip(singles[k], params):
            q.grad = p.grad[k].clone()
    norms = group.clip_grad_norm_(params, 0.5)
    for k in range(S):
        assert torch.equal(norms[k], torch.nn.utils.clip_grad_norm_(singles[k], 0.5))
        assert all(torch.equal(p.grad[k], q.grad) for p, q in zip(params, singles[k]))


def test_minatars_batched_convolution_rounds_otherwise_than_the_single_runs():
    """Why a MinAtar member is its seed alone only to float tolerance: the group's CNN computes the 3x3
    convolution as a matmul over the input's windows (`ppo_lightning.nets.minatar_stacked`), the single
    run's ``nn.Conv2d`` calls oneDNN's convolution, which sums in another order. Its members agree across
    group sizes (each member's matmul on its own slices of a batched call), not with the seed alone."""
    torch.manual_seed(0)
    differ = 0
    for _ in range(10):  # a rollout's 4 SpaceInvaders frames (6 binary channels), 16 3x3 filters
        x, w, b = (torch.rand(4, 6, 10, 10) < 0.1).float(), torch.randn(16, 6, 3, 3) * 0.2, torch.randn(16)
        alone = F.conv2d(x, w, b)
        patches = F.unfold(x, 3).permute(1, 0, 2).reshape(54, 4 * 64)  # (C, kh, kw) x (B, H', W')
        as_matmul = torch.addmm(b.unsqueeze(1), w.reshape(16, 54), patches).view(16, 4, 8, 8).transpose(0, 1)
        differ += not torch.equal(alone, as_matmul)
        assert (alone - as_matmul).abs().max() < 1e-5
    assert differ
