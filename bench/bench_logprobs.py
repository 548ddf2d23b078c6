"""Peak memory and time of tepo.token_logprobs_entropy against a naive full log_softmax.

    python bench/bench_logprobs.py [--batch 4 --seq 2048 --vocab 151936 --reps 3]

Each path runs forward + backward (log-probs and entropy, as the trainer uses them) on bf16
logits of a Qwen2.5-sized vocabulary, in a fresh subprocess so that its peak resident memory
(ru_maxrss) is its own. "Extra memory" is the peak minus the resident size once the logits exist:
what the computation needs beyond the logits themselves (the logits' gradient included, which
both paths must produce).
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def run_one(path, B, T, V, reps):
    import torch
    from tepo import token_logprobs_entropy

    torch.manual_seed(0)
    logits = torch.randn(B, T, V, dtype=torch.bfloat16).requires_grad_()
    targets = torch.randint(0, V, (B, T))
    weights = torch.randn(B, T)
    base = rss_bytes()

    def naive():
        lp = torch.log_softmax(logits.float(), dim=-1)
        logp = lp.gather(-1, targets[..., None]).squeeze(-1)
        with torch.no_grad():
            entropy = -(lp.exp() * lp).sum(-1)
        return logp, entropy

    fn = naive if path == "naive" else lambda: token_logprobs_entropy(logits, targets)
    times = []
    for _ in range(reps):
        logits.grad = None
        t0 = time.perf_counter()
        logp, entropy = fn()
        (logp * weights).sum().backward()
        times.append(time.perf_counter() - t0)
        del logp, entropy
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"path": path, "extra_bytes": peak - base, "logits_bytes": logits.numel() * 2,
            "seconds": statistics.median(times), "threads": torch.get_num_threads()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--child", choices=["naive", "chunked"], help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(run_one(a.child, a.batch, a.seq, a.vocab, a.reps)))
        return
    res = {}
    for path in ("chunked", "naive"):
        cmd = [sys.executable, __file__, "--child", path, "--batch", str(a.batch), "--seq",
               str(a.seq), "--vocab", str(a.vocab), "--reps", str(a.reps)]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode:
            sys.exit(f"{path} failed (out of memory? try a smaller --batch):\n{out.stderr[-2000:]}")
        res[path] = json.loads(out.stdout.strip().splitlines()[-1])
    gib = 2**30
    print(f"logits ({a.batch} x {a.seq} x {a.vocab}, bf16): {res['naive']['logits_bytes'] / gib:.2f}"
          f" GiB; forward + backward of log-probs and entropy; {res['naive']['threads']} threads")
    print(f"{'path':<10}{'extra memory (GiB)':>20}{'time (s)':>12}")
    for path in ("naive", "chunked"):
        print(f"{path:<10}{res[path]['extra_bytes'] / gib:>20.2f}{res[path]['seconds']:>12.2f}")
    mem = res["chunked"]["extra_bytes"] / res["naive"]["extra_bytes"]
    tim = res["chunked"]["seconds"] / res["naive"]["seconds"]
    print(f"chunked / naive: memory {mem:.3f} (target <= 0.25), time {tim:.2f} (target <= 1.5)")


if __name__ == "__main__":
    main()
