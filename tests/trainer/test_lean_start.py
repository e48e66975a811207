"""trainer/lean_start.py's optimizer part, in a fresh process (a test worker may have loaded dynamo
already): an eager AdamW builds, steps, zeroes and saves without importing dynamo, and moves its
weights and state bit for bit as torch's own wrappers do (the DeepSpeed parts:
test_trainer_ema.py, on a real engine)."""

import json
import subprocess
import sys

from conftest import REPO

SCRIPT = """
import json, sys
import torch
from aogpt.trainer import lean_start

torch_step = torch.optim.Adam.step  # torch's wrapper, before lean_start replaces it
lean_start._optimizers_load_dynamo_only_when_compiling()


def train(optimizer_class):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
    optimizer = optimizer_class(model.parameters(), lr=1e-2, weight_decay=0.1, fused=True)
    for step in range(3):
        optimizer.zero_grad()
        model(torch.randn(4, 8)).square().mean().backward()
        optimizer.step()
    optimizer.load_state_dict(optimizer.state_dict())
    state = optimizer.state_dict()["state"]
    return [p.tolist() for p in model.parameters()] + [
        s[key].tolist() for s in state.values() for key in ("exp_avg", "exp_avg_sq", "step")]


lean = train(torch.optim.AdamW)
loaded_by_lean = "torch._dynamo" in sys.modules


class AsTorchHasIt(torch.optim.AdamW):
    step = torch_step


import torch._dynamo  # from here on every wrapper goes through dynamo, as in a compiled run

print(json.dumps({"dynamo_loaded": loaded_by_lean, "same": lean == train(AsTorchHasIt)}))
"""


def test_an_eager_adamw_never_loads_dynamo_and_steps_as_torchs_own_wrappers_do():
    """torch wraps an optimizer's add_param_group, state_dict, load_state_dict, zero_grad and
    Adam's step so that a compiled region cannot trace into them, and every wrapper imports
    dynamo (~2.3 s of CPU) in every rank, compiled or not."""
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                            cwd=REPO, timeout=300)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == {"dynamo_loaded": False, "same": True}
