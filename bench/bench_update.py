"""The old-log-prob pass and the update of one RL step, on response lengths drawn from a named
distribution: the micro-batch layout in use against the per-group layout, in the same run.

    python bench/bench_update.py --lengths lognormal:88:62:384 [--repeats 3]
    python bench/bench_update.py --lengths uniform:128
    python bench/bench_update.py --lengths lognormal:700:500:3072 --ranks 8 --plan-only
    python bench/bench_update.py --lengths uniform:128 --methods dapo clipcov klcov

The setting: bench_step.py's random 17.8 M-parameter Qwen2-shape model (vocabulary 128, hidden
512, 6 layers), 64 responses in groups of 8 to its demo prompts (~75 tokens), one process, fp32,
`tepo`, every response trained (advantages != 0), 4 mini-batches (so the old pass runs on 3 of
them; the first is its own old pass), micro_batch_tokens 4096 (the GPU config's 32,768 over its
3,072-token cap, times the CPU cap here). Response lengths: `lognormal:MEAN:SD:CAP`, a log-normal
with that mean and standard deviation, rounded, at least 1, capped at CAP (the 700/500/3,072 shape
of early Qwen2.5-Math responses divided by 8 is 88:62:384), or `uniform:CAP`, uniform on 1..CAP
(bench_step's random model: its responses run to ~the cap); random token ids of those lengths.

Layouts: "packed" is train.py's (each prompt once, then its responses, several prompts per row,
no padding: packing.segment_attention); "grouped" is the per-group layout of before (one prompt's
responses padded to the longest; micro_batch_layout=grouped). Timed in turn, --repeats times, the
median reported.

Padded/real: the positions a layout computes (packing.computed_tokens, padding included) over the
real ones (each sequence's prompt and response tokens; a prompt counted once per micro-batch that
runs it once), over the step's passes. The rank balance (--ranks N, no timing): N ranks of 64
responses each, the busiest rank's real tokens over the mean, as sampled (each rank its own
prompts) and after packing.balance_ranks' dealing (without launching N processes: the same rule).

--methods A B ...: instead of the two layouts, these methods' steps in train.py's layout, timed in
turn (e.g. dapo against clipcov and klcov, whose selection of tokens over the mini-batch costs a
forward pass without grad per mini-batch: the cost of `cov_batch: minibatch`).
"""
import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from types import SimpleNamespace

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

import torch  # noqa: E402

import packing  # noqa: E402
import checkpoint  # noqa: E402
import policy  # noqa: E402
import ranks  # noqa: E402
import train  # noqa: E402
from demo import DEMO_TEMPLATE, generate_rows, make_tiny_model  # noqa: E402

GROUP, RESPONSES = 8, 64


def draw_lengths(spec, n, rng):
    """n response lengths from `lognormal:MEAN:SD:CAP` or `uniform:CAP`."""
    kind, *nums = spec.split(":")
    if kind == "lognormal" and len(nums) == 3:
        mean, sd, cap = float(nums[0]), float(nums[1]), int(nums[2])
        sigma2 = math.log(1 + (sd / mean) ** 2)
        x = rng.lognormal(math.log(mean) - sigma2 / 2, math.sqrt(sigma2), n)
        return np.clip(np.rint(x), 1, cap).astype(int).tolist()
    if kind == "uniform" and len(nums) == 1:
        return rng.integers(1, int(nums[0]) + 1, n).tolist()
    raise SystemExit(f"--lengths: expected lognormal:MEAN:SD:CAP or uniform:CAP, got {spec!r}")


