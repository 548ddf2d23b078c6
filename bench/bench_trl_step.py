"""Seconds per RL step of TRL's GRPOTrainer on the setting of bench/bench_step.py (issue 8).

TRL is not a dependency of this project: run this in its own venv, never in the project's.

    python3.11 -m venv /work/trl-venv && . /work/trl-venv/bin/activate
    pip install torch==2.13.0                      # the CPU wheel (plain `torch` pulls CUDA)
    pip install "trl==1.16.0" "transformers==5.19.0" sympy pyyaml   # transformers as in the project
    python bench/bench_trl_step.py [--steps 5 --warmup 2]

The setting: a random-weight Qwen2-shape model of 17.8 M parameters (demo.make_tiny_model with
the character tokenizer, vocabulary 128); 8 prompts x 8 samples x up to 128 new tokens per step;
one CPU process, fp32; GRPOTrainer with transformers' generate (no vLLM), loss_type "dapo",
beta 0, temperature 1, one optimizer step per RL step (batch 64 = 8 groups of 8, no gradient
accumulation, one iteration); reward = reward.math_reward. The prompts are bench_step.py's: the
first 8 * (warmup + steps) rows of demo.generate_rows(n, seed=0) in demo.DEMO_TEMPLATE, passed as
plain text (the char tokenizer has no chat template). TRL's default gradient checkpointing is off,
as in train.py (--gradient-checkpointing turns it on). A step is timed from on_step_begin to
on_step_end: generation, reward, loss, backward and optimizer step.

Measure on a quiet machine: when other processes hold the cores, torch's 2 threads wait on each
other in every small op of generate (symptom: generate 5x slower than with --threads 1, CPU time
per step far above wall time x 1 thread). --threads 1 then gives a contention-robust CPU figure.
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoTokenizer, TrainerCallback  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

import demo  # noqa: E402
from reward import math_reward  # noqa: E402
from data import build_prompt  # noqa: E402


def bench_prompts(tokenizer, n):
    """The `n` benchmark rows {"prompt", "answer"}: demo problems of seed 0 in DEMO_TEMPLATE."""
    rows, _ = demo.generate_rows(n, seed=0)
    return [{"prompt": build_prompt(tokenizer, r["problem"], demo.DEMO_TEMPLATE),
             "answer": r["answer"]} for r in rows]


def reward_fn(completions, answer, **_):
    """TRL reward function: the project's math_reward of each completion against its answer."""
    return [math_reward(c, a) for c, a in zip(completions, answer)]


class StepTimer(TrainerCallback):
    """Wall and CPU time of each optimizer step, and the generated tokens TRL logs for it."""

    def __init__(self):
        self.times, self.cpu, self.tokens, self.t0 = [], [], [], None
        self.phase = {"generate": [], "generate+score": []}

    def wrap(self, obj, name, phase):
        """Time every call of obj.name into self.phase[phase] (one call per step here)."""
        fn = getattr(obj, name)

        def timed(*a, **kw):
            t = time.perf_counter()
            out = fn(*a, **kw)
            self.phase[phase].append(time.perf_counter() - t)
            return out
        setattr(obj, name, timed)

    def on_step_begin(self, args, state, control, **kw):
        self.t0 = time.perf_counter(), time.process_time()

    def on_step_end(self, args, state, control, **kw):
        self.times.append(time.perf_counter() - self.t0[0])
        self.cpu.append(time.process_time() - self.t0[1])

    def on_log(self, args, state, control, logs=None, **kw):
        if logs and "completions/mean_length" in logs:
            self.tokens.append(logs["completions/mean_length"] * args.per_device_train_batch_size)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--steps", type=int, default=5, help="measured steps")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--model", default=None, help="model directory (default: a fresh 17.8M one)")
    ap.add_argument("--gradient-checkpointing", action="store_true", help="TRL's default")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    work = tempfile.mkdtemp(prefix="bench_trl_step_")
    model = args.model or demo.make_tiny_model(
        os.path.join(work, "model"), hidden=512, intermediate=1408, layers=6, heads=8, kv_heads=4,
        vocab_size=128, max_positions=1024)
    tokenizer = AutoTokenizer.from_pretrained(model)
    n_steps = args.warmup + args.steps
    data = Dataset.from_list(bench_prompts(tokenizer, 8 * n_steps))

    cfg = GRPOConfig(
        output_dir=os.path.join(work, "run"), use_cpu=True, bf16=False, fp16=False, seed=0,
        per_device_train_batch_size=64, num_generations=8, gradient_accumulation_steps=1,
        num_iterations=1, max_steps=n_steps, max_completion_length=128, temperature=1.0,
        top_p=1.0, top_k=0, loss_type="dapo", beta=0.0, learning_rate=1e-6,
        gradient_checkpointing=args.gradient_checkpointing, logging_steps=1, report_to="none",
        save_strategy="no", disable_tqdm=True)
    timer = StepTimer()
    trainer = GRPOTrainer(model=model, reward_funcs=reward_fn, args=cfg, train_dataset=data,
                          processing_class=tokenizer, callbacks=[timer])
    # The model TRL generates with is trainer.model itself (one process, no wrapper).
    timer.wrap(trainer.model, "generate", "generate")
    timer.wrap(trainer, "_generate_and_score_completions", "generate+score")
    n_params = sum(p.numel() for p in trainer.model.parameters())
    trainer.train()

    times, tokens = timer.times[args.warmup:], timer.tokens[args.warmup:]
    step = statistics.median(times)
    print(f"\nbench_trl_step: TRL GRPOTrainer {n_params / 1e6:.1f}M Qwen2-shape, 8 prompts x 8 "
          f"samples x <=128 tokens, fp32, dapo, beta 0, transformers generate, 1 process, "
          f"{torch.get_num_threads()} torch threads; median of {len(times)} steps after "
          f"{args.warmup} warm-up")
    print("step times (s): " + " ".join(f"{t:.2f}" for t in timer.times))
    gen, gen_score = (timer.phase[k][args.warmup:] for k in ("generate", "generate+score"))
    split = {"generate": gen,  # score: rewards, advantages; update: loss, backward, optimizer
             "score": [b - a for a, b in zip(gen, gen_score)],
             "update": [t - b for b, t in zip(gen_score, times)]}
    print(f"{'phase':<14}{'median s':>10}{'share':>8}")
    for k, v in split.items():
        print(f"{k:<14}{statistics.median(v):>10.3f}{statistics.median(v) / step:>8.1%}")
    print(f"{'step':<14}{step:>10.3f}")
    # On a shared machine, CPU s/step / threads is roughly what a quiet machine's wall time would be
    # (exactly so with 1 thread; with more, threads that wait on a descheduled one burn CPU too).
    print(f"CPU s/step (all threads): {statistics.median(timer.cpu[args.warmup:]):.3f}")
    if tokens:
        tok = statistics.median(tokens)
        print(f"generated tokens/step: {tok:.0f} (mean response {tok / 64:.1f} tokens); "
              f"{tok / step:.0f} generated tokens per second of step")


if __name__ == "__main__":
    main()
