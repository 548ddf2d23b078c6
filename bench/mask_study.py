"""The mask study's report: does TEPO's KL mask change anything once it can act, and at what drift?

    python bench/mask_study.py report --doses runs/mask/d0 runs/mask/d1 runs/mask/d2

docs/RESULTS.md ("The mask study") holds the study's setting, hypotheses and verdict rules, written
before its runs. Each --doses directory is one dose's `bench/study.py run` OUT (its lr and
num_minibatches among its --set values), given from the smallest drift to the largest; they are
named D0, D1, ... in that order. The report reads their finished runs (a run is finished when its
directory holds DONE) and writes between the `<!-- generated mask: begin -->` and
`<!-- generated mask: end -->` markers of docs/RESULTS.md:
  - the doses as they came out (the drift where the mask can act) and the dose premise: tepo-nomask's
    median acting kl_old at the last dose over the first is at least DOSE_SPAN;
  - the budgets per dose and variant, and the equal-optimizer-steps premise: every variant's mean
    optimizer steps per RL step within OPT_TOLERANCE of num_minibatches;
  - the mask where it can act (coverage and gradient share, with the share per seed and per step);
  - the drift with and without the mask, paired by seed (added after the runs: descriptive, no finding);
  - the mask's effect per dose (TEPO minus TEPO without its mask on PRIMARY), by the rule of
    `mask_findings`, and the answer to the study's question;
  - the per-variant tables and the paper's claims per dose (bench/study.py's rules and statistics),
    with dapo-redraw where it ran (added after the 48 runs by the setting's cost rule, and labelled so);
  - the CPU time (the base counted once: the dose directories share it).
"Acting": the optimizer steps after the first of their RL step, the only ones where pi != pi_old
(bench/study.py acting_mean).
"""
import argparse
import datetime
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import study  # noqa: E402

ROOT = study.ROOT
TASK = "mask"            # the generated markers' name
THRESHOLD = 0.8          # C1: steps to a 10-step trailing training accuracy of 0.8 (the shortcut task's)
DOSE_SPAN = 100          # the dose premise: drift at the last dose over the first
OPT_TOLERANCE = 0.02     # the budget premise: optimizer steps per RL step within 2% of num_minibatches
# dapo-redraw (bench/study.py: DAPO drawing again like every variant here) was to be added if the
# 48 runs of the other four cost under 6 CPU-hours (they cost 3.75): its rows appear where it ran.
VARIANTS = ["tepo", "tepo-nomask", "gspo", "grpo", "dapo-redraw"]
SEEDS = 4                # seeds planned per variant and dose
# The mask's effect (TEPO minus TEPO without its mask), the three primary measures: summary key, name
PRIMARY = [("entropy_sampled_final", "final entropy"), ("pass@32", "final held-out pass@32"),
           ("log_ratio_p999", "run's largest p99.9 \\|log r\\|")]  # pipes escaped: table cells
# The paper's claims per dose: id, what, variant, baseline, key, effect kind, side of the null
CLAIMS = [("C1", "steps to 0.8, TEPO / GRPO", "tepo", "grpo", "steps_to_thr", "ratio", "below"),
          ("C2", "final entropy, TEPO - GRPO", "tepo", "grpo", "entropy_sampled_final", "diff", "above"),
          ("C2", "final pass@32, TEPO - GRPO", "tepo", "grpo", "pass@32", "diff", "above"),
          ("C3", "run's largest p99.9 \\|log r\\|, TEPO - GSPO", "tepo", "gspo", "log_ratio_p999", "diff", "below"),
          # against DAPO drawing again (dapo-redraw), as in the studies above, where it ran
          ("C1", "steps to 0.8, TEPO / DAPO (redraw; added after the 48)", "tepo", "dapo-redraw", "steps_to_thr", "ratio", "below"),
          ("C2", "final entropy, TEPO - DAPO (redraw; added after the 48)", "tepo", "dapo-redraw", "entropy_sampled_final", "diff", "above"),
          ("C2", "final pass@32, TEPO - DAPO (redraw; added after the 48)", "tepo", "dapo-redraw", "pass@32", "diff", "above")]
