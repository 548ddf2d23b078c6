"""Rollout throughput: vLLM vs transformers' generate, and the cost of one weight sync.

A random-weight Qwen2-shape model large enough for batching to matter (default ~24 M parameters:
hidden 512, 8 layers, 8 heads, 4 KV heads, intermediate 1408, char vocab 128, tied), 64 prompts
x 8 samples, up to 256 new tokens at temperature 1. Random weights put ~1/128 of the mass on EOS,
so lengths vary (mean ~110). Also: engine start-up, and vLLM on the 17.8 M model (6 layers) with
8 prompts x 8 samples x up to 128 tokens (the shape of a small training step).

    PYTHONPATH=. python bench/bench_rollout.py [--threads 1] [--skip-hf] [--compile]

Prints numbers only; the machine's load (printed) moves them a lot on a shared box.
"""
import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

import rollout  # noqa: E402
from demo import make_tiny_model  # noqa: E402


def load():
    return "load average %.2f %.2f %.2f" % os.getloadavg()


def prompts(k):
    return [f"Problem {i}: Ann has {37 * i + 11} coins and finds {19 * i + 5} more. How many?\n"
            for i in range(k)]


def timed_rollout(engine, k, n, max_new_tokens):
    """(tokens generated, seconds) for k prompts x n samples."""
    t = time.perf_counter()
    out = engine.generate(prompts(k), n=n, max_new_tokens=max_new_tokens, temperature=1.0, seed=0)
    dt = time.perf_counter() - t
    return sum(len(s.response_ids) for g in out for s in g), dt


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1, help="torch threads while sampling")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--hf-batch-size", type=int, default=64, help="sequences per HF generate")
    ap.add_argument("--compile", action="store_true", help="vLLM with torch.compile (no eager)")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp()
    path = make_tiny_model(os.path.join(tmp, "bench"), hidden=512, layers=args.layers, heads=8,
                           kv_heads=4, intermediate=1408, vocab_size=128, max_positions=2048)
    weights = load_file(os.path.join(path, "model.safetensors"))
    params = sum(t.numel() for t in weights.values())
    max_len = 64 + args.max_new_tokens
    k, n, m = args.prompts, args.n, args.max_new_tokens
    print(f"model {params / 1e6:.1f} M params, {k} prompts x {n} samples x <= {m} tokens, "
          f"sampling threads {args.threads}, cores {os.cpu_count()}; {load()}")

    t = time.perf_counter()
    engine = rollout.make_engine(path, backend="vllm", max_model_len=max_len, seed=0,
                                 threads=args.threads, enforce_eager=not args.compile)
    print(f"vLLM engine start (first in process, imports included): "
          f"{time.perf_counter() - t:.1f} s")
    engine.generate(prompts(4), n=2, max_new_tokens=8)  # first-call effects out of the timing
    tokens, dt = timed_rollout(engine, k, n, m)
    v_rate = tokens / dt
    print(f"vLLM: {tokens} tokens in {dt:.1f} s = {v_rate:,.0f} tokens/s; {load()}")

    trainer_state = [(name, t.clone()) for name, t in weights.items()]
    syncs = []
    for _ in range(5):
        t = time.perf_counter()
        engine.update_weights(iter(trainer_state))
        syncs.append(time.perf_counter() - t)
    sync = sorted(syncs)[len(syncs) // 2]
    print(f"update_weights: {sync * 1e3:.1f} ms (median of 5) = {100 * sync / dt:.2f}% of "
          f"that rollout")
    engine.close()

    if not args.skip_hf:
        t = time.perf_counter()
        hf = rollout.make_engine(path, backend="hf", max_model_len=max_len, seed=0,
                                 threads=args.threads, hf_batch_size=args.hf_batch_size)
        print(f"transformers engine start: {time.perf_counter() - t:.1f} s")
        hf.generate(prompts(4), n=2, max_new_tokens=8)
        tokens, dt = timed_rollout(hf, k, n, m)
        print(f"transformers generate: {tokens} tokens in {dt:.1f} s = {tokens / dt:,.0f} "
              f"tokens/s; {load()}")
        print(f"vLLM / transformers = {v_rate / (tokens / dt):.1f}x")
        hf.close()

    small = make_tiny_model(os.path.join(tmp, "m18"), hidden=512, layers=6, heads=8, kv_heads=4,
                            intermediate=1408, vocab_size=128)
    t = time.perf_counter()
    engine = rollout.make_engine(small, backend="vllm", max_model_len=256, seed=0,
                                 threads=args.threads, enforce_eager=not args.compile)
    print(f"vLLM engine start (17.8 M model, second in process): {time.perf_counter() - t:.1f} s")
    engine.generate(prompts(4), n=2, max_new_tokens=8)
    tokens, dt = timed_rollout(engine, 8, 8, 128)
    print(f"vLLM 17.8 M model, 8 prompts x 8 x <= 128: {tokens} tokens in {dt:.2f} s = "
          f"{tokens / dt:,.0f} tokens/s; {load()}")
    engine.close()


if __name__ == "__main__":
    main()
