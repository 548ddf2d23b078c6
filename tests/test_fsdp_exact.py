"""Two FSDP2 ranks, each with half of a batch, produce exactly the gradient of one process with all
of it: the loss normalisation by global counts plus summed (not averaged) rank gradients. And when
one rank sampled everything, balance_ranks deals the sequences out evenly, the gradient unchanged.
The ranks take the update's log-probs from the hidden states through the head in chunks (lm_head
auto), the one process from the model's logits: the tied embedding's gradient, its head's part
read from the root's gathered weight, is reduce-scattered as the rest."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = r'''
import sys, torch, torch.distributed as dist
sys.path.insert(0, ROOT)
import train, tepo, policy, ranks, packing
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
        seqs.append(train.Sequence((0, gid), prompt, resp, float(torch.randn(1, generator=g)), True, torch.zeros(n)))
num_tokens, num_seqs = sum(len(s.resp) for s in seqs), len(seqs)
cfg = tepo.LossConfig.preset("dapo")

def forwards(model, my_seqs, share, fsdp, layout="packed"):
    """(batch, logp) per micro-batch; lockstep_forwards is a collective: FSDP ranks only. The plain
    reference is the layout of before (one prompt per micro-batch, padded), with no prompt shared."""
    tcfg = train.Config(model="m", train_data="d", micro_batch_tokens=40, temperature=1.0,
                        activation_checkpointing=not share, micro_batch_layout=layout)
    if fsdp:
        for _, b, logp, _ in packing.lockstep_forwards(model, my_seqs, cfg=tcfg, device=torch.device("cpu"),
                                                     with_entropy=False, grad=True):
            yield b, logp
        return
    for mb in packing.micro_batches(my_seqs, budget=40, layout="grouped"):
        b = packing.collate(mb, torch.device("cpu"), "grouped", rows=not share)
        yield b, tepo.response_logprobs(model, b, 1.0, False, "logits")[0]   # the model's logits

def grads(model, my_seqs, share, fsdp, layout="packed"):
    for b, logp in forwards(model, my_seqs, share, fsdp, layout):
        old = logp.detach() - 0.05             # ratios != 1, some clipped
        loss, _ = tepo.policy_loss(logp, old, b["adv"], b["mask"], cfg, num_tokens=num_tokens, num_seqs=num_seqs)
        loss.backward()
    return {n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad)
            for n, p in model.named_parameters()}

fsdp = policy.load_policy(path, train.Config(model=path, train_data="x"), torch.device("cpu"))
plain = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
want = grads(plain, seqs, share=False, fsdp=False)  # one process, every sequence: the reference

def check(got, what):
    for n in want:
        err = (got[n] - want[n]).abs().max().item()
        assert err < 1e-6 * max(1.0, want[n].abs().max().item()), (what, n, err)

mine = [s for s in seqs if s.gid[1] % 2 == rank]   # rank 0 gets prompts 0, 2; rank 1 gets 1, 3
for layout in ("grouped", "packed"):
    fsdp.zero_grad(set_to_none=True)
    check(grads(fsdp, mine, share=True, fsdp=True, layout=layout), f"halves, {layout}")
# All on rank 0, none on rank 1: balance_ranks deals them out (by groups: each prompt runs once),
# and the gradient stays.
fsdp.zero_grad(set_to_none=True)
(dealt,) = packing.balance_ranks([seqs if rank == 0 else []])
tokens = [None, None]
dist.all_gather_object(tokens, sum(len(s.resp) for s in dealt) + sum({s.gid: len(s.prompt) for s in dealt}.values()))
assert min(tokens) > 0 and max(tokens) / (sum(tokens) / 2) < 1.10, tokens
check(grads(fsdp, dealt, share=True, fsdp=True), "dealt")
if rank == 0:
    print("EXACT", flush=True)
ranks.end_distributed()  # not a bare destroy_process_group: gloo's threads may abort the exit
'''


@pytest.mark.slow
def test_two_ranks_give_the_single_process_gradient(tiny_model_dir, tmp_path):
    script = tmp_path / "check.py"
    script.write_text(f"ROOT = {ROOT!r}\n" + SCRIPT)
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc_per_node=2", str(script), tiny_model_dir],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and "EXACT" in out.stdout, out.stdout[-2000:] + out.stderr[-4000:]
