"""GPU memory and step-time ESTIMATES for a config (no GPU needed): does a step fit, how long is it.

    python bench/gpu_plan.py [--config configs/math1.5b-tepo.yaml] [--model 1.5b|7b|qwen3-0.6b]
                             [--gpus 8] [--gpu h100|a100|4090|all] [--mfu 0.4] [--response-len N]

Every figure printed is an estimate from the formulas below, not a measurement. Batch, lengths,
micro_batch_tokens, gpu_memory_utilization and activation_checkpointing come from the YAML (via
train.load_config). Assumptions (all per GPU = per rank; W = world size, N = parameters):
- Trainer (FSDP2, fp32 master weights, bf16 compute): master 4N/W, grads 4N/W, AdamW 8N/W bytes.
  Gathered bf16: the root unit (embeddings, final norm, lm_head), unsharded for the whole
  forward/backward, plus 2 decoder layers (the one computing + the prefetched one); at the
  reduce-scatter, a transient unsharded fp32 gradient of the largest unit (the root).
- Activations of one micro-batch of T = micro_batch_tokens tokens (packed: real tokens, each
  prompt once, no padding; an upper bound, the last micro-batch being partly filled). Per layer and token, bf16 (2 B) unless noted, with SDPA/flash
  attention (no S x S matrix saved; Korthikanti et al. 2022 adapted: no dropout masks, SwiGLU,
  RMSNorm, GQA): 2 norm inputs + 2 fp32 norm upcasts (2h x 2 B + 2h x 4 B), qkv and MLP inputs
  (2h), q/k/v before and after RoPE (2 x (q + 2kv)), attention output q (+ fp32 log-sum-exp
  per head), MLP gate, silu(gate), up, product (4I). With checkpointing: the layer inputs
  (T x h x 2 B x layers) plus one layer's full activations (recomputed in the backward).
- Logits: train.py keeps only response positions (logits_to_keep), bf16, T x V x 2 B (upper bound:
  every token a response position); tepo._ChunkedLogProb saves them and its backward writes a
  gradient of the same size, so 2 x T x V x 2 B at the lm_head backward, plus two fp32 chunk
  buffers of 2^24 logits (128 MiB). The no-grad old pass holds the logits once.
- vLLM: gpu_memory_utilization x GPU memory = bf16 weights (2N) + 1.5 GiB assumed for its
  activation/sampler peak + KV cache; KV bytes/token = 2 x layers x kv_heads x head_dim x 2 B.
  Needed per rank: prompts/rank x (prompt + G x response) with prefix caching (the G samples share
  the prompt); worst case prompts/rank x G x (max_prompt_len + max_new_tokens). Less KV than
  needed still runs (vLLM schedules fewer sequences at once / preempts), slower.
- Phases: rollout = vLLM awake + the trainer's resident master weights and Adam states (grads
  freed by zero_grad(set_to_none)); update = vLLM asleep (level 1: weights to CPU RAM, KV freed;
  1 GiB assumed left) + the whole trainer. 1 GiB per process for CUDA context / NCCL buffers.
  Not modelled: allocator fragmentation; torch's caching allocator keeping the update's peak
  reserved when vLLM wakes (train.py calls no torch.cuda.empty_cache()); the weight sync's full
  fp32 tensors gathered one at a time while vLLM is awake (the largest: the embedding, V x h x 4 B).
- Time: update FLOPs = 8 x N x tokens with checkpointing (6 without) + causal attention
  (2 x layers x q_dim x S per token forward, x4 with checkpointing, x3 without), all samples
  trained (A != 0); the old-logprob pass = 2N + attention over (1 - 1/num_minibatches) of the
  tokens (the first mini-batch's forward is its own old pass). "tokens" are the positions the
  config's micro_batch_layout computes, padding included: packed, each prompt once and every
  response token (no padding); grouped (the layout of before), every response padded to its
  group's longest, and under checkpointing the prompt in every row. The longest of a group comes
  from log-normal response lengths (mean --response-len, sd --response-sd, capped at
  max_new_tokens; 4,000 simulated groups). Prefill: 2N x prompts/rank x prompt
  tokens (prefix-cached). Decode: memory-bound: max_new_tokens steps (the longest response sets
  the wall clock), each reading the bf16 weights, plus the KV of every token of every sequence
  at every step, at --hbm-frac of HBM bandwidth; or compute-bound at --mfu if that is slower.
"""
import argparse
import json
import os
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

