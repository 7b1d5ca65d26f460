"""ResNet-152 (or another bench/gpu/make_models.py model) gradients of one
step: eager against eager with cuDNN TF32 on and off, and eager against
torch.compile with TF32 on and off (the compile of the second reuses the
first's graph; the flag is read when the convolutions run). Prints JSON.

    python3 bench/anchors/gradcheck.py resnet152   # from the source root
"""
import copy
import json
import sys
import time

sys.path.insert(0, "bench/gpu")  # noqa: E402
import torch
import torch.nn.functional as F
from make_models import build, batch_of, SPECS
name = sys.argv[1] if len(sys.argv) > 1 else "resnet152"
dev = torch.device("cuda:0")
model = build(name).to(dev)
x, y = batch_of(name, SPECS[name]["batch"], dev)

def grads(m, fn):
    m.zero_grad(set_to_none=True)
    torch.manual_seed(0)
    out = fn(x)
    F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1)).backward()
    return {n: p.grad.detach().float().cpu() for n, p in m.named_parameters() if p.grad is not None}

def rel(a, b):
    scale = max(g.abs().max().item() for g in a.values())
    worst, where = 0.0, ""
    for n in a:
        d = (a[n] - b[n]).abs().max().item()
        if d > worst: worst, where = d, n
    norm = (sum(((a[n] - b[n]) ** 2).sum().item() for n in a) ** 0.5) / (sum((a[n] ** 2).sum().item() for n in a) ** 0.5)
    return {"max_abs_diff_rel_to_largest": worst / scale, "worst_param": where, "relative_l2": norm, "largest": scale}

res = {"model": name, "torch": torch.__version__, "card": torch.cuda.get_device_name(0)}
def setf(on):
    torch.backends.cudnn.allow_tf32 = on
    torch.backends.cuda.matmul.allow_tf32 = False
base = copy.deepcopy(model)  # weights and BN buffers as built, for every run
def fresh():
    m = copy.deepcopy(base); return m
setf(True);  e_on = grads(m1 := fresh(), m1)
setf(True);  e_on2 = grads(m1b := fresh(), m1b)
setf(False); e_off = grads(m2 := fresh(), m2)
setf(False); e_off2 = grads(m2b := fresh(), m2b)
res["eager_tf32_vs_eager_tf32_again"] = rel(e_on, e_on2)
res["eager_fp32_vs_eager_fp32_again"] = rel(e_off, e_off2)
res["eager_tf32_vs_eager_fp32"] = rel(e_off, e_on)
for on in (True, False):
    setf(on)
    m = fresh(); c = torch.compile(m)
    t = time.time(); g = grads(m, c); res[f"compile_s_tf32_{on}"] = round(time.time() - t, 1)
    res[f"compile_vs_eager_same_tf32_{on}"] = rel(e_on if on else e_off, g)
    res[f"compile_vs_eager_fp32_tf32_{on}"] = rel(e_off, g)
    print(json.dumps(res), flush=True)
