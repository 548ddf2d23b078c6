"""bench/study.py: the statistics and verdicts on values whose answer is known, the report on
synthetic metrics files, and the smoke study end to end (run, skip a finished run, resume a run
killed mid-way, report)."""
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import study  # noqa: E402


# ---------------------------------------------------------------------------------------------
# statistics


def test_bootstrap_ci_of_a_mean():
    rng = np.random.default_rng(0)
    x = rng.normal(10.0, 2.0, size=200)
    est, lo, hi = study.bootstrap_ci(x)
    assert est == pytest.approx(x.mean())
    se = x.std(ddof=1) / np.sqrt(len(x))  # a CLT interval: the percentile one is close to it
    assert lo == pytest.approx(est - 1.96 * se, abs=0.25 * se) and hi == pytest.approx(est + 1.96 * se, abs=0.25 * se)
    assert study.bootstrap_ci([3.0, 3.0, 3.0, 3.0]) == (3.0, 3.0, 3.0)  # no spread, no width
    assert study.bootstrap_ci([1.0, 2.0]) == study.bootstrap_ci([1.0, 2.0])  # seeded: reproducible
    assert all(np.isnan(v) for v in study.bootstrap_ci([]))


def test_paired_effect_resamples_the_seeds_jointly():
    # each seed shifts both variants alike: a paired effect sees the +1 through the seed noise
    seeds = np.array([0.0, 5.0, 10.0, 15.0])
    x, y = seeds + 1.0, seeds
    effect, lo, hi = study.paired_effect(x, y, "diff")
    assert (effect, lo, hi) == pytest.approx((1.0, 1.0, 1.0))
    effect, lo, hi = study.paired_effect([50, 60, 40, 50], [100, 120, 80, 100], "ratio")
    assert (effect, lo, hi) == pytest.approx((0.5, 0.5, 0.5))
    with pytest.raises(ValueError):
        study.paired_effect([1, 2], [1, 2, 3])


@pytest.mark.parametrize("x, y, kind, null, side, want", [
    # clearly separated, in the claimed direction
    ([0.30, 0.31, 0.29, 0.30], [0.10, 0.12, 0.11, 0.10], "diff", 0.0, "above", "supported"),
    ([50, 60, 55, 45], [100, 110, 120, 95], "ratio", 1.0, "below", "supported"),
    # identical: the effect is 0 (ratio 1) and so is its CI: nothing told apart
    ([0.2, 0.3, 0.25, 0.2], [0.2, 0.3, 0.25, 0.2], "diff", 0.0, "above", "not separable at this scale"),
    ([80, 90, 100, 70], [80, 90, 100, 70], "ratio", 1.0, "below", "not separable at this scale"),
    # overlapping noise
    ([0.2, 0.4, 0.1, 0.3], [0.3, 0.2, 0.35, 0.15], "diff", 0.0, "above", "not separable at this scale"),
    # reversed: clearly on the other side
    ([0.10, 0.12, 0.11, 0.10], [0.30, 0.31, 0.29, 0.30], "diff", 0.0, "above", "refuted"),
    ([150, 140, 150, 145], [100, 110, 120, 95], "ratio", 1.0, "below", "refuted"),
    ([0.5, 0.6, 0.55, 0.5], [0.1, 0.2, 0.15, 0.1], "diff", 0.0, "below", "refuted"),
])
def test_verdict_on_known_answers(x, y, kind, null, side, want):
    _, lo, hi = study.paired_effect(x, y, kind)
    assert study.verdict(lo, hi, null, side) == want


def test_verdict_rule_at_its_edges():
    assert study.verdict(0.1, 0.2, 0.0, "above") == "supported"
    assert study.verdict(0.0, 0.2, 0.0, "above") == "not separable at this scale"  # touching the null
    assert study.verdict(-0.2, -0.1, 0.0, "above") == "refuted"
    assert study.verdict(0.4, 0.9, 1.0, "below") == "supported"
    assert study.verdict(1.1, 1.3, 1.0, "below") == "refuted"
    assert study.verdict(float("nan"), float("nan"), 0.0, "above") == "no data"
    with pytest.raises(ValueError):
        study.verdict(0, 1, 0, "sideways")


def test_claims_table_pairs_by_seed_and_says_whether_half_is_in_the_ci():
    def summ(steps, ent):
        return {s: {"steps_to_thr": st, "entropy_final": e} for s, (st, e) in enumerate(zip(steps, ent))}
    summaries = {"tepo": summ([50, 60, 40, 50], [0.3, 0.3, 0.3, 0.3]),
                 "grpo": summ([100, 120, 80, 100], [0.3, 0.3, 0.3, 0.3]),
                 "dapo": {**summ([60, 60, 60], [0.1, 0.1, 0.1]), 7: {"steps_to_thr": 1, "entropy_final": 9}}}
    rows = {c["what"]: c for c in study.claims_table(summaries)}
    half = rows["steps to threshold, TEPO / GRPO"]
    assert (half["effect"], half["verdict"], half["note"]) == (0.5, "supported", "CI contains 0.5")
    same = rows["final entropy, TEPO - GRPO"]
    assert same["verdict"] == "not separable at this scale" and same["effect"] == 0
    dapo = rows["steps to threshold, TEPO / DAPO"]
    assert dapo["seeds"] == [0, 1, 2]  # seed 7 of DAPO has no TEPO partner: left out
    assert dapo["effect"] == pytest.approx(50 / 60) and dapo["note"] == "CI excludes 0.5"
    assert not any("GSPO" in w or "mask" in w for w in rows)  # no variant, no claim row
    assert rows["final pass@32, TEPO - GRPO"]["verdict"] == "no data"  # not logged
    one = study.claims_table({"tepo": summ([50], [0.3]), "grpo": summ([100], [0.1])})
    assert {c["verdict"] for c in one} == {"no CI from one seed", "no data"}  # no spread to tell


