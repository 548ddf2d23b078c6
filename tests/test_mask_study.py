"""bench/mask_study.py, the mask study's report, on made-up runs of three doses: the drift per step
and the mask's gradient share against hand-computed values, the rule that tells a finding from a
lead, the two premises, and the doc written between its own markers only."""
import json
import math
import os
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import mask_study  # noqa: E402

STEPS = 4
T975_3 = 3.182446305284263  # Student's t, 0.975 quantile, 3 degrees of freedom


def rows_of(*, kl, nmb, entropy, pass32, p999, grad_mask=0.0, opt=None, mask_frac=0.4):
    """A run's metrics.jsonl rows: evaluations at steps 0 and STEPS, steps 1-STEPS alike."""
    rows = [{"step": 0, "eval/accuracy": 0.6, "eval/pass@1": 0.6, "eval/pass@4": 0.8, "eval/pass@32": 0.9}]
    for t in range(1, STEPS + 1):
        r = {"step": t, "actor/kl_old": kl * t, "actor/optimizer_steps": nmb if opt is None else opt,
             "actor/entropy": entropy + 0.01, "rollout/entropy_sampled": entropy, "reward/accuracy": 0.5 + 0.1 * t, "actor/log_ratio_p999": p999,
             "actor/log_ratio_max": p999 + 1, "rollout/samples_drawn": 128, "rollout/groups_spread": 8,
             "actor/trained_tokens": 1000}
        if grad_mask:
            r.update({"actor/grad_w_kl_mask": grad_mask * t, "actor/grad_w_policy": 1.0,
                      "actor/kl_mask_frac": mask_frac})
        rows.append(r)
    rows[-1].update({"eval/accuracy": 0.8, "eval/pass@1": 0.8, "eval/pass@4": 0.85, "eval/pass@32": pass32})
    return rows


