"""Benchmark eval.py: problems/s and generated tokens/s of a full MATH-500 run.

    PYTHONPATH=. python bench/bench_eval.py [--ckpt DIR] [--data math500.jsonl] [-n 4]
        [--max-new-tokens 256] [--backend vllm]

Without --ckpt it makes a random tiny model of the demo's size (demo.DEMO_MODEL) in a temporary
directory, with a 2048-token context instead of the demo's 512, so that every MATH-500 prompt
(up to ~1800 characters, one token each with the character tokenizer) is sampled rather than
skipped. The answers are wrong: this measures the machinery (prompting, vLLM sampling, grading,
metrics, writing), not the model. Runs eval.main in this process and prints its own timing
(sampling + grading, and the whole run with engine start-up).
"""
import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import eval as ev  # noqa: E402
from demo import DEMO_MODEL, make_tiny_model  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--ckpt", help="model directory (default: a fresh tiny demo-size model)")
    default_data = os.path.join(os.environ.get("TEPO_DATA_DIR", os.path.join(REPO, "..", "shared",
                                                                             "data")),
                                "math500.jsonl")
    ap.add_argument("--data", default=default_data)
    ap.add_argument("-n", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--backend", default="vllm")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--chunk-size", type=int, help="problems per generate call (eval's default)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = args.ckpt or make_tiny_model(os.path.join(tmp, "model"),
                                            **{**DEMO_MODEL, "max_positions": 2048})
        print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
        t0 = time.time()
        out = ev.main(["--ckpt", ckpt, "--data", args.data, "-n", str(args.n),
                       "--max-new-tokens", str(args.max_new_tokens), "--temperature", "1.0",
                       "--top-p", "1.0", "--backend", args.backend, "--seed", str(args.seed),
                       "--out", os.path.join(tmp, "results.json")] +
                      (["--chunk-size", str(args.chunk_size)] if args.chunk_size else []))
        wall = time.time() - t0
    (name, m), = out["benchmarks"].items()
    t = out["timing"]
    print(f"\nbench_eval: {name}, {m['problems']} problems, n={args.n}, max_new_tokens={args.max_new_tokens}, "
          f"backend={args.backend}, chunk={out['config']['chunk_size']} problems/call")
    print(f"  generated tokens     {m['generated_tokens']} (mean {m['mean_response_tokens']:.0f} per "
          f"response, {100 * m['truncation_rate']:.0f}% truncated, {m['prompt_too_long']} prompts "
          f"too long)")
    print(f"  in generate calls    {t['rank0_generate_s']:.1f} s, grading and the rest "
          f"{t['eval_s'] - t['rank0_generate_s']:.1f} s")
    print(f"  sampling + grading   {t['eval_s']:.1f} s: {t['problems_per_s']:.2f} problems/s, "
          f"{t['generated_tokens_per_s']:.0f} generated tokens/s")
    print(f"  whole run            {wall:.1f} s (with engine start-up): "
          f"{m['problems'] / wall:.2f} problems/s, {m['generated_tokens'] / wall:.0f} tokens/s")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
