"""Invariants of a training step that a broken train.py (or eval.py) would violate.

The end-to-end runs go through tests/train_patched.py, which dumps every rollout the engine
returns (--dump-rollouts). From those samples the test recomputes the whole step with a
straightforward reference: one plain (non-FSDP) transformers model, every sequence run on its
own, tepo.policy_loss normalised by the counts of the WHOLE batch (all ranks), the global
gradient norm, clipping, and AdamW written out by hand. The trainer's logged loss and gradient
norm and its checkpointed weights must agree with it. This catches, among others:
  - the loss normalised by one rank's token count instead of the global one (2 ranks),
  - gradients clipped after the optimizer step instead of before (a tiny grad_clip, so the
    clipped and unclipped AdamW updates differ),
  - sequences with A = 0 skipped although GRPO's KL-to-reference term needs them,
  - every rank sampling with the same seed (two ranks, one prompt: different responses),
and eval.py's accuracy counting every one of the n samples, answered or not.
"""
import json
import math
import os
import subprocess
import sys

import pytest
import torch
import yaml
from safetensors.torch import load_file

import eval as ev
import reward
import rollout
import tepo
import train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ----------------------------------------------------------------------------- helpers

def launch(tmp_path, model_dir, name, patch, nproc=1, **overrides):
    """Run train.py (through train_patched.py, rollouts dumped) -> (Config, out_dir, dump_dir)."""
    data = tmp_path / f"{name}.jsonl"
    # One problem only: every prompt of a step is the same, on every rank.
    data.write_text(json.dumps({"problem": "What is 3 + 4?", "answer": "7"}) + "\n")
    cfg = dict(model=model_dir, train_data=str(data), out_dir=str(tmp_path / name), seed=0,
               prompt_template="{problem} \\boxed{}\n", max_prompt_len=64, max_new_tokens=16,
               backend="hf", num_minibatches=1, micro_batch_tokens=256, lr=1e-3,
               log_samples_every=0)
    cfg.update(overrides)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    dump = str(tmp_path / f"{name}_rollouts")
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone",
                 f"--nproc_per_node={nproc}"] if nproc > 1 else [sys.executable])
    cmd = launcher + [os.path.join(ROOT, "tests", "train_patched.py"), *patch,
                      "--dump-rollouts", dump, "--", "--config", str(path)]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, f"{' '.join(cmd)} failed:\n{out.stdout[-3000:]}\n{out.stderr[-5000:]}"
    return train.load_config(str(path)), cfg["out_dir"], dump


def rollouts(dump, rank):
    """The groups of each generate call of one rank: [[[sample dict] per prompt] per call]."""
    with open(os.path.join(dump, f"rank{rank}.jsonl")) as f:
        return [json.loads(line)["groups"] for line in f]


def metrics(out_dir):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def final_weights(out_dir):
    """The weights of the newest checkpoint (a step_XXXXXX transformers directory)."""
    steps = sorted(d for d in os.listdir(out_dir) if d.startswith("step_") and not d.endswith(".tmp"))
    assert steps, f"no checkpoint in {out_dir}: {os.listdir(out_dir)}"
    return load_file(os.path.join(out_dir, steps[-1], "model.safetensors"))