def test_t_interval_on_a_hand_worked_case_and_its_coverage():
    # d = 1, 2, 3, 4: mean 2.5, sd sqrt(5/3), se sqrt(5/3) / 2, t(0.975, 3 df) = 3.182
    est, lo, hi = study.t_interval([2, 4, 6, 8], [1, 2, 3, 4])
    half = 3.182 * np.sqrt(5 / 3) / 2
    assert (est, lo, hi) == pytest.approx((2.5, 2.5 - half, 2.5 + half))
    assert all(np.isnan(v) for v in study.t_interval([1.0], [0.0]))  # one seed: no interval
    # normal differences around 0.3: the interval holds the true mean ~95% of the time at 4 seeds
    # (a wrong quantile, e.g. 1.96 for 3 df, covers ~88%); the percentile bootstrap falls short
    rng = np.random.default_rng(1)
    d = rng.normal(0.3, 1.0, size=(4000, 4))
    t_hits = sum(lo <= 0.3 <= hi for _, lo, hi in (study.t_interval(row, np.zeros(4)) for row in d))
    assert 0.94 <= t_hits / len(d) <= 0.96
    b_hits = sum(lo <= 0.3 <= hi for _, lo, hi in (study.bootstrap_ci(row, n_boot=2000) for row in d[:1000]))
    assert b_hits / 1000 < 0.88


def test_the_t_check_is_the_safer_verdict_at_four_seeds():
    # per-seed differences 0.3, 0.2, 0.25, -0.05: only 1 resample in 256 has a mean <= 0, so the
    # bootstrap's CI lies above 0; the t interval [-0.07, 0.42] does not
    summaries = {"tepo": {s: {"entropy_final": v} for s, v in enumerate([0.5, 0.4, 0.45, 0.15])},
                 "grpo": {s: {"entropy_final": 0.2} for s in range(4)}}
    row = next(c for c in study.claims_table(summaries) if c["what"] == "final entropy, TEPO - GRPO")
    assert row["verdict"] == "supported"
    assert row["t_verdict"] == "not separable at this scale" and row["t"][1] < 0 < row["t"][2]
    far = {"tepo": {s: {"steps_to_thr": v} for s, v in enumerate([50, 52, 48, 50])},
           "grpo": {s: {"steps_to_thr": v} for s, v in enumerate([100, 104, 96, 100])}}
    ratio = study.claims_table(far)[0]
    assert ratio["verdict"] == ratio["t_verdict"] == "supported" and ratio["t"][0] == pytest.approx(-50)


def test_band_is_the_mean_with_a_bootstrap_interval():
    m = np.array([[0.0, 1.0, 2.0], [2.0, 1.0, 4.0], [1.0, 1.0, 3.0], [1.0, 1.0, 3.0]])
    mean, lo, hi = study.band(m)
    assert mean.tolist() == [1.0, 1.0, 3.0]
    assert lo[1] == hi[1] == 1.0  # no spread over seeds at that step
    assert (lo <= mean).all() and (mean <= hi).all() and lo[0] < 1.0 < hi[0]
    assert lo[0] >= 0.0 and hi[0] <= 2.0  # a mean of resampled seeds stays within their range


# ---------------------------------------------------------------------------------------------
# per-run numbers and the report, on synthetic metrics files


