"""The studies: TEPO against the baselines on a task the project makes, with CIs over seeds.

    python bench/study.py run --out runs/study --seeds 0 1 2 3 --steps 150
    python bench/study.py report --out runs/study
    python bench/study.py run --smoke --out /tmp/smoke && python bench/study.py report --out /tmp/smoke --doc /tmp/R.md

`--task` names the task: `chain` (the loss study, the default) or `shortcut` (the entropy study,
a task made to collapse). Each task's report goes between its own markers of docs/RESULTS.md
(`<!-- generated: begin -->` for chain, `<!-- generated shortcut: begin -->` for shortcut) and
into its own plots (docs/study_<metric>.png, docs/study_shortcut_<metric>.png); the shortcut
report opens with its premise (PREMISE: does GRPO collapse there, at a price?).

`run` prepares the base model once (`demo.py prepare --task TASK`, seeded; cached in OUT/base), then
trains every (variant, seed) with train.py and configs/study.yaml into OUT/<variant>-s<seed>/, each
with its own metrics.jsonl. Variants change only the loss (VARIANTS), so every one draws the same
prompts and samples per RL step; the seed sets the data order and the sampling, so two variants
with the same seed see the same prompts (the effects below are paired by seed). DAPO keeps its
dynamic-sampling filter but draws no extra prompts (max_sampling_tries=1); `dapo-redraw`, opt-in,
is DAPO drawing again like the rest where a study gives every variant dynamic sampling. `gmpo`,
`cispo`, `sapo` and `dapo-8020` (DAPO with the 80/20 rule), the newer losses, are opt-in too. The optimizer steps are
NOT equal: train.py skips a mini-batch with no trained token (every group in it all right or all
wrong), which DAPO's filter leaves only in a step that keeps no group and GRPO's KL-to-reference
term (it trains every response) never; so the report measures each variant's budget
(`budget_lines`) and says where two compared ones differ.

A run is finished when its directory holds DONE (written after train.py exits with a complete
metrics.jsonl); a finished run is never redone. Every other run is started with `--resume`:
train.py continues from the run's newest checkpoint (save_every) or starts from step 0 when there
is none, and a resumed run's metrics equal an uninterrupted run's exactly (tests/test_train_e2e.py),
so killing `run` and starting it again gives the same study. OUT/study.json holds the settings
the runs were made with; `run` refuses an OUT made with other ones. OUT/<run>/attempts.jsonl
records each launch: its wall time, its CPU seconds (user + system of the launch and all its
children, from getrusage; a launch killed together with `run` is not recorded) and the step it
resumed from.

`report` reads the finished runs and writes, between the `<!-- generated: begin -->` and
`<!-- generated: end -->` markers of docs/RESULTS.md (the rest of the file, the hypotheses, is
left as it is): the budgets per variant (samples, groups with reward spread, optimizer steps, tokens in the
loss) with a line per compared pair whose budgets differ, where the KL mask and the clip can act
(the optimizer steps with pi != pi_old), the tables per variant, the effect and verdict per claim
(marked where the budgets differ), the total CPU time and
the reproducing command; and one plot per metric, docs/study_<metric>.png (mean over seeds, band =
bootstrap 95% CI of the mean). Statistics (numpy only): a run's summary numbers are computed per
seed; a CI resamples the seeds with replacement (10,000 resamples, percentile interval); an
effect between two variants resamples the seeds they share, the same resample for both (paired).

The verdict rule (docs/RESULTS.md's hypotheses, in `verdict`): each claim names the side of a null
value (0 for a difference, 1 for a ratio) its effect should lie on. *supported* if the 95% CI lies
entirely on that side, *refuted* if it lies entirely on the other side, otherwise *not separable at
this scale*. A comparison the task's hypotheses call two-sided (TWO_SIDED: the entropy study's
against the entropy-control baselines) reads *TEPO higher*, *TEPO lower* or not separable. For the
loss study's C1 ratio the report also says whether the CI contains 0.5 ("about half"). C1's
threshold is the task's (THRESHOLD) unless `--threshold` names another.
Beside each verdict, a cross-check (`t_interval`): the same rule on Student's t 95% interval of the
mean per-seed difference, since a percentile bootstrap over a handful of seeds is too narrow. The
pass@4 rows of C2 are supplementary: added after the pilot showed pass@32 already at 1.00.

`--smoke`: the whole path at toy size for CI (a 4-step pre-training, 2 RL steps, 1 seed, grpo and
tepo, 8 held-out problems with 4 samples, a checkpoint every step), in a few minutes.
"""
import argparse
import datetime
import glob
import json
import os
import platform
import re
import resource
import shlex
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # for table.t975

VARIANTS = {  # name -> train.py overrides
    "grpo": ["method=grpo"], "drgrpo": ["method=drgrpo"],
    "dapo": ["method=dapo", "max_sampling_tries=1"], "gspo": ["method=gspo"],
    "tepo": ["method=tepo"], "tepo-nomask": ["method=tepo", "loss.kl_mask=false"],
    # The entropy-control baselines (ENTROPY_BASELINES.md), added after the first study: Clip-Cov
    # and KL-Cov with their defaults, and GRPO with an entropy bonus of 0.001 (ours: verl's old
    # silent default in its GRPO examples).
    "clipcov": ["method=clipcov"], "klcov": ["method=klcov"],
    "grpo-ent": ["method=grpo", "loss.entropy_coef=0.001"],
    # DAPO drawing again (its paper draws until the batch is full; here at most max_sampling_tries,
    # config.py's 3 unless --set), for a study that gives every variant dynamic sampling (the mask
    # study): there every variant draws alike. Run only when named (--variants): the loss studies ran `dapo`.
    "dapo-redraw": ["method=dapo"],
    # The losses that followed (NEWER_BASELINES.md), with their presets, and the 80/20 rule on DAPO
    # (the paper's pairing, its top 20% of tokens by entropy; one draw, as `dapo`). Run only when
    # named: the studies before them ran without.
    "gmpo": ["method=gmpo"], "cispo": ["method=cispo"], "sapo": ["method=sapo"],
    "dapo-8020": ["method=dapo", "max_sampling_tries=1", "loss.top_entropy_frac=0.2"],
}
OPT_IN = {"dapo-redraw", "gmpo", "cispo", "sapo", "dapo-8020"}  # variants `run` makes only when --variants names them
CONFIG = os.path.join(ROOT, "configs", "study.yaml")
# --smoke: what CI can afford; the defaults of `run` are the study's.
SMOKE = dict(seeds=[0], steps=2, variants=["grpo", "tepo"], pretrain_steps=4, base_eval=16,
             set=["prompts_per_step=4", "group_size=4", "eval_n=4", "eval_max_problems=8",
                  "eval_every=0", "save_every=1", "keep_last=1", "log_samples_every=0"])