PREREGISTERED = VARIANTS[:4]  # the variants the rules were written for


def step_kls(per_step):
    """Each RL step's kl_old over its acting optimizer steps: the logged kl_old is the mean over
    its n optimizer steps, the first of which is 0 by construction, so n / (n - 1) times it.
    -> [float], the steps with at least two optimizer steps"""
    kls = [r["actor/kl_old"] * r["actor/optimizer_steps"] / (r["actor/optimizer_steps"] - 1)
           for r in per_step if (r.get("actor/optimizer_steps") or 0) >= 2 and r.get("actor/kl_old") is not None]
    return [k for k in kls if np.isfinite(k)]  # a non-finite step (skipped as such): left out


def mask_grad_share(per_step):
    """The mask's share of the per-token gradient weight where it can act, over the run: sum of
    n * grad_w_kl_mask over sum of n * (grad_w_kl_mask + grad_w_policy), n the step's optimizer
    steps (train.py logs each as a mean over them). NaN where the mask is off."""
    both = [(r["actor/grad_w_kl_mask"], r["actor/grad_w_policy"], r["actor/optimizer_steps"]) for r in per_step
            if r.get("actor/grad_w_kl_mask") is not None and r.get("actor/grad_w_policy") is not None]
    both = [(m, p, n) for m, p, n in both if np.isfinite(m) and np.isfinite(p)]  # a non-finite step: left out
    mask, pol = sum(m * n for m, _, n in both), sum(p * n for _, p, n in both)
    return mask / (mask + pol) if mask + pol > 0 else np.nan


def mask_step_shares(per_step):
    """(median over RL steps of the step's mask share, the RL steps whose mask weight exceeds the
    policy term's, the RL steps that logged both weights): the run's share above is a sum that a few
    steps can carry, where kl_old is large or the policy term is clipped to 0. Only steps with an
    acting optimizer step log the weights. (nan, nan, 0) where none did (the mask off)."""
    both = [(r["actor/grad_w_kl_mask"], r["actor/grad_w_policy"]) for r in per_step
            if r.get("actor/grad_w_kl_mask") is not None and r.get("actor/grad_w_policy") is not None]
    both = [(m, p) for m, p in both if np.isfinite(m) and np.isfinite(p) and m + p > 0]
    if not both:
        return np.nan, np.nan, 0
    return float(np.median([m / (m + p) for m, p in both])), sum(m > p for m, p in both), len(both)


def run_numbers(rows, steps, cfg):
    """bench/study.py's run_summary, with the drift per step and the mask's gradient share."""
    out = study.run_summary(rows, steps, THRESHOLD, cfg)
    per_step = [r for r in rows if r.get("step", 0) > 0]
    kls = step_kls(per_step)
    share_median, mask_major, share_steps = mask_step_shares(per_step)
    n = len(per_step) or np.nan
    # the final entropy: -log pi_sampler of the sampled tokens over every sample drawn, last 10 steps
    # (actor/entropy, beside it, covers only the groups dynamic sampling kept)
    sampled = [r["rollout/entropy_sampled"] for r in per_step if r.get("rollout/entropy_sampled") is not None]
    kept = [r for r in per_step if (r.get("rollout/groups_spread") or 0) > 0]
    out.update(entropy_sampled_final=float(np.mean(sampled[-study.TRAIL:])) if sampled else np.nan,
               # the budget premise reads the RL steps that kept a group (one that kept none trains nothing)
               opt_per_kept_step=float(np.mean([r.get("actor/optimizer_steps", 0) for r in kept])) if kept else np.nan,
               steps_without_group=len(per_step) - len(kept),
               kl_step_median=float(np.median(kls)) if kls else np.nan,
               kl_step_max=max(kls) if kls else np.nan,
               mask_grad_share=mask_grad_share(per_step),
               mask_share_step_median=share_median, mask_major_steps=mask_major, mask_share_steps=share_steps,
               samples_per_step=out["samples_drawn"] / n, groups_per_step=out["groups_spread"] / n,
               tokens_per_step=out["trained_tokens"] / n)
    return out