def fake_run(path, *, steps, speed, entropy_end, p999, seed, pass32_end=0.8):
    """A metrics.jsonl like train.py's: accuracy rising at `speed` per step, entropy falling to
    `entropy_end`, eval every 5 steps with pass@k, k = 1..32; plus the runner's DONE."""
    rng = np.random.default_rng(seed)
    os.makedirs(path, exist_ok=True)
    rows = []
    for step in range(steps + 1):
        acc = min(0.95, 0.3 + speed * step)
        r = {"step": step}
        if step > 0:
            r.update({"reward/mean": acc, "reward/accuracy": acc + rng.normal(0, 0.01),
                      "actor/entropy": 0.5 + (entropy_end - 0.5) * step / steps,
                      "actor/log_ratio_max": 2 * p999, "actor/log_ratio_p999": p999 * (0.5 + step / (2 * steps)),
                      "actor/kl_old": 1e-4, "actor/clip_frac_low": 0.01, "actor/clip_frac_high": 0.02,
                      "actor/kl_mask_frac": 0.1, "response/length_mean": 70.0, "timing/step": 1.5})
        if step % 5 == 0 or step == steps:
            r["eval/accuracy"] = acc
            for k in (1, 2, 4, 8, 16, 32):
                end = pass32_end if k == 32 else min(1.0, acc + 0.01 * k)
                r[f"eval/pass@{k}"] = acc if k == 1 else end if step == steps else min(1.0, acc + 0.02 * k)
        rows.append(r)
    with open(os.path.join(path, "metrics.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    with open(os.path.join(path, "attempts.jsonl"), "w") as f:
        f.write(json.dumps({"resumed_from": 0, "exit": 0, "wall_s": 100.0, "cpu_s": 180.0}) + "\n")
    open(os.path.join(path, "DONE"), "w").write("{}")


@pytest.fixture()
def synthetic_study(tmp_path):
    """TEPO twice as fast as GRPO and DAPO, higher entropy than all, a smaller log-ratio tail than
    GSPO; tepo-nomask like TEPO except for the entropy. 4 seeds, 40 steps."""
    out = tmp_path / "study"
    out.mkdir()
    (out / "study.json").write_text(json.dumps({"config": "configs/study.yaml", "steps": 40, "nproc": 1,
                                                "set": [], "base_seed": 0, "pretrain_steps": 800,
                                                "base_eval": 500, "smoke": False}))
    spec = {"grpo": (0.01, 0.10, 0.5), "dapo": (0.01, 0.12, 0.5), "drgrpo": (0.01, 0.1, 0.5),
            "gspo": (0.015, 0.1, 2.0), "tepo": (0.02, 0.3, 0.4), "tepo-nomask": (0.02, 0.1, 0.4),
            "clipcov": (0.01, 0.15, 0.5), "klcov": (0.01, 0.2, 0.5), "grpo-ent": (0.01, 0.25, 0.5)}
    for variant, (speed, ent, p999) in spec.items():
        for seed in range(4):
            fake_run(str(out / f"{variant}-s{seed}"), steps=40, speed=speed * (1 + 0.02 * seed),
                     entropy_end=ent + 0.005 * seed, p999=p999 * (1 + 0.05 * seed), seed=seed,
                     pass32_end=0.8 if variant != "tepo" else 0.8 + 0.01 * (-1) ** seed)
    (out / "base").mkdir()
    (out / "base" / "DONE").write_text(json.dumps({"wall_s": 50.0, "cpu_s": 90.0}))
    os.makedirs(out / "grpo-s9")  # an unfinished run (no DONE): left out of the report
    (out / "grpo-s9" / "metrics.jsonl").write_text(json.dumps({"step": 0, "eval/accuracy": 0.0}) + "\n")
    return out


def test_run_summary_reads_the_measures_of_the_hypotheses(synthetic_study):
    rows = study.read_metrics(str(synthetic_study / "tepo-s0"))
    s = study.run_summary(rows, 40, threshold=0.6)
    # accuracy 0.3 + 0.02 step: the mean of steps s-9..s is 0.3 + 0.02 (s - 4.5), 0.6 at s = 19.5
    assert s["steps_to_thr"] == 20 and s["reached"]
    assert s["steps_to_thr_eval"] == 15 and s["reached_eval"]  # eval every 5: 0.3 + 0.3 at step 15
    assert s["pass@1_start"] == pytest.approx(0.3) and s["pass@32"] == pytest.approx(0.81)
    assert s["entropy_final"] == pytest.approx(np.mean([0.5 - 0.2 * t / 40 for t in range(31, 41)]))
    assert s["entropy_start"] == pytest.approx(np.mean([0.5 - 0.2 * t / 40 for t in range(1, 11)]))
    assert s["pass@1_last_gain"] == pytest.approx(0.0)  # 0.95 (capped) at steps 35 and 40
    assert s["log_ratio_p999"] == pytest.approx(0.4) and s["log_ratio_max"] == pytest.approx(0.8)
    slow = study.run_summary(study.read_metrics(str(synthetic_study / "grpo-s0")), 40, threshold=0.9)
    assert (slow["steps_to_thr"], slow["reached"]) == (40, False)  # never: counts as the run's length
    assert slow["pass@1_last_gain"] == pytest.approx(0.05)  # 0.3 + 0.01 step: 0.65 -> 0.70, still rising


@pytest.mark.slow
def test_report_gives_the_verdicts_the_data_were_made_for(synthetic_study, tmp_path):
    doc = tmp_path / "docs" / "RESULTS.md"
    doc.parent.mkdir()
    hand = "# Results\n\n<!-- hypotheses -->\nHand-written hypotheses.\n\n"
    doc.write_text(hand + "<!-- generated: begin -->\nold text\n<!-- generated: end -->\n\nA footer.\n")
    # a plot of this study's names that this report does not draw (no run logs the key) is stale;
    # another study's plots (the shortcut task's, a hand-named one) are not this report's to remove
    for name in ["study_actor_cov_selected_frac.png", "study_shortcut_actor_entropy.png", "study_c2_entropy.png"]:
        (doc.parent / name).write_bytes(b"old")
    study.main(["report", "--out", str(synthetic_study), "--doc", str(doc)])  # the chain task's 0.6
    text = doc.read_text()
    assert text.startswith(hand) and text.endswith("<!-- generated: end -->\n\nA footer.\n")
    assert "old text" not in text
    claims = {}
    for line in text.splitlines():
        cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line)]
        if len(cells) > 6 and cells[1] in ("C1", "C2", "C3"):
            claims[cells[2]] = cells
    v = {what: cells[5] for what, cells in claims.items()}
    # the trailing mean reaches 0.6 at step ~20 for TEPO and ~35 for GRPO: faster, not half
    assert v["steps to threshold, TEPO / GRPO"] == "**supported** (CI excludes 0.5)"
    assert v["final entropy, TEPO - GRPO"] == v["final entropy, TEPO - TEPO without mask"] == "**supported**"
    assert v["run's largest p99.9 |log r|, TEPO - GSPO"] == "**supported**"
    assert v["final pass@32, TEPO - GRPO"] == "**not separable at this scale**"  # 0.8 vs 0.8 +- 0.01
    assert claims["steps to threshold, TEPO / GRPO"][4].startswith("0.5")  # 19.5 / 34.25
    # the t check beside it: the mean per-seed difference of steps, 19.5 - 34.25, its own verdict
    assert re.fullmatch(r"-14\.750 \[-\d+\.\d+, -\d+\.\d+\], supported", claims["steps to threshold, TEPO / GRPO"][6])
    assert claims["final pass@32, TEPO - GRPO"][6].endswith("not separable at this scale")
    assert "final pass@4, TEPO - GRPO (supplementary)" in claims
    assert "grpo: 4 seeds" in text and "grpo-s9" not in text  # the unfinished run is left out
    assert "CPU-hours, measured" in text
    cpu_hours = (len(set(study.VARIANTS) - study.OPT_IN) * 4 * 180 + 90) / 3600
    assert v["final entropy, TEPO - KL-Cov"] == v["final entropy, TEPO - Clip-Cov"] == "**supported**"
    assert f"Total CPU time: {cpu_hours:.2f} CPU-hours" in text
    assert "python bench/study.py run --out" in text and "--threshold 0.6" in text
    pngs = sorted(p.name for p in doc.parent.glob("study_*.png"))
    assert "study_actor_cov_selected_frac.png" not in pngs  # stale plots go
    assert "study_shortcut_actor_entropy.png" in pngs and "study_c2_entropy.png" in pngs
    for name in ["study_eval_accuracy.png", "study_eval_pass32.png", "study_actor_entropy.png",
                 "study_actor_log_ratio_p999.png", "study_reward_accuracy.png", "study_pass_at_k.png"]:
        assert name in pngs and (doc.parent / name).stat().st_size > 10_000
        assert f"![{name}]({name})" in text
    # the pass@k table holds every k at the end, with a CI
    table = text.split("### Held-out pass@k at the end")[1]
    row = next(ln for ln in table.splitlines() if ln.startswith("| tepo | "))
    assert row.count("[") == 6
    # a second report leaves the hand-written part as it is and rewrites the generated one alike
    study.main(["report", "--out", str(synthetic_study), "--threshold", "0.6", "--doc", str(doc)])
    again = doc.read_text()
    assert again.startswith(hand) and again.count("<!-- generated: begin -->") == 1
    assert again.split("<!-- generated: begin -->")[1].split("\n", 2)[2] == text.split("<!-- generated: begin -->")[1].split("\n", 2)[2]


