"""GPU memory and step-time ESTIMATES for a config (no GPU needed): does a step fit, how long is it.

    python bench/gpu_plan.py [--config configs/math1.5b-tepo.yaml] [--model 1.5b|7b|qwen3-0.6b|qwen3-4b]
                             [--gpus 8] [--gpu h100|h200|a100|4090|all] [--mfu F] [--response-len N]

Every figure printed is an estimate from the formulas below, not a measurement; the compute speed
they rest on is the one measured (MEASURED: the 1.5B's update on one H200, 24.9k tokens/s), unless
--mfu gives another. The model is the config's (its hub name, or its directory's config.json),
unless --model names one. Batch, lengths,
micro_batch_tokens, gpu_memory_utilization and activation_checkpointing come from the YAML (via
train.load_config). Assumptions (all per GPU = per rank; W = world size, N = parameters):
- Trainer (FSDP2, fp32 master weights, bf16 compute): master 4N/W, grads 4N/W, AdamW 8N/W bytes.
  Gathered bf16: the root unit (embeddings, final norm, lm_head), unsharded for the whole
  forward/backward, plus 2 decoder layers (the one computing + the prefetched one); at the
  reduce-scatter, a transient unsharded fp32 gradient of the largest unit (the root).
- The packed row's attention mask: FlexAttention's block masks, (T / 128)^2 tiles of int32 (no
  T x T tensor: packing.segment_block_mask).
- Activations of one micro-batch of T = micro_batch_tokens tokens (packed: real tokens, each
  prompt once, no padding; an upper bound, the last micro-batch being partly filled). Per layer and token, bf16 (2 B) unless noted, with SDPA/flash
  attention (no S x S matrix saved; Korthikanti et al. 2022 adapted: no dropout masks, SwiGLU,
  RMSNorm, GQA): 2 norm inputs + 2 fp32 norm upcasts (2h x 2 B + 2h x 4 B), qkv and MLP inputs
  (2h), q/k/v before and after RoPE (2 x (q + 2kv)), attention output q (+ fp32 log-sum-exp
  per head), MLP gate, silu(gate), up, product (4I). With checkpointing: the layer inputs
  (T x h x 2 B x layers) plus one layer's full activations (recomputed in the backward).
- The LM head (config `lm_head`). chunked (auto's choice for every model here): the log-probs come
  from the last hidden states through the head's weight in chunks of C = 2^26 logits
  (tepo.head_logprobs_entropy): no T x V tensor; at most one chunk's logits at a time, bf16 and
  fp32 copies and the fp32 gradient and softmax, C x 16 B (1 GiB), plus the weight's gradient summed
  in fp32 and a bf16 chunk's of it, V x h x 6 B. The backward recomputes each chunk's logits: +2 V h
  FLOPs a position (~4% of the 1.5B's update), not in the times below, which rest on the speed
  measured with the logits. logits (the path of before): train.py keeps only response positions
  (logits_to_keep), bf16, T x V x 2 B (upper bound: every token a response position);
  tepo._ChunkedLogProb saves them and its backward writes a gradient of the same size, so
  2 x T x V x 2 B at the lm_head backward, plus two fp32 chunk buffers of 2^24 logits (128 MiB).
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
- Time: update FLOPs = 8 x N x positions with checkpointing (6 without) + causal attention
  (2 x layers x q_dim x S per position forward, x4 with checkpointing, x3 without), old pass 2N +
  attention per position. The positions are the busiest rank's (each optimizer step and the old
  pass wait for it), simulated with the project's own rule (packing.deal, micro_batches,
  computed_tokens; step_positions): log-normal response lengths (mean --response-len, sd
  --response-sd, capped at max_new_tokens), a share --equal-groups of the groups with equal
  rewards (A = 0: the update skips them unless the loss reads every response, as grpo's KL term
  does), each prompt once in the packed layout; the grouped layout (the layout of before) pads
  every response to its group's longest and, under checkpointing, copies the prompt into every
  row. Prefill: 2N x prompts/rank x prompt tokens (prefix-cached). Decode: memory-bound:
  max_new_tokens steps (the longest response sets the wall clock), each reading the bf16 weights,
  plus the KV of every token of every sequence at every step, at --hbm-frac of HBM bandwidth; or
  compute-bound at --mfu if that is slower.
- The deal (packing.balance_ranks): the bytes the busiest rank receives, counted on a simulated
  step at the step's shape (prompts of the assumed mean, responses of mean --response-len, sd
  0.25 x it) with train.Sequence objects as they are at that point (token ids, rollout
  log-probs), by balance_ranks' own parts; CPU seconds to pickle and unpickle them at the rates
  bench/bench_deal.py measured (per MiB received, on a 2-core Xeon). Each rank receives its
  share of the sequences; before, all of them.
- Evaluation: decode waves of up to 256 sequences (vLLM's max_num_seqs) on the busiest rank, each
  running to the response cap like the rollout's decode: the held-out set (eval_data's rows, else
  MATH-500's 500) at eval_n every eval_every steps, amortised per step; and eval.py --preset paper
  on the same ranks. Problem i on rank i mod W (eval.my_problems); the rule before dealt whole
  chunks of ceil(1024 / n) problems, so MATH-500 at n = 1 was one call on rank 0 (eval_waves).
"""
import argparse
import json
import os
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

