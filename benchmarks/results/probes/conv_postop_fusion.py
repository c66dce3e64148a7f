import time, torch, torch.nn.functional as F
torch.set_num_threads(1); torch.manual_seed(0)
cap = torch.backends.cpu.get_cpu_capability()
x = torch.randn(64,16,32,32).contiguous(memory_format=torch.channels_last)
c0 = torch.nn.Conv2d(16,16,3,padding=1); c1 = torch.nn.Conv2d(16,16,3,padding=1)
for c in (c0, c1):
    c.bias.data.normal_()
pw = torch.ops.mkldnn._convolution_pointwise
def plain(x):
    h = c0(F.relu(x)); h = c1(F.relu(h, inplace=True)); return h.add_(x)
def fused(x):
    h = pw(F.relu(x), c0.weight, c0.bias, [1,1], [1,1], [1,1], 1, "relu", [], "")
    return torch.ops.mkldnn._convolution_pointwise.binary(h, x, c1.weight, c1.bias, [1,1], [1,1], [1,1], 1, "add", None, None, [], None)
def fused_noclone(x):
    h = pw(F.relu(x), c0.weight, c0.bias, [1,1], [1,1], [1,1], 1, "relu", [], "")
    return pw(h, c1.weight, c1.bias, [1,1], [1,1], [1,1], 1, "none", [], "").add_(x)
with torch.no_grad():
    a, b, c = plain(x), fused(x), fused_noclone(x)
    print(cap, "bit-equal fused:", torch.equal(a, b), (a-b).abs().max().item(), "fused relu only:", torch.equal(a, c))
    t = {"plain": [], "fused": [], "fused_relu_only": []}
    for r in range(15):
        for k, f in (("plain", plain), ("fused", fused), ("fused_relu_only", fused_noclone)):
            s = time.process_time(); f(x); f(x); t[k].append(time.process_time() - s)
    print({k: round(min(v)*500, 3) for k, v in t.items()}, "ms per block call")
