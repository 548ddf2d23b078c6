"""The deal's own cost (packing.balance_ranks): the bytes each rank receives and the seconds it
spends pickling and unpickling, per step, before (every sequence gathered on every rank) and now
(the deal's sizes gathered, each sequence sent once, to its rank), in one process (no network:
the bytes are what a rank's collectives carry, the seconds its own CPU's).

    python bench/bench_deal.py [--ranks 8 --prompts 128 --group 8 --scale 1 8 --repeats 3]

The step: --prompts x --group responses over --ranks ranks (--prompts / --ranks prompts each, as
train.py samples them), as train.Sequence objects as balance_ranks gets them from make_sequences:
prompt and response token ids (lists of ints, uniform over Qwen2.5's 151,936 ids), the advantage,
in_loss, and rollout_logp, an fp32 (R,) tensor (old_logp and the rest are filled after the deal).
Prompts of --prompt-len +- 100 tokens (uniform), responses log-normal with mean --response-len (sd
0.25 x it) capped at --max-new-tokens, a share --equal of the groups with equal rewards (out of the
loss). --scale multiplies the prompts (8: 1,024 prompts x 8). Per rank, the busiest (each rank
waits for the slowest at the next collective):
  before  pickle its mini-batches (all_gather_object), receive every rank's (padded to the largest,
          as all_gather_object does), unpickle all of them, deal
  now     pickle its sizes (sizes_of), receive every rank's, unpickle them, deal placeholders,
          pickle each rank's parcel (parcels), receive its own parcels, unpickle them (unpack)
The deal's rule (packing.deal) runs in both; its seconds are shown apart. Times are CPU seconds,
the least of --repeats runs.
"""
import argparse
import os
import pickle
import sys
import time

import numpy as np
import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

import packing  # noqa: E402
from train import Sequence  # noqa: E402

VOCAB = 151936
MiB = 2 ** 20
# A rank's CPU seconds per MiB it receives, and the rule's per sequence (both ways run it), as
# this script measured them at the paper's shape on a 2-core Xeon (2026-11-25): before 0.336 s
# for 18.8 MiB, now 0.032 s for 2.27 MiB, the rule 0.005 s for 1,024 sequences (at 8x the batch
# 0.023 and 0.018 s per MiB, 5.6e-6 s per sequence). gpu_plan's deal line (traffic x these).
SECONDS_PER_MIB = {"before": 0.018, "now": 0.014}
RULE_SECONDS_PER_SEQUENCE = 5e-6