BOOT = 10_000            # bootstrap resamples
TRAIL = 10               # trailing window (steps) of the training-batch accuracy and final entropy
EARLY = 15               # the first steps, whose clip fractions are shown beside the run's mean
BUDGET_GAP = 1.10        # two compared variants whose budgets differ by more are flagged
# The per-step curves drawn: key, title, trailing mean window (1: as logged).
CURVES = [("eval/accuracy", "held-out pass@1 (T=1)", 1),
          ("eval/pass@32", "held-out pass@32", 1),
          ("reward/accuracy", f"training-batch accuracy, {TRAIL}-step trailing mean", TRAIL),
          ("actor/entropy", "policy entropy (nats/token)", 1),
          ("actor/log_ratio_max", "largest per-token |log pi/pi_old| of the step", 1),
          ("actor/log_ratio_p999", "99.9th percentile of per-token |log pi/pi_old|", 1),
          ("actor/kl_old", "KL(pi_old || pi) per token", 1),
          ("actor/clip_frac_low", "clipped below (share of trained tokens)", 1),
          ("actor/clip_frac_high", "clipped above (share of trained tokens)", 1),
          ("actor/kl_mask_frac", "TEPO's KL mask: share of trained tokens", 1),
          ("actor/cov_selected_frac", "Clip-Cov / KL-Cov: share of trained tokens selected", 1),
          ("actor/optimizer_steps", "optimizer steps of the RL step (mini-batches with a trained token)", 1),
          ("response/length_mean", "response length (tokens)", 1)]
# ----------------------------------------------------------------------------------------------
# run


def run_dir(out, variant, seed):
    return os.path.join(out, f"{variant}-s{seed}")


def is_finished(path):
    return os.path.exists(os.path.join(path, "DONE"))


def launch(cmd, log_path, cwd=ROOT):
    """Run `cmd` with its output appended to `log_path`. -> (return code, wall s, CPU s), the CPU
    seconds being user + system of the command and every child it waited for (getrusage)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.time()
    with open(log_path, "a") as log:
        log.write(f"\n$ {shlex.join(cmd)}\n")
        log.flush()
        rc = subprocess.run(cmd, cwd=cwd, stdout=log, stderr=subprocess.STDOUT).returncode
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return rc, time.time() - t0, cpu


def prepare_base(out, settings):
    """OUT/base: the task's data and the pre-trained model, made once (DONE marks it)."""
    base = os.path.join(out, "base")
    if is_finished(base):
        print(f"[skip] {base}: prepared")
        return base
    os.makedirs(base, exist_ok=True)
    cmd = [sys.executable, os.path.join(ROOT, "demo.py"), "prepare", "--task", settings["task"], "--out", base,
           "--seed", str(settings["base_seed"]), "--steps", str(settings["pretrain_steps"]),
           "--n-eval", str(settings["base_eval"])]
    print(f"[prepare] {shlex.join(cmd)}", flush=True)
    rc, wall, cpu = launch(cmd, os.path.join(base, "prepare.log"))
    if rc != 0:
        sys.exit(f"demo.py prepare failed (exit {rc}); see {base}/prepare.log")
    with open(os.path.join(base, "DONE"), "w") as f:
        json.dump({"wall_s": wall, "cpu_s": cpu}, f)
    return base


def train_cmd(out, variant, seed, settings):
    """The train.py command of one run (with --resume: a checkpoint in its directory is used)."""
    base, path = os.path.join(out, "base"), run_dir(out, variant, seed)
    sets = [f"model={base}/model", f"train_data={base}/data/train.jsonl",
            f"eval_data={base}/data/test.jsonl", f"out_dir={path}", f"seed={seed}",
            f"steps={settings['steps']}", *settings["set"], *VARIANTS[variant]]
    nproc = settings["nproc"]
    head = ([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
            if nproc > 1 else [sys.executable])
    return head + [os.path.join(ROOT, "train.py"), "--config", settings["config"],
                   *sum((["--set", s] for s in sets), []), "--resume"]


def complete(rows, steps):
    """A metrics.jsonl whose last record is step `steps` with its held-out evaluation."""
    return bool(rows) and rows[-1].get("step") == steps and "eval/accuracy" in rows[-1]


def run_one(out, variant, seed, settings):
    """Train one (variant, seed) unless it is finished; resume it if it was interrupted."""
    path = run_dir(out, variant, seed)
    if is_finished(path):
        print(f"[skip] {path}: finished")
        return
    os.makedirs(path, exist_ok=True)
    ckpts = sorted(p for p in glob.glob(os.path.join(path, "step_*")) if not p.endswith(".tmp"))
    resumed = int(ckpts[-1].rsplit("_", 1)[1]) if ckpts else 0
    cmd = train_cmd(out, variant, seed, settings)
    print(f"[run] {path}" + (f" (resuming from step {resumed})" if resumed else ""), flush=True)
    rc, wall, cpu = launch(cmd, os.path.join(path, "train.log"))
    with open(os.path.join(path, "attempts.jsonl"), "a") as f:
        f.write(json.dumps({"resumed_from": resumed, "exit": rc, "wall_s": wall, "cpu_s": cpu,
                            "nproc": settings["nproc"], "at": datetime.datetime.now().isoformat()}) + "\n")
    if rc != 0 or not complete(read_metrics(path), settings["steps"]):
        sys.exit(f"{path}: train.py exited {rc} without finishing; see {path}/train.log "
                 f"(`run` again resumes it)")
    attempts = read_jsonl(os.path.join(path, "attempts.jsonl"))
    with open(os.path.join(path, "DONE"), "w") as f:
        json.dump({"wall_s": sum(a["wall_s"] for a in attempts),
                   "cpu_s": sum(a["cpu_s"] for a in attempts), "attempts": len(attempts)}, f)


def study_settings(args):
    """The settings every run of an OUT shares (OUT/study.json; seeds and variants may grow): the
    config file (relative to the repository) and its values, so an edit of it is caught too."""
    import yaml
    smoke = args.smoke
    with open(args.config) as f:
        values = yaml.safe_load(f)
    return {"task": args.task, "config": os.path.relpath(os.path.abspath(args.config), ROOT), "config_values": values,
            "steps": SMOKE["steps"] if smoke else args.steps, "nproc": args.nproc,
            "set": (SMOKE["set"] if smoke else []) + args.set, "base_seed": args.base_seed,
            "pretrain_steps": SMOKE["pretrain_steps"] if smoke else
            args.pretrain_steps or {"chain": 800, "shortcut": 600}[args.task],
            "base_eval": SMOKE["base_eval"] if smoke else args.base_eval, "smoke": smoke}


def cmd_run(args):
    settings = study_settings(args)
    os.makedirs(args.out, exist_ok=True)
    saved = os.path.join(args.out, "study.json")
    if os.path.exists(saved):
        with open(saved) as f:
            old = json.load(f)
        old.setdefault("task", "chain")  # studies made before --task were the chain task's
        if old != settings:
            diff = {k: (old.get(k), settings.get(k)) for k in set(old) | set(settings) if old.get(k) != settings.get(k)}
            sys.exit(f"{args.out} holds runs made with other settings (was, now): {diff}; "
                     f"use another --out")
    else:
        with open(saved, "w") as f:
            json.dump(settings, f, indent=1)
    settings["config"] = os.path.join(ROOT, settings["config"])
    seeds = SMOKE["seeds"] if args.smoke else args.seeds
    variants = SMOKE["variants"] if args.smoke else args.variants
    prepare_base(args.out, settings)
    t0 = time.time()
    for seed in seeds:  # seed by seed: a study stopped part-way holds complete pairs
        for variant in variants:
            run_one(args.out, variant, seed, settings)
    print(f"all {len(variants) * len(seeds)} runs finished ({time.time() - t0:.0f}s in this call)")


# ----------------------------------------------------------------------------------------------
# statistics


def bootstrap_ci(values, stat=np.mean, n_boot=BOOT, seed=0, level=0.95):
    """Percentile bootstrap CI of stat(values) over resamples of the values (seeds) with
    replacement. -> (point estimate, low, high); NaNs when there are no values."""
    x = np.asarray(values, dtype=float)
    if len(x) == 0:
        return (np.nan,) * 3
    idx = np.random.default_rng(seed).integers(0, len(x), size=(n_boot, len(x)))
    boots = stat(x[idx], axis=1)
    lo, hi = np.percentile(boots, [50 * (1 - level), 50 * (1 + level)])
    return float(stat(x[None, :], axis=1)[0]), float(lo), float(hi)


def paired_effect(x, y, kind="diff", n_boot=BOOT, seed=0, level=0.95):
    """Effect of variant x over variant y from per-seed values paired by seed (equal length):
    "diff" mean(x) - mean(y), "ratio" mean(x) / mean(y); each resample draws seeds with
    replacement and takes the same seeds for both. -> (effect, low, high)"""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(x) != len(y):
        raise ValueError(f"paired values need equal lengths, got {len(x)} and {len(y)}")
    if len(x) == 0:
        return (np.nan,) * 3
    idx = np.random.default_rng(seed).integers(0, len(x), size=(n_boot, len(x)))
    f = (lambda a, b: a.mean(-1) - b.mean(-1)) if kind == "diff" else (lambda a, b: a.mean(-1) / b.mean(-1))
    boots = f(x[idx], y[idx])
    lo, hi = np.percentile(boots, [50 * (1 - level), 50 * (1 + level)])
    return float(f(x, y)), float(lo), float(hi)


def t_interval(x, y):
    """The cross-check of a paired effect: Student's t 95% interval of the mean per-seed difference
    mean(x - y). A percentile bootstrap over 4 seeds is too narrow (it covers ~80%, not 95%), the t
    interval is not; for a ratio claim its sign says the same as the ratio's side of 1 (mean(x) <
    mean(y) exactly when mean(x - y) < 0). -> (mean difference, low, high); NaNs below 2 seeds."""
    from table import t975
    d = np.asarray(x, dtype=float) - np.asarray(y, dtype=float)
    if len(d) < 2 or np.isnan(d).any():
        return (np.nan,) * 3
    half = t975(len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d))
    return float(d.mean()), float(d.mean() - half), float(d.mean() + half)