def dose_setting(settings):
    """(lr, num_minibatches) of a dose's OUT from its --set values over configs/study.yaml's."""
    values = dict(settings.get("config_values") or {})
    for s in settings.get("set", []):
        key, _, val = s.partition("=")
        values[key] = val
    return float(values["lr"]), int(values["num_minibatches"])


def load_doses(paths):
    """[(name, path, settings, {variant: {seed: numbers}})] of the dose directories, in order."""
    doses = []
    for i, path in enumerate(paths):
        if not os.path.exists(os.path.join(path, "study.json")):  # not started: named, no numbers
            doses.append((f"D{i}", path, None, {}))
            continue
        runs, settings = study.load_study(path)
        numbers = {}
        for v in VARIANTS:
            for seed, rows in runs.get(v, {}).items():
                cfg = study.read_config(study.run_dir(path, v, seed))
                numbers.setdefault(v, {})[seed] = run_numbers(rows, settings["steps"], cfg)
        doses.append((f"D{i}", path, settings, numbers))
    return doses


def values(numbers, variant, key, seeds=None):
    per_seed = numbers.get(variant, {})
    return [per_seed[s][key] for s in (sorted(per_seed) if seeds is None else seeds)]


def mean_ci(vals, digits=3, sci=False):
    """'mean [low, high]' (bootstrap over seeds); '–' without data."""
    est, lo, hi = study.bootstrap_ci([v for v in vals if np.isfinite(v)])
    if np.isnan(est):
        return "–"
    f = (lambda x: f"{x:.2e}") if sci else (lambda x: f"{x:.{digits}f}")
    return f"{f(est)} [{f(lo)}, {f(hi)}]"


def shared_seeds(numbers, a, b):
    return sorted(set(numbers.get(a, {})) & set(numbers.get(b, {})))


def side(lo, hi):
    """'higher' / 'lower' where the interval lies wholly above / below 0, else None."""
    return "higher" if lo > 0 else "lower" if hi < 0 else None


def mask_effects(doses):
    """{(dose, key): (seeds, bootstrap (est, lo, hi), t (mean, lo, hi), side of the t interval)}:
    TEPO minus TEPO without its mask, paired by seed, on each PRIMARY measure."""
    out = {}
    for name, _, _, numbers in doses:
        seeds = shared_seeds(numbers, "tepo", "tepo-nomask")
        for key, _ in PRIMARY:
            x, y = values(numbers, "tepo", key, seeds), values(numbers, "tepo-nomask", key, seeds)
            boot = study.paired_effect(x, y) if seeds else (np.nan,) * 3
            t = study.t_interval(x, y)
            out[(name, key)] = (seeds, boot, t, None if np.isnan(t[1]) else side(t[1], t[2]))
    return out


def mask_findings(effects):
    """The rule written before the runs: the mask *changes* a measure at a dose where the t
    interval lies wholly on one side of 0. One such interval alone is a lead; a finding is the
    same measure off 0 with the same sign at two doses, or two measures off 0 at one dose.
    -> ({(dose, key)} findings, {(dose, key)} leads)"""
    off = {k: s for k, (_, _, _, s) in effects.items() if s}
    findings = set()
    for (d, key), s in off.items():
        same_elsewhere = any(d2 != d and k2 == key and s2 == s for (d2, k2), s2 in off.items())
        others_here = any(d2 == d and k2 != key for (d2, k2) in off)
        if same_elsewhere or others_here:
            findings.add((d, key))
    return findings, set(off) - findings


def dose_span(doses):
    """tepo-nomask's mean per-run median acting kl_old at the last dose over the first's:
    -> (first, last, ratio), NaN where a dose has none of its runs."""
    at = [np.mean(values(d[3], "tepo-nomask", "kl_step_median")) if d[3].get("tepo-nomask") else np.nan
          for d in (doses[0], doses[-1])]
    return at[0], at[1], at[1] / at[0] if at[0] > 0 else np.nan