GiB = 2 ** 30
GPUS = {  # memory bytes, bf16 dense FLOP/s (the spec sheet's), HBM bytes/s
    "h100": ("H100 80GB", 79.6 * 2 ** 30, 989e12, 3.35e12),  # 81,559 MiB as nvidia-smi shows
    "h200": ("H200 141GB", 139 * 2 ** 30, 989e12, 4.8e12),  # 141 GB of HBM3e, ~139 GiB usable
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
    "qwen3-4b": dict(name="Qwen3-4B-Base", h=2560, I=9728, L=36, heads=32, kv=8, hd=128,
                     V=151936, tied=True, bias=False),
}
SHARED_CONFIG = os.path.join(ROOT, "..", "shared", "qwen2.5-math-tokenizer", "config.json")
# The update's speed as measured, the default in place of an assumed MFU: one NVIDIA H200 (torch
# 2.11.0+cu130), Qwen2.5-Math-1.5B (random weights from its config.json) at configs/math1.5b-tepo
# .yaml's shape: one packed micro-batch (groups of a 150-token prompt and 8 responses of 700),
# forward and backward, bf16, FSDP2 on one GPU, the flex kernel, activation checkpointing:
# 23,000 positions in 0.923 s = 24.9k tokens/s, 29.1% of the matmul peak measured on the spot
# (793 TFLOP/s) at 6N FLOPs a token. bench/gpu_check.py's speed line measures the like on any GPU
# (a micro-batch of the config's micro_batch_tokens).
MEASURED = dict(gpu="NVIDIA H200", model="1.5b", tokens_per_s=24.9e3, prompt=150, response=700,
                checkpointing=True)


def flops_per_token(m, S, checkpointing=True):
    """The update's FLOPs per trained position as the plan counts them: 8N with activation
    checkpointing (the forward recomputed), 6N without, plus causal attention over S positions
    (2 x layers x q_dim x S a forward; x4 with checkpointing, x3 without). `checkpointing` may be
    the share of the layers checkpointed (config checkpoint_layers / layers): (6 + 2 r) N."""
    N = params(m)[2]
    attn = 2 * m["L"] * m["heads"] * m["hd"] * S
    r = float(checkpointing)
    return (6 + 2 * r) * N + (3 + r) * attn


def checkpointing(cfg):
    """`cfg`'s activation checkpointing in words: off, on, or on its first N layers."""
    if not cfg.activation_checkpointing:
        return "off"
    return "on" if cfg.checkpoint_layers is None else f"on the first {cfg.checkpoint_layers} layers"