def verdict(lo, hi, null, side):
    """The claim says the effect lies `side` ("above" or "below") of `null`. supported: the CI
    [lo, hi] lies entirely on that side; refuted: entirely on the other; else not separable.
    side "either" (a two-sided comparison, TEPO minus the other): TEPO higher or lower."""
    if side not in ("above", "below", "either"):
        raise ValueError(f"side must be 'above', 'below' or 'either', got {side!r}")
    if np.isnan(lo) or np.isnan(hi):
        return "no data"
    above, below = lo > null, hi < null
    if side == "either":
        return "TEPO higher" if above else "TEPO lower" if below else "not separable at this scale"
    if (above and side == "above") or (below and side == "below"):
        return "supported"
    if above or below:
        return "refuted"
    return "not separable at this scale"


def band(matrix, n_boot=BOOT, seed=0):
    """Mean over seeds and the bootstrap 95% band of the mean, per column of a (seeds, steps)
    matrix. -> (mean, low, high), each (steps,)"""
    m = np.asarray(matrix, dtype=float)
    idx = np.random.default_rng(seed).integers(0, m.shape[0], size=(n_boot, m.shape[0]))
    boots = m[idx].mean(axis=1)  # (n_boot, steps)
    lo, hi = np.percentile(boots, [2.5, 97.5], axis=0)
    return m.mean(axis=0), lo, hi


# ----------------------------------------------------------------------------------------------
# per-run numbers