@pytest.mark.slow
def test_another_tasks_report_has_its_own_markers_and_plots(synthetic_study, tmp_path):
    """A study of the shortcut task writes between its own markers and into study_shortcut_*.png:
    the chain study's section and plots in the same RESULTS.md stay as they are."""
    settings = json.loads((synthetic_study / "study.json").read_text())
    (synthetic_study / "study.json").write_text(json.dumps({**settings, "task": "shortcut"}))
    doc = tmp_path / "docs" / "RESULTS.md"
    doc.parent.mkdir()
    chain = "<!-- generated: begin -->\nthe chain study\n<!-- generated: end -->\n"
    doc.write_text(chain + "\n## Shortcut\n<!-- generated shortcut: begin -->\n<!-- generated shortcut: end -->\n")
    (doc.parent / "study_actor_entropy.png").write_bytes(b"the chain study's")
    study.main(["report", "--out", str(synthetic_study), "--doc", str(doc)])
    text = doc.read_text()
    assert text.startswith(chain)
    assert "--task shortcut --seeds 0 1 2 3" in text  # the reproducing command names the task
    assert (doc.parent / "study_actor_entropy.png").read_bytes() == b"the chain study's"
    assert (doc.parent / "study_shortcut_actor_entropy.png").stat().st_size > 10_000
    assert "![study_shortcut_pass_at_k.png](study_shortcut_pass_at_k.png)" in text
    # the premise, from GRPO's runs: entropy 0.5 + (end - 0.5) * step / 40, end = 0.1 + 0.005 * seed,
    # so the mean of steps 31-40 over that of steps 1-10, averaged over the seeds; pass@32 falls to 0.8
    assert "does GRPO collapse, at a price?" in text and "**it holds**" in text
    want = np.mean([(0.5 + (e - 0.5) * 35.5 / 40) / (0.5 + (e - 0.5) * 5.5 / 40)
                    for e in (0.1, 0.105, 0.11, 0.115)])
    ratio = next(ln for ln in text.splitlines() if ln.startswith("| entropy, last 10 steps / first 10 |"))
    assert ratio.startswith(f"| entropy, last 10 steps / first 10 | {want:.3f} [") and "| supported |" in ratio
    assert text.index("does GRPO collapse") < text.index("### Per variant")  # the premise comes first
    # one seed gives no interval: the premise cannot be read, whatever the values
    one = {0: study.run_summary(study.read_metrics(str(synthetic_study / "grpo-s0")), 40, 0.6)}
    assert study.premise_status(study.premise_table(one)) == "it cannot be read (no CI from one seed)"
    doc.write_text(chain)  # no shortcut markers: refused, nothing drawn
    with pytest.raises(SystemExit, match="generated shortcut: begin"):
        study.main(["report", "--out", str(synthetic_study), "--doc", str(doc)])


