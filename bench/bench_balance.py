"""How evenly the ranks share each phase of a step: the busiest rank's work over the mean, by the
rule that deals the sequences (packing.deal), simulated on response lengths (no model, no processes).

    python bench/bench_balance.py [--ranks 8 --prompts 16 --group 8 --lengths lognormal:700:500:3072]
                                  [--equal 0 0.4 0.6] [--methods tepo grpo ...] [--steps 200]

The setting: --ranks ranks, each sampling --prompts prompts x --group responses (lengths drawn as
bench_update.py draws them; prompts of 50-300 tokens), cut into 4 mini-batches as train.py's
make_sequences cuts them. A share --equal of the groups have equal rewards (A = 0: an all-right or
all-wrong group); the others get advantages from rewards of 0 or 1 (so a reward-spread group is
trained whole). What each phase forwards is train.py's, for the method's LossConfig:
  update      per mini-batch, the sequences in the loss (A != 0; all of them where a KL-to-reference
              term or an entropy bonus reads every response: grpo); an optimizer step each
  old pass    one pass per mini-batch past the first (its sequences in the loss, as the update
              forwards them), then one of the rest (A = 0, for the metrics: full_batch_metrics)
  ref pass    grpo: one pass over the sequences in the loss
A phase's work on a rank is the positions its forwards compute (packing.micro_batches at the GPU
config's 32,768 tokens, then computed_tokens). The figure: the busiest rank's work over the mean,
for the update summed over its mini-batches (each waits for its busiest rank: sum of max over sum of
mean), averaged over --steps simulated steps; in brackets the worst step; and the positions the
update and old pass compute over all ranks against those of the groups kept whole (a group split
over ranks computes its prompt once per part). The rules: "sampled"
(every rank keeps what it sampled), "all tokens" (the rule before this bench: whole groups by all
their tokens, largest first to the least-loaded rank), "dealt" (packing.deal, today's).
"""
import argparse
import os
import statistics
import sys

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

import packing  # noqa: E402
import tepo  # noqa: E402
from bench_update import draw_lengths  # noqa: E402  (its response lengths)
from train import Sequence  # noqa: E402

BUDGET = 32768
DEAL_METHODS = ("tepo", "gspo", "drgrpo", "clipcov", "klcov", "dapo", "grpo")


def sample_step(args, lcfg, equal, rng):
    """[rank r's mini-batches], each a list of Sequence, as make_sequences gives them."""
    per_rank = []
    for r in range(args.ranks):
        seqs = []
        for g in range(args.prompts):
            prompt = [0] * int(rng.integers(50, 301))
            if rng.random() < equal:
                rewards = [float(rng.integers(0, 2))] * args.group
            else:  # a reward-spread group: at least one right and one wrong
                rewards = [1.0, 0.0] + rng.integers(0, 2, args.group - 2).astype(float).tolist()
            adv = tepo.group_advantages(__import__("torch").tensor(rewards), args.group).tolist()
            for a, n in zip(adv, draw_lengths(args.lengths, args.group, rng)):
                seqs.append(Sequence((r, g), prompt, [0] * n, a,
                                     in_loss=a != 0 or lcfg.every_response_in_loss, rollout_logp=None))
        per_rank.append([list(p) for p in np.array_split(np.array(seqs, dtype=object), 4)])
    return per_rank


def by_all_tokens(minibatches, world):
    """The rule before: per mini-batch, whole groups by all their tokens, largest first, each to
    the least-loaded rank (kept here to measure against)."""
    out = [[[] for _ in minibatches] for _ in range(world)]
    for k, mb in enumerate(minibatches):
        load = [0] * world
        for g in sorted(packing.groups_of(mb), key=lambda g: (-packing.cost(g), g[0].gid)):
            r = min(range(world), key=lambda r: (load[r], r))
            load[r] += packing.cost(g)
            out[r][k] += g
    return out


def work(seqs):
    """The positions the forwards of `seqs` compute on one rank (micro-batches of BUDGET)."""
    return packing.computed_tokens(packing.micro_batches(seqs, BUDGET)) if seqs else 0


def phases(per_rank, lcfg, full_batch_metrics=True):
    """{phase: busiest over mean} for one step's deal (per_rank[r][k]: rank r's mini-batch k)."""
    ranks = range(len(per_rank))
    upd = [[work([s for s in per_rank[r][k] if s.in_loss]) for r in ranks] for k in range(4)]
    # the old pass: one lock-step pass per later mini-batch (its trained sequences, as the update
    # forwards them), then one of the A = 0 sequences; each waits for its busiest rank
    old = upd[1:] + [[work([s for mb in per_rank[r] for s in mb if not s.in_loss]) if full_batch_metrics
                      else 0 for r in ranks]]
    out = {"update": sum(map(max, upd)) / max(sum(map(statistics.mean, upd)), 1e-9),
           "old pass": sum(map(max, old)) / max(sum(map(statistics.mean, old)), 1e-9),
           "positions": sum(map(sum, upd)) + sum(map(sum, old))}
    if lcfg.needs_ref:
        ref = [work([s for mb in per_rank[r] for s in mb if s.in_loss]) for r in ranks]
        out["ref pass"] = max(ref) / max(statistics.mean(ref), 1e-9)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=16, help="prompts per rank")
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--lengths", default="lognormal:700:500:3072")
    ap.add_argument("--equal", type=float, nargs="+", default=[0.0, 0.4, 0.6])
    ap.add_argument("--methods", nargs="+", default=list(DEAL_METHODS), choices=DEAL_METHODS)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(f"{args.ranks} ranks x {args.prompts} prompts x {args.group} responses, lengths "
          f"{args.lengths}, 4 mini-batches, {args.steps} steps; busiest rank's work / mean "
          f"(mean over steps, worst step in brackets)")
    rules = {"sampled": lambda mbs, w: None, "all tokens": by_all_tokens,
             "dealt": lambda mbs, w: packing.deal(mbs, w)}
    for method in args.methods:
        lcfg = tepo.LossConfig.preset(method, max_new_tokens=3072)
        for equal in args.equal if method != "dapo" else [0.0]:  # DAPO drops equal groups
            rng = np.random.default_rng([args.seed, int(equal * 1000)])
            figures = {rule: {} for rule in rules}
            for _ in range(args.steps):
                per_rank = sample_step(args, lcfg, equal, rng)
                global_mbs = [[s for part in per_rank for s in part[k]] for k in range(4)]
                for rule, fn in rules.items():
                    dealt = fn(global_mbs, args.ranks) or per_rank
                    for phase, x in phases(dealt, lcfg).items():
                        figures[rule].setdefault(phase, []).append(x)
            whole = figures["sampled"].pop("positions")
            for rule, by_phase in figures.items():
                extra = sum(by_phase.pop("positions", whole)) / sum(whole) - 1
                cells = ", ".join(f"{p} {statistics.mean(v):.3f} ({max(v):.2f})" for p, v in by_phase.items())
                print(f"{method:<8} equal {equal:>3.0%}  {rule:<11} {cells}; positions {extra:+.2%}")


if __name__ == "__main__":
    main()