def read_jsonl(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def read_metrics(path):
    """A run's metrics.jsonl: one dict per logged step."""
    return read_jsonl(os.path.join(path, "metrics.jsonl"))


def read_config(path):
    """A run's config.yaml (train.py's resolved config), {} where there is none."""
    import yaml
    if not os.path.exists(os.path.join(path, "config.yaml")):
        return {}
    with open(os.path.join(path, "config.yaml")) as f:
        return yaml.safe_load(f) or {}


def series(rows, key, window=1):
    """{step: value} of `key`, as a trailing mean over `window` logged values when window > 1."""
    pts = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
    if window > 1:
        vals = [v for _, v in pts]
        pts = [(s, float(np.mean(vals[max(0, i - window + 1):i + 1]))) for i, (s, _) in enumerate(pts)]
    return dict(pts)


def steps_to(rows, key, threshold, window, steps):
    """First step at which `key` (trailing mean over `window`) reaches `threshold`; a run that never
    does counts as its length `steps` (a lower bound). -> (steps, reached)"""
    for s, v in sorted(series(rows, key, window).items()):
        if s > 0 and v >= threshold:  # step 0 is the held-out evaluation before RL
            return s, True
    return steps, False


def acting_mean(per_step, key):
    """`key`'s mean over the optimizer steps after the first of their RL step: the only ones where
    pi != pi_old, so where the KL mask, kl_old and the clip can be nonzero. At an RL step's first
    optimizer step pi = pi_old exactly (its old log-probs are the update's own forward, or the old
    pass's of the very same rows: train.old_logprobs), so there log r = 0, kl_old = 0, the mask is
    empty and nothing is clipped: a step's record, the mean over its n optimizer steps, holds n - 1
    acting ones' sum. -> sum_t n_t key_t / sum_t (n_t - 1); NaN without such an optimizer step"""
    num = den = 0.0
    for r in per_step:
        n, v = r.get("actor/optimizer_steps"), r.get(key)
        if n and v is not None:
            num += n * v
            den += n - 1
    return num / den if den else np.nan


def total(per_step, key, fallback=np.nan):
    """`key` summed over the steps that log it; `fallback` where none does."""
    vals = [r[key] for r in per_step if r.get(key) is not None]
    return float(sum(vals)) if vals else fallback


def draws_per_step(cfg):
    """(samples, groups) a run draws per RL step by its config.yaml `cfg`: prompts_per_step x
    group_size and prompts_per_step; None where dynamic sampling may draw again (max_sampling_tries
    > 1) or there is no config: then only train.py's logged counts say."""
    if not cfg or (cfg.get("dynamic_sampling") and cfg.get("max_sampling_tries", 1) > 1):
        return None
    return cfg["prompts_per_step"] * cfg["group_size"], cfg["prompts_per_step"]


def run_summary(rows, steps, threshold, cfg=None):
    """The numbers of one run the tables and claims read; `cfg` (the run's config.yaml) gives the
    draws per step where train.py does not log them. -> {name: float} (NaN when not logged)"""
    evals = [r for r in rows if r.get("eval/accuracy") is not None]
    last, first = (evals[-1] if evals else {}), (evals[0] if evals else {})
    per_step = [r for r in rows if r.get("step", 0) > 0]

    def over(key, f, when=lambda r: True):
        vals = [r[key] for r in per_step if r.get(key) is not None and when(r)]
        return float(f(vals)) if vals else np.nan
    draws = draws_per_step(cfg)
    kept = [r["reward/groups_kept"] for r in per_step if r.get("reward/groups_kept") is not None]
    ent = [r["actor/entropy"] for r in per_step if r.get("actor/entropy") is not None]
    out = {"pass@1_start": first.get("eval/accuracy", np.nan), "pass@1": last.get("eval/accuracy", np.nan),
           "entropy_start": float(np.mean(ent[:TRAIL])) if ent else np.nan,
           "entropy_final": float(np.mean(ent[-TRAIL:])) if ent else np.nan,
           # still changing at the end? the last evaluation's pass@1 minus the one before it
           "pass@1_last_gain": (evals[-1]["eval/accuracy"] - evals[-2]["eval/accuracy"]) if len(evals) > 1 else np.nan,
           "entropy_min": over("actor/entropy", min),
           "log_ratio_max": over("actor/log_ratio_max", max),
           "log_ratio_p999": over("actor/log_ratio_p999", max),
           "kl_old": over("actor/kl_old", np.mean),
           "clip_frac_low": over("actor/clip_frac_low", np.mean),
           "clip_frac_high": over("actor/clip_frac_high", np.mean),
           "s_per_step": over("timing/step", np.mean),
           # the budget: what the run drew and what it trained on
           "samples_drawn": total(per_step, "rollout/samples_drawn", draws[0] * len(per_step) if draws else np.nan),
           # groups with a nonzero advantage: logged, or DAPO's share kept of the groups drawn
           "groups_spread": total(per_step, "rollout/groups_spread", sum(kept) * draws[1] if kept and draws else np.nan),
           "trained_tokens": total(per_step, "actor/trained_tokens"),
           "opt_steps": over("actor/optimizer_steps", sum),
           "opt_per_step": over("actor/optimizer_steps", np.mean),
           "opt_per_step_late": over("actor/optimizer_steps", np.mean, lambda r: r["step"] > steps / 2),
           # where the KL mask and the clip can act (acting_mean) and the steps that have such an
           # optimizer step; the clip fractions of the first steps beside the run's mean
           "acting_steps": over("actor/optimizer_steps", lambda v: np.mean(np.asarray(v) >= 2)),
           "kl_mask_frac": over("actor/kl_mask_frac", np.mean),
           "kl_mask_acting": acting_mean(per_step, "actor/kl_mask_frac"),
           "kl_old_acting": acting_mean(per_step, "actor/kl_old"),
           "clip_low_early": over("actor/clip_frac_low", np.mean, lambda r: r["step"] <= EARLY),
           "clip_high_early": over("actor/clip_frac_high", np.mean, lambda r: r["step"] <= EARLY),
           "clip_low_acting": acting_mean(per_step, "actor/clip_frac_low"),
           "clip_high_acting": acting_mean(per_step, "actor/clip_frac_high")}
    for key, val in last.items():
        if key.startswith("eval/pass@"):
            out[key[5:]] = val          # "pass@k" at the end
    for key, val in first.items():
        if key.startswith("eval/pass@"):
            out[key[5:] + "_start"] = val
    out["steps_to_thr"], out["reached"] = steps_to(rows, "reward/accuracy", threshold, TRAIL, steps)
    out["steps_to_thr_eval"], out["reached_eval"] = steps_to(rows, "eval/accuracy", threshold, 1, steps)
    return out


# ----------------------------------------------------------------------------------------------
# report

# The claims of docs/RESULTS.md: (id, what, variant, baseline, summary key, effect kind, side of null)
CLAIMS = [
    ("C1", "steps to threshold, TEPO / GRPO", "tepo", "grpo", "steps_to_thr", "ratio", "below"),
    ("C1", "steps to threshold, TEPO / DAPO", "tepo", "dapo", "steps_to_thr", "ratio", "below"),
    ("C2", "final entropy, TEPO - GRPO", "tepo", "grpo", "entropy_final", "diff", "above"),
    ("C2", "final entropy, TEPO - DAPO", "tepo", "dapo", "entropy_final", "diff", "above"),
    ("C2", "final entropy, TEPO - TEPO without mask", "tepo", "tepo-nomask", "entropy_final", "diff", "above"),
    ("C2", "final pass@32, TEPO - GRPO", "tepo", "grpo", "pass@32", "diff", "above"),
    ("C2", "final pass@32, TEPO - DAPO", "tepo", "dapo", "pass@32", "diff", "above"),
    ("C2", "final pass@32, TEPO - TEPO without mask", "tepo", "tepo-nomask", "pass@32", "diff", "above"),
    # Supplementary, added after the pilot showed held-out pass@32 at 1.00 before RL (100 problems):
    # pass@4 is where collapse onto fewer solutions can still show on this task.
    ("C2", "final pass@4, TEPO - GRPO (supplementary)", "tepo", "grpo", "pass@4", "diff", "above"),
    ("C2", "final pass@4, TEPO - DAPO (supplementary)", "tepo", "dapo", "pass@4", "diff", "above"),
    ("C2", "final pass@4, TEPO - TEPO without mask (supplementary)", "tepo", "tepo-nomask", "pass@4", "diff", "above"),
    # Added with the entropy-control baselines, under the same rule: TEPO against the methods that
    # regularise entropy on every token alike (the paper's "related entropy regularization methods").
    ("C2", "final entropy, TEPO - Clip-Cov", "tepo", "clipcov", "entropy_final", "diff", "above"),
    ("C2", "final entropy, TEPO - KL-Cov", "tepo", "klcov", "entropy_final", "diff", "above"),
    ("C2", "final entropy, TEPO - GRPO with entropy bonus", "tepo", "grpo-ent", "entropy_final", "diff", "above"),
    ("C2", "final pass@32, TEPO - Clip-Cov", "tepo", "clipcov", "pass@32", "diff", "above"),
    ("C2", "final pass@32, TEPO - KL-Cov", "tepo", "klcov", "pass@32", "diff", "above"),
    ("C2", "final pass@32, TEPO - GRPO with entropy bonus", "tepo", "grpo-ent", "pass@32", "diff", "above"),
    ("C2", "final pass@4, TEPO - Clip-Cov (supplementary)", "tepo", "clipcov", "pass@4", "diff", "above"),
    ("C2", "final pass@4, TEPO - KL-Cov (supplementary)", "tepo", "klcov", "pass@4", "diff", "above"),
    ("C2", "final pass@4, TEPO - GRPO with entropy bonus (supplementary)", "tepo", "grpo-ent", "pass@4", "diff", "above"),
    ("C3", "run's largest p99.9 |log r|, TEPO - GSPO", "tepo", "gspo", "log_ratio_p999", "diff", "below"),
    ("C3", "run's largest max |log r|, TEPO - GSPO (supplementary)", "tepo", "gspo", "log_ratio_max", "diff", "below"),
]


# Per task, as its hypotheses in docs/RESULTS.md were written: the accuracy of C1's steps to
# threshold, and the baselines TEPO is compared with two-sided (the entropy study asks whether
# TEPO differs from the entropy-control methods; the loss study's re-run asked, one-sided, the C2
# question of them).
THRESHOLD = {"chain": 0.6, "shortcut": 0.8}
TWO_SIDED = {"chain": (), "shortcut": ("clipcov", "klcov", "grpo-ent")}


def load_study(out):
    """{variant: {seed: rows}} of the finished runs in OUT, and the study's settings."""
    with open(os.path.join(out, "study.json")) as f:
        settings = json.load(f)
    runs = {}
    for path in sorted(glob.glob(os.path.join(out, "*-s*"))):
        m = re.fullmatch(r"(.+)-s(\d+)", os.path.basename(path))
        if m and m[1] in VARIANTS and is_finished(path):
            runs.setdefault(m[1], {})[int(m[2])] = read_metrics(path)
    order = list(VARIANTS)
    return {v: runs[v] for v in sorted(runs, key=order.index)}, settings


BUDGETS = [("opt_steps", "optimizer steps"), ("samples_drawn", "samples drawn"),
           ("groups_spread", "groups with reward spread"), ("trained_tokens", "tokens in the loss")]


def budget_gaps(summaries, a, b):
    """The budgets (BUDGETS) in which variants a and b differ by more than BUDGET_GAP, mean over
    the seeds they share: [(what, a's, b's)]; what neither logs is left out."""
    seeds = sorted(set(summaries[a]) & set(summaries[b]))
    gaps = []
    for key, what in BUDGETS:
        x = np.mean([summaries[a][s].get(key, np.nan) for s in seeds]) if seeds else np.nan
        y = np.mean([summaries[b][s].get(key, np.nan) for s in seeds]) if seeds else np.nan
        if np.isfinite(x) and np.isfinite(y) and max(x, y) > BUDGET_GAP * min(x, y):
            gaps.append((what, float(x), float(y)))
    return gaps


def times(x, y):
    """x / y as '1.72x'; '∞x' where y is 0."""
    return f"{x / y:.2f}x" if y else "∞x"


def claims_table(summaries, task="chain"):
    """One row per claim present in the data: effect, CI, verdict, seeds, per-seed values. The
    task sets which comparisons are two-sided (TWO_SIDED) and whether C1's ratio is read against
    the paper's "about half" (the loss study's hypothesis; the entropy study has none)."""
    rows = []
    for cid, what, a, b, key, kind, side in CLAIMS:
        if a not in summaries or b not in summaries:
            continue
        if b in TWO_SIDED[task]:
            side = "either"
        seeds = sorted(set(summaries[a]) & set(summaries[b]))
        x = [summaries[a][s].get(key, np.nan) for s in seeds]
        y = [summaries[b][s].get(key, np.nan) for s in seeds]
        effect, lo, hi = paired_effect(x, y, kind)
        null = 1.0 if kind == "ratio" else 0.0
        v = verdict(lo, hi, null, side)
        if len(seeds) < 2 and v != "no data":
            v = "no CI from one seed"
        t_est, t_lo, t_hi = t_interval(x, y)
        tv = verdict(t_lo, t_hi, 0.0, side) if len(seeds) >= 2 else "no CI from one seed"
        note = ""
        if kind == "ratio" and task == "chain" and v not in ("no data", "no CI from one seed"):
            note = "CI contains 0.5" if lo <= 0.5 <= hi else "CI excludes 0.5"
        gaps = budget_gaps(summaries, a, b)
        if gaps:
            note = "; ".join([note] * bool(note) + ["unequal budgets: TEPO " + ", ".join(
                f"{times(x, y)} the other's {what}" for what, x, y in gaps)])
        rows.append({"id": cid, "what": what, "effect": effect, "lo": lo, "hi": hi, "verdict": v,
                     "seeds": seeds, "x": x, "y": y, "kind": kind, "side": side, "null": null, "note": note,
                     "t": (t_est, t_lo, t_hi), "t_verdict": tv})
    return rows


# The entropy study's premise T (docs/RESULTS.md): GRPO collapses, at a price. (what, per-seed
# value from a run's summary, null, side the premise needs)
PREMISE = [
    ("entropy, last 10 steps / first 10", lambda s: s["entropy_final"] / s["entropy_start"], 0.5, "below"),
    ("held-out pass@32, end - start", lambda s: s.get("pass@32", np.nan) - s.get("pass@32_start", np.nan), 0.0, "below"),
    ("held-out pass@1, end - start", lambda s: s["pass@1"] - s["pass@1_start"], 0.0, "above"),
]


def premise_table(per_seed):
    """PREMISE's rows for one variant's {seed: summary}: (what, estimate, low, high, verdict, t
    interval), the verdict "supported" when the bootstrap CI lies on the premise's side, "no data"
    without the measure, "no CI from one seed" below two seeds (a bootstrap of one value has no
    width)."""
    rows = []
    for what, f, null, side in PREMISE:
        x = [f(s) for s in per_seed.values()]
        est, lo, hi = bootstrap_ci(x)
        v = verdict(lo, hi, null, side)
        if len(x) < 2 and v != "no data":
            v = "no CI from one seed"
        t = t_interval(np.asarray(x) - null, np.zeros(len(x)))
        rows.append((what, est, lo, hi, v, (t[0] + null, t[1] + null, t[2] + null)))
    return rows


def premise_status(rows):
    """The premise as a whole: it holds (every row supported), does not hold (every row has a CI
    and one is not on its side), or cannot be read (a row without data or a CI)."""
    if all(r[4] == "supported" for r in rows):
        return "it holds"
    if any(r[4] in ("no data", "no CI from one seed") for r in rows):
        return "it cannot be read (" + ", ".join(sorted({r[4] for r in rows if r[4] != "supported"})) + ")"
    return "it does not hold"


def fmt(est, lo, hi, digits=3):
    if np.isnan(est):
        return "–"
    return f"{est:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def machine():
    cpu = "?"
    if os.path.exists("/proc/cpuinfo"):
        cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if "model name" in ln), "?")
    return f"{os.cpu_count()} cores ({cpu}), Python {platform.python_version()}"


