"""Does a change leave training unchanged? The demo's RL trajectory of this tree against a commit's.

    python bench/same_trajectory.py --against d5f7c9d [--steps 6] [--work /tmp/same_traj]
        [--set method=grpo ...]

For restructurings, which must change no behaviour. It checks out COMMIT in a git worktree, makes
the demo's data and model once (`demo.py prepare --steps 250`, with this tree's demo.py, so both
sides start from the same files), then runs `configs/demo.yaml` on 2 ranks for --steps RL steps
(prompts_per_step 16, eval_every 0, save_every 0) with each tree's train.py, and compares every
numeric, non-timing metric of metrics.jsonl to a relative 1e-5. A commit from before the grouped
metric names (reward, kl_old, time/step: now reward/mean, actor/kl_old, timing/step) has its
names mapped to today's (FLAT_NAMES) before the comparison. Prints the largest difference
and exits 1 if a value differs (or a key is missing on one side). `--set` adds config overrides
to both runs: `--set method=grpo` also exercises the reference model and the later mini-batches
(its KL term trains every sequence), which the demo's few rewarded groups at 250 SFT steps rarely
reach.
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOLATILE = ("timing/",)  # wall clock: differs between any two runs
# metrics.jsonl's flat names before they were grouped as today (and time/<phase>: timing/<phase>).
FLAT_NAMES = {
    "reward": "reward/mean", "accuracy": "reward/accuracy", "groups_kept": "reward/groups_kept",
    "response_len": "response/length_mean", "response_len_max": "response/length_max",
    "truncated": "response/truncated_frac",
    "entropy": "actor/entropy", "cov_logp_adv": "actor/cov_logp_adv", "kl_old": "actor/kl_old",
    "kl_ref": "actor/kl_ref", "kl_mask_frac": "actor/kl_mask_frac",
    "clip_frac_low": "actor/clip_frac_low", "clip_frac_high": "actor/clip_frac_high",
    "ratio_mean": "actor/ratio_mean", "ratio_min": "actor/ratio_min", "ratio_max": "actor/ratio_max",
    "grad_norm": "actor/grad_norm", "lr": "actor/lr", "optimizer_steps": "actor/optimizer_steps",
    "skipped_updates": "actor/skipped_updates", "mismatch": "mismatch/abs_mean",
    "tokens_per_s": "timing/rollout_tokens_per_s",
    "eval_accuracy": "eval/accuracy", "eval_dropped_long_prompts": "eval/dropped_long_prompts",
}


def run(cmd, cwd):
    print("$", " ".join(cmd), f"(in {cwd})", flush=True)
    subprocess.run(cmd, cwd=cwd, check=True)


def rl_run(tree, demo_dir, out_dir, steps, extra=()):
    shutil.rmtree(out_dir, ignore_errors=True)  # scratch: a fresh start never reuses an out_dir
    overrides = [f"model={demo_dir}/model", f"train_data={demo_dir}/data/train.jsonl",
                 f"eval_data={demo_dir}/data/test.jsonl", f"out_dir={out_dir}", f"steps={steps}",
                 "prompts_per_step=16", "eval_every=0", "save_every=0", *extra]
    run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         "train.py", "--config", "configs/demo.yaml", *[a for o in overrides for a in ("--set", o)]],
        cwd=tree)
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return [renamed(json.loads(line)) for line in f]


def renamed(record):
    """A record in today's metric names: an older train.py's flat ones (reward, kl_old, ...) and
    time/<phase> mapped to their groups; today's names stay as they are."""
    return {("timing/" + k[len("time/"):] if k.startswith("time/") else FLAT_NAMES.get(k, k)): v
            for k, v in record.items()}


def compare(old, new, rel=1e-5, atol=0.0):
    """[(step, key, old value, new value)] of every difference beyond `rel` (relative) and `atol`
    (absolute: metrics that are themselves differences of near-equal log-probs, such as
    mismatch/abs_mean ~5e-7 in fp32, move by their float noise); and the largest relative one."""
    diffs, worst = [], 0.0
    if len(old) != len(new):
        diffs.append(("-", "number of records", len(old), len(new)))
    for a, b in zip(old, new):
        keys = {k for k in a.keys() | b.keys() if not k.startswith(VOLATILE)}
        for k in sorted(keys):
            x, y = a.get(k, "missing"), b.get(k, "missing")
            if isinstance(x, (int, float)) and isinstance(y, (int, float)):
                d = abs(x - y) / max(abs(x), abs(y), 1e-12)
                if math.isfinite(d):
                    worst = max(worst, d)
                if not d <= rel and not abs(x - y) <= atol:
                    diffs.append((a.get("step"), k, x, y))
            elif x != y:
                diffs.append((a.get("step"), k, x, y))
    return diffs, worst


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--against", required=True, help="the commit to compare with")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--work", default="/tmp/same_trajectory", help="scratch directory")
    ap.add_argument("--set", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                    help="config overrides for both runs (several, as train.py's --set)")
    ap.add_argument("--atol", type=float, default=0.0,
                    help="also accept an absolute difference up to this (default 0: relative 1e-5 only)")
    args = ap.parse_args()
    work = os.path.abspath(args.work)
    os.makedirs(work, exist_ok=True)
    old_tree = os.path.join(work, "old_tree")
    if not os.path.isdir(old_tree):
        run(["git", "worktree", "add", "--detach", old_tree, args.against], cwd=ROOT)
    else:
        run(["git", "checkout", "--detach", args.against], cwd=old_tree)
    demo_dir = os.path.join(work, "demo")
    if not os.path.isdir(os.path.join(demo_dir, "model")):
        run([sys.executable, "demo.py", "prepare", "--out", demo_dir, "--steps", "250"], cwd=ROOT)
    old = rl_run(old_tree, demo_dir, os.path.join(work, "rl_old"), args.steps, args.set)
    new = rl_run(ROOT, demo_dir, os.path.join(work, "rl_new"), args.steps, args.set)
    diffs, worst = compare(old, new, atol=args.atol)
    n = sum(1 for r in new for k in r if not k.startswith(VOLATILE))
    print(f"{len(new)} records, {n} values compared against {args.against}; "
          f"largest relative difference {worst:.2e}")
    for d in diffs[:40]:
        print("DIFFERS: step {}, {}: {} vs {}".format(*d))
    absolute = [abs(x - y) for _, _, x, y in diffs if isinstance(x, (int, float)) and isinstance(y, (int, float))]
    if absolute:
        print(f"largest absolute difference among those: {max(absolute):.2e}")
    sys.exit(1 if diffs else 0)


if __name__ == "__main__":
    main()