def reference(cfg, steps, reward_fn, grad_clip=None):
    """The RL steps recomputed plainly. `steps`: per step, the groups of the whole batch (all
    ranks); `reward_fn(step, text)`. One optimizer step per RL step (num_minibatches=1, so
    theta_old = theta). -> per step {"loss/policy", "loss/kl_ref", "actor/grad_norm", "weights"}."""
    from transformers import AutoModelForCausalLM
    assert cfg.num_minibatches == 1
    lcfg, T = cfg.loss_cfg, cfg.temperature
    grad_clip = cfg.grad_clip if grad_clip is None else grad_clip
    policy = AutoModelForCausalLM.from_pretrained(cfg.model, dtype=torch.float32).eval()
    ref = AutoModelForCausalLM.from_pretrained(cfg.model, dtype=torch.float32).eval() \
        if lcfg.needs_ref else None
    params = dict(policy.named_parameters())
    m1 = {k: torch.zeros_like(p) for k, p in params.items()}
    m2 = {k: torch.zeros_like(p) for k, p in params.items()}
    (b1, b2), eps, out = cfg.betas, 1e-8, []
    for t, groups in enumerate(steps, 1):
        seqs = []
        for g in groups:
            rewards = torch.tensor([reward_fn(t, s["text"]) for s in g])
            adv = tepo.group_advantages(rewards, len(g), lcfg.adv_std_norm)
            seqs += list(zip(g, adv.tolist()))
        num_tokens, num_seqs = sum(len(s["response_ids"]) for s, _ in seqs), len(seqs)
        policy.zero_grad(set_to_none=True)
        sums = {"loss/policy": 0.0, "loss/kl_ref": 0.0}
        for s, a in seqs:
            ids = torch.tensor([s["prompt_ids"] + s["response_ids"]])
            resp, p = torch.tensor([s["response_ids"]]), len(s["prompt_ids"])
            logp, ent = tepo.token_logprobs_entropy(policy(ids).logits[:, p - 1:-1], resp, T)
            ref_logp = None
            if ref is not None:
                with torch.no_grad():
                    ref_logp = tepo.token_logprobs_entropy(ref(ids).logits[:, p - 1:-1], resp, T,
                                                           False)[0]
            loss, m = tepo.policy_loss(logp, logp.detach(), torch.tensor([a]), torch.ones_like(logp),
                                       lcfg, num_tokens=num_tokens, num_seqs=num_seqs, entropy=ent,
                                       old_entropy=ent, ref_logp=ref_logp,
                                       rollout_logp=torch.tensor([s["logprobs"]]))
            loss.backward()
            for k in sums:
                sums[k] += float(m[k])
        grads = {k: p.grad if p.grad is not None else torch.zeros_like(p) for k, p in params.items()}
        norm = math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads.values()))
        coef = min(1.0, grad_clip / (norm + 1e-6))  # torch.nn.utils.clip_grad_norm_'s rule
        with torch.no_grad():  # AdamW (decoupled weight decay, bias-corrected moments)
            for k, p in params.items():
                g = grads[k] * coef
                m1[k].mul_(b1).add_(g, alpha=1 - b1)
                m2[k].mul_(b2).addcmul_(g, g, value=1 - b2)
                p.mul_(1 - cfg.lr * cfg.weight_decay)
                denom = (m2[k] / (1 - b2 ** t)).sqrt() + eps
                p.sub_(cfg.lr * (m1[k] / (1 - b1 ** t)) / denom)
        out.append({**sums, "actor/grad_norm": norm,
                    "weights": {k: p.detach().clone() for k, p in params.items()}})
    return out


def weight_error(got, want, tol):
    """(largest |difference|, fraction of the elements differing by more than `tol`) over the
    checkpoint's tensors (the tied lm_head is saved once). AdamW amplifies float noise in the
    rare elements whose gradient is ~0 (its update is g / (|g| + eps)), hence the fraction."""
    assert set(got) <= set(want), set(got) - set(want)
    diffs = [(got[k].double() - want[k].double()).abs().flatten() for k in got]
    d = torch.cat(diffs)
    return d.max().item(), (d > tol).double().mean().item()


def toy(step, text):
    return float("7" in text)  # train_patched.py --toy-reward


# ----------------------------------------------------------------------------- 2 ranks, TEPO

@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory, tiny_model_dir):
    """TEPO on 2 ranks, 2 steps of 4 prompts x 4 responses, one optimizer step each, a tiny
    grad_clip; and its plain single-process reference over both ranks' samples."""
    tmp = tmp_path_factory.mktemp("two_ranks")
    cfg, out, dump = launch(tmp, tiny_model_dir, "tepo2", ["--toy-reward"], nproc=2,
                            method="tepo", steps=2, prompts_per_step=4, group_size=4,
                            grad_clip=1e-5)
    per_rank = [rollouts(dump, r) for r in (0, 1)]
    assert [len(c) for c in per_rank] == [2, 2], "one generate call per rank and step"
    steps = [per_rank[0][t] + per_rank[1][t] for t in range(2)]
    return dict(cfg=cfg, out=out, per_rank=per_rank, steps=steps, metrics=metrics(out),
                ref=reference(cfg, steps, toy))