def cpu_totals(out, runs):
    """(CPU seconds, wall seconds) of the base preparation and every launch of the finished runs."""
    cpu = wall = 0.0
    base = os.path.join(out, "base", "DONE")
    if os.path.exists(base):
        with open(base) as f:
            b = json.load(f)
        cpu, wall = cpu + b["cpu_s"], wall + b["wall_s"]
    for variant, seeds in runs.items():
        for seed in seeds:
            for a in read_jsonl(os.path.join(run_dir(out, variant, seed), "attempts.jsonl")):
                cpu, wall = cpu + a["cpu_s"], wall + a["wall_s"]
    return cpu, wall


def plot_name(task, what):
    """docs/study_<what>.png for the chain task, docs/study_<task>_<what>.png for another."""
    return "study_" + ("" if task == "chain" else f"{task}_") + what + ".png"


def curve_name(task, key):
    return plot_name(task, re.sub(r"[^a-z0-9]+", "_", key.lower().replace("@", "")).strip("_"))


def plot_curves(runs, docs_dir, threshold=None, task="chain"):
    """docs/study_<metric>.png per CURVES key logged by some run (the accuracies with the
    steps-to-threshold line), and study_pass_at_k.png (final and initial held-out pass@k against
    k), named by plot_name for the task; a plot of those names not drawn this time is removed
    (no other file: another study's plots stay). -> file names"""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    written = []
    for key, title, window in CURVES:
        fig, ax, drawn = *plt.subplots(figsize=(7, 4.5)), False
        for variant, seeds in runs.items():
            per_seed = [series(rows, key, window) for rows in seeds.values()]
            steps = sorted(set.intersection(*(set(d) for d in per_seed)))
            if not steps:
                continue
            mean, lo, hi = band([[d[s] for s in steps] for d in per_seed])
            line, = ax.plot(steps, mean, label=f"{variant} ({len(per_seed)})", marker="o" if len(steps) < 12 else None)
            ax.fill_between(steps, lo, hi, color=line.get_color(), alpha=0.15)
            drawn = True
        if drawn:
            if threshold is not None and key in ("reward/accuracy", "eval/accuracy"):
                ax.axhline(threshold, color="gray", ls="--", lw=1)
            ax.set_title(f"{title}\nmean over seeds, band = bootstrap 95% CI", fontsize=10)
            ax.set_xlabel("RL step")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
            fig.tight_layout()
            name = curve_name(task, key)
            fig.savefig(os.path.join(docs_dir, name), dpi=90)
            written.append(name)
        plt.close(fig)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for variant, seeds in runs.items():
        ends = [[r for r in rows if r.get("eval/accuracy") is not None] for rows in seeds.values()]
        ks = sorted({int(k[10:]) for e in ends if e for k in e[-1] if k.startswith("eval/pass@")})
        ks = [k for k in ks if all(e and f"eval/pass@{k}" in e[-1] for e in ends)]
        if not ks:
            continue
        mean, lo, hi = band([[e[-1][f"eval/pass@{k}"] for k in ks] for e in ends])
        line, = ax.plot(ks, mean, marker="o", label=f"{variant}, step {ends[0][-1]['step']}")
        ax.fill_between(ks, lo, hi, color=line.get_color(), alpha=0.15)
        start, _, _ = band([[e[0][f"eval/pass@{k}"] for k in ks] for e in ends])
        ax.plot(ks, start, ls=":", color=line.get_color(), alpha=0.6)
    if ax.lines:
        ax.set_xscale("log", base=2)
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.set_xlabel("k")
        ax.set_title("held-out pass@k at the end (solid) and before RL (dotted)\n"
                     "mean over seeds, band = bootstrap 95% CI", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(docs_dir, plot_name(task, "pass_at_k")), dpi=90)
        written.append(plot_name(task, "pass_at_k"))
    plt.close(fig)
    for name in [curve_name(task, key) for key, _, _ in CURVES] + [plot_name(task, "pass_at_k")]:
        if name not in written and os.path.exists(os.path.join(docs_dir, name)):
            os.remove(os.path.join(docs_dir, name))
    return written