GiB = 2 ** 30
GPUS = {  # memory bytes, bf16 dense FLOP/s, HBM bytes/s
    "h100": ("H100 80GB", 79.6 * 2 ** 30, 989e12, 3.35e12),  # 81,559 MiB as nvidia-smi shows
    "a100": ("A100 80GB", 80 * 2 ** 30, 312e12, 2.0e12),
    "4090": ("RTX 4090 24GB", 24 * 2 ** 30, 165e12, 1.0e12),
}
MODELS = {  # hidden, intermediate, layers, heads, kv_heads, head_dim, vocab, tied, qkv bias
    "1.5b": dict(name="Qwen2.5-Math-1.5B", h=1536, I=8960, L=28, heads=12, kv=2, hd=128,
                 V=151936, tied=True, bias=True),
    "7b": dict(name="Qwen2.5-Math-7B", h=3584, I=18944, L=28, heads=28, kv=4, hd=128,
               V=152064, tied=False, bias=True),
    "qwen3-0.6b": dict(name="Qwen3-0.6B", h=1024, I=3072, L=28, heads=16, kv=8, hd=128,
                       V=151936, tied=True, bias=False),
}
SHARED_CONFIG = os.path.join(ROOT, "..", "shared", "qwen2.5-math-tokenizer", "config.json")
VLLM_OVERHEAD, CTX, ASLEEP = 1.5 * GiB, 1 * GiB, 1 * GiB