@pytest.mark.slow
def test_the_entropy_study_reads_its_own_hypotheses(synthetic_study, tmp_path):
    """As docs/RESULTS.md wrote them for the shortcut task: C1 at 0.8 unless told otherwise, TEPO
    against the entropy-control baselines two-sided, no "about half" note on C1, and a study
    without GRPO says its premise cannot be read (it said nothing)."""
    settings = json.loads((synthetic_study / "study.json").read_text())
    (synthetic_study / "study.json").write_text(json.dumps({**settings, "task": "shortcut"}))
    doc = tmp_path / "RESULTS.md"
    doc.write_text("<!-- generated shortcut: begin -->\n<!-- generated shortcut: end -->\n")
    study.main(["report", "--out", str(synthetic_study), "--doc", str(doc)])
    text = doc.read_text()
    assert "--threshold 0.8`" in text and "steps to 80%, training batch" in text
    rows = {ln.split(" | ")[1]: ln.split(" | ") for ln in text.splitlines() if ln.startswith("| C")}
    # the fixture's TEPO ends with entropy 0.3 against Clip-Cov's 0.15: higher, not "supported"
    assert rows["final entropy, TEPO - Clip-Cov"][2:5:2] == ["≠ 0", "**TEPO higher**"]
    assert rows["final entropy, TEPO - Clip-Cov"][5].endswith(", TEPO higher")  # the t check too
    assert rows["final entropy, TEPO - GRPO"][2:5:2] == ["> 0", "**supported**"]  # one-sided as written
    assert all(rows[f"final {m}, TEPO - {b}"][2] == "≠ 0" for m in ("entropy", "pass@32")
               for b in ("Clip-Cov", "KL-Cov", "GRPO with entropy bonus"))
    assert "excludes 0.5" not in text and "contains 0.5" not in text
    study.main(["report", "--out", str(synthetic_study), "--doc", str(doc), "--threshold", "0.7"])
    assert "--threshold 0.7`" in doc.read_text() and "steps to 70%, training batch" in doc.read_text()
    # the same runs as a chain study keep the loss study's one-sided reading and its 0.5 note
    chain = {v: {s: {"entropy_final": e, "steps_to_thr": 10} for s, e in enumerate(ents)}
             for v, ents in {"tepo": [0.1, 0.11, 0.1, 0.12], "clipcov": [0.3, 0.31, 0.3, 0.32],
                             "grpo": [0.3] * 4}.items()}
    one_sided = {c["what"]: c for c in study.claims_table(chain)}
    assert one_sided["final entropy, TEPO - Clip-Cov"]["verdict"] == "refuted"
    assert one_sided["steps to threshold, TEPO / GRPO"]["note"] == "CI excludes 0.5"
    two = {c["what"]: c for c in study.claims_table(chain, "shortcut")}
    assert two["final entropy, TEPO - Clip-Cov"]["verdict"] == "TEPO lower"
    assert two["steps to threshold, TEPO / GRPO"]["note"] == ""
    # a premise against its side does not hold; without GRPO's runs it cannot be read
    flat = {s: {"entropy_final": 0.9, "entropy_start": 1.0, "pass@32": 0.9 + 0.01 * s, "pass@32_start": 0.8,
                "pass@1": 0.6, "pass@1_start": 0.5} for s in range(4)}
    assert study.premise_status(study.premise_table(flat)) == "it does not hold"
    # some rows without data (runs evaluated without pass@32): it cannot be read, not "does not
    # hold" (the reading that needed every row to lack data said so)
    partial = {s: {k: v for k, v in summary.items() if not k.startswith("pass@32")} for s, summary in flat.items()}
    verdicts = [r[4] for r in study.premise_table(partial)]
    assert verdicts.count("no data") == 1 and "no data" != verdicts[0]
    status = study.premise_status(study.premise_table(partial))
    assert status.startswith("it cannot be read (") and "no data" in status, status
    for run in synthetic_study.glob("grpo-s*"):
        shutil.rmtree(run)
    study.main(["report", "--out", str(synthetic_study), "--doc", str(doc)])
    assert "It cannot be read: the study has no finished GRPO run" in doc.read_text()