def make_batch(spec, seed, tokenizer, rank=0):
    """64 Sequences (8 prompts x 8 responses) with advantages != 0, as make_sequences gives them."""
    rng = np.random.default_rng([seed, rank])
    rows, _ = generate_rows(RESPONSES // GROUP, seed=seed + rank)
    seqs = []
    for i, n in enumerate(draw_lengths(spec, RESPONSES, rng)):
        prompt = tokenizer(DEMO_TEMPLATE.replace("{problem}", rows[i // GROUP]["problem"])).input_ids
        seqs.append(train.Sequence((rank, i // GROUP), prompt, rng.integers(2, 100, n).tolist(),
                                   float(rng.standard_normal()) or 0.5, True, torch.zeros(n)))
    return seqs


def minibatches(seqs, k=4):
    """make_sequences' split: k consecutive parts."""
    return [seqs[len(seqs) * j // k: len(seqs) * (j + 1) // k] for j in range(k)]


def step_passes(seqs):
    """The sequence sets of one step's forwards: the old pass (mini-batches 1-3), then each
    mini-batch's update (the first is its own old pass)."""
    mbs = minibatches(seqs)
    return [[s for mb in mbs[1:] for s in mb]] + mbs


def padded_over_real(seqs, cfg):
    """(computed, real) positions over one step's passes in cfg's layout: packing.computed_tokens
    (padding included) against each sequence's prompt and response tokens, a prompt counted once
    per micro-batch that runs it once (and per row where every row holds a copy)."""
    rows = cfg.activation_checkpointing and cfg.micro_batch_layout == "grouped"
    computed = real = 0
    for part in step_passes(seqs):
        mbs = packing.micro_batches(part, cfg.micro_batch_tokens, cfg.micro_batch_layout)
        computed += packing.computed_tokens(mbs, cfg.micro_batch_layout, rows)
        for mb in mbs:
            real += sum(len(s.resp) for s in mb) + (sum(len(s.prompt) for s in mb) if rows
                                                    else sum({s.gid: len(s.prompt) for s in mb}.values()))
    return computed, real


def time_step(run, seqs):
    """Seconds of old_logprobs + update_policy for one RL step on fresh copies of `seqs`."""
    fresh = [train.Sequence(s.gid, s.prompt, s.resp, s.adv, True, s.rollout_logp) for s in seqs]
    mbs = minibatches(fresh)
    t0 = time.perf_counter()
    train.old_logprobs(run, minibatches=mbs)
    train.update_policy(run, minibatches=mbs, step=0)
    return time.perf_counter() - t0


def rank_balance(spec, ranks, seed, tokenizer):
    """The busiest rank's tokens over the mean (worst mini-batch; each prompt once): as each rank
    sampled its own prompts, and as packing.deal (balance_ranks' rule) deals them."""
    per_rank = [minibatches(make_batch(spec, seed, tokenizer, r)) for r in range(ranks)]
    tokens = lambda ss: sum(len(s.resp) for s in ss) + sum({s.gid: len(s.prompt) for s in ss}.values())  # noqa: E731
    worst = lambda loads: max(loads) / statistics.mean(loads)  # noqa: E731
    before = max(worst([tokens(mbs[k]) for mbs in per_rank]) for k in range(4))
    dealt = packing.deal([[s for mbs in per_rank for s in mbs[k]] for k in range(4)], ranks)
    after = max(worst([tokens(d[k]) for d in dealt]) for k in range(4))
    return before, after


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--lengths", default="lognormal:88:62:384")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--micro-batch-tokens", type=int, default=4096)
    ap.add_argument("--activation-checkpointing", action="store_true",
                    help="as the GPU config: no KV cache, so the grouped layout copies the prompt per row")
    ap.add_argument("--ranks", type=int, default=8, help="ranks simulated for the balance figure")
    ap.add_argument("--plan-only", action="store_true", help="padding and balance only, no timing")
    ap.add_argument("--methods", nargs="+", help="time these methods (packed layout) instead of the layouts")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="bench_update_")
    cap = int(args.lengths.split(":")[-1])
    path = make_tiny_model(os.path.join(work, "model"), hidden=512, intermediate=1408, layers=6,
                           heads=8, kv_heads=4, vocab_size=128, max_positions=max(1024, cap + 256))
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(path)
    base = dict(model=path, train_data="unused", method="tepo", num_minibatches=4, lr=1e-6,
                micro_batch_tokens=args.micro_batch_tokens, temperature=1.0,
                activation_checkpointing=args.activation_checkpointing)
    # grouped: the layout of before, one prompt's responses padded to the longest (its prompt
    # shared through the KV cache, or, under activation checkpointing, copied into every row)
    cfgs = {"packed": train.Config(**base), "grouped": train.Config(**base, micro_batch_layout="grouped")}
    if args.methods:
        cfgs = {m: train.Config(**{**base, "method": m}) for m in args.methods}
    seqs = make_batch(args.lengths, args.seed, tokenizer)
    lens = [len(s.resp) for s in seqs]
    print(f"bench_update: {RESPONSES} responses in groups of {GROUP}, lengths {args.lengths}: mean "
          f"{statistics.mean(lens):.1f}, max {max(lens)}; prompts {len(seqs[0].prompt)} tokens; "
          f"micro_batch_tokens {args.micro_batch_tokens}; 4 mini-batches; fp32, 1 process"
          + ("; activation checkpointing" if args.activation_checkpointing else ""))
    ratio = {}
    for name, cfg in cfgs.items():
        if args.methods:
            break
        comp, real = padded_over_real(seqs, cfg)
        ratio[name] = comp / real
        print(f"{name:<8} computed positions {comp}, real {real}")
    before, after = rank_balance(args.lengths, args.ranks, args.seed, tokenizer)
    print(f"rank balance over {args.ranks} simulated ranks (busiest rank's tokens / mean, worst "
          f"mini-batch): as sampled {before:.3f}, dealt by balance_ranks {after:.3f}")
    if args.plan_only:
        print(f"padded/real {ratio['packed']:.3f} (grouped {ratio['grouped']:.3f})")
        return
    ranks.setup_distributed()
    torch.manual_seed(0)
    times = {name: [] for name in cfgs}
    runs = {}
    for name, cfg in cfgs.items():
        model = policy.load_policy(path, cfg, torch.device("cpu"))
        runs[name] = SimpleNamespace(cfg=cfg, model=model, ref_model=None, device=torch.device("cpu"), rank=0, world=1,
                                     optimizer=torch.optim.AdamW(model.parameters(), lr=cfg.lr),
                                     state=checkpoint.TrainState())
    for name in cfgs:  # warm-up
        time_step(runs[name], seqs)
    for _ in range(args.repeats):
        for name in cfgs:
            times[name].append(time_step(runs[name], seqs))
    for name in cfgs:
        print(f"{name:<8} seconds {' '.join(f'{t:.2f}' for t in times[name])}")
    med = {name: statistics.median(t) for name, t in times.items()}
    if args.methods:
        first = args.methods[0]
        print("seconds " + ", ".join(f"{m} {med[m]:.2f} ({med[m] / med[first]:.2f}x {first})" for m in med))
        return
    print(f"speed-up over the grouped layout: {med['grouped'] / med['packed']:.2f}x")
    print(f"padded/real {ratio['packed']:.3f} (grouped {ratio['grouped']:.3f})")
    print(f"seconds {med['packed']:.2f} (grouped {med['grouped']:.2f})")


if __name__ == "__main__":
    main()
