"""A training script written for CUDA only: it fails under plain `python` without CUDA.

Used by tests/tools/test_cli.py through `torchneuron run` and `torchneuron verify`.
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=5)
parser.add_argument("--amp", action="store_true")
args = parser.parse_args()

assert torch.cuda.is_available(), "this script needs CUDA"
torch.backends.cudnn.benchmark = True
device = torch.device("cuda")
torch.manual_seed(0)
torch.cuda.manual_seed(0)
print("running on", torch.cuda.get_device_name(0), "devices:", torch.cuda.device_count())

model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)).cuda()
x = torch.randn(64, 16).to(device)
y = (x[:, :1] * 2 - x[:, 1:2]).to("cuda:0")
assert x.is_cuda and next(model.parameters()).is_cuda
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
scaler = torch.cuda.amp.GradScaler(enabled=args.amp)
noise = torch.zeros(64, 1, device="cuda")
for step in range(args.steps):
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.amp):
        loss = F.mse_loss(model(x) + noise, y)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    torch.cuda.synchronize()
    print(f"step {step} loss: {loss.item():.6f}")
print("peak memory", torch.cuda.max_memory_allocated(), "allocated", torch.cuda.memory_allocated())
torch.cuda.empty_cache()
