"""The step diagnostics train.py adds for the loss study: the tail of the per-token |log pi/pi_old|
(max and 99.9th percentile over all ranks' trained tokens, without gathering every token) and
pass@k of the held-out evaluation, each against a direct computation written here."""
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def nearest_rank_p999(values):
    """The 99.9th percentile by nearest rank: the ceil(0.999 n)-th smallest, in exact integers
    (numpy's method="inverted_cdf" agrees except where 0.999 * n lands just above an integer in
    floating point, e.g. n = 1000)."""
    return sorted(values)[-(-999 * len(values) // 1000) - 1]


@pytest.mark.parametrize("n", [1, 2, 7, 999, 1000, 1001, 4321, 20000])
def test_the_largest_tail_size_values_hold_the_nearest_rank_quantile(n):
    values = np.random.default_rng(n).exponential(size=n)
    k = train.tail_size(n, 0.999)
    top = train.keep_largest(torch.zeros(0), torch.tensor(values), k)
    want = nearest_rank_p999(values)
    assert top[-1].item() == pytest.approx(want, rel=1e-6), (n, k)
    assert top[0].item() == pytest.approx(values.max(), rel=1e-6)


SCRIPT = r'''
import json, math, sys, torch, torch.distributed as dist
from types import SimpleNamespace
sys.path.insert(0, ROOT)
import ranks, rollout, train
dist.init_process_group("gloo")
rank = dist.get_rank()
out = {}
# The tail: uneven shares of 3001 values (0 on rank 1's first chunk), fed in chunks as the update does.
g = torch.Generator().manual_seed(0)
values = torch.randn(3001, generator=g).abs() ** 3
mine = values[:1900] if rank == 0 else values[1900:]
n = len(values)
top = torch.zeros(0)
for chunk in mine.split(257 if rank == 0 else 400):
    top = train.keep_largest(top, chunk, train.tail_size(n, 0.999))
out["tail"] = train.global_tail(top, n, 0.999)
# pass@k: problem i's n = 8 samples hold correct[i % 5] right answers. 300 problems: chunks of
# 128 (eval.py's default for n = 8), 0 and 2 sampled on rank 0, 1 on rank 1.
correct = [0, 1, 3, 8, 5]
class Engine:
    def generate(self, prompts, n=1, **kw):  # prompt ids: [problem index]
        return [[rollout.Sample(p, [2], f"p{p[0]}: " + ("\\boxed{7}" if j < correct[p[0] % 5] else "\\boxed{0}"),
                                [-1.0], "stop") for j in range(n)] for p in prompts]
rows = [{"problem": f"p{i}", "prompt": f"p{i}", "prompt_ids": [i], "answer": "7"} for i in range(300)]
cfg = SimpleNamespace(eval_n=8, max_new_tokens=4, temperature=1.0, top_p=1.0, seed=0, reward_timeout=0.2,
                      eval_data="held_out.jsonl")
grade = lambda text, answer: (text, text.endswith("\\boxed{" + answer + "}"))
run = SimpleNamespace(cfg=cfg, eval_rows=rows, rank=rank, world=2, engine=Engine(), judge=grade,
                      state=SimpleNamespace(step=0))
out["eval"] = train.evaluate(run)
# A grader that raises on problem 3's responses (8 right ones, rank 1) and hangs on the first of
# problem 134's (5 right ones, rank 0): those count as wrong, and the run goes on.
import time
seen = set()
def faulty(text, answer):
    if text.startswith("p3:"):
        raise ValueError("bad parse")
    if text.startswith("p134:") and "p134" not in seen:
        seen.add("p134")
        time.sleep(30)
    return grade(text, answer)
run.judge = faulty
out["faulty"] = train.evaluate(run)
# The batch at theta_old (old_policy_metrics): rank r holds 2 + r sequences of 3 + r tokens.
seqs = []
for i in range(2 + rank):
    old = -torch.rand(3 + rank, generator=g) * 2
    roll = old + 0.3 * torch.randn(3 + rank, generator=g)
    seqs.append(train.Sequence(0, [1], list(range(3 + rank)), i - 0.7 * rank, True, roll, old,
                               torch.rand(3 + rank, generator=g)))
rec = train.old_policy_metrics([seqs[:1], seqs[1:]])
out["batch"] = {k: rec[k] for k in ("mismatch/abs_mean", "mismatch/kl", "mismatch/ratio_max",
                                     "actor/entropy", "actor/cov_logp_adv")}
out["tokens"] = [[s.old_logp.tolist(), s.rollout_logp.tolist(), s.old_entropy.tolist(), [s.adv] * len(s.resp)]
                 for s in seqs]
gathered = [None, None]
dist.all_gather_object(gathered, out["tokens"])
out["tokens"] = [t for part in gathered for t in part]
if rank == 0:
    print("RESULT " + json.dumps(out))
ranks.end_distributed()  # not a bare destroy_process_group: gloo's threads may abort the exit
'''


@pytest.mark.slow
def test_log_ratio_tail_pass_at_k_and_mismatch_over_two_ranks(tmp_path):
    """Two gloo ranks: the tail from each rank's largest values equals the one over all values;
    pass@k equals 1 - C(n-c, k)/C(n, k) averaged over problems, whichever rank holds them; the
    sampler/trainer mismatch (mean |d|, k3 KL, max ratio), the entropy and Cov(log pi_old, A) are
    over both ranks' tokens."""
    script = tmp_path / "diag.py"
    script.write_text(f"ROOT = {ROOT!r}\n" + SCRIPT)
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc_per_node=2", str(script)], capture_output=True, text=True,
                         timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    import json
    res = json.loads(next(ln for ln in out.stdout.splitlines() if ln.startswith("RESULT "))[7:])
    values = (torch.randn(3001, generator=torch.Generator().manual_seed(0)).abs() ** 3).numpy()
    assert res["tail"][0] == pytest.approx(values.max(), rel=1e-6)
    assert res["tail"][1] == pytest.approx(nearest_rank_p999(values), rel=1e-6)
    old, roll, ent, adv = (np.concatenate([t[j] for t in res["tokens"]]) for j in range(4))
    d = old - roll                                   # log pi_old / pi_rollout per token
    assert len(d) == 2 * 3 + 3 * 4
    batch = res["batch"]
    assert batch["mismatch/abs_mean"] == pytest.approx(np.abs(d).mean(), rel=1e-6)
    assert batch["mismatch/kl"] == pytest.approx((np.exp(d) - d - 1).mean(), rel=1e-6)
    assert batch["mismatch/ratio_max"] == pytest.approx(np.exp(d).max(), rel=1e-6)
    assert batch["actor/entropy"] == pytest.approx(ent.mean(), rel=1e-6)
    cov = ((old - old.mean()) * (adv - adv.mean())).mean()     # Cov(log pi_old, A) over the tokens
    assert abs(cov) > 0.05 and batch["actor/cov_logp_adv"] == pytest.approx(cov, rel=1e-6)
    correct, n = [[0, 1, 3, 8, 5][i % 5] for i in range(300)], 8
    want = {k: np.mean([1 - math.comb(n - c, k) / math.comb(n, k) for c in correct]) for k in (1, 2, 4, 8)}
    assert set(res["eval"]) == {"eval/accuracy", "eval/accuracy_ci95", "eval/pass@1", "eval/pass@2",
                                "eval/pass@4", "eval/pass@8"}
    assert res["eval"]["eval/accuracy"] == pytest.approx(sum(correct) / (300 * n))
    # the 95% interval's half-width: Student's t over the 300 problems' accuracies (t_299 = 1.968)
    acc = np.array(correct) / n
    assert res["eval"]["eval/accuracy_ci95"] == pytest.approx(1.968 * acc.std(ddof=1) / math.sqrt(300), rel=1e-3)
    for k, v in want.items():
        assert res["eval"][f"eval/pass@{k}"] == pytest.approx(v), k
    # problem 3's 8 graded calls raised, problem 134's first response hung: 9 failures, all wrong
    faulty = list(correct)
    faulty[3], faulty[134] = 0, 4  # problem 3: its 8 right answers lost; 134: 1 of its 5 right ones
    assert res["faulty"]["eval/grader_failures"] == 9
    assert res["faulty"]["eval/accuracy"] == pytest.approx(sum(faulty) / (300 * n))
    assert res["faulty"]["eval/pass@8"] == pytest.approx(np.mean([c > 0 for c in faulty]))
    assert "eval/grader_failures" not in res["eval"]
    assert "held_out: 8 grading calls raised and 0 ran over the reward timeout (0.2s) on rank 1" in out.stdout
    assert "held_out: 0 grading calls raised and 1 ran over the reward timeout (0.2s) on rank 0" in out.stdout
    assert "ValueError: bad parse" in out.stdout and "took over reward_timeout=0.2s" in out.stdout