def premise_lines(settings, summaries):
    """The entropy study's premise, first in its report (not the chain study's: it has none)."""
    if settings.get("task", "chain") == "chain":
        return []
    if "grpo" not in summaries:
        return ["### The premise: does GRPO collapse, at a price?", "",
                "**It cannot be read: the study has no finished GRPO run.** Every claim below is "
                "tested on a task whose collapse is not shown.", ""]
    rows = premise_table(summaries["grpo"])
    return ["### The premise: does GRPO collapse, at a price?", "",
            "GRPO's runs, mean over seeds with the bootstrap 95% CI and Student's t interval. The premise "
            "holds when the entropy ratio's CI lies below 0.5, pass@32's change below 0 and pass@1's "
            f"above 0: **{premise_status(rows)}**.", "",
            "| measure | estimate [95% CI] | verdict | t interval |", "|---|---|---|---|",
            *[f"| {what} | {fmt(est, lo, hi)} | {v} | {fmt(*t)} |" for what, est, lo, hi, v, t in rows], ""]


def spread(vals, spec=",.2f"):
    """'mean (min–max)' of per-seed values in format `spec`, the range only where it shows;
    '–' without data."""
    x = np.asarray(vals, dtype=float)
    if len(x) == 0 or np.isnan(x).all():
        return "–"
    lo, hi = f"{np.nanmin(x):{spec}}", f"{np.nanmax(x):{spec}}"
    return f"{np.nanmean(x):{spec}}" + (f" ({lo}–{hi})" if hi != lo else "")


