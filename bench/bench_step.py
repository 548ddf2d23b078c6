"""Seconds per RL step of the real train.py loop on a fixed setting, split by phase.

    python bench/bench_step.py [--steps 5 --warmup 2] [--set key=value ...]

The setting (issue 8, the same as the TRL GRPOTrainer reference of 11.3 s/step): a random-weight
Qwen2-shape model of 17.8 M parameters (vocabulary 128 with the character tokenizer, hidden 512,
intermediate 1408, 6 layers, 8 heads, 4 KV heads, tied embeddings); 8 prompts x 8 samples x up to
128 new tokens; one process, fp32, `tepo` loss, one mini-batch; vLLM rollout, grading, old
log-probs, update, weight sync. Prompts are the demo task's (arithmetic word problems with
demo.DEMO_TEMPLATE, ~75 characters, one token each); bench/bench_trl_step.py builds the very same
ones for TRL. It runs train.main itself and reads the per-phase times train.py logs to
metrics.jsonl.

A random model earns reward 0 from the real grader on every sample, so every advantage is 0 and
train.py skips the update (exactly: such a batch has no gradient). `--reward toy` (1.0 when the
response contains a '7') gives groups reward spread, so the update runs as in a real step; TRL's
GRPOTrainer runs its backward pass in both cases. Report both.

Two options change the setting and are reported as such: `--set dtype=bfloat16` samples in bf16
(the trainer stays fp32, as on GPUs; this CPU has AVX512-BF16) and `--set full_batch_metrics=false`
skips the no-grad forward that only measures entropy on the A = 0 samples.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

import yaml  # noqa: E402

from demo import DEMO_TEMPLATE, generate_rows, make_tiny_model  # noqa: E402

PHASES = ("rollout", "reward", "old_logprobs", "update", "sync")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--steps", type=int, default=5, help="measured steps")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--set", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                    help="extra train.py overrides (several pairs, or the flag repeated)")
    ap.add_argument("--reward", choices=("math", "toy"), default="math",
                    help="math: reward.py (all 0 on a random model); toy: '7' in the response")
    args = ap.parse_args()
    work = args.workdir or tempfile.mkdtemp(prefix="bench_step_")
    model = make_tiny_model(os.path.join(work, "model"), hidden=512, intermediate=1408, layers=6,
                            heads=8, kv_heads=4, vocab_size=128, max_positions=1024)
    rows, _ = generate_rows(8 * (args.steps + args.warmup), seed=0)
    data = os.path.join(work, "prompts.jsonl")
    with open(data, "w") as f:
        for r in rows:
            f.write(json.dumps({"problem": r["problem"], "answer": r["answer"]}) + "\n")
    cfg = dict(model=model, train_data=data, out_dir=os.path.join(work, "run"), method="tepo",
               prompt_template=DEMO_TEMPLATE,
               steps=args.steps + args.warmup, prompts_per_step=8, group_size=8,
               max_prompt_len=256, max_new_tokens=128, temperature=1.0, num_minibatches=1,
               micro_batch_tokens=65536, lr=1e-6, backend="vllm", dtype="float32",
               log_samples_every=0, save_every=0, seed=0)
    cfg_path = os.path.join(work, "bench.yaml")
    with open(cfg_path, "w") as f:
        yaml.safe_dump(cfg, f)

    import reward
    import train
    if args.reward == "toy":
        reward.math_reward = lambda response, gold, **kw: float("7" in response)
    train.main(["--config", cfg_path, *sum((["--set", s] for s in args.set), [])])

    with open(os.path.join(cfg["out_dir"], "metrics.jsonl")) as f:
        recs = [json.loads(line) for line in f][args.warmup:]
    med = lambda key: statistics.median(r[key] for r in recs)  # noqa: E731
    step = med("timing/step")
    print(f"\nbench_step: 17.8M Qwen2-shape, 8 prompts x 8 samples x <=128 tokens, fp32, tepo, "
          f"1 mini-batch, 1 process; median of {len(recs)} steps after {args.warmup} warm-up")
    print(f"{'phase':<14}{'median s':>10}{'share':>8}")
    for p in PHASES:
        print(f"{p:<14}{med('timing/' + p):>10.3f}{med('timing/' + p) / step:>8.1%}")
    print(f"{'step':<14}{step:>10.3f}")
    print(f"reward {args.reward}: {med('reward/mean'):.3f} mean; "
          f"{statistics.mean(r['actor/optimizer_steps'] for r in recs):.1f} optimizer steps per RL step")
    print(f"generated tokens/s (rollout phase): {med('timing/rollout_tokens_per_s'):.0f}; "
          f"mean response length {med('response/length_mean'):.1f} tokens; "
          f"TRL GRPOTrainer reference 11.3 s/step -> {11.3 / step:.2f}x")


if __name__ == "__main__":
    main()