@pytest.mark.slow
def test_two_ranks_loss_and_grad_norm_equal_the_whole_batch_reference(two_ranks):
    """Each step's loss and gradient norm on 2 ranks == one process over both ranks' samples:
    the loss must be normalised by the global token count, rank gradients summed."""
    rows, ref = two_ranks["metrics"], two_ranks["ref"]
    assert [r["step"] for r in rows] == [1, 2] and all(r["actor/optimizer_steps"] == 1 for r in rows)
    assert all(r["actor/grad_norm"] > 0 for r in ref), "the toy reward should give each step a gradient"
    for t, (row, want) in enumerate(zip(rows, ref), 1):
        assert row["actor/grad_norm"] == pytest.approx(want["actor/grad_norm"], rel=1e-4), \
            f"step {t}: grad_norm {row['actor/grad_norm']} != reference {want['actor/grad_norm']}"
        assert row["loss/policy"] == pytest.approx(want["loss/policy"], rel=1e-4, abs=1e-7), \
            f"step {t}: loss/policy {row['loss/policy']} != reference {want['loss/policy']}"


@pytest.mark.slow
def test_two_ranks_weights_equal_adamw_on_the_clipped_gradient(two_ranks):
    """The checkpoint after 2 steps == AdamW by hand on the gradient clipped to grad_clip=1e-5
    BEFORE each step. At that size the clipped gradient is comparable to AdamW's eps, so
    clipping changes the update (checked: the unclipped reference is far off)."""
    got, cfg = final_weights(two_ranks["out"]), two_ranks["cfg"]
    want = two_ranks["ref"][-1]["weights"]
    assert all(r["actor/grad_norm"] > 100 * cfg.grad_clip for r in two_ranks["ref"])
    tol = 0.01 * cfg.lr  # 1% of the largest AdamW step
    unclipped = reference(cfg, two_ranks["steps"], toy, grad_clip=1e9)[-1]["weights"]
    gap = weight_error(unclipped, want, tol)
    assert gap[1] > 0.5, f"clipping should change most of the update (gap {gap})"
    err = weight_error(got, want, tol)
    assert err[0] < 10 * tol and err[1] < 1e-3, (
        f"weights vs AdamW on the clipped gradient: max error {err[0]:.3g}, {err[1]:.2%} of the "
        f"elements off by > {tol:g}; vs the unclipped update: {weight_error(got, unclipped, tol)}")


@pytest.mark.slow
def test_two_ranks_sequence_mean_equals_the_whole_batch_reference(tmp_path, tiny_model_dir):
    """GSPO on 2 ranks == one process over both ranks' samples: its sequence-mean aggregation (GRPO's
    and GSPO's) divides by the global count of sequences, not a rank's (TEPO's token mean, above,
    by the global count of tokens). A loss divided by one rank's count fails here."""
    cfg, out, dump = launch(tmp_path, tiny_model_dir, "gspo2", ["--toy-reward"], nproc=2, method="gspo",
                            steps=1, prompts_per_step=4, group_size=4)
    per_rank = [rollouts(dump, r) for r in (0, 1)]
    (row,), (want,) = metrics(out), reference(cfg, [per_rank[0][0] + per_rank[1][0]], toy)
    assert want["actor/grad_norm"] > 0, "the toy reward should give the step a gradient"
    assert row["actor/grad_norm"] == pytest.approx(want["actor/grad_norm"], rel=1e-4)
    assert row["loss/policy"] == pytest.approx(want["loss/policy"], rel=1e-4, abs=1e-7)


@pytest.mark.slow
def test_the_covariance_methods_select_over_both_ranks(tmp_path, tiny_model_dir):
    """KL-Cov with the 80/20 rule on 2 FSDP2 ranks, 2 mini-batches a step (so the second one's
    |log r| is not 0): the selection's extra forward (select_tokens, a lock-step collective) and
    both choices over both ranks' tokens (choose_cov's gathers, ranks.global_nth) run inside the
    update on every rank alike, and select tokens."""
    _, out, _ = launch(tmp_path, tiny_model_dir, "klcov2", ["--toy-reward"], nproc=2, method="klcov",
                       steps=2, prompts_per_step=4, group_size=4, num_minibatches=2,
                       loss={"top_entropy_frac": 0.3})
    rows = metrics(out)
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["actor/optimizer_steps"] == 2 and r["actor/cov_selected_frac"] > 0
        assert 0 < r["actor/high_entropy_frac"] < 0.4
        assert all(math.isfinite(v) for v in r.values() if isinstance(v, float))


@pytest.mark.slow
def test_two_ranks_sample_one_prompt_differently(two_ranks):
    """Both ranks get the same prompt (a one-problem data set): their responses must differ,
    which they do only if the sampling seed differs between ranks."""
    r0, r1 = two_ranks["per_rank"]
    for t in range(2):
        g0, g1 = r0[t][0], r1[t][0]
        assert g0[0]["prompt_ids"] == g1[0]["prompt_ids"]
        resp0, resp1 = [s["response_ids"] for s in g0], [s["response_ids"] for s in g1]
        assert len(set(map(tuple, resp0))) > 1, "the samples of one group should differ"
        assert resp0 != resp1, f"step {t + 1}: rank 0 and rank 1 sampled the same responses"


