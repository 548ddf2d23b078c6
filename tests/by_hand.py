"""Every metric of an RL step computed by hand, from what the step's phases were given, for
tests/test_metrics_by_hand.py and tests/test_boundaries.py.

`run_steps(tmp, model_dir, reward_fn, lengths=..., eval_rows=..., **config)` runs train.main in
this process on one rank (transformers' generate, as conftest.train_here; no checkpoint is saved)
while recording, per RL step, what each phase was given and returned: the engine's weights as it
sampled, the rollouts (every group drawn), the mini-batches as dealt, each micro-batch of the
update with the log-probs and entropy its forward computed, each optimizer step (with the
gradient's norm taken by hand before the clip), every lock-step forward call, and the held-out
samples. `lengths` cuts the responses to a ragged batch.

The references below are plain code written from docs/METRICS.md and tepo.py's docstring, not
from the functions they check: a sequence at a time, in float64, each sum divided by counts
taken from the recorded mini-batches; the log-probs at theta_old from a plain transformers
forward; a held-out answer graded by reward.grade (the grader is not what they check). `expected_record` gives every key of a metrics.jsonl
record but the timings (wall clock), so a test that compares it with the record key for key
also sees a metric added without a reference, or one left out.
"""
import json
import math
import os
import time
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch
import yaml

import reward
import train
from conftest import free_port
from policy import full_tensor

TIMING = ("timing/rollout", "timing/reward", "timing/old_logprobs", "timing/update", "timing/sync",
          "timing/step", "timing/rollout_tokens_per_s")


class Scripted:
    """A reward of one's own whose k-th call (over the run) returns script[k] (cycled): a number,
    "raise" (the call raises) or "stall" (it sleeps past any reward_timeout). `given` keeps what
    each call was scripted to do, in call order: the grading order is the order of the groups
    drawn and of their samples."""

    def __init__(self, script):
        self.script, self.given = list(script), []

    def __call__(self, response, gold, **kw):
        what = self.script[len(self.given) % len(self.script)]
        self.given.append(what)
        if what == "raise":
            raise ValueError("a scripted failure")
        if what == "stall":
            time.sleep(30)  # the reward_timeout's alarm interrupts it
        return float(what)


@dataclass
class StepRecord:
    """What one RL step's phases were given and returned."""
    rollouts: object = None                         # train.Rollouts
    weights: dict = None                            # theta_old: the engine's weights as it sampled
    minibatches: list = None                        # [[Sequence]], as old_logprobs got them
    micro: list = field(default_factory=list)       # per update micro-batch: mb, logp, entropy, ...
    opt: list = field(default_factory=list)         # per optimizer step: norm (by hand), taken, lr
    forwards: list = field(default_factory=list)    # (phase, grad, [[Sequence] per micro-batch])


@dataclass
class Result:
    cfg: object          # train.Config
    records: list        # metrics.jsonl
    steps: list          # [StepRecord]
    given: list          # Scripted.given
    out_dir: str
    evals: list          # per held-out evaluation: {"step", "rows", "outputs": n Samples a problem}
    eval_file: list      # the held-out file's rows, or None