def answer(doses, effects):
    """The study's answer, as the rule reads it, in a sentence or two; where the dose premise does
    not hold, that first."""
    findings, leads = mask_findings(effects)
    order = {d[0]: i for i, d in enumerate(doses)}
    key_order = {k: i for i, (k, _) in enumerate(PRIMARY)}
    by_dose = lambda fs: sorted(fs, key=lambda f: (order[f[0]], key_order[f[1]]))  # noqa: E731
    name_of = dict(PRIMARY)
    _, _, span = dose_span(doses)
    head = (f"The doses span {span:,.0f} times the drift, not the {DOSE_SPAN} asked: the answer covers only the "
            "range reached. " if np.isfinite(span) and span < DOSE_SPAN else "")
    fewest = min((len(effects[(d[0], PRIMARY[0][0])][0]) for d in doses), default=0)
    if fewest < SEEDS:  # the rule is read as written, on the seeds there are: said first
        head = (f"**Partial: as few as {fewest} of the {SEEDS} seeds planned at a dose**, so the t intervals are "
                "wide and this reading is not the study's answer yet. ") + head
    drift = {name: np.mean(values(numbers, "tepo-nomask", "kl_step_median")) if numbers.get("tepo-nomask") else np.nan
             for name, _, _, numbers in doses}
    if findings:
        first = next(d for d, *_ in doses if any(f[0] == d for f in findings))
        what = "; ".join(f"{name_of[k]} {effects[(first, k)][3]} with the mask" for d, k in by_dose(findings) if d == first)
        text = (f"**The mask changes something from {first} on** (tepo-nomask's median acting kl_old there "
                f"{drift[first]:.1e} per token): {what}. Findings at: "
                + ", ".join(f"{d} {name_of[k]} ({effects[(d, k)][3]})" for d, k in by_dose(findings)) + ".")
    else:
        text = (f"**No finding: the mask changes none of the three measures at any dose**, up to the drift "
                f"{doses[-1][0]} reached (tepo-nomask's median acting kl_old {drift[doses[-1][0]]:.1e} per token).")
    if leads:
        text += " Leads (one interval alone, not a finding): " + ", ".join(
            f"{d} {name_of[k]} ({effects[(d, k)][3]})" for d, k in by_dose(leads)) + "."
    return head + text


