"""Sampler-vs-trainer log-prob gap in fp32 and bf16 at step 0 (issue 13, defect 9), on CPU.

    python demo.py prepare --out /tmp/mm_demo --steps 250        # the demo model, a few minutes
    python bench/bench_mismatch.py [--demo-model /tmp/mm_demo/model] [--qwen] [--train-step]
                                   [--prompts 8 --n 8 --max-new-tokens 48] [--no-sampler]

The GPU config samples with vLLM in bf16 (`dtype: bfloat16`) and trains with FSDP2 mixed precision
(fp32 master weights, bf16 compute: train_dtype auto = bf16 on GPU). At step 0 theta = theta_old =
the sampler's weights, so the log-probs should agree up to numerics. For each model this bench
samples one fixed batch (generate seed 1234) with vLLM (in-process, rollout.make_engine) in float32 and in
bfloat16, then recomputes the log-probs of the very same responses with the trainer's code
(tepo.response_logprobs over packing.micro_batches/collate, packed as in training) in four trainer modes:
  fp32          policy.load_policy, FSDP2 over a 1-rank gloo group, train_dtype float32
  bf16-fsdp2    policy.load_policy with train_dtype bfloat16: MixedPrecisionPolicy(param bf16,
                reduce fp32), the GPU path (falls back to autocast, printing the error, if it fails)
  bf16-autocast policy.load_model (fp32 weights) under torch.autocast("cpu", bfloat16)
  bf16-weights  policy.load_model cast to bfloat16 (what vLLM's bf16 engine holds)
Per token, d = logp_trainer - logp_sampler: mean |d|, p99 |d|, max |d|, mean d, and the k3 KL
estimate mean(exp(d) - d - 1) (tepo.kl_estimate; GRPO's estimator, >= 0); per sequence, |mean of
d over its tokens| (mean and max): the log of GSPO/TEPO's sequence ratio if the sampler's
log-probs stood in for the old ones (TEPO clips it at -3e-4/+4e-4). A last table compares
the trainer with itself: its no-grad old pass vs a grad-enabled forward of the same weights
(kl_old at theta = theta_old, which train.py's later mini-batches would see before any update).

--train-step also runs train.py itself for one RL step (one process, configs/demo.yaml on the
demo model, 16 prompts x 8, num_minibatches 4, the toy reward of tests/train_patched.py -- 1.0
when the response contains a '7' -- so every mini-batch updates) for several dtype/lr settings, and
prints `mismatch/abs_mean` and `actor/kl_old` from its metrics.jsonl, plus kl_old and the ratio
extremes of each mini-batch (recorded by wrapping tepo.policy_loss in the child process).
metrics.jsonl's kl_old is the mean over the 4 mini-batches; the first one's is 0 by construction
(its forward is its own old pass), the later ones' reflect the real updates plus any numerical
non-determinism; lr 0 is the control with no update.

Models: the demo model (`python demo.py prepare --out /tmp/mm_demo --steps 250`, 0.8 M params,
vocabulary 98, pre-trained so its distributions are peaked like a real policy's), and with
--qwen a random 2-layer Qwen2 with the real 151,936-token vocabulary (tests/qwen_math.py; its
distributions are near-uniform over 152k tokens, so the log-softmax normaliser sums many terms).
Everything runs on CPU (this machine has AVX512-BF16), so GPU kernels (flash attention, cuBLAS
bf16 GEMMs, vLLM's fused CUDA ops) are not what is measured: the numbers show the size of the bf16
effect, not the GPU's exact figures.
"""
import argparse
import json
import os
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

import torch  # noqa: E402

import data  # noqa: E402
import packing  # noqa: E402
import policy  # noqa: E402
import ranks  # noqa: E402
import rollout  # noqa: E402
import tepo  # noqa: E402
import train  # noqa: E402


