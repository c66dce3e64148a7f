import time, torch, torch.nn.functional as F
torch.set_num_threads(1); torch.manual_seed(0)
cap = torch.backends.cpu.get_cpu_capability()
N = 128
obs = torch.randint(0,256,(N,64,64,3),dtype=torch.uint8)
conv = torch.nn.Conv2d(3,16,3,padding=1); conv.bias.data.normal_()
def x_of(): return obs.permute(0,3,1,2).float() * (1/255)
def conv_path():
    return conv(x_of())
def im2col_path():
    x = obs.float() * (1/255)                 # [N,64,64,3] NHWC
    xp = F.pad(x, (0,0,1,1,1,1))              # [N,66,66,3]
    # patches [N,64,64,3,3,3] via unfold on H and W: (kh, kw, c) order
    p = xp.unfold(1,3,1).unfold(2,3,1)        # [N,64,64,3(c),3(kh),3(kw)]
    p = p.reshape(N*4096, 27)                 # copies
    w = conv.weight.reshape(16, 27)           # [o, c*kh*kw] matches (c,kh,kw)
    out = torch.addmm(conv.bias, p, w.t())    # [N*4096,16] = NHWC
    return out.view(N,64,64,16).permute(0,3,1,2)  # NCHW view, channels_last memory
a = conv_path(); b = im2col_path()
print(cap, "max abs diff", (a-b).abs().max().item(), "layout cl:", b.is_contiguous(memory_format=torch.channels_last))
def fb(f):
    def run():
        conv.zero_grad(); f().sum().backward()
    return run
t = {}
fs = {"conv_fwd": lambda: conv_path(), "im2col_fwd": lambda: im2col_path(), "conv_fb": fb(conv_path), "im2col_fb": fb(im2col_path)}
for r in range(6):
    for k, f in fs.items():
        if k.endswith("fwd"):
            with torch.no_grad():
                s = time.process_time(); f(); t.setdefault(k, []).append(time.process_time() - s)
        else:
            s = time.process_time(); f(); t.setdefault(k, []).append(time.process_time() - s)
print({k: round(min(v)*1000, 1) for k, v in t.items()}, "ms")
