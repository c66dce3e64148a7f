"""Issue 21: the bf16 EWMA anchor's no-grad forward with oneDNN post-ops (the ops inductor emits), vs the
shipped path on oneDNN tensors. One thread, CPU clock, interleaved rounds, a bf16 copy of the IMPALA net
with perturbed weights, uint8 observations, chunks of 64 (as the model). Variants:
  onednn        the path before: oneDNN tensors, mkldnn_convolution, mkldnn_max_pool2d, relu_, add_
  onednn_relu   + conv0 and its ReLU as one op (_convolution_pointwise "relu"), on oneDNN tensors
  dense_fused   dense channels_last: conv0+ReLU fused, conv1 + residual add fused (the in-place
                _convolution_pointwise_.binary "add"; the binary op refuses oneDNN tensors), separable pool
  mixed2        stacks 1-2 as onednn, stack 3 as dense_fused (one to_dense + channels_last copy)
Prints each variant's max |difference| to the shipped path and to the fp32 network, and the times.
    python benchmarks/results/probes/onednn_fusion_bf16.py [samples] [rounds]
"""
import copy
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import ppo_lightning.nets.impala as impala

torch.set_num_threads(1)
torch.manual_seed(0)
net = impala.ImpalaActorCritic({"shape": [64, 64, 3], "dtype": "uint8"}, {"type": "discrete", "n": 15})
with torch.no_grad():
    for p in net.parameters():
        p.add_(torch.randn_like(p) * 0.05)
bnet = copy.deepcopy(net).to(torch.bfloat16)
N = int(sys.argv[1]) if len(sys.argv) > 1 else 512
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 9
obs = torch.randint(0, 256, (N, 64, 64, 3), dtype=torch.uint8)
P = torch.ops.mkldnn._convolution_pointwise
Bi = torch.ops.mkldnn._convolution_pointwise_.binary
PAD = [1, 1]


def conv_m(x, c):
    return torch.mkldnn_convolution(x, c.weight, c.bias, c.padding, c.stride, c.dilation, c.groups)


def prep(x):
    x = x.permute(0, 3, 1, 2).to(torch.bfloat16)
    return (x * (1.0 / 255.0)).contiguous(memory_format=torch.channels_last)


def tail(self, x):
    return F.relu(self.dense(torch.relu(x).flatten(1)), inplace=True)


def onednn_stack(stack, x, fuse):
    x = torch.mkldnn_max_pool2d(conv_m(x, stack.firstconv), [3, 3], [2, 2], [1, 1])
    for block in stack.blocks:
        c0 = block.conv0
        h = P(torch.relu(x), c0.weight, c0.bias, PAD, PAD, PAD, 1, "relu", [], "") if fuse \
            else conv_m(torch.relu(x), c0).relu_()
        x = conv_m(h, block.conv1).add_(x)
    return x


def dense_stack(stack, x):
    fc = stack.firstconv
    x = impala.max_pool_3x3_s2(F.conv2d(x, fc.weight, fc.bias, padding=1))
    for block in stack.blocks:
        c0, c1 = block.conv0, block.conv1
        h = P(torch.relu(x), c0.weight, c0.bias, PAD, PAD, PAD, 1, "relu", [], "")
        x = Bi(x, h, c1.weight, c1.bias, PAD, PAD, PAD, 1, "add", None, None, [], None)  # x += conv1(h)
    return x


def v_onednn(self, obs, fuse=False, dense_from=3):
    x = prep(obs).to_mkldnn()
    for i, stack in enumerate(self.stacks):
        if i < dense_from:
            x = onednn_stack(stack, x, fuse)
        else:
            if x.is_mkldnn:
                x = x.to_dense().contiguous(memory_format=torch.channels_last)
            x = dense_stack(stack, x)
    return tail(self, x.to_dense() if x.is_mkldnn else x)


def v_dense_fused(self, obs):
    x = prep(obs)
    for stack in self.stacks:
        x = dense_stack(stack, x)
    return tail(self, x)


variants = {"onednn": v_onednn, "onednn_relu": lambda s, o: v_onednn(s, o, fuse=True),
            "dense_fused": v_dense_fused, "mixed2": lambda s, o: v_onednn(s, o, dense_from=2)}


def run(fn):
    with torch.no_grad():
        return torch.cat([fn(bnet, c) for c in obs.split(64)]).float()


with torch.no_grad():
    exact = torch.cat([net.features(c) for c in obs.split(64)])
outs = {k: run(v) for k, v in variants.items()}
assert torch.equal(outs["onednn"], torch.cat([bnet.features(c) for c in obs.split(64)]).float())  # = the model
for k, o in outs.items():
    print(f"{k:12s} max |d| vs onednn {(o - outs['onednn']).abs().max().item():.4g}, vs the fp32 net "
          f"{(o - exact).abs().max().item():.4g} (mean {(o - exact).abs().mean().item():.3g})")
T = {k: [] for k in variants}
for r in range(rounds + 1):
    for k, v in list(variants.items())[:: 1 if r % 2 else -1]:  # the order reverses every round
        t = time.process_time()
        run(v)
        if r:
            T[k].append(time.process_time() - t)
for k, t in T.items():
    print(f"{k:12s} median {1e3 * statistics.median(t):7.1f} ms  min {1e3 * min(t):7.1f} ms  "
          f"(median ratio to onednn {statistics.median(a / b for a, b in zip(t, T['onednn'])):.3f})  "
          f"{N} samples, chunks of 64, CPU clock, 1 thread, {rounds} rounds")
