"""bench/study.py's budget tables (issue 57): optimizer steps, samples, groups, and where the KL mask
and the clip can act, checked against values worked by hand from small synthetic metrics files."""
import json
import os
import sys

import numpy as np
import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import study  # noqa: E402

# Per RL step 1..4: the optimizer steps taken and, for the steps that took one, the logged means over
# them (train.py logs no actor/ loss metric for a step without an optimizer step).
TEPO = {0: dict(n=[4, 2, 1, 0], mask=[0.3, 0.2, 0.0], low=[0.2, 0.1, 0.0], high=[0.4, 0.2, 0.0],
                kl=[4e-4, 2e-4, 0.0]),
        1: dict(n=[4, 4, 2, 1], mask=[0.3, 0.3, 0.2, 0.0], low=[0.1] * 4, high=[0.1] * 4, kl=[1e-4] * 4)}
DAPO = {0: dict(n=[4, 4, 4, 4], kept=[1.0, 0.75, 0.5, 0.5]), 1: dict(n=[4, 4, 4, 3], kept=[1.0, 1.0, 0.5, 0.25])}


def write_run(path, spec, cfg):
    os.makedirs(path)
    rows = [{"step": 0, "eval/accuracy": 0.3}]
    for t, n in enumerate(spec["n"]):
        r = {"step": t + 1, "actor/optimizer_steps": n, "reward/accuracy": 0.5}
        if "kept" in spec:
            r["reward/groups_kept"] = spec["kept"][t]
        if n and "mask" in spec:
            r.update({"actor/kl_mask_frac": spec["mask"][t], "actor/clip_frac_low": spec["low"][t],
                      "actor/clip_frac_high": spec["high"][t], "actor/kl_old": spec["kl"][t]})
        rows.append(r)
    rows[-1]["eval/accuracy"] = 0.5
    with open(os.path.join(path, "metrics.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    with open(os.path.join(path, "config.yaml"), "w") as f:
        yaml.safe_dump(cfg, f)
    open(os.path.join(path, "DONE"), "w").write("{}")


@pytest.fixture()
def budget_study(tmp_path):
    out = tmp_path / "study"
    out.mkdir()
    (out / "study.json").write_text(json.dumps({"config": "configs/study.yaml", "steps": 4, "nproc": 1, "set": [],
                                                "base_seed": 0, "pretrain_steps": 800, "base_eval": 500,
                                                "smoke": False}))
    draws = {"prompts_per_step": 8, "group_size": 8, "max_sampling_tries": 1}
    for seed in (0, 1):
        write_run(str(out / f"tepo-s{seed}"), TEPO[seed], {**draws, "dynamic_sampling": False})
        write_run(str(out / f"dapo-s{seed}"), DAPO[seed], {**draws, "dynamic_sampling": True})
    return out


def summaries_of(out):
    runs, settings = study.load_study(str(out))
    return {v: {s: study.run_summary(rows, 4, 0.6, study.read_config(study.run_dir(str(out), v, s)))
                for s, rows in seeds.items()} for v, seeds in runs.items()}


def test_the_budget_of_each_run_by_hand(budget_study):
    s = summaries_of(budget_study)
    t0, t1, d0, d1 = s["tepo"][0], s["tepo"][1], s["dapo"][0], s["dapo"][1]
    assert (t0["opt_steps"], t0["opt_per_step"], t0["opt_per_step_late"]) == (7, 1.75, 0.5)  # late: steps 3, 4
    assert (t1["opt_steps"], t1["opt_per_step"], t1["opt_per_step_late"]) == (11, 2.75, 1.5)
    assert (d0["opt_steps"], d1["opt_steps"]) == (16, 15)
    assert t0["samples_drawn"] == d1["samples_drawn"] == 4 * 8 * 8  # prompts x group size, 4 steps
    assert d0["groups_spread"] == (1 + 0.75 + 0.5 + 0.5) * 8 and d1["groups_spread"] == 22
    assert np.isnan(t0["groups_spread"]) and np.isnan(t0["trained_tokens"])  # not logged
    # the mask where it can act: (4 x 0.3 + 2 x 0.2 + 1 x 0) / (3 + 1 + 0), not the run's mean 0.5 / 3
    assert t0["kl_mask_frac"] == pytest.approx(0.5 / 3) and t0["kl_mask_acting"] == pytest.approx(0.4)
    assert t1["kl_mask_acting"] == pytest.approx((1.2 + 1.2 + 0.4) / (3 + 3 + 1))
    assert t0["kl_old_acting"] == pytest.approx((16e-4 + 4e-4) / 4)
    assert (t0["clip_low_acting"], t0["clip_high_acting"]) == pytest.approx((1.0 / 4, 2.0 / 4))
    assert (t0["clip_low_early"], t0["clip_high_early"]) == pytest.approx((0.1, 0.2))  # all 4 steps <= EARLY
    assert (t0["acting_steps"], t1["acting_steps"]) == (0.5, 0.75)  # RL steps with >= 2 optimizer steps
    assert np.isnan(d0["kl_mask_acting"])  # DAPO has no mask


def test_the_acting_mean_leaves_out_each_rl_steps_first_optimizer_step():
    """At an RL step's first optimizer step pi = pi_old (tests/test_train_steps.py: exactly, even in
    bf16): its values are 0, so a step's mean over n optimizer steps is its n - 1 acting ones' sum
    over n."""
    rows = [{"step": 1, "actor/optimizer_steps": 3, "actor/kl_mask_frac": 0.3},
            {"step": 2, "actor/optimizer_steps": 2, "actor/kl_mask_frac": 0.1}]
    assert study.acting_mean(rows, "actor/kl_mask_frac") == pytest.approx((0.9 + 0.2) / 3)
    assert np.isnan(study.acting_mean([{"step": 1, "actor/optimizer_steps": 1, "actor/kl_mask_frac": 0.0}],
                                      "actor/kl_mask_frac"))  # one optimizer step: pi = pi_old throughout


def test_draws_from_the_config_only_where_sampling_draws_once():
    assert study.draws_per_step({"prompts_per_step": 8, "group_size": 4, "dynamic_sampling": False,
                                 "max_sampling_tries": 3}) == (32, 8)
    assert study.draws_per_step({"prompts_per_step": 8, "group_size": 4, "dynamic_sampling": True,
                                 "max_sampling_tries": 3}) is None  # it may draw again: unknown
    assert study.draws_per_step({}) is None
    logged = [{"step": 1, "rollout/samples_drawn": 96, "rollout/groups_spread": 5, "actor/trained_tokens": 700},
              {"step": 2, "rollout/samples_drawn": 64, "rollout/groups_spread": 3, "actor/trained_tokens": 300}]
    s = study.run_summary(logged, 2, 0.6, {"prompts_per_step": 8, "group_size": 8})
    assert (s["samples_drawn"], s["groups_spread"], s["trained_tokens"]) == (160, 8, 1000)  # logged first


def test_the_report_prints_the_budgets_and_flags_unequal_ones(budget_study):
    runs, settings = study.load_study(str(budget_study))
    text = "\n".join(study.report_lines(str(budget_study), runs, settings, 0.6, [], "cmd"))
    # mean over the 2 seeds (the range in brackets): samples, groups, per step, last half, in all, tokens
    assert "| tepo | 256 | – | 2.25 (1.75–2.75) | 1.00 (0.50–1.50) | 9 (7–11) | – |" in text
    assert "| dapo | 256 | 22 | 3.88 (3.75–4.00) | 3.75 (3.50–4.00) | 16 (15–16) | – |" in text
    assert ("**Budgets differ**: dapo takes 1.72x the optimizer steps of tepo (16 against 9, mean over "
            "the seeds they share); the C1, C2 comparisons between them are not at equal budgets.") in text
    assert "samples drawn of" not in text  # equal samples: not flagged
    # where the mask and the clip act, beside the run means
    assert "where the KL mask and the clip can act" in text
    row = next(ln for ln in text.splitlines() if ln.startswith("| tepo | 62%"))
    assert "| 62% (50%–75%) | 0.183 (0.167–0.200) → 0.400 |" in row  # run means 0.5 / 3 and 0.8 / 4 -> 0.4 on both
    claims = {c["what"]: c for c in study.claims_table(summaries_of(budget_study))}
    assert claims["steps to threshold, TEPO / DAPO"]["note"].endswith(
        "unequal budgets: TEPO 0.58x the other's optimizer steps")  # 9 / 15.5


def test_a_variant_without_optimizer_steps_is_flagged_not_divided_by():
    # the smoke study: every reward 0, so TEPO trains nothing while GRPO's KL term trains every response
    s = {"tepo": {0: {"opt_steps": 0.0, "steps_to_thr": 2}}, "grpo": {0: {"opt_steps": 8.0, "steps_to_thr": 2}}}
    lines = study.budget_lines(s, 2)
    assert any(ln.startswith("- **Budgets differ**: grpo takes ∞x the optimizer steps of tepo (8 against 0,")
               for ln in lines)
    assert study.claims_table(s)[0]["note"] == "unequal budgets: TEPO 0.00x the other's optimizer steps"
    same = {"tepo": {0: {"opt_steps": 105.0}}, "grpo": {0: {"opt_steps": 100.0}}}  # within 10%: not flagged
    assert not study.budget_gaps(same, "tepo", "grpo") and "Budgets differ" not in "\n".join(study.budget_lines(same, 2))