def sample(model_dir, prompts, dtype, args):
    engine = rollout.make_engine(model_dir, backend="vllm", dtype=dtype, seed=0,
                                 max_model_len=args.max_model_len)
    t0 = time.time()
    outs = engine.generate(prompts, n=args.n, max_new_tokens=args.max_new_tokens,
                           temperature=args.temperature, seed=1234)
    dt = time.time() - t0
    engine.close()
    seqs = [train.Sequence((0, g), s.prompt_ids, s.response_ids, 0.0, True,
                           rollout_logp=torch.tensor(s.logprobs, dtype=torch.float32))
            for g, group in enumerate(outs) for s in group if s.response_ids]
    print(f"  sampled {len(seqs)} responses in {dtype} ({sum(len(s.resp) for s in seqs)} "
          f"tokens, {dt:.1f} s)", flush=True)
    return seqs


def trainer_models(model_dir, temperature):
    """{mode: (model, autocast?)}: the four trainer modes of the docstring."""
    base = dict(model=model_dir, train_data="unused", temperature=temperature)
    out = {"fp32": (policy.load_policy(model_dir, train.Config(**base, train_dtype="float32"),
                                      torch.device("cpu"), trainable=True), False)}
    try:
        m = policy.load_policy(model_dir, train.Config(**base, train_dtype="bfloat16"),
                              torch.device("cpu"), trainable=True)
        probe = packing.collate([train.Sequence((0, 0), [0, 0], [0, 0, 0], 0.0, True, torch.zeros(3))], "cpu")
        tepo.response_logprobs(m, probe, temperature, False)[0].sum().backward()
        m.zero_grad(set_to_none=True)
        out["bf16-fsdp2"] = (m, False)
    except Exception as e:  # noqa: BLE001 - reported, then the autocast fallback is the bf16 path
        print(f"  bf16 FSDP2 mixed precision FAILED on CPU/gloo: {type(e).__name__}: {e}")
    out["bf16-autocast"] = (policy.load_model(model_dir), True)
    out["bf16-weights"] = (policy.load_model(model_dir).to(torch.bfloat16), False)
    return out


def trainer_logprobs(model, autocast, seqs, args, grad=False):
    out = {}
    for mb in packing.micro_batches(seqs, args.micro_batch_tokens):
        batch = packing.collate(mb, "cpu")
        with torch.set_grad_enabled(grad), torch.autocast("cpu", torch.bfloat16, enabled=autocast):
            logp, _ = tepo.response_logprobs(model, batch, args.temperature, False)
        for b, s in enumerate(mb):
            out[id(s)] = logp[b, :len(s.resp)].detach().float()
    return torch.cat([out[id(s)] for s in seqs])


def stats(trainer, reference, lengths):
    d = (trainer - reference).double()
    a = d.abs()
    k3 = tepo.kl_estimate(reference.double(), trainer.double(), "k3")
    seq = torch.stack([x.mean() for x in d.split(lengths)]).abs()  # |log s_i|, GSPO/TEPO's ratio
    return (f"{a.mean():10.2e} {a.quantile(0.99):10.2e} {a.max():10.2e} {d.mean():+10.2e} "
            f"{k3.mean():10.2e} {seq.mean():10.2e} {seq.max():10.2e}")


HEADER = (f"{'mean|d|':>10} {'p99|d|':>10} {'max|d|':>10} {'mean d':>10} {'k3 KL':>10} "
          f"{'seq|d|':>10} {'seq max':>10}")