def premise_lines(doses):
    """The dose premise and the budget premise, with their tables."""
    L = ["### The doses as they came out", "",
         "Per dose and variant, mean over seeds [bootstrap 95% CI]: the median over RL steps of the step's "
         "kl_old where the mask can act (its acting optimizer steps), its mean over the acting optimizer "
         "steps, the largest step, and the run's largest p99.9 and max |log r|.", "",
         "| dose | lr, mini-batches | variant | seeds | median acting kl_old | mean acting kl_old | largest one-step kl_old | "
         "largest p99.9 \\|log r\\| | largest \\|log r\\| |", "|---|---|---|---|---|---|---|---|---|"]
    for name, _, settings, numbers in doses:
        if settings is None:
            continue
        lr, nmb = dose_setting(settings)
        for v in VARIANTS:
            if v in numbers:
                L.append(f"| {name} | {lr:g}, {nmb} | {v} | {len(numbers[v])} | "
                         f"{mean_ci(values(numbers, v, 'kl_step_median'), sci=True)} | "
                         f"{mean_ci(values(numbers, v, 'kl_old_acting'), sci=True)} | "
                         f"{mean_ci(values(numbers, v, 'kl_step_max'), sci=True)} | "
                         f"{mean_ci(values(numbers, v, 'log_ratio_p999'))} | {mean_ci(values(numbers, v, 'log_ratio_max'))} |")
    lo, hi, span = dose_span(doses)
    holds = "holds" if span >= DOSE_SPAN else "does not hold" if np.isfinite(span) else "cannot be read yet"
    L += ["", f"**The dose premise {holds}**: tepo-nomask's median acting kl_old is {hi:.2e} at "
              f"{doses[-1][0]} and {lo:.2e} at {doses[0][0]}, {span:,.0f} times (at least {DOSE_SPAN} asked).", "",
          "### The budgets", "",
          "Per dose and variant, mean over seeds (per-seed range in brackets), per RL step: optimizer steps "
          "(`actor/optimizer_steps`) over the RL steps that kept a group, the RL steps that kept none (they "
          "train nothing), samples drawn (`rollout/samples_drawn`: dynamic sampling draws again "
          "when fewer than 8 groups have spread), groups with reward spread (`rollout/groups_spread`, "
          "the groups trained) and tokens in the loss (`actor/trained_tokens`).", "",
          "| dose | variant | optimizer steps (RL steps that kept a group) | RL steps that kept none | samples drawn | "
          "groups with spread | tokens in the loss |", "|---|---|---|---|---|---|---|"]
    bad, bad_later, missing = [], [], []
    for name, _, settings, numbers in doses:
        if settings is None:
            missing.append(f"{name} (not started)")
            continue
        nmb = dose_setting(settings)[1]
        for v in VARIANTS:
            if v not in numbers:
                missing.append(f"{name} {v}")
                continue
            opt = values(numbers, v, "opt_per_kept_step")
            if not abs(np.mean(opt) - nmb) <= OPT_TOLERANCE * nmb + 1e-9:  # NaN fails too
                (bad if v in PREREGISTERED else bad_later).append(f"{name} {v} ({np.mean(opt):.2f} of {nmb})")
            L.append(f"| {name} | {v} | {study.spread(opt)} | {study.spread(values(numbers, v, 'steps_without_group'), '.2f')} | "
                     f"{study.spread(values(numbers, v, 'samples_per_step'), ',.0f')} | "
                     f"{study.spread(values(numbers, v, 'groups_per_step'))} | "
                     f"{study.spread(values(numbers, v, 'tokens_per_step'), ',.0f')} |")
    verdict = (f"does not hold** for: {', '.join(bad)}; the comparisons with these runs are not at equal "
               "optimizer steps (their verdicts stand, flagged by this line)." if bad else
               f"holds** for the runs finished: every variant's optimizer steps per RL step that kept a group are "
               f"within {OPT_TOLERANCE:.0%} of its dose's num_minibatches." + (
                   f" Not yet finished: {', '.join(missing)}." if missing else ""))
    L += ["", "**The equal-optimizer-steps premise " + verdict, ""]
    if any(d[3].get("dapo-redraw") for d in doses):  # added after the 48: said apart, never flips the premise
        L += ["dapo-redraw (DAPO drawing again, added after the 48 runs): " + (
            f"off num_minibatches by more than {OPT_TOLERANCE:.0%} at {', '.join(bad_later)}; its comparisons are "
            "not at equal optimizer steps." if bad_later else
            f"within {OPT_TOLERANCE:.0%} of num_minibatches at every dose it ran.") + " It differs from TEPO in "
            "more than the budget: clip 0.2 / 0.28 on the token ratio, token-mean, rewards +1 / -1 with an "
            "overlong penalty, no KL to the reference.", ""]
    return L