def recomputed(cfg, m):
    """The share of the decoder layers activation checkpointing recomputes under `cfg`."""
    if not cfg.activation_checkpointing:
        return 0.0
    return 1.0 if cfg.checkpoint_layers is None else min(cfg.checkpoint_layers, m["L"]) / m["L"]


def measured_mfu(peak=989e12):
    """MEASURED's tokens per second as a share of `peak` (the H200's spec-sheet bf16, which the
    plan divides by), counting FLOPs as the plan does (8N + attention: the recompute counted):
    the plan then gives MEASURED's own seconds for its shape. (At 6N against the measured matmul
    peak the same speed is the 29.1% quoted; against the spec sheet's, 23.3%.)"""
    m = model_shapes(MEASURED["model"])
    S = MEASURED["prompt"] + MEASURED["response"]
    return MEASURED["tokens_per_s"] * flops_per_token(m, S, MEASURED["checkpointing"]) / peak


HEAD_CHUNK = 2 ** 26  # tepo.HEAD_CHUNK_ELEMS: the chunked head's logits at a time


def head_bytes(cfg, m, T):
    """The update's memory for the log-probs at the LM head, one micro-batch of T positions: the
    chunked head's one chunk and its weight's gradient sums, or (lm_head: logits) the bf16 logits and
    their gradient, T x V x 2 B each, with _ChunkedLogProb's two fp32 buffers of 2^24."""
    if cfg.lm_head == "logits":
        return 2 * T * m["V"] * 2 + 2 * 2 ** 24 * 4
    return HEAD_CHUNK * 16 + m["V"] * m["h"] * 6


def shapes_from_config(path):
    """The plan's shapes from a transformers config.json (a model directory's): any Qwen2 / Qwen3 /
    Llama-like decoder."""
    with open(path) as f:
        c = json.load(f)
    c = c.get("text_config", c)
    heads = c["num_attention_heads"]
    return dict(name=c.get("_name_or_path") or os.path.basename(os.path.dirname(os.path.abspath(path))),
                h=c["hidden_size"], I=c["intermediate_size"], L=c["num_hidden_layers"], heads=heads,
                kv=c.get("num_key_value_heads", heads), hd=c.get("head_dim") or c["hidden_size"] // heads,
                V=c["vocab_size"], tied=c.get("tie_word_embeddings", False),
                bias=c.get("model_type") == "qwen2" or bool(c.get("attention_bias")))


def config_model(name):
    """The shapes of a config's `model`: a directory's config.json, or the MODELS entry whose hub
    name it is (Qwen/Qwen2.5-Math-7B -> "7b"). -> (key or the directory, shapes)"""
    if os.path.isfile(os.path.join(name, "config.json")):
        return name, shapes_from_config(os.path.join(name, "config.json"))
    for key, m in MODELS.items():
        if m["name"].lower() == name.rstrip("/").split("/")[-1].lower():
            return key, model_shapes(key)
    raise SystemExit(f"gpu_plan: the config's model {name!r} is neither a directory with config.json nor one "
                     f"of {', '.join(m['name'] for m in MODELS.values())}: give --model {'|'.join(MODELS)}")
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