def test_a_shortcut_study_prepares_the_shortcut_tasks_base(tmp_path, monkeypatch):
    """run's first launch (demo.py prepare) names the study's task and its settings."""
    launched = []
    monkeypatch.setattr(study, "launch", lambda cmd, log: (launched.append(cmd), (0, 1.0, 1.0))[1])
    study.prepare_base(str(tmp_path), {"task": "shortcut", "base_seed": 3, "pretrain_steps": 600, "base_eval": 500})
    cmd = launched[0]
    assert cmd[1].endswith("demo.py") and cmd[2:5] == ["prepare", "--task", "shortcut"]
    assert cmd[cmd.index("--seed") + 1] == "3" and cmd[cmd.index("--steps") + 1] == "600"
    assert (tmp_path / "base" / "DONE").exists()
    study.prepare_base(str(tmp_path), {"task": "shortcut"})  # prepared: not launched again
    assert len(launched) == 1


def test_verdict_either_side():
    assert [study.verdict(lo, hi, 0, "either") for lo, hi in [(0.1, 0.2), (-0.2, -0.1), (-0.1, 0.1), (0, 0.1)]] == [
        "TEPO higher", "TEPO lower", "not separable at this scale", "not separable at this scale"]


@pytest.mark.slow
def test_pass_at_k_plot_and_bands_from_metrics_files(synthetic_study, tmp_path):
    runs, _ = study.load_study(str(synthetic_study))
    assert list(runs) == [v for v in study.VARIANTS if v not in study.OPT_IN] and sorted(runs["grpo"]) == [0, 1, 2, 3]
    pngs = study.plot_curves(runs, str(tmp_path))
    assert "study_pass_at_k.png" in pngs and "study_actor_kl_mask_frac.png" in pngs
    # the band of a curve: the per-step values of the seeds, their mean inside the band
    per_seed = [study.series(rows, "eval/pass@32") for rows in runs["tepo"].values()]
    final = [d[40] for d in per_seed]
    mean, lo, hi = study.band([[v] for v in final])
    assert mean[0] == pytest.approx(np.mean(final)) and lo[0] >= min(final) and hi[0] <= max(final)
    assert lo[0] < mean[0] < hi[0]


@pytest.mark.slow
def test_a_smoke_studys_report_gives_the_command_that_made_it(synthetic_study, tmp_path, monkeypatch):
    """A smoke study run with a --set of its own is reproduced with it (without the smoke's own
    settings, which --smoke adds) and with its --nproc (left out, a smoke study of another --nproc
    than 2 was refused as other settings): the command the report prints is one `run` accepts on
    that OUT."""
    monkeypatch.setattr(study, "prepare_base", lambda *a, **k: None)  # nothing is launched here
    monkeypatch.setattr(study, "run_one", lambda *a, **k: None)
    (synthetic_study / "study.json").unlink()  # the settings of a smoke study of one process
    study.main(["run", "--smoke", "--nproc", "1", "--set", "backend=hf", "--out", str(synthetic_study)])
    doc = tmp_path / "docs" / "RESULTS.md"
    doc.parent.mkdir()
    doc.write_text("<!-- generated: begin -->\n<!-- generated: end -->\n")
    study.main(["report", "--out", str(synthetic_study), "--threshold", "0.6", "--doc", str(doc)])
    command = next(line for line in doc.read_text().splitlines() if line.startswith("Reproduce:"))
    assert f"run --out {synthetic_study} --task chain --smoke --nproc 1 --set backend=hf &&" in command, command
    assert "save_every" not in command
    argv = shlex.split(command.split("python bench/study.py ", 1)[1].split(" && ")[0])
    study.main(argv)  # accepted: the same settings (other ones exit, naming them)


def test_report_refuses_a_doc_without_markers(synthetic_study, tmp_path):
    doc = tmp_path / "R.md"
    doc.write_text("# no markers\n")
    with pytest.raises(SystemExit, match="generated"):
        study.main(["report", "--out", str(synthetic_study), "--doc", str(doc)])
    assert doc.read_text() == "# no markers\n" and not list(tmp_path.glob("*.png"))
    doc.write_text("<!-- generated: begin -->\n<!-- generated: end -->\n")
    with pytest.raises(SystemExit, match="no study"):
        study.main(["report", "--out", str(tmp_path / "nothing"), "--doc", str(doc)])


