import time, torch, torch.nn.functional as F
torch.set_num_threads(2); torch.manual_seed(0)
print(torch.backends.cpu.get_cpu_capability())
N=128
obs = torch.randint(0,256,(N,64,64,3),dtype=torch.uint8)
w = torch.randn(16,3,3,3); b = torch.zeros(16)
w8 = torch.zeros(16,8,3,3); w8[:, :3] = w
def a():  # current
    x = obs.permute(0,3,1,2).float()*(1/255); return F.conv2d(x, w, b, padding=1)
def p8():
    x = obs.permute(0,3,1,2).float()*(1/255)
    x8 = F.pad(x, (0,0,0,0,0,5))  # channel pad (NCHW logical) -> contiguous?
    x8 = x8.contiguous(memory_format=torch.channels_last)
    return F.conv2d(x8, w8, b, padding=1)
def nchw():
    x = (obs.permute(0,3,1,2).float()*(1/255)).contiguous(); return F.conv2d(x, w, b, padding=1)
def conv_only_cl():
    return F.conv2d(xcl, w, b, padding=1)
xcl = (obs.permute(0,3,1,2).float()*(1/255))
def second():  # a block conv 16->16 at 32x32 for reference
    return F.conv2d(x16, w16, None, padding=1)
x16 = torch.randn(N,16,32,32).contiguous(memory_format=torch.channels_last); w16=torch.randn(16,16,3,3)
fl = {"a":2*3*16*9*4096*N, "p8":2*3*16*9*4096*N, "nchw":2*3*16*9*4096*N, "conv_only_cl":2*3*16*9*4096*N, "second":2*16*16*9*1024*N}
fs = dict(a=a,p8=p8,nchw=nchw,conv_only_cl=conv_only_cl,second=second)
t = {k: [] for k in fs}
with torch.no_grad():
    print("p8 equal to a:", torch.equal(a(), p8()), (a()-p8()).abs().max().item())
    for r in range(8):
        for k,f in fs.items():
            s=time.perf_counter(); f(); f(); t[k].append((time.perf_counter()-s)/2)
for k,v in t.items():
    print(k, round(min(v)*1000,2), "ms", round(fl[k]/min(v)/1e9,1), "GFLOP/s")
