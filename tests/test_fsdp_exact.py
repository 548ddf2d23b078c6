"""Two FSDP2 ranks, each with half of a batch, produce exactly the gradient of one process with all
of it: the loss normalisation by global counts plus summed (not averaged) rank gradients."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = r'''
import sys, torch, torch.distributed as dist
sys.path.insert(0, ROOT)
import train, tepo, policy
from transformers import AutoModelForCausalLM
dist.init_process_group("gloo")
rank, path = dist.get_rank(), sys.argv[1]
torch.set_num_threads(1)
g = torch.Generator().manual_seed(0)
seqs = []
for gid in range(4):                       # 4 prompts x 3 responses, ragged lengths
    prompt = torch.randint(2, 100, (4 + gid,), generator=g).tolist()
    for j in range(3):
        n = 2 + (gid * 3 + j) % 5
        resp = torch.randint(2, 100, (n,), generator=g).tolist()
        seqs.append(train.Sequence(gid, prompt, resp, float(torch.randn(1, generator=g)), True, torch.zeros(n)))
num_tokens, num_seqs = sum(len(s.resp) for s in seqs), len(seqs)
cfg = tepo.LossConfig.preset("dapo")

def forwards(model, my_seqs, share, fsdp):
    """(batch, logp) per micro-batch; lockstep_forwards is a collective: FSDP ranks only."""
    tcfg = train.Config(model="m", train_data="d", micro_batch_tokens=40, temperature=1.0,
                        activation_checkpointing=not share)
    if fsdp:
        for _, b, logp, _ in train.lockstep_forwards(model, my_seqs, tcfg, torch.device("cpu"), False, grad=True):
            yield b, logp
        return
    for mb in train.micro_batches(my_seqs, budget=40):
        b = train.collate(mb, torch.device("cpu"))
        yield b, tepo.response_logprobs(model, b, 1.0, False, share)[0]

def grads(model, my_seqs, share, fsdp):
    for b, logp in forwards(model, my_seqs, share, fsdp):
        old = logp.detach() - 0.05             # ratios != 1, some clipped
        loss, _ = tepo.policy_loss(logp, old, b["adv"], b["mask"], cfg, num_tokens=num_tokens, num_seqs=num_seqs)
        loss.backward()
    return {n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad)
            for n, p in model.named_parameters()}

fsdp = policy.load_policy(path, train.Config(model=path, train_data="x"), torch.device("cpu"))
mine = [s for s in seqs if s.gid % 2 == rank]   # rank 0 gets prompts 0, 2; rank 1 gets 1, 3
got = grads(fsdp, mine, share=True, fsdp=True)     # the plain reference below shares nothing
if rank == 0:
    plain = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    want = grads(plain, seqs, share=False, fsdp=False)
    for n in want:
        err = (got[n] - want[n]).abs().max().item()
        assert err < 1e-6 * max(1.0, want[n].abs().max().item()), (n, err)
    print("EXACT", flush=True)
dist.destroy_process_group()
'''


@pytest.mark.slow
def test_two_ranks_give_the_single_process_gradient(tiny_model_dir, tmp_path):
    script = tmp_path / "check.py"
    script.write_text(f"ROOT = {ROOT!r}\n" + SCRIPT)
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc_per_node=2", str(script), tiny_model_dir],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and "EXACT" in out.stdout, out.stdout[-2000:] + out.stderr[-4000:]