# ----------------------------------------------------------------------------- GRPO, A = 0

@pytest.mark.slow
def test_grpo_kl_term_trains_groups_with_equal_rewards(tmp_path, tiny_model_dir):
    """GRPO (kl_coef 0.04): step 1 has reward spread and moves the policy away from the
    reference; in step 2 every reward is 0 (A = 0 everywhere), yet the KL-to-reference term
    gives a gradient, so the step must train on all sequences: gradient norm, KL loss and
    final weights as in the plain reference."""
    P, G = 2, 8  # 2 groups of 8: reward spread in step 1 (about 1 seed in 35 would have none)
    cfg, out, dump = launch(tmp_path, tiny_model_dir, "grpo",
                            ["--toy-reward", "--flat-reward-after", str(P * G)],
                            method="grpo", steps=2, prompts_per_step=P, group_size=G)
    assert cfg.loss_cfg.kl_coef == 0.04
    steps = rollouts(dump, 0)
    ref = reference(cfg, steps, lambda t, text: toy(t, text) if t == 1 else 0.0)
    rows = metrics(out)
    assert any(len({toy(1, s["text"]) for s in g}) > 1 for g in steps[0]), \
        "step 1 needs a group with reward spread, to move the policy off the reference"
    assert rows[1]["reward/mean"] == 0.0
    assert ref[1]["actor/grad_norm"] > 0 and ref[1]["loss/kl_ref"] > 0 and ref[1]["loss/policy"] == 0
    for t, (row, want) in enumerate(zip(rows, ref), 1):
        for k in ("actor/grad_norm", "loss/kl_ref"):
            assert row.get(k, 0.0) == pytest.approx(want[k], rel=1e-4, abs=1e-9), \
                f"step {t}: {k} {row.get(k)} != reference {want[k]} (optimizer_steps " \
                f"{row['actor/optimizer_steps']})"
    tol = 0.01 * cfg.lr
    err = weight_error(final_weights(out), ref[-1]["weights"], tol)
    assert err[0] < 10 * tol and err[1] < 1e-3, (
        f"final weights vs the reference: max error {err[0]:.3g}, {err[1]:.2%} of the elements "
        f"off by > {tol:g}")


# ----------------------------------------------------------------------------- eval.py

class CannedEngine:
    """A rollout engine that answers every prompt with the same n canned texts."""

    def __init__(self, texts):
        self.texts = texts

    def generate(self, prompts, n=1, max_new_tokens=256, temperature=1.0, top_p=1.0, seed=None, seeds=None, progress=None):
        assert n == len(self.texts)
        return [[rollout.Sample(list(p), [5, 6], t, [-1.0, -1.0], "stop") for t in self.texts]
                for p in prompts]


def test_eval_accuracy_counts_all_n_samples(tmp_path, tiny_model_dir, monkeypatch):
    """accuracy = correct samples / (problems * n): a sample with no extractable answer counts as
    wrong, it is not left out of the denominator."""
    texts = ["so \\boxed{7}", "I do not know", "\\boxed{8}", "no idea at all"]
    bench = tmp_path / "bench.jsonl"
    golds = ["7", "8", "9"]  # per problem: 1, 1 and 0 of the 4 samples correct
    bench.write_text("".join(json.dumps({"problem": f"Problem {i}?", "answer": a}) + "\n"
                             for i, a in enumerate(golds)))
    monkeypatch.setattr(rollout, "make_engine", lambda *a, **kw: CannedEngine(texts))
    res = ev.main(["--ckpt", tiny_model_dir, "--data", str(bench), "-n", "4", "--k", "1,4",
                   "--temperature", "1.0", "--backend", "hf", "--out", str(tmp_path / "r.json")])
    m = res["benchmarks"]["bench"]
    answered = [reward.grade(t, "7")[0] is not None for t in texts]
    assert answered == [True, False, True, False]  # the canned texts do what they should
    assert m["accuracy"] == pytest.approx(2 / (3 * 4)), \
        f"accuracy {m['accuracy']}, expected 2 correct / (3 problems x 4 samples) = {2 / 12:.4f}"
    assert m["pass@1"] == pytest.approx(2 / 12) and m["pass@4"] == pytest.approx(2 / 3)
