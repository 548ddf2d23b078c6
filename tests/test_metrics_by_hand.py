"""Every metric of docs/METRICS.md computed by hand on a small batch and compared with what train.py
logs (tests/by_hand.py: the references, and a runner that records what each phase of a step was
given). One RL step (two where a rule spans steps) in this process on one rank per setting; each
record is compared key for key, so a metric logged without a reference fails too.
"""
import pytest

from by_hand import Scripted, check_timings, compare, expected_record, run_steps

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
                                  warmup_steps=2, lengths=[12, 4, 8, 11])),
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
    # Clip-Cov: its tokens chosen in each micro-batch (verl's), a wide band of candidates
    "clipcov": (SPREAD + SPREAD, dict(method="clipcov", loss={"cov_batch": "microbatch", "cov_lb": -100.0,
                                                              "cov_ratio": 0.1},
                                      micro_batch_tokens=48, lengths=RAGGED)),
}


# Compared apart (the xfail below): the mask's weights under kl_mask_target old.
SKIP = {"tepo-old": ("actor/grad_w_policy", "actor/grad_w_kl_mask")}


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


@pytest.mark.xfail(strict=True, reason="update_metrics divides the mask's gradient weights by every "
                                       "optimizer step, though those before the first one taken are not measured")
def test_the_masks_gradient_weights_are_means_over_the_steps_that_measured_them(step, tiny_model_dir):
    """kl_mask_target old, 3 optimizer steps: actor/grad_w_policy and actor/grad_w_kl_mask are measured
    at the second and third (at the first pi = pi_old, the mask's weight is 0 by construction) and
    are their mean over those two; divided by all three they read low by a third. Their share,
    a ratio, is right either way (test_every_metric_of_the_step_by_hand[tepo-old])."""
    result = step("tepo-old")
    want = expected_record(result, 0, tiny_model_dir)
    record = next(r for r in result.records if r["step"] == 1)
    for key in SKIP["tepo-old"]:
        assert record[key] == pytest.approx(want[key], rel=1e-5), key


def test_the_settings_hold_what_they_are_meant_to_test(step):
    """What each setting is for is in its batch: ragged lengths in a micro-batch; TEPO's mask acting
    at a later optimizer step and, reading pi_ref, weighted at the first; an A = 0 response beside
    trained ones in a mini-batch, and one mini-batch with none trained; dynamic sampling drawing
    once with exactly P informative groups, then twice and cutting one; reward calls that failed;
    the covariance methods selecting tokens."""
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
