"""Memory of one packed forward + backward (the update's micro-batch), by row length and by the way
log-probs come out of the model.

    python bench/bench_packed_memory.py [--tokens 4096 8192 16384 32768] [--kernel sdpa|flex]
                                        [--shape tiny|1.5b] [--layers N] [--dtype float32|bfloat16]
                                        [--lm-head chunked logits] [--device cpu|cuda]
                                        [--tree DIR]   # another checkout's code (today's, before)

Two shapes. `tiny` (the default, attention's own memory): a random Qwen2-shape model (hidden 256, 4
layers, 4 heads of 64, 2 KV heads, the character vocabulary of 128, so that logits are small);
groups of ~2k tokens (prompts of 150 tokens, each with 8 responses). `1.5b` (the logits' memory):
Qwen2.5-Math-1.5B's shapes (hidden 1536, intermediate 8960, 12 heads of 128, 2 KV heads, the
vocabulary of 151,936, tied embeddings) cut to --layers decoder layers (2), random weights;
groups of a 150-token prompt and 8 responses of 700 (the GPU configs' shape: 28,750 positions are
5 groups, 40 responses). Either with activation checkpointing, as the GPU configs train; one packed
row of T tokens made by the project's own collate, through tepo.response_logprobs with each
--lm-head (chunked: from the hidden states through the head in chunks; logits: the model's logits,
the path of before) and a backward of the log-probs' sum. The weights in --dtype: bfloat16 is what
the GPU computes in (FSDP2's mixed precision casts the weights to it; here they are built in it).

Each (T, lm_head) runs in a fresh process; the figure is the peak memory of the forward + backward
above the memory before it (imports, model, batch): on the CPU the peak resident memory above
that process's peak before it (ru_maxrss), on CUDA torch.cuda.max_memory_allocated above the
memory allocated before. It includes the parameters' gradients (one model's size in --dtype,
printed apart): the rest is activations, logits and their gradient. Linear growth: peak(32k) /
peak(8k) near 4; a (T, T) tensor anywhere (a mask, scores) shows as quadratic growth.

--tree runs the same measurement with the code of another checkout (its collate, its attention,
its response_logprobs; a checkout from before `lm_head` computes the logits whatever --lm-head says).
Memory needed: at --shape 1.5b, T = 28,750, bfloat16, the logits path holds ~2 x T x V x 2 B
(~16 GiB) at its peak, in fp32 twice that; the chunked path a few GiB.
"""
import argparse
import inspect
import json
import os
import resource
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
SHAPES = {  # hidden, intermediate, heads, kv_heads, vocab, tied; the group: prompt, responses, tokens
    "tiny": dict(hidden=256, intermediate=512, heads=4, kv=2, vocab=128, layers=4, group=2048),
    "1.5b": dict(hidden=1536, intermediate=8960, heads=12, kv=2, vocab=151936, layers=2,
                 group=150 + 8 * 700),
}


def model_of(shape, layers, dtype, device):
    """A random Qwen2 of `shape` with `layers` decoder layers, tied embeddings, built in `dtype`."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    s = SHAPES[shape]
    config = Qwen2Config(vocab_size=s["vocab"], hidden_size=s["hidden"], intermediate_size=s["intermediate"],
                         num_hidden_layers=layers, num_attention_heads=s["heads"], num_key_value_heads=s["kv"],
                         max_position_embeddings=65536, tie_word_embeddings=True)
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # built in it: no fp32 copy's transient in the peak before
    try:
        with torch.device(device):
            return Qwen2ForCausalLM(config)
    finally:
        torch.set_default_dtype(default)


def child(T, args):
    """In a fresh process, with the checkout's code on sys.path: print {"T", "peak_mib", "grads_mib"}."""
    import torch
    import tepo
    try:
        import packing
        collate = packing.collate
        use = (lambda m: packing.use_packed_attention(m, args.kernel)) if hasattr(packing, "use_packed_attention") \
            else packing.use_segment_attention
        Seq = __import__("train").Sequence
    except ImportError:  # a checkout from before packing.py: the same functions in train / tepo
        import train
        collate, use, Seq = train.collate, tepo.use_segment_attention, train.Sequence
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    s = SHAPES[args.shape]
    model = use(model_of(args.shape, args.layers or s["layers"], dtype, device))
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    groups, prompt = max(1, T // s["group"]), 150
    resp = (T // groups - prompt) // 8
    seqs = [Seq((0, g), [3] * prompt, [4 + (i % 50)] * resp, 1.0, True, torch.zeros(resp))
            for g in range(groups) for i in range(8)]
    batch = collate(seqs, device)
    with_head = "lm_head" in inspect.signature(tepo.response_logprobs).parameters
    extra = [args.lm_head] if with_head else []
    if device.type == "cuda":
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    else:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    logp, _ = tepo.response_logprobs(model, batch, 1.0, False, *extra)
    logp.sum().backward()
    if device.type == "cuda":
        torch.cuda.synchronize()
        after = torch.cuda.max_memory_allocated()
    else:
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    grads = sum(p.numel() * p.element_size() for p in model.parameters())
    print(json.dumps({"T": batch["ids"].shape[1], "peak_mib": (after - before) / 2**20, "grads_mib": grads / 2**20,
                      "lm_head": args.lm_head if with_head else "logits (before lm_head)"}))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--tokens", type=int, nargs="+", default=[4096, 8192, 16384, 32768])
    ap.add_argument("--kernel", default="sdpa", choices=("sdpa", "flex"))
    ap.add_argument("--shape", default="tiny", choices=SHAPES)
    ap.add_argument("--layers", type=int, help="decoder layers (default: tiny 4, 1.5b 2)")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--lm-head", nargs="+", default=["chunked"], choices=("auto", "chunked", "logits"),
                    help="the ways measured, each T in each (default chunked; logits chunked: before/after)")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--tree", default=ROOT, help="the checkout whose code is measured")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        args.lm_head = args.lm_head[0]
        return child(args.child, args)
    tree = os.path.abspath(args.tree)
    env = {**os.environ, "PYTHONPATH": tree, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    rows = []
    for T in args.tokens:
        for head in args.lm_head:
            cmd = [sys.executable, os.path.abspath(__file__), "--child", str(T), "--kernel", args.kernel,
                   "--shape", args.shape, "--dtype", args.dtype, "--lm-head", head, "--device", args.device,
                   *(["--layers", str(args.layers)] if args.layers else [])]
            out = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
            if out.returncode:
                raise SystemExit(f"T = {T}, lm_head {head} failed:\n{out.stderr[-2000:]}")
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    first = rows[0]["lm_head"]
    ref = min((r for r in rows if r["lm_head"] == first), key=lambda r: abs(r["T"] - 8192))["peak_mib"]
    s = SHAPES[args.shape]
    print(f"code of {tree} (kernel {args.kernel}); one packed forward + backward, activation checkpointing, "
          f"{args.dtype} on {args.device}; shape {args.shape} (hidden {s['hidden']}, vocabulary {s['vocab']:,}, "
          f"{args.layers or s['layers']} layers); the parameters' gradients {rows[0]['grads_mib']:.0f} MiB of "
          f"each peak")
    print(f"{'T':>7} {'lm_head':>24} {'peak above the model (MiB)':>28} {'/ ' + first + ' at ~8k':>18}")
    for r in rows:
        print(f"{r['T']:>7} {r['lm_head']:>24} {r['peak_mib']:>28.0f} {r['peak_mib'] / ref:>18.2f}")


if __name__ == "__main__":
    main()