def model_shapes(key):
    m = dict(MODELS[key])
    if key == "1.5b" and os.path.isfile(SHARED_CONFIG):  # the real config.json wins
        with open(SHARED_CONFIG) as f:
            c = json.load(f)
        m.update(h=c["hidden_size"], I=c["intermediate_size"], L=c["num_hidden_layers"],
                 heads=c["num_attention_heads"], kv=c["num_key_value_heads"], V=c["vocab_size"],
                 hd=c["hidden_size"] // c["num_attention_heads"], tied=c["tie_word_embeddings"])
        m["name"] += " (shapes from ../shared config.json)"
    return m


def params(m):
    q, kv = m["heads"] * m["hd"], m["kv"] * m["hd"]
    layer = m["h"] * (q + 2 * kv) + q * m["h"] + 3 * m["h"] * m["I"] + 2 * m["h"]
    layer += (q + 2 * kv) if m["bias"] else 2 * m["hd"]  # Qwen2 qkv bias; Qwen3 q/k norms
    embed = m["V"] * m["h"]
    root = embed * (1 if m["tied"] else 2) + m["h"]
    return layer, root, m["L"] * layer + root


def act_bytes_per_token_layer(m):
    h, I, q, kv = m["h"], m["I"], m["heads"] * m["hd"], m["kv"] * m["hd"]
    return 2 * (2 * h + 2 * h + 2 * (q + 2 * kv) + q + 4 * I) + 4 * 2 * h + 4 * m["heads"]


def computed_per_rank(cfg, ppr, G, prompt, resp, sd, layout):
    """(positions computed, real tokens) of one rank's step in `layout` (see the docstring)."""
    import numpy as np
    real = ppr * (prompt + G * resp)
    if layout == "packed":
        return real, real
    sigma2 = np.log(1 + (sd / resp) ** 2)
    lengths = np.random.default_rng(0).lognormal(np.log(resp) - sigma2 / 2, np.sqrt(sigma2), (4000, G))
    longest = np.minimum(lengths, cfg.max_new_tokens).max(1).mean()
    rows = cfg.activation_checkpointing  # no KV cache to share the prompt through
    return ppr * ((G if rows else 1) * prompt + G * longest), real


def plan(cfg, m, gpu, W, mfu, hbm_frac, resp, prompt, sd=None):
    gname, mem, flops, bw = GPUS[gpu]
    layer, root, N = params(m)
    ppr, G, T = cfg.prompts_per_step // W, cfg.group_size, cfg.micro_batch_tokens
    print(f"\n=== {m['name']}: N = {N / 1e9:.2f} B params | {W} x {gname} | ESTIMATES ===")
    print(f"setting: {cfg.prompts_per_step} prompts x {G} samples ({ppr} prompts/rank), prompt "
          f"{prompt} tok (assumed mean; cap {cfg.max_prompt_len}), response {resp} tok (assumed "
          f"mean; cap {cfg.max_new_tokens}), micro_batch_tokens {T}, "
          f"checkpointing {'on' if cfg.activation_checkpointing else 'off'}")
    row = lambda what, b, note="": print(f"  {what:<44}{b / GiB:>8.2f} GiB  {note}")  # noqa: E731
    print("trainer states (FSDP2-sharded over W):")
    states = {"fp32 master weights 4N/W": 4 * N / W, "fp32 grads 4N/W": 4 * N / W,
              "AdamW exp_avg + exp_avg_sq 8N/W": 8 * N / W}
    for k, v in states.items():
        row(k, v)
    gathered = 2 * root + 2 * 2 * layer
    row("gathered bf16: root + 2 layers", gathered, f"(root {2 * root / GiB:.2f}, layer "
        f"{2 * layer / GiB:.2f})")
    row("transient fp32 unsharded root grad", 4 * root, "(at its reduce-scatter)")
    per_layer = act_bytes_per_token_layer(m)
    full = T * per_layer * m["L"]
    ckpt = T * m["h"] * 2 * m["L"] + T * per_layer
    print(f"activations, one micro-batch of {T} tokens ({per_layer / m['h']:.0f} x h = "
          f"{per_layer / 1024:.0f} KiB per token per layer):")
    row("  without checkpointing: T x per-layer x L", full)
    row("  with checkpointing: inputs + 1 layer", ckpt)
    logits = T * m["V"] * 2
    row("logits bf16 T x V x 2 B (+ its grad: x2)", 2 * logits + 2 * 2 ** 24 * 4,
        "(+ 2 fp32 chunk buffers of 2^24)")
    act = ckpt if cfg.activation_checkpointing else full
    update = sum(states.values()) + gathered + act + 2 * logits + 2 ** 27 + CTX + ASLEEP
    update_peak2 = sum(states.values()) + gathered + 4 * root + CTX + ASLEEP  # at reduce-scatter
    # vLLM
    budget = cfg.gpu_memory_utilization * mem
    kv_tok = 2 * m["L"] * m["kv"] * m["hd"] * 2
    kv = budget - 2 * N - VLLM_OVERHEAD
    need = ppr * (prompt + G * resp)
    worst = ppr * G * (cfg.max_prompt_len + cfg.max_new_tokens)
    print(f"vLLM: {cfg.gpu_memory_utilization} x {mem / GiB:.1f} GiB = {budget / GiB:.1f} GiB = "
          f"weights {2 * N / GiB:.2f} + overhead {VLLM_OVERHEAD / GiB:.1f} (assumed) + KV "
          f"{kv / GiB:.2f} GiB")
    verdict = ("enough" if kv >= worst * kv_tok else "enough for mean lengths"
               if kv >= need * kv_tok else "TOO SMALL")
    print(f"  KV {kv_tok / 1024:.0f} KiB/token -> {max(kv, 0) / kv_tok / 1e3:.0f}k tokens; the step "
          f"needs {need / 1e3:.0f}k (mean lengths, prefix-cached), {worst / 1e3:.0f}k worst case -> "
          f"{verdict}"
          f"{'' if kv >= worst * kv_tok else ' (fewer sequences decode at once / preemption: slower)'}")
    rollout_mem = 4 * N / W + 8 * N / W + budget + CTX
    fits = lambda b: "fits" if b <= mem else "DOES NOT FIT"  # noqa: E731
    engine_ok = kv > 0  # vLLM refuses to start when its share cannot hold the weights and some KV
    if not engine_ok:
        least = (2 * N + VLLM_OVERHEAD + need * kv_tok) / mem
        print(f"  ENGINE DOES NOT FIT: {cfg.gpu_memory_utilization} x {mem / GiB:.1f} GiB cannot hold "
              f"the bf16 weights and overhead; gpu_memory_utilization >= ~{least:.2f} would"
              f"{' (more than the whole GPU: shard the engine, tensor_parallel, or a larger GPU)' if least >= 1 else ''}, with "
              f"the step's KV at mean lengths (then the rollout needs "
              f"{(4 * N / W + 8 * N / W + least * mem + CTX) / GiB:.1f} GiB)")
    print(f"phase memory per GPU (of {mem / GiB:.1f} GiB):")
    row("rollout: master + Adam + vLLM + ctx", rollout_mem,
        fits(rollout_mem) if engine_ok else "DOES NOT FIT (engine, above)")
    row("update: states + gathered + act + logits", update, fits(update))
    row("update: optimizer-side peak (reduce-scatter)", update_peak2, fits(update_peak2))
    if update > mem:
        free = mem - (update - 2 * logits - act)  # what scales with T: logits (x2) + activations
        per_tok = 2 * m["V"] * 2 + act / T
        print(f"  -> micro_batch_tokens <= ~{max(free, 0) / per_tok / 1e3:.0f}k would fit (estimate)")
    # time
    S = prompt + resp
    q_dim = m["heads"] * m["hd"]
    attn_fwd = 2 * m["L"] * q_dim * S                       # per token, causal
    tok, real = computed_per_rank(cfg, ppr, G, prompt, resp, sd or 0.65 * resp, cfg.micro_batch_layout)
    print(f"micro-batch layout {cfg.micro_batch_layout}: {tok / 1e3:.0f}k positions computed per rank "
          f"and step for {real / 1e3:.0f}k real tokens ({tok / real:.2f}x; counted in the update and "
          f"old-pass times below)")
    k_mult = 4 if cfg.activation_checkpointing else 3
    upd_flops = tok * ((8 if cfg.activation_checkpointing else 6) * N + k_mult * attn_fwd)
    old_flops = tok * (1 - 1 / cfg.num_minibatches) * (2 * N + attn_fwd)
    prefill = ppr * prompt * (2 * N + attn_fwd * prompt / S)
    steps = cfg.max_new_tokens
    seqs = ppr * G
    kv_read = seqs * (prompt * resp + resp * resp / 2) * kv_tok
    dec_mem = (steps * 2 * N + kv_read) / (hbm_frac * bw)
    dec_cmp = seqs * resp * (2 * N + 2 * attn_fwd) / (flops * mfu)
    t_roll = prefill / (flops * mfu) + max(dec_mem, dec_cmp)
    t_old, t_upd = old_flops / (flops * mfu), upd_flops / (flops * mfu)
    print(f"step time (ESTIMATE; MFU {mfu:.0%} of {flops / 1e12:.0f} TFLOPS, decode at "
          f"{hbm_frac:.0%} of {bw / 1e12:.2f} TB/s):")
    print(f"  rollout  {t_roll:7.1f} s  (prefill {prefill / (flops * mfu):.2f} s; decode "
          f"{steps} steps x {seqs} seqs: memory-bound {dec_mem:.1f} s, compute-bound "
          f"{dec_cmp:.1f} s; the larger counts)")
    print(f"  old pass {t_old:7.1f} s  ({old_flops / 1e15:.1f} PFLOP)")
    print(f"  update   {t_upd:7.1f} s  ({upd_flops / 1e15:.1f} PFLOP; {tok / 1e3:.0f}k tokens/rank)")
    print(f"  total    {t_roll + t_old + t_upd:7.1f} s/step (not modelled: weight sync, grading, "
          f"stragglers, vLLM's per-decode-step CPU overhead: +1 s per 0.33 ms/step over {steps} steps)")


def anchor(mfu=0.11):
    """prime-rl: ~11,900 trained tokens/s, Qwen3-0.6B, one H100, MFU ~11%."""
    m = model_shapes("qwen3-0.6b")
    _, _, N = params(m)
    _, _, peak, _ = GPUS["h100"]
    print(f"\n=== anchor: {m['name']} (N = {N / 1e9:.3f} B) on 1 x H100 at {mfu:.0%} MFU "
          f"(ESTIMATE) vs prime-rl's reported ~11,900 trained tokens/s ===")
    for S in (1024, 4096, 8192, 16384):
        attn = 2 * m["L"] * m["heads"] * m["hd"] * S
        for name, f in (("6N+attn (no ckpt)", 6 * N + 3 * attn),
                        ("8N+attn (ckpt)", 8 * N + 4 * attn)):
            print(f"  seq {S:>6}  {name:<18} {f / 1e9:5.2f} GFLOP/token -> "
                  f"{peak * mfu / f:>8,.0f} tokens/s")
    print(f"  11,900 tokens/s at {mfu:.0%} MFU implies {peak * mfu / 11900 / 1e9:.2f} GFLOP/token "
          f"= {peak * mfu / 11900 / N:.1f} x N")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "math1.5b-tepo.yaml"))
    ap.add_argument("--model", choices=MODELS, default="1.5b")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--gpu", choices=(*GPUS, "all"), default="all")
    ap.add_argument("--mfu", type=float, default=0.4, help="assumed MFU of prefill/update")
    ap.add_argument("--hbm-frac", type=float, default=0.6, help="assumed share of HBM bandwidth")
    ap.add_argument("--response-len", type=int, help="assumed mean (default max_new_tokens / 2)")
    ap.add_argument("--prompt-len", type=int, default=150, help="assumed mean prompt tokens")
    ap.add_argument("--response-sd", type=float, help="assumed sd of response lengths (default "
                                                      "0.65 x mean): the grouped layout's padding")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override, e.g. micro_batch_layout=grouped")
    ap.add_argument("--no-anchor", action="store_true")
    args = ap.parse_args()
    import train
    cfg = train.load_config(args.config, args.set)
    resp = args.response_len or cfg.max_new_tokens // 2
    for gpu in GPUS if args.gpu == "all" else (args.gpu,):
        plan(cfg, model_shapes(args.model), gpu, args.gpus, args.mfu, args.hbm_frac, resp,
             args.prompt_len, args.response_sd)
    if not args.no_anchor:
        anchor()


if __name__ == "__main__":
    main()