def mask_lines(doses, effects):
    """Where the mask acts, its effect per dose, and the answer."""
    L = ["### The mask where it can act", "",
         "TEPO's runs, mean over seeds [bootstrap 95% CI]: the share of trained tokens in the mask, and "
         "the mask's share of the per-token gradient weight (`actor/grad_w_kl_mask` over it plus "
         "`actor/grad_w_policy`), both over the acting optimizer steps. Per seed (added after the runs, "
         "to read the share by: not a rule's measure): the run's share; the median over RL steps of the "
         "step's share; the RL steps where the mask's weight exceeds the policy term's, of those that "
         "logged both (an RL step with an acting optimizer step).", "",
         "| dose | coverage | gradient share | per seed: run's share, median step's share, steps where the mask's "
         "weight exceeds the policy's |", "|---|---|---|---|"]
    for name, _, _, numbers in doses:
        if "tepo" in numbers:
            per_seed = "; ".join(
                f"s{sd}: {n['mask_grad_share']:.2e}, {n['mask_share_step_median']:.1e}, "
                f"{n['mask_major_steps']} of {n['mask_share_steps']}" if n["mask_share_steps"] else f"s{sd}: – (not logged)"
                for sd, n in sorted(numbers["tepo"].items()))
            L.append(f"| {name} | {mean_ci(values(numbers, 'tepo', 'kl_mask_acting'))} | "
                     f"{mean_ci(values(numbers, 'tepo', 'mask_grad_share'), sci=True)} | {per_seed} |")
    L += drift_lines(doses)
    L += ["", "### The mask's effect: TEPO minus TEPO without its mask", "",
          "Paired by seed: the bootstrap 95% CI and Student's t 95% interval of the mean per-seed "
          "difference. *Off 0*: the t interval lies wholly above (higher with the mask) or below (lower).", "",
          "| dose | measure | seeds | estimate [bootstrap 95% CI] | t interval | off 0 | per seed (TEPO; without) |",
          "|---|---|---|---|---|---|---|"]
    for name, _, _, numbers in doses:
        for key, what in PRIMARY:
            seeds, boot, t, s = effects[(name, key)]
            if not seeds:
                continue
            per_seed = "; ".join(f"s{sd}: {numbers['tepo'][sd][key]:.4g}, {numbers['tepo-nomask'][sd][key]:.4g}"
                                 for sd in seeds)
            L.append(f"| {name} | {what} | {len(seeds)} | {study.fmt(*boot, digits=4)} | "
                     f"{study.fmt(*t, digits=4)} | {s or 'no'} | {per_seed or '–'} |")
    return L + ["", answer(doses, effects), ""]


def drift_lines(doses):
    """Does the mask hold down what it reads? TEPO's drift over TEPO without its mask, paired by
    seed, as log10 ratios. Added after the runs were read: a description, not one of the rule's
    measures, so it makes no finding."""
    L = ["", "### The drift with and without the mask (added after the runs; not a rule's measure)", "",
         "TEPO over TEPO without its mask, paired by seed, as the log10 of the ratio (below 0: less drift "
         "with the mask): the bootstrap 95% CI and Student's t 95% interval of the mean per-seed log10 "
         "ratio. Added once the runs were in, to see whether the mask holds down the kl_old it reads; it "
         "is not one of the three measures of the rule and makes no finding.", "",
         "| dose | drift | seeds | log10 ratio [bootstrap 95% CI] | t interval | per seed (TEPO; without) |",
         "|---|---|---|---|---|---|"]
    for name, _, _, numbers in doses:
        seeds = shared_seeds(numbers, "tepo", "tepo-nomask")
        for key, what in (("kl_step_median", "median acting kl_old"), ("kl_step_max", "largest one-step kl_old")):
            x, y = values(numbers, "tepo", key, seeds), values(numbers, "tepo-nomask", key, seeds)
            if not seeds:
                continue
            per_seed = "; ".join(f"s{sd}: {a:.2e}, {b:.2e}" for sd, a, b in zip(seeds, x, y))
            if not all(np.isfinite(v) and v > 0 for v in x + y):  # no log of 0: said, not dropped
                L.append(f"| {name} | {what} | {len(seeds)} | – | – | a seed's drift is 0 or not finite: {per_seed} |")
                continue
            lx, ly = np.log10(x), np.log10(y)
            L.append(f"| {name} | {what} | {len(seeds)} | {study.fmt(*study.paired_effect(lx, ly), digits=2)} | "
                     f"{study.fmt(*study.t_interval(lx, ly), digits=2)} | {per_seed} |")
    return L