def make_dose(path, lr, nmb, runs):
    """A dose's OUT as bench/study.py run leaves it: study.json, and per run DONE and metrics."""
    os.makedirs(path)
    with open(os.path.join(path, "study.json"), "w") as f:
        json.dump({"task": "shortcut", "config": "configs/study.yaml",
                   "config_values": {"lr": 1e-4, "num_minibatches": 4, "prompts_per_step": 8, "group_size": 8},
                   "steps": STEPS, "nproc": 1, "set": ["eval_max_problems=200", f"lr={lr}", f"num_minibatches={nmb}"],
                   "base_seed": 0, "pretrain_steps": 600, "base_eval": 500, "smoke": False}, f)
    for (variant, seed), rows in runs.items():
        d = os.path.join(path, f"{variant}-s{seed}")
        os.makedirs(d)
        with open(os.path.join(d, "metrics.jsonl"), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
        with open(os.path.join(d, "DONE"), "w") as f:
            json.dump({"wall_s": 60.0, "cpu_s": 100.0, "attempts": 1}, f)
        with open(os.path.join(d, "attempts.jsonl"), "w") as f:
            f.write(json.dumps({"resumed_from": 0, "exit": 0, "wall_s": 60.0, "cpu_s": 100.0}) + "\n")


# The mask's entropy effect by seed: consistently +0.002 at D1 and D2 (a finding: the same measure
# off 0 with the same sign at two doses), pass@32 +0.01 at D0 only (a lead: one interval alone).
ENT_GAIN = {0: 0.0, 1: 0.002, 2: 0.002}
NOISE = [0.0001, -0.0001, 0.0002, -0.0002]


def dose_runs(d, nmb, kl):
    runs = {}
    for seed in range(4):
        base = dict(nmb=nmb, p999=1.0 + 0.1 * seed, pass32=0.86)
        runs[("tepo-nomask", seed)] = rows_of(kl=kl, entropy=0.02 + 0.001 * seed, **base)
        runs[("tepo", seed)] = rows_of(kl=kl, entropy=0.02 + 0.001 * seed + ENT_GAIN[d] + NOISE[seed],
                                       grad_mask=1e-3 * (d + 1), **{**base, "pass32": 0.86 + (0.01 + NOISE[seed] if d == 0 else 0)},
                                       )
        runs[("grpo", seed)] = rows_of(kl=kl, entropy=0.018, **base)
        runs[("gspo", seed)] = rows_of(kl=kl, entropy=0.019, **base)
        runs[("dapo-redraw", seed)] = rows_of(kl=kl, entropy=0.017 + 0.001 * seed, **base)
    return runs


@pytest.fixture
def doses(tmp_path):
    paths = []
    for d, (lr, nmb, kl) in enumerate([(1e-4, 4, 1e-5), (2e-4, 8, 1e-4), (3e-4, 8, 1e-2)]):
        paths.append(str(tmp_path / f"d{d}"))
        make_dose(paths[-1], lr, nmb, dose_runs(d, nmb, kl))
    return paths


def test_drift_per_step_and_gradient_share_by_hand():
    rows = [{"step": 1, "actor/kl_old": 0.3, "actor/optimizer_steps": 4,
             "actor/grad_w_kl_mask": 0.01, "actor/grad_w_policy": 1.0},
            {"step": 2, "actor/kl_old": 0.5, "actor/optimizer_steps": 2,
             "actor/grad_w_kl_mask": 0.03, "actor/grad_w_policy": 0.5},
            {"step": 3, "actor/kl_old": 0.0, "actor/optimizer_steps": 1}]  # no acting step: left out
    # the logged mean over n optimizer steps holds n - 1 acting ones: x n / (n - 1)
    assert mask_study.step_kls(rows) == pytest.approx([0.3 * 4 / 3, 0.5 * 2 / 1])
    share = (0.01 * 4 + 0.03 * 2) / (0.01 * 4 + 0.03 * 2 + 1.0 * 4 + 0.5 * 2)
    assert mask_study.mask_grad_share(rows) == pytest.approx(share)
    assert math.isnan(mask_study.mask_grad_share([{"step": 1, "actor/optimizer_steps": 4}]))
    # per RL step: the median of the steps' shares, and the steps where the mask outweighs the
    # policy term (here one whose policy term was clipped to 0: share 1)
    rows[2].update({"actor/grad_w_kl_mask": 0.2, "actor/grad_w_policy": 0.0})
    median, major, logged = mask_study.mask_step_shares(rows)
    assert median == pytest.approx(0.03 / 0.53) and major == 1 and logged == 3
    none = mask_study.mask_step_shares([{"step": 1}])  # not logged: no numbers, not a 0
    assert np.isnan(none[0]) and np.isnan(none[1]) and none[2] == 0
    # a non-finite kl_old (a step skipped as such) is left out of the drift, not carried as NaN
    assert mask_study.step_kls([{"actor/kl_old": float("nan"), "actor/optimizer_steps": 4}]) == []


def test_drift_with_and_without_the_mask_paired_by_seed(doses, tmp_path):
    """The descriptive drift table: TEPO's kl_old scaled by a factor per seed and per step at D2
    reads as the mean over seeds of log10(TEPO's / its pair's), median and largest step apart, with
    the t interval by hand; 0 where the two are alike."""
    factor = {0: 0.1, 1: 0.5, 2: 0.2, 3: 1.0}  # per seed; the last step x 3 more: the largest differs
    for seed in range(4):
        path = os.path.join(doses[2], f"tepo-s{seed}", "metrics.jsonl")
        rows = [json.loads(line) for line in open(path)]
        for r in rows[1:]:
            r["actor/kl_old"] *= factor[seed] * (3 if r["step"] == STEPS else 1)
        with open(path, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    doc = tmp_path / "R.md"
    doc.write_text("<!-- generated mask: begin -->\n<!-- generated mask: end -->\n")
    mask_study.main(["report", "--doses", *doses, "--doc", str(doc)])
    lines = doc.read_text().splitlines()
    kl = np.array([1e-2 * t for t in range(1, STEPS + 1)])  # the pair's steps; x n/(n-1) cancels
    for what, stat in (("median acting kl_old", np.median), ("largest one-step kl_old", np.max)):
        d = np.array([np.log10(stat(kl * f * np.r_[np.ones(STEPS - 1), 3]) / stat(kl)) for f in factor.values()])
        half = T975_3 * d.std(ddof=1) / 2
        row = next(line for line in lines if line.startswith(f"| D2 | {what} |"))
        assert f"| 4 | {d.mean():.2f} [" in row and f"| {d.mean():.2f} [{d.mean() - half:.2f}, {d.mean() + half:.2f}] |" in row, row
    row = next(line for line in lines if line.startswith("| D1 | largest one-step kl_old |"))
    assert "| 4 | 0.00 [0.00, 0.00] | 0.00 [0.00, 0.00] |" in row, row
    # the mask table's per-seed cells: the run's share, the median step's, steps the mask outweighs
    w = [3e-3 * t for t in range(1, STEPS + 1)]
    cell = f"s0: {sum(w) / (sum(w) + STEPS):.2e}, {np.median([x / (x + 1) for x in w]):.1e}, 0 of {STEPS}"
    assert any(line.startswith("| D2 | ") and cell in line for line in lines)


def test_report_reads_a_finding_a_lead_and_both_premises(doses, tmp_path):
    doc = tmp_path / "RESULTS.md"
    doc.write_text("before\n<!-- generated mask: begin -->\nold\n<!-- generated mask: end -->\nafter\n")
    mask_study.main(["report", "--doses", *doses, "--doc", str(doc)])
    text = doc.read_text()
    assert text.startswith("before\n<!-- generated mask: begin -->\n") and text.endswith("<!-- generated mask: end -->\nafter\n")
    assert "\nold\n" not in text
    # the answer: the entropy at D1 and D2 is a finding, from D1 on; pass@32 at D0 alone a lead
    assert "**The mask changes something from D1 on**" in text and "Partial" not in text, text
    assert "final entropy higher with the mask" in text
    assert "Leads (one interval alone, not a finding): D0 final held-out pass@32 (higher)" in text
    # the t interval of the D1 entropy effect, against a plain computation
    d = np.array([0.002 + n for n in NOISE])
    half = T975_3 * d.std(ddof=1) / 2
    row = next(line for line in text.splitlines() if line.startswith("| D1 | final entropy |"))
    assert f"{d.mean():.4f} [{d.mean() - half:.4f}, {d.mean() + half:.4f}]" in row and "| higher |" in row
    # the dose premise: tepo-nomask's median acting kl_old, D2 over D0 (kl x t per step, x n/(n-1))
    med = lambda kl, n: np.median([kl * t * n / (n - 1) for t in range(1, STEPS + 1)])  # noqa: E731
    span = med(1e-2, 8) / med(1e-5, 4)
    assert f"**The dose premise holds**: tepo-nomask's median acting kl_old is {med(1e-2, 8):.2e} at D2" in text
    assert f"{span:,.0f} times" in text
    assert "**The equal-optimizer-steps premise holds**" in text
    # the mask's gradient share where it can act, D2's: sum n x w_mask over sum n x (w_mask + w_policy)
    w = [3e-3 * t for t in range(1, STEPS + 1)]
    share = sum(w) / (sum(w) + STEPS)
    cover = 0.4 * 8 / 7  # the logged share is a mean over all 8 optimizer steps; 7 of them act
    assert f"| D2 | {cover:.3f} [{cover:.3f}, {cover:.3f}] | {share:.2e} [{share:.2e}, {share:.2e}] |" in text
    # the claims per dose, C1 to C3, and C1 and C2 against DAPO (drawing again like the others)
    assert sum(line.startswith("| D0 | C") for line in text.splitlines()) == 7
    row = next(line for line in text.splitlines() if line.startswith("| D2 | C2 | final entropy, TEPO - DAPO (redraw"))
    gain = 0.02 + ENT_GAIN[2] + np.mean(NOISE) - 0.017  # TEPO's final entropy minus DAPO's, mean over seeds
    assert f"| 4 | {gain:.3f} [" in row and "**supported**" in row, row
    assert "| D1 | dapo-redraw | 8.00 |" in text and "Not yet finished" not in text
    assert "dapo-redraw (DAPO drawing again, added after the 48 runs): within 2% of num_minibatches" in text


def test_budget_premise_fails_where_a_variant_skips_optimizer_steps(doses, tmp_path):
    path = os.path.join(doses[1], "gspo-s0", "metrics.jsonl")
    rows = [json.loads(line) for line in open(path)]
    for r in rows[1:]:
        r["actor/optimizer_steps"] = 6
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    doc = tmp_path / "R.md"
    doc.write_text("<!-- generated mask: begin -->\n<!-- generated mask: end -->\n")
    mask_study.main(["report", "--doses", *doses, "--doc", str(doc)])
    assert "**The equal-optimizer-steps premise does not hold** for: D1 gspo (7.50 of 8);" in doc.read_text()


def test_budget_premise_reads_the_steps_that_kept_a_group(doses, tmp_path):
    """An RL step whose draws kept no group trains nothing (0 optimizer steps): counted apart, not
    against the premise, which reads the steps that kept a group."""
    path = os.path.join(doses[1], "gspo-s0", "metrics.jsonl")
    rows = [json.loads(line) for line in open(path)]
    rows[2].update({"actor/optimizer_steps": 0, "rollout/groups_spread": 0})
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    doc = tmp_path / "R.md"
    doc.write_text("<!-- generated mask: begin -->\n<!-- generated mask: end -->\n")
    mask_study.main(["report", "--doses", *doses, "--doc", str(doc)])
    text = doc.read_text()
    assert "**The equal-optimizer-steps premise holds** for the runs finished" in text
    assert "| D1 | gspo | 8.00 | 0.25 (0.00–1.00) |" in text


def test_no_finding_is_said_as_such(tmp_path):
    paths = []
    for d, (lr, nmb, kl) in enumerate([(1e-4, 4, 1e-5), (3e-4, 8, 1e-4)]):
        runs = {}
        for seed in range(3):
            for v in ("tepo", "tepo-nomask"):
                runs[(v, seed)] = rows_of(kl=kl, nmb=nmb, entropy=0.02 + 0.001 * seed + (NOISE[seed] if v == "tepo" else 0),
                                          pass32=0.86, p999=1.0, grad_mask=1e-4 if v == "tepo" else 0.0)
        paths.append(str(tmp_path / f"d{d}"))
        make_dose(paths[-1], lr, nmb, runs)
    doc = tmp_path / "R.md"
    doc.write_text("<!-- generated mask: begin -->\n<!-- generated mask: end -->\n")
    mask_study.main(["report", "--doses", *paths, "--doc", str(doc)])
    text = doc.read_text()
    assert "**Partial: as few as 3 of the 4 seeds planned at a dose**" in text  # 3 seeds made here
    assert "**No finding: the mask changes none of the three measures at any dose**, up to the drift D1" in text
    assert "Leads" not in text
    assert "**The dose premise does not hold**" in text  # 10x, not 100x


def test_finding_rule_by_cases():
    """Two measures off 0 at one dose: both findings; one measure off 0 at two doses with opposite
    signs: two leads; an interval that touches 0 is not off it."""
    e = lambda s: ([0, 1, 2], (0, 0, 0), (0, 0, 0), s)  # noqa: E731
    effects = {("D0", "entropy_sampled_final"): e("higher"), ("D0", "pass@32"): e("lower"),
               ("D0", "log_ratio_p999"): e(None),
               ("D1", "entropy_sampled_final"): e(None), ("D1", "pass@32"): e(None), ("D1", "log_ratio_p999"): e("lower"),
               ("D2", "entropy_sampled_final"): e(None), ("D2", "pass@32"): e(None), ("D2", "log_ratio_p999"): e("higher")}
    findings, leads = mask_study.mask_findings(effects)
    assert findings == {("D0", "entropy_sampled_final"), ("D0", "pass@32")}
    assert leads == {("D1", "log_ratio_p999"), ("D2", "log_ratio_p999")}
    assert mask_study.side(0.0, 0.3) is None and mask_study.side(1e-9, 0.3) == "higher"


def test_a_dose_not_started_is_named_and_left_out(doses, tmp_path):
    """While the study runs, a dose whose directory holds no study yet: named, no numbers."""
    doc = tmp_path / "R.md"
    doc.write_text("<!-- generated mask: begin -->\n<!-- generated mask: end -->\n")
    mask_study.main(["report", "--doses", doses[0], str(tmp_path / "later"), "--doc", str(doc)])
    text = doc.read_text()
    assert "D0: tepo 4, tepo-nomask 4, gspo 4, grpo 4, dapo-redraw 4; D1: not started)" in text
    assert "Not yet finished: D1 (not started)." in text and "**The dose premise cannot be read yet**" in text
    assert not any(line.startswith("| D1 |") for line in text.splitlines())


def test_dapo_off_the_budget_is_said_apart_and_one_seed_gives_no_verdict(doses, tmp_path):
    """dapo-redraw, added after the 48 runs, never flips the pre-registered budget premise: said on
    its own line. A claim with one shared seed has no interval to read: no verdict from it."""
    for seed in range(4):
        path = os.path.join(doses[1], f"dapo-redraw-s{seed}", "metrics.jsonl")
        rows = [json.loads(line) for line in open(path)]
        for r in rows[1:]:
            r["actor/optimizer_steps"] = 6
        with open(path, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    for seed in (1, 2, 3):
        os.remove(os.path.join(doses[2], f"dapo-redraw-s{seed}", "DONE"))
    doc = tmp_path / "R.md"
    doc.write_text("<!-- generated mask: begin -->\n<!-- generated mask: end -->\n")
    mask_study.main(["report", "--doses", *doses, "--doc", str(doc)])
    text = doc.read_text()
    assert "**The equal-optimizer-steps premise holds**" in text
    assert "off num_minibatches by more than 2% at D1 dapo-redraw (6.00 of 8)" in text
    row = next(line for line in text.splitlines() if line.startswith("| D2 | C2 | final entropy, TEPO - DAPO (redraw"))
    assert "| 1 |" in row and row.count("no CI from one seed") == 2, row