def step_batch(ranks, prompts, group, resp_len, max_new, equal, prompt_len=150, minibatches=4, seed=0):
    """[rank r's mini-batches]: make_sequences' output on each rank (see the module docstring)."""
    rng = np.random.default_rng(seed)
    sigma2 = np.log(1 + 0.25 ** 2)
    per_rank = []
    for r in range(ranks):
        seqs = []
        for g in range(prompts // ranks):
            prompt = rng.integers(0, VOCAB, int(rng.integers(max(prompt_len - 100, 1), prompt_len + 101))).tolist()
            lens = np.clip(np.rint(rng.lognormal(np.log(resp_len) - sigma2 / 2, np.sqrt(sigma2), group)),
                           1, max_new).astype(int)
            flat = rng.random() < equal
            for j, n in enumerate(lens):
                adv = 0.0 if flat else (1.0 if j % 2 else -1.0)
                seqs.append(Sequence((r, g), prompt, rng.integers(0, VOCAB, int(n)).tolist(), adv,
                                     in_loss=adv != 0,
                                     rollout_logp=torch.from_numpy(-rng.random(int(n), dtype=np.float32))))
        per_rank.append([[seqs[i] for i in idx] for idx in np.array_split(np.arange(len(seqs)), minibatches)])
    return per_rank


def timed(fn):
    """fn's result and the CPU seconds it took (process time: on a shared machine, wall time would
    count the other processes' turns too; the work here is single-threaded)."""
    t0 = time.process_time()
    out = fn()
    return out, time.process_time() - t0


def before(per_rank):
    """The gather of before, per rank: {"bytes": received, "seconds": pickling + unpickling} (the
    busiest rank's), and the deal's seconds."""
    W = len(per_rank)
    blobs, pickling = zip(*(timed(lambda: pickle.dumps(mine)) for mine in per_rank))
    everyone, unpickling = timed(lambda: [pickle.loads(b) for b in blobs])  # every rank does this
    global_mbs = [[s for mine in everyone for s in mine[k]] for k in range(len(everyone[0]))]
    _, dealing = timed(lambda: packing.deal(global_mbs, W))
    return {"bytes": W * max(map(len, blobs)), "seconds": max(pickling) + unpickling, "deal": dealing,
            "batch bytes": sum(map(len, blobs))}


def now(per_rank):
    """The same, by balance_ranks' parts as it runs them (sizes_of, placeholders, deal, parcels,
    unpack), with a check that every rank ends with what the gather of before gives it."""
    W = len(per_rank)
    sizes, pickling = zip(*(timed(lambda: pickle.dumps(packing.sizes_of(mine))) for mine in per_rank))
    everyone, unpickling = timed(lambda: [pickle.loads(b) for b in sizes])
    dealt, dealing = timed(lambda: packing.deal(packing.placeholders(everyone), W))
    sent, packing_s = zip(*(timed(lambda: packing.parcels(per_rank[r], dealt, r)) for r in range(W)))
    got, unpacking = zip(*(timed(lambda: packing.unpack(per_rank[r], dealt, r, [sent[src][r] for src in range(W)]))
                           for r in range(W)))
    received = [W * max(map(len, sizes)) + sum(len(sent[src][r]) for src in range(W)) for r in range(W)]
    seconds = [pickling[r] + unpickling + packing_s[r] + unpacking[r] for r in range(W)]
    return {"bytes": max(received), "seconds": max(seconds), "deal": dealing, "result": got}


def traffic(per_rank):
    """The busiest rank's bytes received in one step, {"before": ..., "now": ...}, as before() and
    now() count them, without timing anything (gpu_plan's)."""
    W = len(per_rank)
    sizes = [packing.sizes_of(mine) for mine in per_rank]
    dealt = packing.deal(packing.placeholders(sizes), W)
    sent = [packing.parcels(per_rank[r], dealt, r) for r in range(W)]
    gathered = W * max(len(pickle.dumps(x)) for x in sizes)
    return {"before": W * max(len(pickle.dumps(mine)) for mine in per_rank),
            "now": max(gathered + sum(len(sent[src][r]) for src in range(W)) for r in range(W))}


def same_result(got, per_rank):
    """Whether each rank's mini-batches (`got`) are those the gather of before deals it, sequence
    by sequence in order (compared by their values: token ids, advantage, log-probs)."""
    W = len(per_rank)
    want = packing.deal([[s for mine in per_rank for s in mine[k]] for k in range(len(per_rank[0]))], W)
    key = lambda s: (s.gid, s.prompt, s.resp, s.adv, s.in_loss, s.rollout_logp.tolist())  # noqa: E731
    return all([[key(s) for s in mb] for mb in got[r]] == [[key(s) for s in mb] for mb in want[r]]
               for r in range(W))


def measure(ranks, prompts, group, resp_len, max_new, equal, prompt_len=150, repeats=3, check=True):
    """The deal's cost at one step's shape (step_batch) -> {"before": {...}, "now": {...}, "batch":
    {"sequences", "tokens" (mean per sequence), "bytes" (the batch pickled)}, "same": bool or None},
    each of before/now with the busiest rank's "bytes" received and "seconds" of pickling and
    unpickling, and "deal", the rule's seconds; the least of `repeats` runs. `check`: whether
    every rank's result is compared with the way of before's (same_result)."""
    per_rank = step_batch(ranks, prompts, group, resp_len, max_new, equal, prompt_len)
    seqs = [s for mine in per_rank for mb in mine for s in mb]
    old = min((before(per_rank) for _ in range(repeats)), key=lambda x: x["seconds"])
    new = min((now(per_rank) for _ in range(repeats)), key=lambda x: x["seconds"])
    got = new.pop("result")
    return {"before": old, "now": new, "same": same_result(got, per_rank) if check else None,
            "batch": {"sequences": len(seqs), "bytes": old["batch bytes"],
                      "tokens": sum(len(s.prompt) + len(s.resp) for s in seqs) / len(seqs)}}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=128)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=150)
    ap.add_argument("--response-len", type=int, default=2300)
    ap.add_argument("--max-new-tokens", type=int, default=3072)
    ap.add_argument("--equal", type=float, default=0.4)
    ap.add_argument("--scale", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    for scale in args.scale:
        m = measure(args.ranks, args.prompts * scale, args.group, args.response_len, args.max_new_tokens,
                    args.equal, args.prompt_len, args.repeats)
        old, new, batch = m["before"], m["now"], m["batch"]
        print(f"{args.prompts * scale} prompts x {args.group} on {args.ranks} ranks ({batch['sequences']} "
              f"sequences, mean {batch['tokens']:.0f} tokens each, the batch {batch['bytes'] / MiB:.1f} MiB "
              f"pickled); per rank and step, the busiest:")
        print(f"  before  received {old['bytes'] / MiB:7.2f} MiB, pickling + unpickling {old['seconds']:.3f} s")
        print(f"  now     received {new['bytes'] / MiB:7.2f} MiB, pickling + unpickling {new['seconds']:.3f} s; "
              f"the same mini-batches on every rank: {m['same']}")
        rule = min(old['deal'], new['deal'])
        print(f"  the deal's rule (both) {rule:.3f} s; per MiB received: before {old['seconds'] / old['bytes'] * MiB:.4f} s, "
              f"now {new['seconds'] / new['bytes'] * MiB:.4f} s; the rule per sequence {rule / batch['sequences']:.1e} s")


if __name__ == "__main__":
    main()