def test_a_study_is_tied_to_its_settings_and_config_values(tmp_path):
    import argparse
    cfg = tmp_path / "c.yaml"

    def settings(text, **kw):
        cfg.write_text(text)
        args = dict(task="chain", config=str(cfg), smoke=False, steps=150, nproc=2, set=[], base_seed=0,
                    pretrain_steps=800, base_eval=500)
        return study.study_settings(argparse.Namespace(**{**args, **kw}))
    a = settings("lr: 1.0e-4\nsteps: 150\n")
    assert a == settings("# a comment\nlr: 0.0001   # the same value\nsteps: 150\n")
    assert a != settings("lr: 2.0e-4\nsteps: 150\n")  # an edited config is another study
    assert a != settings("lr: 1.0e-4\nsteps: 150\n", steps=200)
    assert settings("lr: 1\n", smoke=True)["steps"] == study.SMOKE["steps"]
    assert a != settings("lr: 1.0e-4\nsteps: 150\n", task="shortcut")  # another task, another study


def test_a_study_made_before_tasks_is_the_chain_tasks(tmp_path, monkeypatch):
    """An OUT whose study.json predates --task (no "task" key) is taken as the chain task's: `run`
    with the same settings goes on (here: every run finished, nothing to do), with another task
    it refuses."""
    import argparse
    out = tmp_path / "old"
    out.mkdir()
    args = argparse.Namespace(task="chain", config=study.CONFIG, smoke=False, steps=150, nproc=2, set=[],
                              base_seed=0, pretrain_steps=800, base_eval=500, out=str(out), seeds=[0],
                              variants=["grpo"])
    old = study.study_settings(args)
    del old["task"]
    (out / "study.json").write_text(json.dumps(old))
    for d in ("base", "grpo-s0"):
        (out / d).mkdir()
        (out / d / "DONE").write_text("{}")
    study.cmd_run(args)  # no refusal: every run is finished
    with pytest.raises(SystemExit, match="other settings"):
        study.cmd_run(argparse.Namespace(**{**vars(args), "task": "shortcut"}))


# ---------------------------------------------------------------------------------------------
# the smoke study, end to end


def study_cmd(*args):
    return [sys.executable, os.path.join(ROOT, "bench", "study.py"), *args]


