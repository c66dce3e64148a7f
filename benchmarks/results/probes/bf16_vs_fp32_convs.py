import torch, torch.nn.functional as F, time
torch.set_num_threads(1)
for (c_in, c_out, hw, n) in ((16,16,32,64),(32,32,16,128),(16,32,32,64),(3,16,64,64)):
    x = torch.randn(n,c_in,hw,hw).contiguous(memory_format=torch.channels_last); w=torch.randn(c_out,c_in,3,3)
    xb, wb = x.bfloat16(), w.bfloat16()
    t={}
    with torch.no_grad():
        for r in range(8):
            for k,(a,b) in {"fp32":(x,w),"bf16":(xb,wb)}.items():
                s=time.process_time(); F.conv2d(a,b,padding=1); t.setdefault(k,[]).append(time.process_time()-s)
    fl = 2*c_in*c_out*9*hw*hw*n
    print(f"{c_in}->{c_out}@{hw}", {k: round(fl/min(v)/1e9,1) for k,v in t.items()}, "GFLOP/s")