def step_positions(cfg, W, prompt, resp, sd, equal, steps=40, seed=0):
    """Positions one step's passes compute, simulated through the project's own dealing and
    micro-batching (packing.deal, micro_batches, computed_tokens) on log-normal response lengths
    (mean resp, sd, capped at max_new_tokens), prompts of `prompt` tokens, a share `equal` of the
    groups with equal rewards (A = 0: the update skips them unless the loss reads every response).
    -> dict of means over `steps` simulated steps: "update" the busiest rank's positions summed
    over the mini-batches (each optimizer step waits for its busiest rank), "update_mean" the
    mean rank's, "old" and "old_mean" the same for the old pass, "real" every real token / W, and
    "before": the busiest rank's update under the rule before (whole groups by all their tokens)."""
    import numpy as np
    import packing
    from train import Sequence
    lcfg, layout, rows = cfg.loss_cfg, cfg.micro_batch_layout, cfg.activation_checkpointing
    rng = np.random.default_rng(seed)
    sigma2 = np.log(1 + (sd / resp) ** 2)
    ppr, G, K = cfg.prompts_per_step // W, cfg.group_size, cfg.num_minibatches

    def work(seqs):
        mbs = packing.micro_batches(seqs, cfg.micro_batch_tokens, layout)
        return packing.computed_tokens(mbs, layout, rows) if seqs else 0
    acc = {}
    for _ in range(steps):
        mbs = [[] for _ in range(K)]
        for r in range(W):
            seqs = []
            for g in range(ppr):
                flat = rng.random() < equal
                lens = np.minimum(np.maximum(np.rint(rng.lognormal(np.log(resp) - sigma2 / 2, np.sqrt(sigma2), G)), 1),
                                  cfg.max_new_tokens).astype(int)
                for j, n in enumerate(lens):
                    a = 0.0 if flat else (1.0 if j % 2 else -1.0)
                    seqs.append(Sequence((r, g), [0] * prompt, [0] * int(n), a,
                                         in_loss=a != 0 or lcfg.every_response_in_loss, rollout_logp=None))
            for k, part in enumerate(np.array_split(np.arange(len(seqs)), K)):
                mbs[k] += [seqs[i] for i in part]
        dealt = packing.deal(mbs, W, full_batch_metrics=cfg.full_batch_metrics)
        upd = [[work([s for s in dealt[r][k] if s.in_loss]) for r in range(W)] for k in range(K)]
        # the old pass: each later mini-batch's trained sequences as the update forwards them, then
        # the A = 0 ones apart (for the metrics); each call waits for its busiest rank
        parts = [[work([s for s in dealt[r][k] if s.in_loss]) for r in range(W)] for k in range(1, K)]
        parts.append([work([s for k in range(K) for s in dealt[r][k] if not s.in_loss])
                      if cfg.full_batch_metrics else 0 for r in range(W)])
        old = [sum(p[r] for p in parts) for r in range(W)]
        before = []
        for k in range(K):  # the rule before: whole groups by all their tokens, trained ones counted
            load, trained = [0] * W, [0] * W
            for grp in sorted(packing.groups_of(mbs[k]), key=lambda g: (-packing.cost(g), g[0].gid)):
                r = min(range(W), key=lambda r: (load[r], r))
                load[r] += packing.cost(grp)
                trained[r] += packing.cost([s for s in grp if s.in_loss]) if any(s.in_loss for s in grp) else 0
            before.append(max(trained))
        real = sum(len(s.resp) for mb in mbs for s in mb) + sum(
            len(g[0].prompt) for mb in mbs for g in packing.groups_of(mb))
        for key, v in (("update", sum(map(max, upd))), ("update_mean", sum(map(sum, upd)) / W),
                       ("old", sum(map(max, parts))), ("old_mean", sum(old) / W), ("real", real / W),
                       ("before", sum(before))):
            acc[key] = acc.get(key, 0) + v / steps
    return acc


_deal_traffic = {}


def deal_cost(W, prompts, G, resp, max_new, equal, prompt):
    """The deal's (balance_ranks') seconds and bytes on the busiest rank, before and now: the bytes
    counted on a simulated step (bench_deal.traffic, once per shape), the seconds from them at
    bench_deal's measured rates. -> {"before": (seconds, bytes), "now": (seconds, bytes)}"""
    import bench_deal
    key = (W, prompts, G, resp, max_new, equal, prompt)
    if key not in _deal_traffic:
        _deal_traffic[key] = bench_deal.traffic(bench_deal.step_batch(W, prompts, G, resp, max_new, equal, prompt))
    rule = prompts * G * bench_deal.RULE_SECONDS_PER_SEQUENCE
    return {way: (n / bench_deal.MiB * bench_deal.SECONDS_PER_MIB[way] + rule, n)
            for way, n in _deal_traffic[key].items()}