def run_case(name, model_dir, prompts, args):
    print(f"\n### {name}: {model_dir}", flush=True)
    batches = {dt: sample(model_dir, prompts, dt, args) for dt in ("float32", "bfloat16")}
    models = trainer_models(model_dir, args.temperature)
    rows = []
    for sdt, seqs in batches.items():
        ref, lengths = torch.cat([s.rollout_logp for s in seqs]), [len(s.resp) for s in seqs]
        for mode, (model, ac) in models.items():
            rows.append((f"vLLM {sdt}", mode, len(ref),
                         stats(trainer_logprobs(model, ac, seqs, args), ref, lengths)))
    print(f"\n{name}: per token, d = logp_trainer - logp_sampler (ESTIMATED on CPU; same responses)")
    print(f"{'sampler':<16}{'trainer':<15}{'tokens':>7} {HEADER}")
    for r in rows:
        print(f"{r[0]:<16}{r[1]:<15}{r[2]:>7} {r[3]}")
    print(f"\n{name}: the trainer vs itself at theta = theta_old (no-grad old pass vs grad-enabled "
          f"forward), bf16-sampled responses")
    print(f"{'trainer':<15}{'tokens':>7} {HEADER}")
    seqs = batches["bfloat16"]
    for mode, (model, ac) in models.items():
        old = trainer_logprobs(model, ac, seqs, args)
        new = trainer_logprobs(model, ac, seqs, args, grad=True)
        print(f"{mode:<15}{len(old):>7} {stats(new, old, [len(s.resp) for s in seqs])}")
    for model, _ in models.values():
        del model


TRAIN_RUNS = (  # (dtype, train_dtype, lr)
    ("bfloat16", "bfloat16", 0.0), ("bfloat16", "bfloat16", 1e-6), ("bfloat16", "bfloat16", 1e-4),
    ("float32", "float32", 0.0), ("float32", "float32", 1e-6), ("float32", "float32", 1e-4))


def train_child(argv):
    """In a fresh process: train.main with the toy reward, recording each micro-batch's kl_old."""
    import reward
    out_json, rest = argv[0], argv[1:]
    reward.math_reward = lambda response, gold, **kw: float("7" in response)
    calls, opt_steps, real_loss, real_step = [], [0], tepo.policy_loss, torch.optim.AdamW.step

    def loss(*a, **kw):
        value, m = real_loss(*a, **kw)
        calls.append({"minibatch": opt_steps[0], "kl_old": float(m["actor/kl_old"]),
                      "ratio_min": float(m["actor/ratio_min"]), "ratio_max": float(m["actor/ratio_max"])})
        return value, m

    def step(self, *a, **kw):
        opt_steps[0] += 1
        return real_step(self, *a, **kw)
    tepo.policy_loss, torch.optim.AdamW.step = loss, step
    train.main(rest)
    with open(out_json, "w") as f:
        json.dump(calls, f)


