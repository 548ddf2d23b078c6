"""The mismatch corrections on the demo with bf16 sampling: do the metrics move, does it still learn?

    python demo.py prepare --out runs/demo                     # the demo model (~5 minutes)
    python bench/bench_offpolicy.py --demo runs/demo [--steps 40] [--nproc 2]
                                    [--variants none tis mask tis-seq mask-seq] [--set key=value]

Each variant is configs/demo.yaml with the vLLM sampler in bf16 (`dtype: bfloat16`, trainer fp32:
the GPU configs' sampler/trainer split, on a CPU with AVX512-BF16) and one `loss.is_correction`
setting: none | tis | mask (token level) | tis-seq | mask-seq (sequence level), cap C = 2 unless
--set loss.is_cap=... . Same seed, data and budget for all. Prints per variant the mean over steps
of mismatch/abs_mean, mismatch/kl, mismatch/ratio_max (and its max), mismatch/is_weight and
mismatch/masked_frac, and the held-out accuracy at the start and the end (every eval_every steps
on eval_max_problems problems). Each run's metrics.jsonl stays in --work.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

import yaml

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
VARIANTS = {"none": {}, "tis": {"is_correction": "tis"}, "mask": {"is_correction": "mask"},
            "tis-seq": {"is_correction": "tis", "is_level": "sequence"},
            "mask-seq": {"is_correction": "mask", "is_level": "sequence"}}


def get(row, *keys):
    """The first of `keys` in a metrics row (the grouped name, or the older one)."""
    return next((row[k] for k in keys if row.get(k) is not None), None)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--demo", required=True, help="a `demo.py prepare` output: DEMO/model, DEMO/data")
    ap.add_argument("--work", default="runs/bench_offpolicy")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--set", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                    help="extra train.py overrides (several, as train.py's --set)")
    args = ap.parse_args()
    with open(os.path.join(ROOT, "configs", "demo.yaml")) as f:
        base = yaml.safe_load(f)
    base.update(model=os.path.join(args.demo, "model"),
                train_data=os.path.join(args.demo, "data", "train.jsonl"),
                eval_data=os.path.join(args.demo, "data", "test.jsonl"), steps=args.steps,
                dtype="bfloat16", eval_every=10, eval_max_problems=200, save_every=0,
                log_samples_every=0)
    results = {}
    for name in args.variants:
        out = os.path.abspath(os.path.join(args.work, name))
        shutil.rmtree(out, ignore_errors=True)  # scratch: a fresh start never reuses an out_dir
        os.makedirs(out)
        cfg = dict(base, out_dir=out, loss=dict(VARIANTS[name]))
        path = os.path.join(out, "bench.yaml")
        with open(path, "w") as f:
            yaml.safe_dump(cfg, f)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc_per_node={args.nproc}", os.path.join(ROOT, "train.py"), "--config", path]
        for item in args.set:
            cmd += ["--set", item]
        print(f"== {name}: {' '.join(cmd)}", flush=True)
        subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
        with open(os.path.join(out, "metrics.jsonl")) as f:
            results[name] = [json.loads(line) for line in f]

    print(f"\n{args.steps} RL steps of configs/demo.yaml, vLLM sampling in bf16, trainer fp32, "
          f"{args.nproc} processes; means over steps (ratio max: mean | max)")
    print(f"{'variant':<10}{'|d| mean':>10}{'kl k3':>10}{'ratio max':>19}{'is weight':>11}"
          f"{'masked':>9}{'acc start':>11}{'acc end':>9}")
    for name, rows in results.items():
        steps = [r for r in rows if r["step"] > 0 and get(r, "mismatch/kl") is not None]
        def mean(*keys, fmt=".4f"):  # over the steps that logged it; "-" when none did
            vals = [get(r, *keys) for r in steps if get(r, *keys) is not None]
            return format(sum(vals) / len(vals), fmt) if vals else "-"
        evals = [get(r, "eval/accuracy", "eval_accuracy") for r in rows
                 if get(r, "eval/accuracy", "eval_accuracy") is not None]
        rmax = max((get(r, "mismatch/ratio_max") for r in steps), default=float("nan"))
        print(f"{name:<10}{mean('mismatch/abs_mean', 'mismatch', fmt='.2e'):>10}"
              f"{mean('mismatch/kl', fmt='.2e'):>10}{mean('mismatch/ratio_max', fmt='.3f'):>10} | {rmax:<6.3f}"
              f"{mean('mismatch/is_weight'):>11}{mean('mismatch/masked_frac'):>9}"
              f"{evals[0]:>11.3f}{evals[-1]:>9.3f}")


if __name__ == "__main__":
    main()
