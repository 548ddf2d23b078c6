"""Memory of one packed forward + backward, by row length: does it grow linearly with T?

    python bench/bench_packed_memory.py [--tokens 4096 8192 16384 32768] [--kernel sdpa|flex]
                                        [--tree DIR]   # another checkout's code (today's, before)

The setting: a random Qwen2-shape model (hidden 256, 4 layers, 4 heads of 64, 2 KV heads, the
character vocabulary of 128, so that logits are small and attention's own memory shows), with
activation checkpointing, as the GPU configs train; one packed row of T tokens (prompts of 150
tokens, each with 8 responses of (T / n_groups - 150) / 8 tokens: groups of ~2k tokens), made by the
project's own collate, through tepo.response_logprobs and a backward of the log-probs' sum. Each T
runs in a fresh process; the figure is the peak resident memory of the forward + backward above
that process's peak before it (imports, model, batch), on the CPU. Linear growth: peak(32k) /
peak(8k) near 4. A (T, T) tensor anywhere (a mask, scores) shows as quadratic growth: a bool
(1, 1, T, T) mask is 1 GiB at T = 32,768.

--tree runs the same measurement with the code of another checkout (the packed path as it was
there: its collate and its attention), for a before/after in one run.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def child(T, kernel):
    """In a fresh process, with the checkout's code on sys.path: print {"T", "peak_mib"}."""
    import torch
    import demo
    import tepo
    try:
        import packing
        collate = packing.collate
        use = (lambda m: packing.use_packed_attention(m, kernel)) if hasattr(packing, "use_packed_attention") \
            else packing.use_segment_attention
        Seq = __import__("train").Sequence
    except ImportError:  # a checkout from before packing.py: the same functions in train / tepo
        import train
        collate, use, Seq = train.collate, tepo.use_segment_attention, train.Sequence
    from transformers import AutoModelForCausalLM
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as d:
        path = demo.make_tiny_model(d, hidden=256, layers=4, heads=4, kv_heads=2, intermediate=512,
                                    vocab_size=128, max_positions=4096)
        model = use(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32))
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    groups, prompt = max(1, T // 2048), 150
    resp = (T // groups - prompt) // 8
    seqs = [Seq((0, g), [3] * prompt, [4 + (i % 50)] * resp, 1.0, True, torch.zeros(resp))
            for g in range(groups) for i in range(8)]
    batch = collate(seqs, torch.device("cpu"))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    logp, _ = tepo.response_logprobs(model, batch, 1.0, False)
    logp.sum().backward()
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"T": batch["ids"].shape[1], "peak_mib": (after - before) / 1024}))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--tokens", type=int, nargs="+", default=[4096, 8192, 16384, 32768])
    ap.add_argument("--kernel", default="sdpa", choices=("sdpa", "flex"))
    ap.add_argument("--tree", default=ROOT, help="the checkout whose code is measured")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.child, args.kernel)
    tree = os.path.abspath(args.tree)
    env = {**os.environ, "PYTHONPATH": tree, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    rows = []
    for T in args.tokens:
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", str(T), "--kernel",
                              args.kernel], cwd=tree, env=env, capture_output=True, text=True)
        if out.returncode:
            raise SystemExit(f"T = {T} failed:\n{out.stderr[-2000:]}")
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    base = dict(zip(args.tokens, (r["peak_mib"] for r in rows))).get(8192, rows[0]["peak_mib"])
    print(f"code of {tree} (kernel {args.kernel}); one packed forward + backward, activation checkpointing")
    print(f"{'T':>7} {'peak above the model (MiB)':>28} {'/ peak at 8k':>14}")
    for r in rows:
        print(f"{r['T']:>7} {r['peak_mib']:>28.0f} {r['peak_mib'] / base:>14.2f}")


if __name__ == "__main__":
    main()