def test_a_run_is_one_process_or_torchrun_by_nproc():
    """train_cmd: `python train.py` for one process, torchrun for several, the study's --set and the
    variant's after the run's own keys, always --resume (the smoke study below runs one process)."""
    settings = {"steps": 3, "set": ["eval_n=4"], "config": "configs/study.yaml"}
    for nproc, head in ((1, [sys.executable]),
                        (2, [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"])):
        cmd = study.train_cmd("/o", "tepo-nomask", 1, {**settings, "nproc": nproc})
        assert cmd[:len(head)] == head and cmd[len(head)] == os.path.join(ROOT, "train.py")
        sets = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--set"]
        assert sets[:6] == ["model=/o/base/model", "train_data=/o/base/data/train.jsonl",
                            "eval_data=/o/base/data/test.jsonl", "out_dir=/o/tepo-nomask-s1", "seed=1", "steps=3"]
        assert sets[6:] == ["eval_n=4", *study.VARIANTS["tepo-nomask"]] and cmd[-1] == "--resume"


def test_dapo_redraw_keeps_the_studys_draws_and_is_run_only_when_named(monkeypatch):
    """`dapo` pins one draw after the study's --set (the loss studies' equal samples); `dapo-redraw`
    keeps the mask study's 3, with DAPO's dynamic sampling, and `run` makes it only when named."""
    from config import load_config
    sets = ["eval_max_problems=200", "dynamic_sampling=true", "max_sampling_tries=3", "lr=2e-4", "num_minibatches=8"]
    settings = {"steps": 50, "set": sets, "config": "configs/study.yaml", "nproc": 1}
    tries = {}
    for v in ("dapo", "dapo-redraw"):
        cmd = study.train_cmd("/o", v, 0, settings)
        cfg = load_config(os.path.join(ROOT, "configs", "study.yaml"), [cmd[i + 1] for i, a in enumerate(cmd) if a == "--set"])
        assert cfg.method == "dapo" and cfg.dynamic_sampling is True and cfg.num_minibatches == 8
        tries[v] = cfg.max_sampling_tries
    assert tries == {"dapo": 1, "dapo-redraw": 3}
    seen = {}
    monkeypatch.setattr(study, "cmd_run", lambda args: seen.update(variants=args.variants))
    study.main(["run", "--out", "/nonexistent"])
    assert "dapo-redraw" not in seen["variants"] and "dapo" in seen["variants"]
    study.main(["run", "--out", "/nonexistent", "--variants", "dapo-redraw"])
    assert seen["variants"] == ["dapo-redraw"]


def test_the_newer_losses_are_variants_run_only_when_named(monkeypatch):
    """gmpo, cispo, sapo (their presets) and dapo-8020 (DAPO's one draw, as `dapo`, with the 80/20
    rule's 0.2) are variants, and `run` makes them only when named: the default list, and so the
    studies' commands and results, are what they were."""
    from config import load_config
    assert [v for v in study.VARIANTS if v not in study.OPT_IN] == [
        "grpo", "drgrpo", "dapo", "gspo", "tepo", "tepo-nomask", "clipcov", "klcov", "grpo-ent"]
    settings = {"steps": 50, "set": ["eval_max_problems=200"], "config": "configs/study.yaml", "nproc": 1}
    for v, method, frac in (("gmpo", "gmpo", 0.0), ("cispo", "cispo", 0.0), ("sapo", "sapo", 0.0),
                            ("dapo-8020", "dapo", 0.2)):
        cmd = study.train_cmd("/o", v, 0, settings)
        cfg = load_config(os.path.join(ROOT, "configs", "study.yaml"), [cmd[i + 1] for i, a in enumerate(cmd) if a == "--set"])
        assert (cfg.method, cfg.loss_cfg.top_entropy_frac) == (method, frac), v
        assert cfg.loss_cfg == load_config(None, ["model=m", "train_data=d", f"method={method}", "max_new_tokens=128",
                                                  f"loss.top_entropy_frac={frac}"]).loss_cfg, v
    assert load_config(os.path.join(ROOT, "configs", "study.yaml"),
                       [cmd[i + 1] for i, a in enumerate(cmd) if a == "--set"]).max_sampling_tries == 1
    seen = {}
    monkeypatch.setattr(study, "cmd_run", lambda args: seen.update(variants=args.variants))
    study.main(["run", "--out", "/nonexistent"])
    assert not {"gmpo", "cispo", "sapo", "dapo-8020"} & set(seen["variants"])
    study.main(["run", "--out", "/nonexistent", "--variants", "gmpo", "cispo", "sapo", "dapo-8020"])
    assert seen["variants"] == ["gmpo", "cispo", "sapo", "dapo-8020"]


# The runner is under test, not the engine: transformers' generate starts in a fraction of vLLM's
# time (vLLM's sampling is tested by tests/test_rollout.py and the two-rank runs).
SMOKE_RUN = ("--smoke", "--set", "backend=hf")


@pytest.mark.slow
def test_smoke_study_runs_skips_finished_runs_resumes_a_killed_one_and_reports(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "smoke"
    # 1. start the study and kill it (the runner and its train.py) once a run has a checkpoint
    #    and before it finishes: the smoke runs save every step, so step 1's is the signal
    proc = subprocess.Popen(study_cmd("run", *SMOKE_RUN, "--out", str(out)), cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    first = out / "grpo-s0"
    deadline = time.time() + 900
    while not (first / "step_000001").exists():
        assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
        assert time.time() < deadline, "no checkpoint within 15 minutes"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (first / "DONE").exists(), "the run finished before the kill: nothing to resume"
    assert (out / "base" / "DONE").exists()
    # 2. run again: the killed run resumes from its checkpoint, the other one runs from scratch
    done = subprocess.run(study_cmd("run", *SMOKE_RUN, "--out", str(out)), cwd=ROOT, capture_output=True,
                          text=True, timeout=1800)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "[skip] " + str(out / "base") in done.stdout
    assert f"[run] {first} (resuming from step 1)" in done.stdout
    attempts = study.read_jsonl(str(first / "attempts.jsonl"))
    assert [a["resumed_from"] for a in attempts] == [1] and attempts[0]["cpu_s"] > 0
    assert "--resume: from" in (first / "train.log").read_text()
    for variant in ("grpo", "tepo"):
        rows = study.read_metrics(str(out / f"{variant}-s0"))
        assert [r["step"] for r in rows] == [0, 1, 2]  # no step twice after the resume
        assert study.complete(rows, 2) and (out / f"{variant}-s0" / "DONE").exists()
        assert "eval/pass@4" in rows[-1]
    # the smoke model is right nowhere: every reward is 0, so every advantage is exactly 0, and GRPO's
    # KL term has no gradient while the policy is the reference: nothing moves, through a resume too
    grpo = study.read_metrics(str(first))
    assert all(r["actor/log_ratio_max"] == r["actor/log_ratio_p999"] == 0 for r in grpo[1:]), grpo
    # 3. run again (in this process: nothing is launched): nothing is redone
    stamps = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.glob("*-s0/*.jsonl")}
    capsys.readouterr()
    study.main(["run", *SMOKE_RUN, "--out", str(out)])
    again = capsys.readouterr().out
    assert again.count("[skip]") == 3 and "[run]" not in again, again
    assert stamps == {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.glob("*-s0/*.jsonl")}
    # other settings in the same OUT are refused
    with pytest.raises(SystemExit, match="other settings"):
        study.main(["run", "--out", str(out), "--steps", "3"])
    # 4. the report
    doc = tmp_path / "docs" / "RESULTS.md"
    doc.parent.mkdir()
    doc.write_text("hand\n<!-- generated: begin -->\n<!-- generated: end -->\n")
    study.main(["report", "--out", str(out), "--doc", str(doc)])
    text = doc.read_text()
    assert text.startswith("hand\n") and "| grpo | 1 |" in text and "| tepo | 1 |" in text
    assert "python bench/study.py run --out" in text and "--smoke --nproc 2 --set backend=hf" in text
    assert (doc.parent / "study_eval_accuracy.png").exists() and (doc.parent / "study_pass_at_k.png").exists()