def budget_lines(summaries, steps):
    """The budgets per variant, a line per compared pair whose budgets differ (budget_gaps), and
    where the KL mask and the clip can act (acting_mean), as report lines."""
    L = ["### Per variant: the budget", "",
         f"What each variant drew and trained on over its {steps} RL steps: mean over seeds (the "
         "per-seed range in brackets). Samples drawn: train.py's `rollout/samples_drawn`, else "
         "prompts_per_step x group_size a step by the run's config (exact unless dynamic sampling "
         "draws again); groups with reward spread (a nonzero advantage; GRPO's KL term trains "
         "the others too): `rollout/groups_spread`, else DAPO's `reward/groups_kept` x prompts_per_step; tokens in the loss: `actor/trained_tokens`; "
         "optimizer steps: `actor/optimizer_steps`, one per mini-batch with a trained token (train.py "
         "skips the others). –: not logged.", "",
         "| variant | samples drawn | groups with reward spread | optimizer steps per RL step | over the last half "
         "| optimizer steps in all | tokens in the loss |", "|---|---|---|---|---|---|---|"]
    for v, per_seed in summaries.items():
        vals = lambda key: [s.get(key, np.nan) for s in per_seed.values()]  # noqa: E731
        L.append(f"| {v} | {spread(vals('samples_drawn'), ',.0f')} | {spread(vals('groups_spread'), ',.0f')} | "
                 f"{spread(vals('opt_per_step'))} | {spread(vals('opt_per_step_late'))} | "
                 f"{spread(vals('opt_steps'), ',.0f')} | {spread(vals('trained_tokens'), ',.0f')} |")
    pairs = list(dict.fromkeys((a, b) for _, _, a, b, *_ in CLAIMS if a in summaries and b in summaries))
    differ = []
    for a, b in pairs:
        ids = ", ".join(dict.fromkeys(c[0] for c in CLAIMS if (c[2], c[3]) == (a, b)))
        for what, x, y in budget_gaps(summaries, a, b):
            big, small = (a, b) if x > y else (b, a)
            differ.append(f"- **Budgets differ**: {big} takes {times(max(x, y), min(x, y))} the {what} of "
                          f"{small} ({max(x, y):,.0f} against {min(x, y):,.0f}, mean over the seeds they "
                          f"share); the {ids} comparisons between them are not at equal budgets.")
    L += ["", *differ] if differ else ["", f"The budgets of every compared pair are within "
                                            f"{BUDGET_GAP - 1:.0%} of each other (where logged)."]
    L += ["", "### Per variant: where the KL mask and the clip can act", "",
          "At the first optimizer step of an RL step pi = pi_old: kl_old and the KL mask's gradient are "
          "0 and nothing is clipped. A step's logged value is the mean over its optimizer steps, so a run "
          "mean counts those zeros; *where pi ≠ pi_old* is the mean over the optimizer steps after the "
          "first of their RL step (`acting_mean`)." + f" Steps 1-{EARLY}: the mean of the logged values over the first {EARLY} RL steps.", "",
          "| variant | RL steps with ≥ 2 optimizer steps | KL mask, share of trained tokens: run mean "
          "→ where pi ≠ pi_old | kl_old where pi ≠ pi_old | clipped low / high: run mean | steps "
          f"1-{EARLY} | where pi ≠ pi_old |", "|---|---|---|---|---|---|---|"]
    for v, per_seed in summaries.items():
        vals = lambda key: [s.get(key, np.nan) for s in per_seed.values()]  # noqa: E731
        two = lambda a, b: f"{spread(vals(a), '.3f')} / {spread(vals(b), '.3f')}"  # noqa: E731
        L.append(f"| {v} | {spread(vals('acting_steps'), '.0%')} | {spread(vals('kl_mask_frac'), '.3f')} → "
                 f"{spread(vals('kl_mask_acting'), '.3f')} | {spread(vals('kl_old_acting'), '.1e')} | "
                 f"{two('clip_frac_low', 'clip_frac_high')} | {two('clip_low_early', 'clip_high_early')} | "
                 f"{two('clip_low_acting', 'clip_high_acting')} |")
    return L + [""]


def report_lines(out, runs, settings, threshold, pngs, command):
    """The generated part of docs/RESULTS.md, as lines."""
    task = settings.get("task", "chain")
    summaries = {v: {s: run_summary(rows, settings["steps"], threshold, read_config(run_dir(out, v, s)))
                     for s, rows in seeds.items()} for v, seeds in runs.items()}
    cpu, wall = cpu_totals(out, runs)
    n_runs = sum(len(s) for s in runs.values())
    base_log = os.path.join(out, "base", "prepare.log")
    base_acc = re.findall(r"held-out accuracy at T=(\S+): (\S+) on (\d+) problems",
                          open(base_log).read() if os.path.exists(base_log) else "")
    base = (f"; the pre-trained model ({settings['pretrain_steps']} steps of demo.py prepare --task "
            f"{settings.get('task', 'chain')}) is "
            f"right {' and '.join(f'{acc} at T={t}' for t, acc, _ in base_acc)} on {base_acc[0][2]} held-out "
            f"problems" if base_acc else "")
    L = [f"Generated by `bench/study.py report` on {datetime.date.today()} from {n_runs} finished runs "
         f"({', '.join(f'{v}: {len(s)} seeds' for v, s in runs.items())}); machine: {machine()}.", "",
         f"Reproduce: `{command}`", "",
         f"Total CPU time: {cpu / 3600:.2f} CPU-hours, measured (user + system seconds of every launch "
         f"and its children, getrusage; base preparation included), in {wall / 3600:.2f} h of wall "
         f"time summed over launches, {settings['nproc']} process(es) per run.", "",
         f"Setting: {settings['config']} with {settings['set'] or 'no overrides'}, {settings['steps']} RL "
         f"steps{base}. Each number is the mean over seeds with its bootstrap 95% CI [low, high] "
         f"({BOOT:,} resamples of the seeds).", "",
         *premise_lines(settings, summaries),
         *budget_lines(summaries, settings["steps"]),
         "### Per variant: accuracy and speed", "",
         f"| variant | seeds | held-out pass@1: start → end | held-out pass@32: start → end | steps to "
         f"{threshold:.0%}, training batch ({TRAIL}-step mean) | steps to {threshold:.0%}, held-out | pass@1 gain "
         f"over the last evaluation interval | s/step |",
         "|---|---|---|---|---|---|---|---|"]
    stability = ["", "### Per variant: entropy and the size of the updates", "",
                 "| variant | entropy, first 10 steps → last 10 | min entropy | max \\|log r\\| over the run "
                 "| max p99.9 \\|log r\\| over the run | mean kl_old | mean clipped low / high |",
                 "|---|---|---|---|---|---|---|"]
    for v, per_seed in summaries.items():
        vals = lambda key: [s.get(key, np.nan) for s in per_seed.values()]  # noqa: E731
        ci = lambda key, d=3: fmt(*bootstrap_ci(vals(key)), digits=d)  # noqa: E731
        reached = sum(s["reached"] for s in per_seed.values())
        reached_eval = sum(s["reached_eval"] for s in per_seed.values())
        n = len(per_seed)
        start = lambda key, d=3: "–" if np.isnan(np.mean(vals(key))) else f"{np.mean(vals(key)):.{d}f}"  # noqa: E731
        L.append(f"| {v} | {n} | {start('pass@1_start')} → {ci('pass@1')} | "
                 f"{start('pass@32_start')} → {ci('pass@32')} | "
                 f"{ci('steps_to_thr', 0)} ({reached}/{n} reached) | {ci('steps_to_thr_eval', 0)} "
                 f"({reached_eval}/{n}) | {ci('pass@1_last_gain')} | {np.mean(vals('s_per_step')):.2f} |")
        stability.append(f"| {v} | {start('entropy_start', 4)} → {ci('entropy_final', 4)} | {ci('entropy_min', 4)} | {ci('log_ratio_max')} | "
                         f"{ci('log_ratio_p999')} | {ci('kl_old', 5)} | {np.mean(vals('clip_frac_low')):.3f} / "
                         f"{np.mean(vals('clip_frac_high')):.3f} |")
    L += stability
    ks = sorted({int(k[5:]) for ps in summaries.values() for s in ps.values() for k in s
                 if re.fullmatch(r"pass@\d+", k)})
    if ks:
        L += ["", "### Held-out pass@k at the end", "",
              "| variant | " + " | ".join(f"pass@{k}" for k in ks) + " |", "|---|" + "---|" * len(ks)]
        for v, per_seed in summaries.items():
            L.append(f"| {v} | " + " | ".join(fmt(*bootstrap_ci([s.get(f"pass@{k}", np.nan) for s in per_seed.values()]))
                                               for k in ks) + " |")
    L += ["", "### The claims", "",
          "Effect: a difference of means (TEPO minus the other) or a ratio of means (TEPO over the "
          "other), paired by seed. Verdict: *supported* if the 95% CI lies on the claimed side of the "
          "null (0 for a difference, 1 for a ratio), *refuted* if it lies on the other side, else "
          "*not separable at this scale*. A run that never reaches the threshold counts as its length. "
          "Cross-check: the same rule on Student's t 95% interval of the mean per-seed difference "
          "(TEPO minus the other, null 0), which does not under-cover at 4 seeds as the percentile "
          "bootstrap does; where the two verdicts differ, the t one is the safer reading."
          + (" A comparison claimed ≠ 0 is two-sided, as its hypothesis was written: *TEPO higher* or "
             "*TEPO lower* if the CI lies above or below 0." if TWO_SIDED[task] else ""), "",
          "| claim | effect | claimed | estimate [95% CI] | verdict | t check: mean difference [95% CI], verdict "
          "| per seed (TEPO; other) |", "|---|---|---|---|---|---|---|"]
    for c in claims_table(summaries, task):
        claimed = f"{ {'below': '<', 'above': '>', 'either': '≠'}[c['side']]} {c['null']:g}"
        per = "; ".join(f"s{s}: {x:.4g}, {y:.4g}" for s, x, y in zip(c["seeds"], c["x"], c["y"]))
        note = f" ({c['note']})" if c["note"] else ""
        L.append(f"| {c['id']} | {c['what'].replace('|', chr(92) + '|')} | {claimed} | {fmt(c['effect'], c['lo'], c['hi'])} | "
                 f"**{c['verdict']}**{note} | {fmt(*c['t'])}, {c['t_verdict']} | {per} |")
    L += ["", *[f"![{p}]({p})" for p in pngs]]
    return L


