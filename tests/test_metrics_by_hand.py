"""Every metric of docs/METRICS.md computed by hand on a small batch and compared with what train.py
logs (tests/by_hand.py: the references, and a runner that records what each phase of a step was
given). One RL step (two where a rule spans steps) in this process on one rank per setting; each
record is compared key for key, so a metric logged without a reference fails too.
"""
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import rollout
import tepo
import train
from by_hand import (Scripted, StepRecord, check_timings, compare, eval_by_hand, expected_record, held_out_by_hand,
                     run_steps, update_by_hand)
from checkpoint import TrainState

# Rewards in grading order: group by group, sample by sample. "1 0 0 1" spreads a group of 4.
SPREAD, RIGHT, WRONG = [1, 0, 0, 1], [1, 1, 1, 1], [0, 0, 0, 0]


@pytest.fixture(scope="module")
def step(tmp_path_factory, tiny_model_dir):
    """step(name) -> by_hand.Result of SETTINGS[name], run once per module."""
    done = {}

    def get(name):
        if name not in done:
            script, config = SETTINGS[name]
            done[name] = run_steps(str(tmp_path_factory.mktemp(name)), tiny_model_dir, Scripted(script), **config)
        return done[name]
    return get


# held out before and after the step (the first step is the last): 3 problems and one whose prompt
# passes max_prompt_len (dropped, counted)
HELD_OUT = [{"problem": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(3)] + [
    {"problem": "Long " * 20 + "1 + 1?", "answer": "2"}]
RAGGED = [12, 5, 9, 2]  # response lengths (cut): a ragged batch, padding in every micro-batch

SETTINGS = {
    # TEPO, its mask reading pi_ref: the mask's weights count from the first optimizer step; no
    # reward call may fail (max_reward_errors 0) and none does
    "tepo-ref": (SPREAD + SPREAD, dict(method="tepo", loss={"kl_mask_target": "ref"}, lengths=RAGGED,
                                       max_reward_errors=0.0)),
    # TEPO (mask on pi_old) over 3 mini-batches of 8 responses (3, 3 and 2), a group all right
    # (A = 0) across the first two, each response a micro-batch of its own: the old pass, the
    # mask's share after the first step
    "tepo-old": ([1, 0, 1, 1, 0, 1, 1, 0], dict(method="tepo", prompts_per_step=4, group_size=2, num_minibatches=3,
                                                micro_batch_tokens=30, lengths=[12, 5])),
    # GSPO's seq-mean over every response of a mini-batch (those with A = 0 too); a mini-batch all
    # A = 0 (no optimizer step); the batch metrics over the trained responses only
    "gspo-zero": ([1, 0, 1, 1, 0, 1, 0, 0], dict(method="gspo", prompts_per_step=4, group_size=2, num_minibatches=3,
                                                   full_batch_metrics=False, lengths=[12, 6])),
    # GRPO: the KL to pi_ref by k2 trains every response (A = 0 too), the layout of before; the
    # first step of a warm-up
    "grpo": (SPREAD + RIGHT, dict(method="grpo", loss={"kl_kind": "k2"}, micro_batch_layout="grouped",
                                  warmup_steps=2, lengths=[12, 4, 8, 11], eval_rows=HELD_OUT, eval_n=2)),
    # Dr.GRPO's sum-norm, an entropy bonus, the truncated IS weight per sequence
    "drgrpo": (SPREAD + [0, 1, 1, 1], dict(method="drgrpo", loss={"entropy_coef": 0.01, "is_correction": "tis",
                                                                  "is_level": "sequence", "is_cap": 1.5},
                                           lengths=RAGGED)),
    # DAPO: step 1 holds exactly P informative groups at its first draw (no second draw); step 2
    # holds 1, draws again and holds 3, keeps 2 (one cut: not counted as spread); a grading call
    # raises and one runs over reward_timeout (wrong answers, counted); overlong shaping over the
    # last 3 tokens; the masked IS weight per sequence
    "dapo": (SPREAD + SPREAD + SPREAD + WRONG + ["raise", 1, 0, 0] + [1, "stall", 0, 1] + SPREAD,
             dict(method="dapo", steps=2, max_reward_errors=0.2, reward_timeout=0.2,
                  loss={"is_correction": "mask", "is_level": "sequence"}, lengths=[12, 10, 9, 3])),
    # KL-Cov: its tokens chosen over the whole mini-batch
    "klcov": (SPREAD + SPREAD, dict(method="klcov", loss={"cov_ratio": 0.1}, lengths=RAGGED)),
    # The newer losses, each with TEPO's mask (so that each token's gradient weight is compared too)
    # and narrow, unequal clips (both sides act, and a swap of the two shows): GMPO with the 80/20
    # rule, its tokens chosen over a mini-batch of several micro-batches among the A != 0
    # responses' (a KL term trains the A = 0 ones too: beside them, and alone in a mini-batch);
    # CISPO; SAPO
    "gmpo-8020": ([1, 0, 1, 1, 0, 0, 1, 1, 0, 1, 1, 0], dict(method="gmpo", prompts_per_step=6, group_size=2,
                                                             num_minibatches=3, micro_batch_tokens=40, lengths=RAGGED,
                                                loss={"clip_low": 0.02, "clip_high": 0.03, "kl_coef": 0.01,
                                                      "top_entropy_frac": 0.2, "kl_mask": True})),
    "cispo-mask": (SPREAD + SPREAD, dict(method="cispo", loss={"clip_low": 0.02, "clip_high": 0.03, "kl_mask": True},
                                         lengths=RAGGED)),
    "sapo": (SPREAD + SPREAD, dict(method="sapo", loss={"kl_mask": True}, lengths=RAGGED)),
    # Clip-Cov: its tokens chosen in each micro-batch (verl's), a wide band of candidates
    "clipcov": (SPREAD + SPREAD, dict(method="clipcov", loss={"cov_batch": "microbatch", "cov_lb": -100.0,
                                                              "cov_ratio": 0.1},
                                      micro_batch_tokens=48, lengths=RAGGED)),
}


SKIP = {}  # keys a setting's comparison leaves out (none now)


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_every_metric_of_the_step_by_hand(step, tiny_model_dir, name):
    """Each record of the run equals, key for key, the by-hand values of by_hand.expected_record:
    the rollout's from the groups drawn and the scripted rewards (dynamic sampling by its rule),
    the batch's at theta_old from plain forwards, the update's from each micro-batch's forward,
    term by term. Timings: what holds of wall-clock seconds (by_hand.check_timings)."""
    result = step(name)
    records = [r for r in result.records if r["step"] > 0]
    assert len(records) == len(result.steps) == result.cfg.steps
    for i, record in enumerate(records):
        compare(record, expected_record(result, i, tiny_model_dir), skip=SKIP.get(name, ()))
        check_timings(record)
    if result.evals:  # the record before training: the held-out evaluation alone
        assert result.records[0]["step"] == 0
        compare(result.records[0], held_out_by_hand(result, 0))


def test_the_masks_gradient_weights_are_means_over_the_steps_that_measured_them(step, tiny_model_dir):
    """kl_mask_target old, 3 optimizer steps: actor/grad_w_policy and actor/grad_w_kl_mask are measured
    at the second and third (at the first pi = pi_old, the mask's weight is 0 by construction) and
    are their mean over those two; divided by all three they read low by a third. Their share,
    a ratio, is right either way (test_every_metric_of_the_step_by_hand[tepo-old])."""
    result = step("tepo-old")
    want = expected_record(result, 0, tiny_model_dir)
    record = next(r for r in result.records if r["step"] == 1)
    for key in ("actor/grad_w_policy", "actor/grad_w_kl_mask"):
        assert record[key] == pytest.approx(want[key], rel=1e-5), key


def test_the_settings_hold_what_they_are_meant_to_test(step):
    """What each setting is for is in its batch: ragged lengths in a micro-batch; TEPO's mask acting
    at a later optimizer step and, reading pi_ref, weighted at the first; an A = 0 response beside
    trained ones in a mini-batch, and one mini-batch with none trained; dynamic sampling drawing
    once with exactly P informative groups, then twice and cutting one; reward calls that failed;
    the covariance methods selecting tokens; the newer losses clipping on both sides, and the 80/20
    rule over a mini-batch with no response of A != 0."""
    for name in set(SETTINGS) - {"tepo-old"}:  # (tepo-old: a micro-batch a response)
        st = step(name).steps[0]
        assert any(len({len(s.resp) for s in m["mb"]}) > 1 for m in st.micro), name  # ragged
    tepo = step("tepo-ref").steps[0]
    assert len(tepo.opt) == 2 and tepo.micro[0]["after_taken"] is False
    gspo = step("gspo-zero").steps[0]
    assert [sum(s.in_loss for s in mb) for mb in gspo.minibatches] == [2, 2, 0] and len(gspo.opt) == 2
    dapo = step("dapo")
    assert [len(s.rollouts.drawn) for s in dapo.steps] == [2, 4]
    assert [len(s.rollouts.groups) for s in dapo.steps] == [2, 2]
    informative = [0 < sum(g.correct) < 4 for g in dapo.steps[1].rollouts.drawn]
    assert informative == [True, False, True, True]  # the fourth is cut by the share-out
    assert all(len(set(g.rewards)) > 1 for g in dapo.steps[1].rollouts.drawn)  # spread, all four
    assert dapo.records[-1]["reward/errors"] == 1 and dapo.records[-1]["reward/timeouts"] == 1
    for name in ("klcov", "clipcov"):
        assert step(name).records[-1]["actor/cov_selected_frac"] > 0, name
    old = step("tepo-old")
    assert old.records[-1]["actor/kl_mask_frac"] > 0 and old.records[-1]["actor/grad_w_kl_mask"] > 0
    gmpo = step("gmpo-8020")  # A = 0 responses beside A != 0 ones; a mini-batch trained by the KL term alone
    assert [[s.adv != 0 for s in mb] for mb in gmpo.steps[0].minibatches] == [[True] * 2 + [False] * 2, [False] * 4,
                                                                              [True] * 4]
    assert len(gmpo.steps[0].opt) == 3 and 0 < gmpo.records[-1]["actor/high_entropy_frac"] < 0.5
    assert all(sum(any(m["mb"][0] is s for s in mb) for m in gmpo.steps[0].micro) > 1
               for mb in gmpo.steps[0].minibatches)  # several micro-batches a mini-batch
    for name in ("gmpo-8020", "cispo-mask"):  # both sides of the clip act
        assert step(name).records[-1]["actor/clip_frac_low"] > 0 < step(name).records[-1]["actor/clip_frac_high"]
    for name in ("gmpo-8020", "cispo-mask", "sapo"):
        assert step(name).records[-1]["actor/grad_w_kl_mask"] > 0, name
    sapo = step("sapo").records[-1]
    assert sapo["actor/ratio_min"] < 0.9 and sapo["actor/ratio_max"] > 1.1  # the gate away from r = 1


def test_the_old_pass_forwards_each_later_mini_batch_as_the_update_does(step):
    """Three mini-batches, each cut into micro-batches: the old pass forwards mini-batch 2's trained
    responses in exactly the micro-batches of the update's second forward pass, then mini-batch
    3's as its third, then the A = 0 responses apart (packing mini-batches 2 and 3 together into
    one pass gives other rows; with two mini-batches both forms are one pass)."""
    st = step("tepo-old").steps[0]

    def ids(plan):
        return [[id(s) for s in mb] for mb in plan]
    old = [ids(plan) for phase, grad, plan in st.forwards if phase == "old"]
    update = [ids(plan) for phase, grad, plan in st.forwards if phase == "update" and grad]
    assert len(update) == 3 and all(len(plan) >= 2 for plan in update)
    assert old[:2] == update[1:]
    zero = {id(s) for mb in st.minibatches for s in mb if not s.in_loss}
    assert len(old) == 3 and {i for mb in old[2] for i in mb} == zero and len(zero) == 2


# ----------------------------------------------------------------------------- the loss's own metrics


def sequences(lcfg, seed=0):
    """Four responses (3, 2, 4 and 2 tokens; A = 1, -1, 0.5, 0) whose log-ratios reach every
    branch: a token past the clamp (-45; +15 below it, so the KL is not symmetric in its two
    sides), tokens clipped low and high and a ratio above the high clip with A < 0, a sequence
    whose mean log-ratio passes -20 (A = 0, as GRPO's KL term trains it); the sampler's log-probs
    put some importance weights past the cap; entropies above, below and equal to H_old.
    Collated (B, T) with junk in the padding, as a packed forward leaves it (a log-prob of +30 or
    -30: a ratio past either clamp if the padding were read)."""
    g = torch.Generator().manual_seed(seed)
    lens, advs = [3, 2, 4, 2], [1.0, -1.0, 0.5, 0.0]
    deltas = [[15.0, 0.3, -0.01], [-0.5, 0.5], [0.1, -0.3, 0.0, 0.02], [-45.0, -1.0]]
    w_logs = [[0.0, 1.0, -0.2], [0.0, 0.3], [-1.0, 0.0, 0.1, 0.5], [0.2, -0.9]]  # log pi_old - log pi_rollout
    seqs, T = [], max(lens)
    for R, a, d, lw in zip(lens, advs, deltas, w_logs):
        old = -torch.rand(R, generator=g, dtype=torch.float64).float() * 3
        H_old = torch.rand(R, generator=g) * 2
        H = torch.rand(R, generator=g) * 2
        H[-1] = H_old[-1]  # a tie: not falling
        seqs.append(SimpleNamespace(prompt=[1], resp=[5] * R, adv=a, in_loss=True, old_logp=old, old_entropy=H_old,
                                    rollout_logp=old - torch.tensor(lw), ref_logp=old - 0.2,
                                    cov_sel=torch.rand(R, generator=g) < 0.4, now=old + torch.tensor(d), entropy=H))
    B = len(seqs)
    batch = {k: torch.zeros(B, T) for k in ("old_logp", "old_entropy", "rollout_logp", "ref_logp", "mask")}
    batch["logp"] = torch.tensor([[30.0 if b == 0 else -30.0] * T for b in range(B)])
    batch["entropy"], batch["cov_sel"] = torch.full((B, T), 9.0), torch.zeros(B, T, dtype=torch.bool)
    for b, s in enumerate(seqs):
        R = len(s.resp)
        for key, v in (("logp", s.now), ("old_logp", s.old_logp), ("old_entropy", s.old_entropy),
                       ("rollout_logp", s.rollout_logp), ("ref_logp", s.ref_logp), ("entropy", s.entropy),
                       ("cov_sel", s.cov_sel), ("mask", torch.ones(R))):
            batch[key][b, :R] = v
    return seqs, batch


LOSSES = [("tepo", {"is_correction": "mask", "is_cap": 2.0, "entropy_coef": 0.01}),
          ("tepo", {"kl_mask_target": "ref", "is_correction": "tis", "is_level": "sequence", "is_cap": 1.5}),
          ("gspo", {}), ("grpo", {"kl_kind": "k1"}), ("drgrpo", {"max_new_tokens": 6, "kl_coef": 0.1, "kl_kind": "k2"}),
          ("dapo", {"is_correction": "mask", "is_level": "token"}), ("clipcov", {}), ("klcov", {"entropy_coef": -0.1})]


@pytest.mark.parametrize("method,loss", LOSSES, ids=[f"{m}-{i}" for i, (m, _) in enumerate(LOSSES)])
def test_the_losss_metrics_by_hand_at_the_clamp_and_the_clip(method, loss):
    """tepo.policy_loss's loss and every metric it returns, on a micro-batch whose tokens reach the
    clamp (|log r| > 20, token and sequence), both clips, importance weights past the cap (dropped
    or truncated) and the KL mask, against the by-hand references (the same as a step's: one
    mini-batch, one optimizer step, the mask able to act). The steps of a run rarely reach these."""
    cfg = train.Config(model="m", train_data="d", method=method, loss=loss)
    lc = cfg.loss_cfg
    seqs, batch = sequences(lc)
    logp = batch["logp"].clone().requires_grad_(True)
    n = sum(len(s.resp) for s in seqs)
    out, metrics = tepo.policy_loss(
        logp, batch["old_logp"], torch.tensor([s.adv for s in seqs]), batch["mask"], lc, num_tokens=n,
        num_seqs=len(seqs), entropy=batch["entropy"], old_entropy=batch["old_entropy"],
        ref_logp=batch["ref_logp"] if lc.needs_ref else None, rollout_logp=batch["rollout_logp"],
        cov_sel=batch["cov_sel"] if lc.cov != "none" else None)
    for s in seqs:  # what the reference reads of a sequence it was not given
        s.ref_logp = s.ref_logp if lc.needs_ref else None
        s.cov_sel = s.cov_sel if lc.cov != "none" else None
    st = StepRecord(minibatches=[seqs], opt=[dict(norm=0.0, taken=True, lr=cfg.lr)],
                    micro=[dict(mb=seqs, logp=batch["logp"], entropy=batch["entropy"], cov_sel=None, after_taken=True)])
    want = update_by_hand(cfg, st, 0, check_selection=False)
    got = {k: float(v) for k, v in metrics.items()}
    assert set(got) <= set(want) and {k for k in want if k.startswith(("loss/", "actor/grad_w"))} <= set(got)
    wrong = {k: (v, want[k]) for k, v in got.items() if v != pytest.approx(want[k], rel=1e-6, abs=1e-9)}
    assert not wrong, wrong
    loss = sum(want[k] for k in want if k.startswith("loss/"))
    assert float(out.detach()) == pytest.approx(loss, rel=1e-5)  # summed in float32
    assert got["actor/ratio_clamped_frac"] > 0 and got["actor/clip_frac_low"] + got["actor/clip_frac_high"] > 0 \
        or lc.cov == "kl"


@pytest.mark.parametrize("n", [999, 1000, 1001, 2001])
def test_the_log_ratio_tail_is_the_nearest_rank_quantile(one_rank, n):
    """actor/log_ratio_p999: the ceil(0.999 n)-th smallest |log r| (numpy's inverted_cdf), from each
    rank's tail_size largest: the largest for n = 999, the second largest for 1000 and 1001, the
    third for 2001."""
    from ranks import keep_largest, tail_size
    values = torch.rand(n, generator=torch.Generator().manual_seed(n))
    top = keep_largest(torch.zeros(0), values, tail_size(n, train.TAIL_Q))
    got = train.log_ratio_tail(top, n)
    x = values.double().numpy()
    assert got["actor/log_ratio_max"] == pytest.approx(x.max())
    assert got["actor/log_ratio_p999"] == pytest.approx(np.quantile(x, 0.999, method="inverted_cdf"))
    assert got["actor/log_ratio_p999"] == pytest.approx(np.sort(x)[-{999: 1, 1000: 2, 1001: 2, 2001: 3}[n]])


# ----------------------------------------------------------------------------- held out


def test_the_held_out_metrics_by_hand(one_rank):
    """train.evaluate's record (eval/accuracy, eval/pass@k, eval/accuracy_ci95, eval/grader_failures)
    from 3 problems x 4 samples, one grading call raising (a wrong answer, counted), by hand."""
    texts = [["7", "8", "7", "!"], ["8", "8", "8", "8"], ["7", "7", "7", "8"]]

    def judge(text, gold):
        if text == "!":
            raise ValueError("a grader's failure")
        return text, text == gold

    class Engine:
        def generate(self, prompts, n=1, **kw):
            return [[rollout.Sample(list(p), [5], texts[p[0] - 1][j], [-1.0], "stop") for j in range(n)]
                    for p in prompts]
    rows = [{"problem": f"p{i}", "prompt": f"p{i}", "prompt_ids": [i + 1], "answer": "7"} for i in range(3)]
    cfg = train.Config(model="m", train_data="d", eval_n=4, eval_data="held.jsonl")
    run = SimpleNamespace(cfg=cfg, rank=0, world=1, engine=Engine(), judge=judge, state=TrainState(), eval_rows=rows)
    got = train.evaluate(run)
    want = eval_by_hand(rows, [[SimpleNamespace(text=t) for t in ts] for ts in texts], 4, lambda t, g: judge(t, g)[1])
    assert want["eval/grader_failures"] == 1 and want["eval/accuracy"] == 5 / 12
    assert set(got) == set(want)
    assert {k: got[k] for k in want} == pytest.approx(want, rel=1e-12)