def toy_rows(n=40):
    return [{"problem": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(n)]


def recorded(engine, lengths, evals):
    """The engine, its held-out samples recorded (evals[-1]["outputs"]) and its training draws cut
    to lengths[j] tokens for the j-th response of each prompt (where it is longer), as responses
    that stopped there: the tiny random model never stops before max_new_tokens, and a batch of
    one length hides every rule about padding."""
    generate = engine.generate

    def cut(prompts, n=1, **kw):
        out = generate(prompts, n=n, **kw)
        if kw.get("seeds") is not None:  # a held-out evaluation's
            evals[-1]["outputs"] += out
        elif lengths:
            for group in out:
                for j, s in enumerate(group):
                    if lengths[j % len(lengths)] < len(s.response_ids):
                        L = lengths[j % len(lengths)]
                        s.response_ids, s.logprobs = s.response_ids[:L], s.logprobs[:L]
                        s.finish_reason = "stop"
                        s.text = engine.tokenizer.decode(s.response_ids, skip_special_tokens=True)
        return out
    engine.generate = cut
    return engine


def run_steps(tmp, model_dir, reward_fn, lengths=None, eval_rows=None, **config):
    """train.main on one rank in this process, its phases recorded; the responses cut to `lengths`
    (ragged); `eval_rows` the held-out data. -> Result"""
    import torch.distributed as dist

    import rollout
    data = os.path.join(tmp, "toy.jsonl")
    with open(data, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in toy_rows())
    cfg = dict(model=model_dir, train_data=data, out_dir=os.path.join(tmp, "out"), seed=0,
               prompt_template="{problem} \\boxed{}\n", steps=1, prompts_per_step=2, group_size=4,
               max_prompt_len=64, max_new_tokens=12, num_minibatches=2, micro_batch_tokens=256,
               lr=1e-2, log_samples_every=0, backend="hf")
    if eval_rows:
        cfg["eval_data"] = os.path.join(tmp, "held_out.jsonl")
        with open(cfg["eval_data"], "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in eval_rows)
    cfg.update(config)
    path = os.path.join(tmp, "config.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f)
    steps, phase, current, evals = [], ["-"], [None], []
    real = {name: getattr(train, name) for name in ("sample_and_grade", "old_logprobs", "update_policy",
                                                     "lockstep_forwards", "micro_batch_loss", "clip_and_step",
                                                     "evaluate")}

    def evaluate(run):
        evals.append(dict(step=run.state.step, rows=[dict(r) for r in run.eval_rows], outputs=[]))
        return real["evaluate"](run)

    def sample_and_grade(run, *, step):
        weights = {k: v.detach().clone() for k, v in run.engine.model.state_dict().items()}
        out = real["sample_and_grade"](run, step=step)
        steps.append(StepRecord(rollouts=out, weights=weights))
        return out

    def old_logprobs(run, *, minibatches):
        steps[-1].minibatches, phase[0] = minibatches, "old"
        return real["old_logprobs"](run, minibatches=minibatches)

    def update_policy(run, *, minibatches, step):
        phase[0] = "update"
        try:
            return real["update_policy"](run, minibatches=minibatches, step=step)
        finally:
            phase[0] = "-"

    def lockstep_forwards(model, seqs, **kw):
        plan = []
        steps[-1].forwards.append((phase[0], kw.get("grad", False), plan))
        for item in real["lockstep_forwards"](model, seqs, **kw):
            plan.append(list(item[0]))
            current[0] = list(item[0])
            yield item

    def micro_batch_loss(cfg, batch, logp, entropy, *, counts, keys):
        out = real["micro_batch_loss"](cfg, batch, logp, entropy, counts=counts, keys=keys)
        st = steps[-1]
        st.micro.append(dict(mb=current[0], logp=logp.detach().clone(), entropy=entropy.detach().clone(),
                             cov_sel=batch["cov_sel"].clone() if "cov_sel" in batch else None,
                             entropy_sel=batch["entropy_sel"].clone() if "entropy_sel" in batch else None,
                             after_taken=any(o["taken"] for o in st.opt)))
        return out

    def clip_and_step(run, loss_sum):
        norm = math.sqrt(sum(float((full_tensor(p.grad).double() ** 2).sum())
                             for p in run.model.parameters() if p.grad is not None))
        out = real["clip_and_step"](run, loss_sum)
        steps[-1].opt.append(dict(norm=norm, taken=out.taken, lr=run.optimizer.param_groups[0]["lr"]))
        return out

    with pytest.MonkeyPatch.context() as m:
        m.setattr(reward, "math_reward", reward_fn)
        make = rollout.make_engine
        m.setattr(rollout, "make_engine", lambda *a, **kw: recorded(make(*a, **kw), lengths, evals))
        for name, fn in dict(sample_and_grade=sample_and_grade, old_logprobs=old_logprobs,
                             update_policy=update_policy, lockstep_forwards=lockstep_forwards,
                             micro_batch_loss=micro_batch_loss, clip_and_step=clip_and_step,
                             evaluate=evaluate).items():
            m.setattr(train, name, fn)
        m.setattr(train, "save_or_stop", lambda run, *, step: None)  # no checkpoint: not what is read here
        for key, value in dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                               MASTER_PORT=str(free_port())).items():
            m.setenv(key, value)
        assert not dist.is_initialized()
        try:
            train.main(["--config", path])
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
    with open(os.path.join(cfg["out_dir"], "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    return Result(train.load_config(path), records, steps, getattr(reward_fn, "given", []), cfg["out_dir"],
                  evals, eval_rows)


# ----------------------------------------------------------------------------- the references


def k3(logp, target):
    """KL(pi || target) by k3, from tokens sampled from pi: e^d - d - 1, d = target - logp clamped
    to +-20 (tepo.kl_estimate's rule: one wild token cannot overflow exp)."""
    return kl_of_kind(logp, target, "k3")


def kl_of_kind(logp, target, kind):
    d = (target - logp).clamp(-20, 20)
    return {"k1": -d, "k2": 0.5 * d ** 2, "k3": torch.exp(d) - d - 1}[kind]


def k3_weight(logp, target):
    """|d k3 / d log pi| per token: |1 - e^d| where |d| <= 20, 0 past the clamp (constant there)."""
    d = target - logp
    return torch.where(d.abs() <= 20, (1 - torch.exp(d)).abs(), 0.0)


def shaped_by_hand(cfg, raw, n_tokens):
    """(reward, correct) of a scripted reward `raw` ("raise"/"stall": a failed call) for a response
    of n_tokens, as docs/CONFIG.md and train.shaped_reward's docstring say: a failure scores
    failed_reward; a reward below 1 is wrong and gets wrong_reward; then DAPO's overlong penalty,
    0 up to max_new_tokens - B tokens, falling linearly to -overlong_factor at max_new_tokens."""
    r = cfg.failed_reward if raw in ("raise", "stall") else float(raw)
    correct = r >= 1.0
    if not correct:
        r += cfg.wrong_reward
    B = cfg.overlong_buffer
    if B > 0:
        over = n_tokens - (cfg.max_new_tokens - B)
        r += -cfg.overlong_factor * over / B if over > 0 else 0.0
    return r, correct


def rollout_by_hand(cfg, drawn, given, world=1):
    """reward/, response/, rollout/ metrics of one RL step on one rank, from the groups drawn (in
    order) and the scripted rewards of their samples (`given`, in the same order). Dynamic
    sampling by its rule: draws of P prompts until P informative groups are held (neither all
    right nor all wrong) or max_sampling_tries; the first P informative ones are kept.
    -> (metrics, the groups kept)"""
    samples = [s for g in drawn for s in g.samples]
    assert len(given) == len(samples), "every sample drawn was graded once"
    graded, i = [], 0
    for g in drawn:
        graded.append([shaped_by_hand(cfg, given[i + j], len(s.response_ids)) for j, s in enumerate(g.samples)])
        i += len(g.samples)
    P = cfg.prompts_per_step
    if cfg.dynamic_sampling:
        informative, draws = [], 0
        while draws < cfg.max_sampling_tries:
            batch = list(range(draws * P, (draws + 1) * P))
            draws += 1
            informative += [k for k in batch if 0 < sum(c for _, c in graded[k]) < cfg.group_size]
            if len(informative) >= P:
                informative = informative[:P]
                break
        kept = informative
    else:
        draws, kept = 1, list(range(P))
    lens = [len(s.response_ids) for s in samples]
    rewards = [r for g in graded for r, _ in g]
    failures = [x for x in given if x in ("raise", "stall")]
    out = {"reward/mean": sum(rewards) / len(rewards),
           "reward/accuracy": sum(c for g in graded for _, c in g) / len(rewards),
           "response/length_mean": sum(lens) / len(lens), "response/length_max": max(lens),
           "response/truncated_frac": sum(s.finish_reason == "length" for s in samples) / len(samples),
           "rollout/samples_drawn": draws * P * cfg.group_size,
           "rollout/groups_spread": sum(len({r for r, _ in graded[k]}) > 1 for k in kept),
           "rollout/entropy_sampled": -sum(sum(s.logprobs) for s in samples) / sum(lens),
           "reward/errors": failures.count("raise"), "reward/timeouts": failures.count("stall")}
    if cfg.dynamic_sampling:
        out["reward/groups_kept"] = len(kept) / (draws * P)
    return out, [drawn[k] for k in kept]


_PLAIN = {}


def plain_model(model_dir, weights):
    """The model of model_dir (transformers, float32) with `weights` (a state dict)."""
    from transformers import AutoModelForCausalLM
    if model_dir not in _PLAIN:
        _PLAIN[model_dir] = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    _PLAIN[model_dir].load_state_dict(weights)
    return _PLAIN[model_dir]


def plain_logprobs(model, seqs, temperature):
    """[(log pi (R,), entropy (R,))] of each sequence's response tokens under `model`, by a plain
    transformers forward of prompt + response (no packing, no FSDP, no chunks), float64. One call,
    the rows right-padded: a causal model's positions never see the padding after them."""
    rows = [list(s.prompt) + list(s.resp) for s in seqs]
    T = max(map(len, rows))
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([r + [0] * (T - len(r)) for r in rows])).logits.double()
    out = []
    for b, s in enumerate(seqs):
        p, R = len(s.prompt), len(s.resp)
        logp = (logits[b, p - 1:p - 1 + R] / temperature).log_softmax(-1)
        out.append((logp.gather(1, torch.tensor(s.resp)[:, None])[:, 0], -(logp.exp() * logp).sum(-1)))
    return out


def old_policy_by_hand(cfg, minibatches, model):
    """actor/entropy, actor/cov_logp_adv and mismatch/ at theta_old, over every response of the
    batch (full_batch_metrics) or those in the loss, from the trainer's old log-probs and entropy
    (checked against plain forwards of `model`, theta_old) and the sampler's log-probs."""
    seqs = [s for mb in minibatches for s in mb if s.in_loss or cfg.full_batch_metrics]
    lp, H, A, roll = [], [], [], []
    for s, (logp, ent) in zip(seqs, plain_logprobs(model, seqs, cfg.temperature)):
        assert s.old_logp is not None
        assert torch.allclose(s.old_logp.double(), logp, atol=2e-5), "old log-probs: theta_old's"
        assert torch.allclose(s.old_entropy.double(), ent, atol=2e-5), "old entropy: theta_old's"
        lp.append(s.old_logp.double())  # the same (above), to the trainer's rounding
        H.append(s.old_entropy.double())
        A.append(torch.full((len(s.resp),), float(s.adv), dtype=torch.float64))
        roll.append(s.rollout_logp.double())
    lp, H, A, roll = map(torch.cat, (lp, H, A, roll))
    return {"actor/entropy": H.mean().item(),
            "actor/cov_logp_adv": ((lp - lp.mean()) * (A - A.mean())).mean().item(),
            "mismatch/abs_mean": (roll - lp).abs().mean().item(),
            "mismatch/kl": k3(roll, lp).mean().item(),
            "mismatch/ratio_max": math.exp((lp - roll).max().item())}


def lr_by_hand(cfg, step):
    """The learning rate of RL step `step` (from 0): linear warm-up over warmup_steps ((s+1)/W of
    lr), then lr, or the cosine from lr down to min_lr_ratio * lr over the steps after it."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if cfg.lr_schedule == "constant":
        return cfg.lr
    t = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * (1 + math.cos(math.pi * t)) / 2)


def cov_by_hand(lc, items):
    """Clip-Cov / KL-Cov's selection over `items` [(current logp (R,), old logp (R,), A)] (one
    selection batch), by its definition (tepo.py): cov = (A - mean A)(logp - mean logp) over the
    batch's tokens, n = max(1, floor(cov_ratio * tokens)); KL-Cov takes the n largest cov; Clip-Cov
    n at random among the tokens with cov_lb < cov < cov_ub that the clip left alone.
    -> (the tokens' eligibility, as one flat bool tensor, n, the cov values)"""
    lp = torch.cat([x for x, _, _ in items])
    old = torch.cat([o for _, o, _ in items])
    A = torch.cat([torch.full((len(x),), a, dtype=torch.float64) for x, _, a in items])
    cov = (A - A.mean()) * (lp - lp.mean())
    n = max(1, int(lc.cov_ratio * len(lp)))
    if lc.cov == "kl":
        return torch.ones_like(cov, dtype=torch.bool), n, cov
    r = torch.exp(lp - old)
    clipped = ((r > 1 + lc.clip_high) & (A > 0)) | ((r < 1 - lc.clip_low) & (A < 0))
    return ~clipped & (cov > lc.cov_lb) & (cov < lc.cov_ub), n, cov


def newer_by_hand(lc, lp, log_r, A):
    """GMPO, CISPO and SAPO on one response's tokens, as ../shared/NEWER_BASELINES.md writes them:
    (the per-token loss (R,), d loss / d log pi_t (R,), the tokens clipped low and high (R,) bool).
    CISPO: -sg(clip(r, 1 - eps_low, 1 + eps_high)) A log pi, each token; clipped where the weight
    is. SAPO: -(4 / tau) sigmoid(tau (r - 1)) A, tau by the sign of A; no clip. GMPO: each token's
    log-ratio clipped on the side A favours (above eps_high with A > 0, below -eps_low with A < 0:
    no gradient there), rho = exp(their mean), -A rho on every token of the response."""
    r = torch.exp(log_r.clamp(-20, 20))
    none = torch.zeros(len(lp), dtype=torch.bool)
    if lc.surrogate == "cispo":
        w = r.clamp(1 - lc.clip_low, 1 + lc.clip_high)
        return -w * A * lp, -w * A, r < 1 - lc.clip_low, r > 1 + lc.clip_high
    if lc.surrogate == "sapo":
        tau = lc.sapo_tau_pos if A > 0 else lc.sapo_tau_neg
        g = torch.sigmoid(tau * (r - 1))
        return -(4 / tau) * g * A, -4 * g * (1 - g) * r * A, none, none
    assert lc.surrogate == "gmpo"
    low = (log_r < -lc.clip_low) & (A < 0) if A < 0 else none
    high = (log_r > lc.clip_high) & (A > 0) if A > 0 else none
    d = torch.where(low, -lc.clip_low, torch.where(high, lc.clip_high, log_r))
    rho = torch.exp(d.mean())
    return (-A * rho).expand(len(lp)), torch.where(low | high, 0.0, -A * rho), low, high


def top_entropy_by_hand(frac, H):
    """The 80/20 rule's tokens among the entropies H (N,) of a mini-batch's tokens of responses with
    A != 0: those at or above H's (1 - frac)-quantile, linearly interpolated (Wang et al.'s, TRL's
    torch.quantile). -> (N,) bool"""
    return H >= torch.quantile(H, 1 - frac)


def update_by_hand(cfg, st, step, skipped_before=0, grad_w_over_measured=True, check_selection=True):
    """The update's metrics (actor/, loss/, mismatch/is_weight and /masked_frac, actor/trained_tokens,
    the log-ratio tail, optimizer steps, grad norm, lr) of one RL step, from the mini-batches and
    each micro-batch's forward. Per optimizer step: each loss term aggregated as its method says
    (token-mean over the mini-batch's response tokens, seq-mean-token-mean over its responses,
    seq-mean-token-sum-norm over responses x L_max), the KL mask's term over its tokens; each
    metric a mean over the mini-batch's trained tokens; then the mean over the optimizer steps
    (ratio_min / _max: the extremes over them all). grad_w: each term's sum over tokens of
    |d term / d log pi_t|, where the mask can act (kl_mask_target old: after the step's first
    optimizer step taken), divided by the steps where it was measured (`grad_w_over_measured`)
    or by all of them. Clip-Cov / KL-Cov: the selection is checked against its definition
    (`check_selection`)."""
    lc = cfg.loss_cfg
    mbs = st.minibatches
    k_of = {id(s): k for k, mb in enumerate(mbs) for s in mb}
    tokens = [sum(len(s.resp) for s in mb) for mb in mbs]
    n_seqs = [len(mb) for mb in mbs]
    trained = [sum(len(s.resp) for s in mb if s.in_loss) for mb in mbs]
    n_steps = sum(t > 0 for t in trained)
    assert len(st.opt) == n_steps, "one optimizer step per mini-batch with trained tokens"
    lo, hi = 1 - lc.clip_low, 1 + lc.clip_high
    sums, measured, ratios, abs_log_r = {}, set(), [], []
    by_step = {}  # k -> [(seq, logp, H, sel)] to check the covariance selection over the mini-batch
    top = {}  # id(seq) -> (R,) bool: the 80/20 rule's tokens, chosen over each mini-batch by hand
    if lc.top_entropy_frac > 0:
        for k in range(len(mbs)):
            scored = [(s, m["entropy"][b, :len(s.resp)].double()) for m in st.micro if k_of[id(m["mb"][0])] == k
                      for b, s in enumerate(m["mb"]) if s.adv != 0]
            if scored:
                keep = top_entropy_by_hand(lc.top_entropy_frac, torch.cat([H for _, H in scored]))
                top.update((id(s), x) for (s, _), x in zip(scored, keep.split([len(H) for _, H in scored])))

    def add(key, value):
        sums[key] = sums.get(key, 0.0) + float(value)
    for m in st.micro:
        k = k_of[id(m["mb"][0])]
        assert all(k_of[id(s)] == k and s.in_loss for s in m["mb"])
        for b, s in enumerate(m["mb"]):
            R = len(s.resp)
            lp, H = m["logp"][b, :R].double(), m["entropy"][b, :R].double()
            old, H_old = s.old_logp.double(), s.old_entropy.double()
            sel = (m["cov_sel"][b, :R] if m["cov_sel"] is not None else
                   s.cov_sel if s.cov_sel is not None else torch.zeros(R, dtype=torch.bool)).bool()
            by_step.setdefault(k, []).append((s, lp, H, sel))
            A = float(s.adv)
            log_r = lp - old
            abs_log_r.append(log_r.abs())
            if lc.ratio == "token":
                ratio, clamped = torch.exp(log_r.clamp(-20, 20)), log_r.abs() > 20
            else:  # the sequence's geometric mean ratio on each of its tokens
                mean = log_r.mean()
                ratio, clamped = torch.exp(mean.clamp(-20, 20)).expand(R), (mean.abs() > 20).expand(R)
            ratios.append(ratio)
            pessimistic = ((ratio > hi) & (A > 0)) | ((ratio < lo) & (A < 0))
            low, high = (ratio < lo) & (A < 0), (ratio > hi) & (A > 0)
            if lc.surrogate != "clip":
                loss, dloss, low, high = newer_by_hand(lc, lp, log_r, A)
            elif lc.cov == "kl":  # no clip; |log r| on the selected tokens
                loss = -ratio * A + lc.kl_cov_coef * log_r.abs() * sel
                dloss, low, high = None, torch.zeros_like(low), torch.zeros_like(high)
            else:
                loss = -torch.where(pessimistic, ratio.clamp(lo, hi), ratio) * A
                dloss = torch.where(pessimistic, 0.0, -ratio * A)  # d loss / d log pi_t
                if lc.cov == "clip":
                    loss, dloss = torch.where(sel, 0.0, loss), torch.where(sel, 0.0, dloss)
            w = torch.ones(R, dtype=torch.float64)
            if lc.is_correction != "none":
                log_w = s.old_logp.double() - s.rollout_logp.double()
                if lc.is_level == "sequence":
                    log_w = log_w.sum().expand(R)
                c = math.log(lc.is_cap)
                w = (torch.exp(log_w.clamp(max=c)) if lc.is_correction == "tis"
                     else torch.where(log_w.abs() <= c, torch.exp(log_w), 0.0))
            kept = torch.ones(R, dtype=torch.bool)
            if lc.top_entropy_frac > 0:  # the policy term on the 80/20 rule's tokens alone
                kept = top.get(id(s), torch.zeros(R, dtype=torch.bool))
                chosen = m["entropy_sel"][b, :R].bool()
                assert torch.equal(chosen, kept), "the 80/20 rule's tokens: the quantile's over the mini-batch"
                loss = torch.where(kept, loss, 0.0)
                dloss = None if dloss is None else torch.where(kept, dloss, 0.0)
            per = {"token-mean": 1 / tokens[k], "seq-mean-token-mean": 1 / (R * n_seqs[k]),
                   "seq-mean-token-sum-norm": 1 / (n_seqs[k] * lc.max_new_tokens)}[lc.aggregation]
            add("loss/policy", (loss * w).sum() * per)
            if lc.entropy_coef:
                add("loss/entropy_bonus", -lc.entropy_coef * H.sum() * per)
            add("loss/kl_ref", lc.kl_coef * kl_of_kind(lp, s.ref_logp.double(), lc.kl_kind).sum() * per
                if lc.kl_coef > 0 else 0.0)
            mask_tokens = torch.zeros(R, dtype=torch.bool)
            if lc.kl_mask:
                mask_tokens = (A > 0) & (H < H_old)
                target = old if lc.kl_mask_target == "old" else s.ref_logp.double()
                add("loss/kl_mask", lc.kl_mask_coef * (k3(lp, target) * mask_tokens).sum() / tokens[k])
                if lc.kl_mask_target == "ref" or m["after_taken"]:
                    measured.add(k)
                    add("actor/grad_w_policy", (dloss * w).abs().sum() * per)
                    add("actor/grad_w_kl_mask",
                        lc.kl_mask_coef * (k3_weight(lp, target) * mask_tokens).sum() / tokens[k])
            else:
                add("loss/kl_mask", 0.0)
            n = trained[k]
            add("actor/clip_frac_low", low.sum() / n)
            add("actor/clip_frac_high", high.sum() / n)
            add("actor/ratio_mean", ratio.sum() / n)
            add("actor/ratio_clamped_frac", clamped.sum() / n)
            add("actor/kl_old", k3(lp, old).sum() / n)
            if lc.kl_mask:
                add("actor/kl_mask_frac", mask_tokens.sum() / n)
            if lc.cov != "none":
                add("actor/cov_selected_frac", sel.sum() / n)
            if lc.top_entropy_frac > 0:
                add("actor/high_entropy_frac", kept.sum() / n)
            if lc.needs_ref:
                add("actor/kl_ref", kl_of_kind(lp, s.ref_logp.double(), lc.kl_kind).sum() / n)
            if lc.is_correction != "none":
                add("mismatch/is_weight", w.sum() / n)
                if lc.is_correction == "mask":
                    add("mismatch/masked_frac", (w == 0).sum() / n)
    if lc.cov != "none" and check_selection:  # the selection, against its definition
        for k, items in by_step.items():
            batches = [items]  # over the mini-batch; microbatch: each of the update's micro-batches
            if lc.cov_batch == "microbatch":
                batches = [[it for it in items if any(it[0] is s for s in m["mb"])]
                           for m in st.micro if k_of[id(m["mb"][0])] == k]
            for batch in batches:
                eligible, n, cov = cov_by_hand(lc, [(lp, s.old_logp.double(), float(s.adv)) for s, lp, _, _ in batch])
                sel = torch.cat([x for _, _, _, x in batch])
                assert not (sel & ~eligible).any(), "a selected token outside the candidates"
                assert int(sel.sum()) == min(n, int(eligible.sum()))
                if lc.cov == "kl":  # the n largest
                    assert cov[sel].min() >= cov[~sel].max() if (~sel).any() else True
    out = {key: v / n_steps for key, v in sums.items() if not key.startswith("actor/grad_w_")}
    for key in ("actor/grad_w_policy", "actor/grad_w_kl_mask"):
        if key in sums:
            out[key] = sums[key] / (len(measured) if grad_w_over_measured else n_steps)
    if "actor/grad_w_policy" in out:
        total = out["actor/grad_w_policy"] + out["actor/grad_w_kl_mask"]
        out["actor/kl_mask_grad_share"] = out["actor/grad_w_kl_mask"] / total if total > 0 else 0.0
    if ratios:
        out["actor/ratio_min"] = torch.cat(ratios).min().item()
        out["actor/ratio_max"] = torch.cat(ratios).max().item()
    out["actor/trained_tokens"] = sum(trained)
    if sum(trained):
        x = torch.cat(abs_log_r).numpy()
        out["actor/log_ratio_max"] = float(x.max())
        out["actor/log_ratio_p999"] = float(np.quantile(x, 0.999, method="inverted_cdf"))
    out["actor/optimizer_steps"] = n_steps
    out["actor/grad_norm"] = sum(o["norm"] for o in st.opt) / max(n_steps, 1)
    out["actor/lr"] = lr_by_hand(cfg, step)
    out["actor/skipped_updates"] = skipped_before + sum(not o["taken"] for o in st.opt)
    assert all(o["lr"] == pytest.approx(out["actor/lr"], rel=1e-12) for o in st.opt), "the optimizer's lr"
    return out


# Student's t, two-sided 95%, by degrees of freedom, to the usual table's 3 decimals (table.py's;
# exactly 12.7062, 4.3027, 3.1824, 2.7764)
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776}


def eval_by_hand(rows, outputs, n, judge):
    """eval/ metrics of a held-out evaluation: outputs[i] the n samples (with .text) of problem i,
    judge(text, gold) -> correct (raising: a grader failure, counted, wrong). Accuracy over every
    sample; pass@k = 1 - C(n - c, k) / C(n, k) averaged over the problems, k = 1, 2, 4, ... <= n;
    the 95% half-width by Student's t over the problems' accuracies."""
    correct, failures = [], 0
    for row, samples in zip(rows, outputs):
        c = 0
        for s in samples:
            try:
                c += bool(judge(s.text, row["answer"]))
            except Exception:
                failures += 1
        correct.append(c)
    P = len(rows)
    out = {"eval/accuracy": sum(correct) / (P * n)}
    k = 1
    while k <= n:
        out[f"eval/pass@{k}"] = sum(1 - math.comb(n - c, k) / math.comb(n, k) for c in correct) / P
        k *= 2
    if P > 1:
        acc = [c / n for c in correct]
        mean = sum(acc) / P
        out["eval/accuracy_ci95"] = T975[P - 1] * math.sqrt(sum((a - mean) ** 2 for a in acc) / (P - 1) / P)
    if failures:
        out["eval/grader_failures"] = failures
    return out


def held_out_by_hand(result, step):
    """The eval/ keys of the record of `step` (0: before training), by hand; {} where none ran.
    Graded by the rules (reward.grade), which is what the run's grader does on these texts (no
    answer a rule finds, so no second opinion is asked); eval/dropped_long_prompts at step 0: the
    held-out prompts longer than max_prompt_len, tokenized here."""
    import data
    cfg = result.cfg
    done = [e for e in (result.evals or []) if e["step"] == step]
    if not done:
        return {}
    (e,) = done
    grade = lambda text, gold: reward.grade(text, gold, second_opinion=False)[1]  # noqa: E731
    out = eval_by_hand(e["rows"], e["outputs"], cfg.eval_n, grade)
    if step == 0:
        tok = data.load_tokenizer(cfg.model)
        long = sum(len(data.encode_prompt(tok, r["problem"], cfg.prompt_template)[1]) > cfg.max_prompt_len
                   for r in result.eval_file)
        assert len(e["rows"]) == len(result.eval_file) - long
        if long:
            out["eval/dropped_long_prompts"] = long
    return out


def expected_record(result, i, model_dir, **kw):
    """Every metric of RL step i's record (timings apart), by hand. -> dict"""
    cfg, st = result.cfg, result.steps[i]
    before = sum(len(g.samples) for s in result.steps[:i] for g in s.rollouts.drawn)
    drawn = st.rollouts.drawn
    given = result.given[before:before + sum(len(g.samples) for g in drawn)]
    out, kept = rollout_by_hand(cfg, drawn, given)
    assert [id(g) for g in kept] == [id(g) for g in st.rollouts.groups], "the groups kept"
    out.update(old_policy_by_hand(cfg, st.minibatches, plain_model(model_dir, st.weights)))
    skipped = sum(not o["taken"] for s in result.steps[:i] for o in s.opt)
    out.update(update_by_hand(cfg, st, i, skipped_before=skipped, **kw))
    out.update(held_out_by_hand(result, i + 1))
    return out


def compare(record, expected, rel=1e-5, abs_=1e-7, skip=()):
    """Every key of the record (but step, timings and `skip`) has its by-hand value; no by-hand
    value lacks its key. A key whose values differ is named with both."""
    keys = set(record) - {"step", *TIMING} - set(skip)
    assert keys == set(expected) - set(skip), (f"logged without a reference: {sorted(keys - set(expected))}; "
                                                f"by hand but not logged: {sorted(set(expected) - keys)}")
    wrong = {k: (record[k], expected[k]) for k in sorted(keys)
             if record[k] != pytest.approx(expected[k], rel=rel, abs=abs_)}
    assert not wrong, f"logged vs by hand: {wrong}"


def check_timings(record):
    """The timings cannot be computed by hand (wall clock); what holds of them: each phase's
    seconds are >= 0 and together within the step's, and the rollout's speed is its tokens over
    its seconds."""
    phases = [record[k] for k in TIMING[:5]]
    assert all(t >= 0 for t in phases) and sum(phases) <= record["timing/step"]
    assert record["timing/rollout_tokens_per_s"] == pytest.approx(
        record["rollout/samples_drawn"] * record["response/length_mean"] / max(record["timing/rollout"], 1e-9),
        rel=1e-9)