def markers(task="chain"):
    """The lines between which `report` writes: the chain study's, or another task's own."""
    name = "generated" if task == "chain" else f"generated {task}"
    return f"<!-- {name}: begin -->", f"<!-- {name}: end -->"


def check_doc(doc, task="chain"):
    """-> the text of `doc`, which must hold the task's begin marker followed by its end marker."""
    begin, end = markers(task)
    with open(doc) as f:
        text = f.read()
    if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
        sys.exit(f"{doc} needs one '{begin}' line followed by one '{end}' line")
    return text


def write_generated(doc, lines, task="chain"):
    """Replace what lies between the task's generated markers of `doc` with `lines`."""
    begin, end = markers(task)
    text = check_doc(doc, task)
    head, rest = text.split(begin)
    _, tail = rest.split(end)
    with open(doc, "w") as f:
        f.write(head + begin + "\n" + "\n".join(lines) + "\n" + end + tail)


def cmd_report(args):
    if not os.path.exists(os.path.join(args.out, "study.json")):
        sys.exit(f"{args.out} holds no study (no study.json): `bench/study.py run --out {args.out}` first")
    runs, settings = load_study(args.out)
    task = settings.get("task", "chain")
    threshold = THRESHOLD[task] if args.threshold is None else args.threshold
    check_doc(args.doc, task)  # before any plot is written
    if not runs:
        sys.exit(f"no finished runs in {args.out}")
    docs_dir = os.path.dirname(os.path.abspath(args.doc))
    pngs = plot_curves(runs, docs_dir, threshold, task)
    seeds = sorted({s for v in runs.values() for s in v})
    run_args = (["--task", task, "--smoke", "--nproc", str(settings["nproc"]),
                 *sum((["--set", s] for s in settings["set"][len(SMOKE["set"]):]), [])]
                if settings["smoke"] else
                ["--task", task, "--seeds", *map(str, seeds), "--steps", str(settings["steps"]),
                 "--variants", *runs, "--nproc", str(settings["nproc"]),
                 "--pretrain-steps", str(settings["pretrain_steps"]), "--base-seed", str(settings["base_seed"]),
                 *sum((["--set", s] for s in settings["set"]), [])])
    command = (f"python bench/study.py run --out {args.out} {shlex.join(run_args)} && "
               f"python bench/study.py report --out {args.out} --threshold {threshold:g}")
    lines = report_lines(args.out, runs, settings, threshold, pngs, command)
    write_generated(args.doc, lines, task)
    print("\n".join(lines))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="prepare the base model, train every (variant, seed)")
    r.add_argument("--out", default=os.path.join(ROOT, "runs", "study"))
    r.add_argument("--task", choices=["chain", "shortcut"], default="chain",
                   help="chain: the loss study's task; shortcut: the entropy study's (demo.py prepare --task)")
    r.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    r.add_argument("--steps", type=int, default=150)
    r.add_argument("--variants", nargs="+", default=[v for v in VARIANTS if v not in OPT_IN],
                   choices=list(VARIANTS))
    r.add_argument("--nproc", type=int, default=2,
                   help="processes per run (torchrun; 1: plain python train.py)")
    r.add_argument("--config", default=CONFIG)
    r.add_argument("--set", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                   help="train.py overrides for every run (several, as train.py's --set)")
    r.add_argument("--base-seed", type=int, default=0, help="seed of the task data and pre-training")
    r.add_argument("--pretrain-steps", type=int, default=None,
                   help="pre-training steps of the base model (default: 800 chain, 600 shortcut)")
    r.add_argument("--base-eval", type=int, default=500, help="held-out problems demo.py measures")
    r.add_argument("--smoke", action="store_true", help="toy size for CI (SMOKE)")
    p = sub.add_parser("report", help="tables, verdicts and plots from the finished runs")
    p.add_argument("--out", default=os.path.join(ROOT, "runs", "study"))
    p.add_argument("--threshold", type=float, default=None,
                   help="accuracy of the steps-to-threshold measure (default: the task's hypothesis, "
                        + ", ".join(f"{v:g} {t}" for t, v in THRESHOLD.items()) + ")")
    p.add_argument("--doc", default=os.path.join(ROOT, "docs", "RESULTS.md"),
                   help="rewritten between its generated markers; plots go to its directory")
    args = ap.parse_args(argv)
    (cmd_run if args.cmd == "run" else cmd_report)(args)


if __name__ == "__main__":
    main()