def variant_lines(doses):
    L = ["### Per dose and variant: entropy, accuracy, speed to 0.8", "",
         "Mean over seeds [bootstrap 95% CI]; steps to 0.8: the 10-step trailing training-batch accuracy "
         "(a run that never reaches it counts as its length).", "",
         "| dose | variant | final entropy (sampled tokens, every sample drawn) | final actor/entropy (groups kept) "
         "| pass@1 | pass@4 | pass@32 | steps to 0.8 |", "|---|---|---|---|---|---|---|---|"]
    for name, _, _, numbers in doses:
        for v in VARIANTS:
            if v in numbers:
                L.append(f"| {name} | {v} | {mean_ci(values(numbers, v, 'entropy_sampled_final'), 4)} | "
                         f"{mean_ci(values(numbers, v, 'entropy_final'), 4)} | "
                         + " | ".join(mean_ci(values(numbers, v, k)) for k in ("pass@1", "pass@4", "pass@32"))
                         + f" | {mean_ci(values(numbers, v, 'steps_to_thr'), 1)} |")
    L += ["", "### The paper's claims, per dose", "",
          "By the rules of the studies above: *supported* if the bootstrap 95% CI lies on the claimed side "
          "of the null (0 for a difference, 1 for a ratio), *refuted* if on the other, else *not separable "
          "at this scale*; the t check (the mean per-seed difference, null 0) beside it.", "",
          "| dose | claim | effect | claimed | seeds | estimate [95% CI] | verdict | t check |",
          "|---|---|---|---|---|---|---|---|"]
    for name, _, _, numbers in doses:
        for cid, what, a, b, key, kind, where in CLAIMS:
            seeds = shared_seeds(numbers, a, b)
            if not seeds:
                continue
            x, y = values(numbers, a, key, seeds), values(numbers, b, key, seeds)
            est, lo, hi = study.paired_effect(x, y, kind)
            null = 1.0 if kind == "ratio" else 0.0
            t = study.t_interval(x, y)
            one = len(seeds) < 2  # a bootstrap of one value has no width: no verdict from it
            v = "no CI from one seed" if one else study.verdict(lo, hi, null, where)
            tv = "no CI from one seed" if one else study.verdict(t[1], t[2], 0.0, where)
            L.append(f"| {name} | {cid} | {what} | {'<' if where == 'below' else '>'} {null:g} | {len(seeds)} | "
                     f"{study.fmt(est, lo, hi)} | **{v}** | {study.fmt(*t)}, {tv} |")
    return L + [""]


def cost_line(doses):
    cpu = wall = 0.0
    for i, (_, path, _, numbers) in enumerate(doses):
        runs = {v: list(seeds) for v, seeds in numbers.items()}
        c, w = study.cpu_totals(path, runs)
        if i:  # the base is shared: counted with the first dose only
            base = os.path.join(path, "base", "DONE")
            if os.path.exists(base):
                with open(base) as f:
                    b = json.load(f)
                c, w = c - b["cpu_s"], w - b["wall_s"]
        cpu, wall = cpu + c, wall + w
    n = sum(len(s) for _, _, _, numbers in doses for s in numbers.values())
    return (f"Total CPU time: {cpu / 3600:.2f} CPU-hours in {wall / 3600:.2f} h of wall time, measured (user + "
            f"system seconds of every launch and its children), over {n} finished runs and the base model.")


def report_lines(doses):
    effects = mask_effects(doses)
    counts = "; ".join(f"{name}: " + (", ".join(f"{v} {len(numbers[v])}" for v in VARIANTS if v in numbers)
                                       or ("none finished" if settings else "not started"))
                       for name, _, settings, numbers in doses)
    L = [f"Generated by `bench/mask_study.py report` on {datetime.date.today()} from the finished runs "
         f"(seeds per variant, {counts}); machine: {study.machine()}.", "",
         f"Reproduce: the runs as above, then `python bench/mask_study.py report --doses "
         f"{' '.join(os.path.relpath(p, ROOT) for _, p, _, _ in doses)}`.", "", cost_line(doses), ""]
    return L + premise_lines(doses) + mask_lines(doses, effects) + variant_lines(doses)


def cmd_report(args):
    study.check_doc(args.doc, TASK)
    doses = load_doses(args.doses)
    if not any(numbers for *_, numbers in doses):
        sys.exit("no finished runs in " + ", ".join(args.doses))
    lines = report_lines(doses)
    study.write_generated(args.doc, lines, TASK)
    print("\n".join(lines))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("report", help="the tables and the answer from the finished runs of every dose")
    p.add_argument("--doses", nargs="+", required=True, help="the doses' bench/study.py OUT directories, "
                   "smallest drift first")
    p.add_argument("--doc", default=os.path.join(ROOT, "docs", "RESULTS.md"),
                   help="rewritten between its `generated mask` markers")
    args = ap.parse_args(argv)
    cmd_report(args)


if __name__ == "__main__":
    main()