def train_steps(args):
    import subprocess
    demo_dir = os.path.dirname(os.path.abspath(args.demo_model))
    work = tempfile.mkdtemp(prefix="mm_train_")
    print(f"\ntrain.py, 1 RL step, 1 process (demo model, configs/demo.yaml: 16 prompts x 8, "
          f"<= 64 new tokens, tepo, num_minibatches 4, toy reward); work dir {work}", flush=True)
    results = []
    for dtype, tdtype, lr in TRAIN_RUNS:
        tag = f"{dtype}-{tdtype}-lr{lr:g}"
        out, calls = os.path.join(work, tag), os.path.join(work, tag + ".json")
        cmd = [sys.executable, os.path.abspath(__file__), "--train-child", calls,
               "--config", os.path.join(ROOT, "configs", "demo.yaml"), "--set", f"model={args.demo_model}",
               "--set", f"train_data={os.path.join(demo_dir, 'data', 'train.jsonl')}",
               "--set", "eval_data=''", "--set", f"out_dir={out}", "--set", "steps=1",
               "--set", "save_every=0", "--set", "log_samples_every=0", "--set", f"lr={lr}",
               "--set", "warmup_steps=0", "--set", f"dtype={dtype}", "--set", f"train_dtype={tdtype}",
               "--set", "num_minibatches=4"]
        t0 = time.time()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode:
            print(f"  {tag}: train.py FAILED (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
            continue
        with open(os.path.join(out, "metrics.jsonl")) as f:
            rec = [json.loads(line) for line in f][-1]
        with open(calls) as f:
            per_call = json.load(f)
        per_mb = {}
        for c in per_call:
            mb = per_mb.setdefault(c["minibatch"], {"kl_old": 0.0, "rmin": 1.0, "rmax": 1.0})
            mb["kl_old"] += c["kl_old"]
            mb["rmin"], mb["rmax"] = min(mb["rmin"], c["ratio_min"]), max(mb["rmax"], c["ratio_max"])
        results.append((dtype, tdtype, lr, rec, per_mb))
        print(f"  {tag}: done in {time.time() - t0:.0f} s", flush=True)
    print(f"\n{'sampler':<10}{'trainer':<10}{'lr':>7}{'mismatch':>10}{'kl_old':>10}{'clip lo':>8}"
          f"{'clip hi':>8}{'opt':>4}{'reward':>7}")
    for dtype, tdtype, lr, rec, _ in results:
        print(f"{dtype:<10}{tdtype:<10}{lr:>7g}{rec.get('mismatch/abs_mean') or 0:>10.2e}"
              f"{rec.get('actor/kl_old') or 0:>10.2e}{rec.get('actor/clip_frac_low') or 0:>8.3f}"
              f"{rec.get('actor/clip_frac_high') or 0:>8.3f}{rec['actor/optimizer_steps']:>4}"
              f"{rec['reward/mean']:>7.2f}")
    print("(metrics.jsonl: mismatch = mean |logp_sampler - logp_trainer_old| over all tokens; kl_old,"
          " clip fractions: means over the 4 mini-batches, the first one's 0)")
    print("\nper mini-batch: kl_old [ratio_min - 1, ratio_max - 1] of the sequence ratio "
          "(TEPO clips at 1 - 3e-4, 1 + 4e-4)")
    for dtype, tdtype, lr, _, per_mb in results:
        mbs = "  ".join(f"{v['kl_old']:.1e} [{v['rmin'] - 1:+.1e},{v['rmax'] - 1:+.1e}]"
                        for _, v in sorted(per_mb.items()))
        short = {"bfloat16": "bf16", "float32": "fp32"}
        print(f"{short[dtype]}/{short[tdtype]} lr {lr:<6g} {mbs}")


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--train-child":
        return train_child(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--demo-model", default="/tmp/mm_demo/model",
                    help="demo.py prepare's OUT/model (skipped if absent)")
    ap.add_argument("--demo-data", default=None, help="default: <demo-model>/../data/test.jsonl")
    ap.add_argument("--qwen", action="store_true", help="also the random real-vocabulary Qwen2")
    ap.add_argument("--train-step", action="store_true", help="also run train.py for one step")
    ap.add_argument("--no-sampler", action="store_true", help="skip the sampler/trainer tables")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--max-model-len", type=int, default=512)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--micro-batch-tokens", type=int, default=4096)
    args = ap.parse_args()
    if args.train_step:
        train_steps(args)
    if args.no_sampler:
        return
    torch.manual_seed(0)
    ranks.setup_distributed()  # a 1-rank gloo group, before vLLM (which would make its own)
    from transformers import AutoTokenizer
    if os.path.isdir(args.demo_model):
        from demo import DEMO_TEMPLATE
        path = args.demo_data or os.path.join(args.demo_model, "..", "data", "test.jsonl")
        tok = AutoTokenizer.from_pretrained(args.demo_model)
        prompts = [data.build_prompt(tok, r["problem"], DEMO_TEMPLATE)
                   for r in data.load_problems(path)[:args.prompts]]
        run_case("demo model (pre-trained, vocab 98)", args.demo_model, prompts, args)
    else:
        print(f"no demo model at {args.demo_model}: run `python demo.py prepare --out "
              f"{os.path.dirname(args.demo_model)} --steps 250` (skipped)")
    if args.qwen:
        from qwen_math import DATA_DIR, make_qwen_math_model
        path = make_qwen_math_model(os.path.join(tempfile.mkdtemp(prefix="mm_qwen_"), "model"))
        tok = AutoTokenizer.from_pretrained(path)
        rows = data.load_problems(os.path.join(DATA_DIR, "math500.jsonl"))[:args.prompts]
        prompts = [data.build_prompt(tok, r["problem"]) for r in rows]
        run_case("random 2-layer Qwen2, real vocab 151,936", path, prompts, args)


if __name__ == "__main__":
    main()