def eval_waves(problems, n, W, rule, max_num_seqs=256, seqs_per_call=1024):
    """Decode waves (of up to max_num_seqs sequences at once) on the busiest rank for one benchmark
    of `problems` problems at n samples: "now", problem i on rank i mod W (eval.my_problems) in
    calls of ceil(seqs_per_call / n) problems; "before", whole chunks of that many problems dealt
    round-robin to the ranks, one call each."""
    import math as m
    chunk = m.ceil(seqs_per_call / n)
    if rule == "now":
        mine = m.ceil(problems / W)
        return sum(m.ceil(min(chunk, mine - c) * n / max_num_seqs) for c in range(0, mine, chunk))
    chunks = [min(chunk, problems - c) for c in range(0, problems, chunk)]
    per_rank = [chunks[r::W] for r in range(W)]
    return max(sum(m.ceil(c * n / max_num_seqs) for c in mine) for mine in per_rank)


def plan(cfg, m, gpu, W, mfu, hbm_frac, resp, prompt, sd=None, equal=0.4):
    """Print the plan of one model on W GPUs of one kind; -> its headline figures (GiB per GPU
    of each phase, seconds per step and phase, minutes of eval.py --preset paper), which the
    README and the configs' comments quote (tests/test_gpu_plan.py compares)."""
    gname, mem, flops, bw = GPUS[gpu]
    layer, root, N = params(m)
    ppr, G, T = cfg.prompts_per_step // W, cfg.group_size, cfg.micro_batch_tokens
    print(f"\n=== {m['name']}: N = {N / 1e9:.2f} B params | {W} x {gname} | ESTIMATES ===")
    print(f"setting: {cfg.prompts_per_step} prompts x {G} samples ({ppr} prompts/rank), prompt "
          f"{prompt} tok (assumed mean; cap {cfg.max_prompt_len}), response {resp} tok (assumed "
          f"mean; cap {cfg.max_new_tokens}), micro_batch_tokens {T}, "
          f"checkpointing {checkpointing(cfg)}, lm_head {cfg.lm_head}")
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
    k = round(recomputed(cfg, m) * m["L"]) if cfg.activation_checkpointing else m["L"]
    ckpt = T * m["h"] * 2 * k + T * per_layer * (m["L"] - k) + (T * per_layer if k else 0)
    print(f"activations, one micro-batch of {T} tokens ({per_layer / m['h']:.0f} x h = "
          f"{per_layer / 1024:.0f} KiB per token per layer):")
    row("  without checkpointing: T x per-layer x L", full)
    row(f"  with checkpointing: inputs + 1 layer" + (f" ({k} of {m['L']} layers; the rest whole)"
                                                      if k < m["L"] else ""), ckpt)
    head = head_bytes(cfg, m, T)
    if cfg.lm_head == "logits":
        row("logits bf16 T x V x 2 B (+ its grad: x2)", head, "(+ 2 fp32 chunk buffers of 2^24)")
    else:
        row("LM head in chunks: C x 16 B + V x h x 6 B", head, f"(no T x V logits: they were "
            f"{2 * T * m['V'] * 2 / GiB:.2f} GiB with their gradient; lm_head: logits)")
    nb = -(-T // 128)
    row("attention mask of a packed row", 2 * 2 * nb * nb * 4, f"(block masks of (T / 128)^2 tiles; "
        f"before: a T x T bool, {T * T / GiB:.2f} GiB kept, ~3x that while built)")
    act = ckpt if cfg.activation_checkpointing else full
    update = sum(states.values()) + gathered + act + head + CTX + ASLEEP + 16 * nb * nb
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
    row("update: states + gathered + act + head", update, fits(update))
    row("update: optimizer-side peak (reduce-scatter)", update_peak2, fits(update_peak2))
    if update > mem:
        scales = head if cfg.lm_head == "logits" else 0   # what scales with T: the logits (x2), activations
        free = mem - (update - scales - act)
        per_tok = scales / T + act / T
        print(f"  -> micro_batch_tokens <= ~{max(free, 0) / per_tok / 1e3:.0f}k would fit (estimate)")
    # time
    S = prompt + resp
    q_dim = m["heads"] * m["hd"]
    attn_fwd = 2 * m["L"] * q_dim * S                       # per token, causal
    pos = step_positions(cfg, W, prompt, resp, sd or 0.65 * resp, equal)
    before = (f"; {pos['before'] / pos['update_mean']:.2f}x under the rule before, whole groups by all "
              f"their tokens" if cfg.micro_batch_layout == "packed" else "")
    print(f"micro-batch layout {cfg.micro_batch_layout}, {equal:.0%} of groups with equal rewards "
          f"(--equal-groups): per rank and step {pos['real'] / 1e3:.0f}k real tokens; the busiest "
          f"rank computes {pos['update'] / 1e3:.0f}k positions in the update ({pos['update'] / pos['update_mean']:.3f}x "
          f"the mean rank{before}) and {pos['old'] / 1e3:.0f}k in the old pass ({pos['old'] / pos['old_mean']:.3f}x): "
          f"the busiest rank's count in the times below (packing.deal, simulated)")
    r = recomputed(cfg, m)
    upd_flops = pos["update"] * ((6 + 2 * r) * N + (3 + r) * attn_fwd)
    old_flops = pos["old"] * (2 * N + attn_fwd)
    prefill = ppr * prompt * (2 * N + attn_fwd * prompt / S)
    steps = cfg.max_new_tokens
    seqs = ppr * G
    kv_read = seqs * (prompt * resp + resp * resp / 2) * kv_tok
    dec_mem = (steps * 2 * N + kv_read) / (hbm_frac * bw)
    dec_cmp = seqs * resp * (2 * N + 2 * attn_fwd) / (flops * mfu)
    t_roll = prefill / (flops * mfu) + max(dec_mem, dec_cmp)
    t_old, t_upd = old_flops / (flops * mfu), upd_flops / (flops * mfu)
    # Evaluation: decode waves of up to 256 sequences on the busiest rank (eval.py's rule now, and
    # the chunks of before), each running to the response cap, memory-bound like the rollout.
    wave = (steps * 2 * N + 256 * (prompt * resp + resp * resp / 2) * kv_tok) / (hbm_frac * bw)
    held_out = count_rows(cfg.eval_data) or 500
    now, before = (eval_waves(held_out, cfg.eval_n, W, rule) for rule in ("now", "before"))
    t_eval = now * wave / max(cfg.eval_every, 1) if cfg.eval_data else 0.0
    print(f"step time (ESTIMATE; MFU {mfu:.0%} of {flops / 1e12:.0f} TFLOPS, decode at "
          f"{hbm_frac:.0%} of {bw / 1e12:.2f} TB/s):")
    print(f"  rollout  {t_roll:7.1f} s  (prefill {prefill / (flops * mfu):.2f} s; decode "
          f"{steps} steps x {seqs} seqs: memory-bound {dec_mem:.1f} s, compute-bound "
          f"{dec_cmp:.1f} s; the larger counts)")
    print(f"  old pass {t_old:7.1f} s  ({old_flops / 1e15:.1f} PFLOP)")
    print(f"  update   {t_upd:7.1f} s  ({upd_flops / 1e15:.1f} PFLOP; the busiest rank's {pos['update'] / 1e3:.0f}k "
          f"positions)")
    print(f"  eval     {t_eval:7.1f} s  (held-out {held_out} problems x {cfg.eval_n} every {cfg.eval_every} "
          f"steps: {now} decode wave(s) of {wave:.1f} s on the busiest rank; before, rank 0 alone: {before})")
    deal = deal_cost(W, cfg.prompts_per_step, G, resp, cfg.max_new_tokens, equal, prompt)
    t_deal = deal["now"][0]
    print(f"  deal     {t_deal:7.2f} s  (balance_ranks on the busiest rank: {deal['now'][1] / 2**20:.1f} MiB "
          f"received, its share of the sequences, pickled and unpickled; before, every sequence to every "
          f"rank, {deal['before'][1] / 2**20:.1f} MiB and {deal['before'][0]:.2f} s; CPU seconds at "
          f"bench_deal.py's rates)")
    print(f"  total    {t_roll + t_old + t_upd + t_eval + t_deal:7.1f} s/step (not modelled: weight sync, grading, "
          f"vLLM's per-decode-step CPU overhead: +1 s per 0.33 ms/step over {steps} steps)")
    paper = {b: (size, 32 if size < 100 else 4) for b, size in PAPER_SIZES.items()}
    now, before = (sum(eval_waves(p, n, W, rule) for p, n in paper.values()) for rule in ("now", "before"))
    print(f"eval.py --preset paper ({sum(p * n for p, n in paper.values()):,} samples) on {W} ranks: "
          f"{now} decode waves on the busiest rank, ~{now * wave / 60:.1f} min (before: {before} waves, "
          f"~{before * wave / 60:.1f} min)")
    return {"rollout_gib": rollout_mem / GiB, "update_gib": update / GiB, "rollout_s": t_roll,
            "old_s": t_old, "update_s": t_upd, "eval_s": t_eval,
            "deal_s": t_deal, "step_s": t_roll + t_old + t_upd + t_eval + t_deal,
            "paper_eval_min": now * wave / 60}


def count_rows(path):
    """The lines of a JSONL file, or 0 when it is not there."""
    try:
        with open(path if os.path.isabs(path) else os.path.join(ROOT, path)) as f:
            return sum(1 for line in f if line.strip())
    except OSError:
        return 0


# The paper protocol's benchmarks and their sizes (data.py fetch's files): n = 32 under 100
# problems, else 4 (eval.PRESETS["paper"]).
PAPER_SIZES = {"math500": 500, "aime24": 30, "aime25": 30, "amc23": 40, "minerva": 272,
               "olympiadbench": 675, "gsm8k": 1319}


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
    ap.add_argument("--model", choices=MODELS, help="the shapes to plan (default: the config's model)")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--gpu", choices=(*GPUS, "all"), default="all")
    ap.add_argument("--mfu", type=float, help="MFU of prefill, old pass and update, of the spec sheet's "
                                               "bf16 peak, FLOPs counted as the plan does (default: "
                                               "the update's as measured on one H200, MEASURED)")
    ap.add_argument("--hbm-frac", type=float, default=0.6, help="assumed share of HBM bandwidth")
    ap.add_argument("--response-len", type=int, help="assumed mean (default max_new_tokens / 2)")
    ap.add_argument("--prompt-len", type=int, default=150, help="assumed mean prompt tokens")
    ap.add_argument("--response-sd", type=float, help="assumed sd of response lengths (default "
                                                      "0.65 x mean): the grouped layout's padding")
    ap.add_argument("--equal-groups", type=float, default=0.4,
                    help="share of groups with equal rewards, which the update skips (default 0.4: "
                         "early and late in training 40-60%% of groups are)")
    ap.add_argument("--set", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                    help="config overrides, e.g. micro_batch_layout=grouped (several, as train.py's)")
    ap.add_argument("--no-anchor", action="store_true")
    args = ap.parse_args()
    import train
    cfg = train.load_config(args.config, args.set)
    resp = args.response_len or cfg.max_new_tokens // 2
    shapes = model_shapes(args.model) if args.model else config_model(cfg.model)[1]
    mfu = args.mfu or measured_mfu()
    if not args.mfu:
        print(f"MFU {mfu:.1%} of the spec sheet's bf16 peak, FLOPs counted as below: the update's "
              f"{MEASURED['tokens_per_s'] / 1e3:.1f}k tokens/s measured on one {MEASURED['gpu']} "
              f"(Qwen2.5-Math-1.5B, checkpointing; MEASURED), taken for every GPU and phase")
    for gpu in GPUS if args.gpu == "all" else (args.gpu,):
        plan(cfg, shapes, gpu, args.gpus, mfu, args.hbm_frac, resp,
             args.prompt_len, args.response_sd, args.equal_groups)
    if not args.no_anchor:
        anchor()


if __name__ == "__main__":
    main()
