"""The first command on a GPU machine: does this project's GPU path work here, before GPU-hours go
into a run? Each check prints its number and PASS or FAIL; the exit code is the number that failed.

    python bench/gpu_check.py [--config configs/math1.5b-tepo.yaml] [--model ID_OR_DIR]
                              [--backend vllm|hf] [--random-init]
    python bench/gpu_check.py --cpu    # the same checks on the CPU with a tiny model (the tests)

On one GPU, with the config's model (or --model: a smaller one checks the path faster), in a few
minutes:
  1. one RL step   train.py for one step of the config at a small size (4 prompts x 4 responses of
                   up to 256 tokens, on 16 arithmetic problems), in its own process: it ends, with
                   finite metrics; its seconds per step
  2. packed = own  the trainer's log-probs of packed responses (the config's kernel: FlexAttention
                   on a GPU, FSDP2 as in training) against each sequence through the model alone,
                   with transformers' own attention: in fp32 the largest |difference| per token
                   (a leak between the sequences of a row, or a wrong mask, is ~1), and in the
                   config's train_dtype (bf16) the mean
  3. vLLM beside   the engine started at the config's gpu_memory_utilization beside the trainer,
                   sampling; its log-probs against the trainer's (mismatch/abs_mean) and the GPU
                   memory in use
  4. weight sync   the engine asleep, one optimizer step of the trainer (lr 1e-4, so the policy
                   moves), the engine woken and sent the weights (as train.py's sync_weights):
                   the mismatch of fresh samples after the sync, against the mismatch before it
  5. gradients     one forward and backward of a packed row (3 prompts x 4 responses) through the
                   model cut to two layers, the first within a sliding window (where the
                   architecture has one), under the flex kernel against sdpa: the worst relative
                   difference of a parameter's gradient, in fp32 and in bf16 (against bf16's own
                   rounding there: sdpa in bf16 against sdpa in fp32)
  6. floor        check 1's step runs at lr 1e-30 with a reward that spreads every group: the
                   policy does not move, so the later mini-batches' largest |log r| and |log s_i|
                   and the KL mask's share are 0 where the kernels compute alike with and
                   without grad (the first mini-batch's are by construction); FAIL where a clip
                   decision moved: a token clipped, or |log s_i| over a tenth of the clip
  7. speed        one training micro-batch of the config at its shape (micro_batch_tokens of
                   groups of a 150-token prompt and group_size responses of 700; bf16, activation
                   checkpointing, the packed kernel, the LM head in chunks, FSDP2): tokens/s
                   forward+backward, peak memory, MFU (6N) of a bf16 matmul's peak measured here;
                   under it, a line each (not judged) for the LM head of before (lm_head logits),
                   checkpointing off (with either head), on half the layers, and each layer
                   compiled (a GPU's only); and gpu_plan's step estimate for the config on 8 such
                   GPUs at the config's speed
--backend hf (the default where vLLM cannot be imported): the rollout with transformers'
generate; checks 3 and 4, which need vLLM, print SKIP with the reason. The exit code counts FAILs
only.
--random-init: --model is a directory with the model's config.json and tokenizer files but no
weights (the hub cannot be reached): the checks run on random weights of the config's
architecture and size (the path, the kernels, the speed; rewards and accuracy mean nothing then).
--cpu: the same seven, on a tiny random Qwen2 model (demo.make_tiny_model), fp32 but for check 2's
bf16 line, the "sdpa" kernel for the trainer (the flex kernel's forward is checked as well in 2;
torch's flex_attention has no backward on the CPU, so 5 checks sdpa against each sequence alone
through the eager attention), vLLM's CPU build or (--backend hf) transformers' generate:
tests/test_gpu_check.py runs it, so it cannot rot.
Versions: the GPU path supports torch >= 2.11 and transformers >= 5.17 (the oldest a GPU has run it
with: torch 2.11.0+cu130, transformers 5.17.0 on an H200); older ones are named at start.
"""
import argparse
import contextlib
import importlib.util
import io
import json
import math
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

import torch  # noqa: E402
import yaml  # noqa: E402

import packing  # noqa: E402
import policy  # noqa: E402
import ranks  # noqa: E402
import rollout  # noqa: E402
import tepo  # noqa: E402
from config import load_config  # noqa: E402
from data import build_prompt, encode_prompt, load_tokenizer, resolve_model  # noqa: E402
from demo import DEMO_TEMPLATE, generate_rows, make_tiny_model  # noqa: E402
from train import Sequence  # noqa: E402

# Tolerances: (CPU fp32, GPU). fp32 on either device leaves only float noise; bf16 a few 1e-3 per
# token (README: 4.9e-3 sampler/trainer at step 0 in bf16), a broken path ~0.1 to 10.
TOL = {"fp32_max": 1e-3, "bf16_logp": 3.0, "mismatch": (1e-4, 2e-2), "sync_ratio": 3.0,
       "grad_fp32": 1e-3, "grad_bf16": 3.0}
# The packed log-probs in bf16 (packed_equals_own): against each sequence alone through the model
# in bf16, within TOL["bf16_logp"] x bf16's own noise on the same tokens (the same reference in bf16
# against fp32), as the gradients' check. A fixed 2e-2 passed an H200's random-weight 1.5B by a hair
# (1.86e-2): near-uniform logits over 151,936 tokens put every log-prob near -log(151936) = -11.9,
# where bf16's step is 2^-4 (its rounding alone is ~1.6e-2 on average there), while real weights'
# sampled tokens sit far higher. A leak between sequences gives ~1.
OLDEST = {"torch": (2, 11), "transformers": (5, 17)}  # the oldest the GPU path has run with
# The gradients' (kernel_gradients): the worst relative difference over the parameters, measured
# on the CPU form's row (3 prompts x 4 responses, a window of 12). fp32: sdpa against the eager
# attention 8.2e-7 (float noise); 1e-3 as the log-probs'. bf16: each kernel in bf16 is 1.4e-2 to
# 1.5e-2 from itself in fp32 (bf16's own rounding, "noise"), and sdpa is 1.4e-2 from eager, both
# in bf16 (0.9 x the noise): two kernels each one noise from the exact gradient differ by up to 2
# noises, so 3 x the noise measured on the same row (on a GPU, of sdpa: its size on real weights
# and long rows is not known beforehand) is that with a margin. A backward that drops the window
# is 1.1 off (72 x the noise), one whose window is one position too wide 0.42 (28 x).


def report(results, name, value, ok, note=""):
    print(f"{'PASS' if ok else 'FAIL'}  {name:<14} {value}{'  ' + note if note else ''}", flush=True)
    results.append(ok)


def skip(name, why):
    """A check that cannot run here: said, and not counted (the exit code counts FAILs)."""
    print(f"SKIP  {name:<14} {why}", flush=True)


def version_lines():
    """The versions the check runs on, and a warning for one older than the GPU path supports."""
    import transformers
    out = [f"torch {torch.__version__}, transformers {transformers.__version__}"]
    for name, module in (("torch", torch), ("transformers", transformers)):
        have = tuple(int(x) for x in module.__version__.split("+")[0].split(".")[:2])
        if have < OLDEST[name]:
            out.append(f"warning: {name} {module.__version__} is older than the oldest the GPU path has run "
                       f"with ({'.'.join(map(str, OLDEST[name]))}): a FAIL may be the version's")
    return out


def random_model(src, work):
    """--random-init: the architecture of `src`'s config.json (a directory with the config and the
    tokenizer files, no weights) with random weights, saved in bf16 into work/random with the
    tokenizer. -> its path"""
    import shutil

    from transformers import AutoConfig, AutoModelForCausalLM
    if not os.path.isfile(os.path.join(src, "config.json")):
        raise SystemExit(f"--random-init: {src} has no config.json (give a directory with the model's "
                         f"config.json and tokenizer files)")
    out = os.path.join(work, "random")
    os.makedirs(out)
    for f in os.listdir(src):
        if not f.endswith((".safetensors", ".bin", ".pt")) and os.path.isfile(os.path.join(src, f)):
            shutil.copy(os.path.join(src, f), out)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(src), dtype=torch.bfloat16)
    model.save_pretrained(out)
    return out


def small_config(args, model_dir, work):
    """The config at the check's size, as a YAML file on top of --config (its model, kernel, dtypes
    and memory split kept): 16 arithmetic problems to train on. -> its path"""
    data_file = os.path.join(work, "problems.jsonl")
    rows, _ = generate_rows(16, seed=0)
    with open(data_file, "w") as f:
        f.writelines(json.dumps({"problem": r["problem"], "answer": r["answer"]}) + "\n" for r in rows)
    small = {"base": os.path.abspath(args.config), "model": model_dir, "train_data": data_file,
             "eval_data": "", "out_dir": os.path.join(work, "rl"), "steps": 1, "prompts_per_step": 4,
             "group_size": 4, "max_prompt_len": 128, "max_new_tokens": 48 if args.cpu else 256,
             "save_every": 0, "log_samples_every": 0, "loggers": ["jsonl"],
             "prompt_template": DEMO_TEMPLATE,
             # the floor (rl_step): the policy does not move (an fp32 weight plus 1e-30 is itself),
             # and a reward that spreads every group, so every mini-batch trains
             "lr": 1e-30, "reward": "gpu_check_reward:coin", "failed_reward": 0.0}
    with open(os.path.join(work, "gpu_check_reward.py"), "w") as f:
        f.write(COIN_REWARD)
    sys.path.insert(0, work)  # the config names it: importable here, and in train.py (PYTHONPATH)
    if args.cpu:
        small.update(dtype="float32", train_dtype="float32")
    if args.backend == "hf":
        small["backend"] = "hf"
    path = os.path.join(work, "small.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(small, f)
    return path


COIN_REWARD = '''"""gpu_check's reward: 1 or 0 by a hash of the response, so every group of 4 is likely
spread and every mini-batch trains (random weights earn 0 from the grader on every sample)."""
import zlib


def coin(response, gold, *, format_reward=0.0, no_answer_penalty=0.0):
    return float(zlib.crc32(response.encode()) % 2)
'''


def rl_step(config, results):
    """1. train.py for one step, in its own process (torchrun, one rank); and 6, the floor: at lr
    1e-30 the policy does not move, so every later mini-batch's ratios to pi_old should be 1, as the
    first one's are by construction (train.old_logprobs forwards each mini-batch as the update
    does: the same rows, so the same kernels' inputs; the update's forward runs under grad)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
           os.path.join(ROOT, "train.py"), "--config", config]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(config), os.environ.get("PYTHONPATH", "")]))
    t0 = time.perf_counter()
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    if run.returncode:
        return report(results, "one RL step", f"exit {run.returncode}", False, run.stderr[-1500:])
    cfg = load_config(config)
    with open(os.path.join(cfg.out_dir, "metrics.jsonl")) as f:
        last = [json.loads(line) for line in f][-1]
    finite = all(v is None or not isinstance(v, float) or math.isfinite(v) for v in last.values())
    report(results, "one RL step", f"{last['timing/step']:.1f} s/step ({time.perf_counter() - t0:.0f} s "
           f"with start-up), reward {last['reward/mean']:.3f}", finite and last["step"] == 1)
    report_floor(results, last, cfg.loss_cfg)


def report_floor(results, last, lcfg):
    """6. The floor at lr 1e-30 (rl_step): the largest |log r| per token, the largest |log s_i|
    (the sequence ratio TEPO and GSPO clip, from actor/ratio_min and _max) and the KL mask's share
    over the later mini-batches, beside the clip range. 0 expected (exact). FAIL where the noise
    moved a clip decision: a token clipped (actor/clip_frac_low, _high), or for a sequence ratio
    |log s_i| over a tenth of the narrowest clip. The mask's share is reported, not judged: where
    log r is noise, H < H_old is a coin flip, but its term's gradient is that noise's size."""
    steps = last.get("actor/optimizer_steps", 0)
    if steps < 2:  # seeded: again the same; 1 in ~150 with 4 groups of 4 (each all alike 1 in 8)
        return report(results, "floor", f"{steps} optimizer step(s): no later mini-batch trained", False,
                      "the coin reward left too few groups spread; report this line")
    log_r = last.get("actor/log_ratio_max", 0.0)
    log_s = max(abs(math.log(last["actor/ratio_max"])), abs(math.log(last["actor/ratio_min"])))
    mask = last.get("actor/kl_mask_frac")
    clipped = last.get("actor/clip_frac_low", 0.0) + last.get("actor/clip_frac_high", 0.0)
    clip = min(lcfg.clip_low, lcfg.clip_high)
    exact = log_r == 0 and log_s == 0 and not mask
    ok = clipped == 0 and (lcfg.ratio == "token" or log_s < 0.1 * clip)
    report(results, "floor", f"at lr 1e-30, {steps} optimizer steps: max |log r| {log_r:.1e}, max |log "
           f"{'s_i' if lcfg.ratio == 'sequence' else 'r'}| {log_s:.1e}"
           + (f", KL mask on {mask:.1%} of tokens" if mask is not None else "") + f", clipped {clipped:.1%}"
           + (" (exact)" if exact else " (NOT exact: the old pass and the update's forward round apart)"),
           ok, f"clip range 1 - {lcfg.clip_low:g} / 1 + {lcfg.clip_high:g}")


def sequences(tokenizer, n, max_resp, seed=0, per_prompt=2):
    """n Sequences: real prompts (the demo's problems through the template), random responses of
    1..max_resp tokens, `per_prompt` per prompt, advantages +1 and -1 in turn."""
    g = torch.Generator().manual_seed(seed)
    rows, _ = generate_rows(n // per_prompt, seed=seed)
    vocab = min(len(tokenizer), 30000)
    out = []
    for k, row in enumerate(rows):
        prompt = encode_prompt(tokenizer, row["problem"], DEMO_TEMPLATE)[1]
        for _ in range(per_prompt):
            R = int(torch.randint(1, max_resp + 1, (1,), generator=g))
            out.append(Sequence((0, k), prompt, torch.randint(3, vocab, (R,), generator=g).tolist(),
                                (-1.0) ** len(out), True, torch.zeros(R)))
    return out


def trainer_logprobs(model, seqs, device, temperature=1.0):
    """[(R,) fp32] of `seqs` packed into one row (no grad)."""
    with torch.no_grad():
        batch = packing.collate(seqs, device)
        logp, _ = tepo.response_logprobs(model, batch, temperature, False)
    return [logp[b, :len(s.resp)].float().cpu() for b, s in enumerate(seqs)]


def own_logprobs(model_dir, seqs, device, dtype):
    """[(R,) fp32] of each sequence alone through the model with transformers' own SDPA attention."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="sdpa").to(device)
    out = []
    with torch.no_grad():
        for s in seqs:
            logits = model(input_ids=torch.tensor([s.prompt + s.resp], device=device)).logits[0].float()
            lp = logits[len(s.prompt) - 1:-1].log_softmax(-1)
            out.append(lp.gather(1, torch.tensor(s.resp, device=device)[:, None])[:, 0].cpu())
    del model
    return out


def differences(a, b):
    d = torch.cat([(x - y).abs() for x, y in zip(a, b)])
    return d.max().item(), d.mean().item()


def packed_equals_own(args, config, model_dir, device, results):
    """2. Packed log-probs (FSDP2, the config's kernel) against each sequence alone."""
    tokenizer = load_tokenizer(model_dir)
    seqs = sequences(tokenizer, 12, 48 if args.cpu else 600)
    kernels = ["sdpa", "flex"] if args.cpu else [None]  # None: the config's (flex on a GPU)
    for kernel in kernels:
        cfg = load_config(config, ["train_dtype=float32"] + ([f"packed_attention={kernel}"] if kernel else []))
        if kernel == "flex":  # forward only on the CPU (no flex backward there): the model alone
            model = policy.load_model(model_dir, "flex").to(device)
        else:
            model = policy.load_policy(model_dir, cfg, device, trainable=False)
        worst, _ = differences(trainer_logprobs(model, seqs, device),
                               own_logprobs(model_dir, seqs, device, torch.float32))
        name = f"packed = own ({kernel or policy.packed_kernel(cfg, device)}, fp32)"
        report(results, name, f"max |d| {worst:.2e} per token", worst <= TOL["fp32_max"])
        del model
    cfg = load_config(config, ["train_dtype=bfloat16"])
    model = policy.load_policy(model_dir, cfg, device, trainable=False)
    own16, own32 = (own_logprobs(model_dir, seqs, device, d) for d in (torch.bfloat16, torch.float32))
    _, mean = differences(trainer_logprobs(model, seqs, device), own16)
    _, noise = differences(own16, own32)
    report(results, "packed = own (bf16)", f"mean |d| {mean:.2e} per token", mean <= TOL["bf16_logp"] * noise,
           f"bf16's own: the reference in bf16 vs fp32 {noise:.2e}, tolerance {TOL['bf16_logp']:g} x that")
    del model


def windowed_config(model_dir, window, layers=2):
    """`model_dir`'s transformers config cut to its first `layers` layers, which attend in turn
    within a sliding `window` and over everything (the first sliding), where the architecture
    reads a window (Qwen2 and Qwen3 through use_sliding_window, Gemma 3, Mistral; Llama has none):
    the packed row's hardest case, on the model's own weights. -> config"""
    from transformers import AutoConfig
    config = AutoConfig.from_pretrained(model_dir)
    text = config.get_text_config()
    text.num_hidden_layers = min(layers, text.num_hidden_layers)
    text.layer_types = [("sliding_attention", "full_attention")[i % 2] for i in range(text.num_hidden_layers)]
    text.sliding_window = window
    text.use_sliding_window = True
    return config


def keeps_window(config):
    """Whether a model built from `config` has a layer attending within a sliding window (its
    architecture reads the setting). Built on the meta device: no memory, no weights."""
    from transformers import AutoModelForCausalLM
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return any(getattr(m, "sliding_window", None) for m in model.modules())


def gradients(model_dir, config, seqs, kernel, dtype, device, checkpointing=False):
    """{parameter name: gradient (fp32, on the CPU)} of one forward and backward of `seqs` through
    the model `config` builds from `model_dir`'s weights, in `dtype` (weights and compute: what
    FSDP2's bf16 MixedPrecisionPolicy computes with, on one rank), for the policy-gradient loss
    -sum_i A_i sum_t logp[i, t] / (response tokens). `kernel`: "sdpa" or "flex", the sequences
    packed into one row (packing.collate, as train.py forwards them); "eager", each sequence alone
    through transformers' own eager attention (the reference: nothing packed)."""
    from transformers.utils import logging as hf_logging
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the layers cut off are "weights not used", as meant
    try:
        model = policy.load_model(model_dir, kernel if kernel in packing.KERNELS else None, config)
    finally:
        hf_logging.set_verbosity(verbosity)
    if kernel == "eager":
        model.set_attn_implementation("eager")
    model.to(device=device, dtype=dtype).train()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    tokens = sum(len(s.resp) for s in seqs)
    if kernel in packing.KERNELS:
        batch = packing.collate(seqs, device)
        logp, _ = tepo.response_logprobs(model, batch, 1.0, False)
        (-(batch["adv"][:, None] * logp * batch["mask"]).sum() / tokens).backward()
    else:
        for s in seqs:
            ids = torch.tensor([s.prompt + s.resp], device=device)
            logits = model(input_ids=ids, use_cache=False).logits[:, len(s.prompt) - 1:-1]
            logp, _ = tepo.token_logprobs_entropy(logits, torch.tensor([s.resp], device=device), 1.0, False)
            (-s.adv * logp.sum() / tokens).backward()
    return {n: p.grad.float().cpu() for n, p in model.named_parameters() if p.grad is not None}


def gradient_difference(a, b):
    """The worst relative difference of two gradients over the parameters, max over p of
    |a_p - b_p| / |b_p| (L2 norms), and that parameter's name: a leak, a wrong mask or a wrong
    window in one layer shows in that layer's tensors whatever the rest does. -> (value, name)"""
    if a.keys() != b.keys():
        raise ValueError(f"the gradients are of different parameters: {sorted(a.keys() ^ b.keys())}")
    worst = {n: ((a[n] - b[n]).norm() / b[n].norm().clamp_min(1e-30)).item() for n in b}
    name = max(worst, key=worst.get)
    return worst[name], name


def compare_kernels(model_dir, config, seqs, kernel, reference, device, checkpointing=False):
    """The gradients of `kernel` against `reference`'s (gradients, gradient_difference) on the same
    sequences and weights: in fp32, and in bf16 beside bf16's own rounding (`reference` in bf16
    against itself in fp32). -> {"fp32": (difference, parameter), "bf16": ..., "bf16 noise": ...}"""
    grads = {(k, d): gradients(model_dir, config, seqs, k, d, device, checkpointing)
             for k in (kernel, reference) for d in (torch.float32, torch.bfloat16)}
    return {"fp32": gradient_difference(grads[kernel, torch.float32], grads[reference, torch.float32]),
            "bf16": gradient_difference(grads[kernel, torch.bfloat16], grads[reference, torch.bfloat16]),
            "bf16 noise": gradient_difference(grads[reference, torch.bfloat16],
                                              grads[reference, torch.float32])}


def gradients_agree(differences):
    """PASS rule of compare_kernels' differences -> {"fp32": bool, "bf16": bool}. fp32: within
    TOL["grad_fp32"]; bf16: within TOL["grad_bf16"] times bf16's own noise on that row."""
    return {"fp32": differences["fp32"][0] <= TOL["grad_fp32"],
            "bf16": differences["bf16"][0] <= TOL["grad_bf16"] * differences["bf16 noise"][0]}


def kernel_gradients(args, config, model_dir, device, results):
    """5. The packed kernel's gradients against another's: on a GPU flex (the default kernel, whose
    backward runs nowhere else) against sdpa; on the CPU (no flex backward there) sdpa against
    each sequence alone through the eager attention. One packed row of several prompts with
    several responses each, through the model cut to two layers, one of them sliding."""
    cfg = load_config(config)
    kernel, reference = ("sdpa", "eager") if args.cpu else ("flex", "sdpa")
    window = 12 if args.cpu else 200
    seqs = sequences(load_tokenizer(model_dir), 12, 48 if args.cpu else 600, seed=3, per_prompt=4)
    windowed = windowed_config(model_dir, window)
    differences = compare_kernels(model_dir, windowed, seqs, kernel, reference, device,
                                  cfg.activation_checkpointing)
    ok = gradients_agree(differences)
    slides = keeps_window(windowed)
    shape = (f"{len(seqs) // 4} prompts x 4 responses, {sum(len(s.resp) for s in seqs)} response "
             f"tokens, window {window if slides else 'none (the architecture has none)'}")
    value, name = differences["fp32"]
    report(results, f"grads {kernel} = {reference} (fp32)", f"worst {value:.2e} ({name})", ok["fp32"],
           shape)
    value, name = differences["bf16"]
    noise = differences["bf16 noise"][0]
    report(results, f"grads {kernel} = {reference} (bf16)", f"worst {value:.2e} ({name})", ok["bf16"],
           f"bf16's own: {reference} bf16 vs fp32 {noise:.2e}, tolerance {TOL['grad_bf16']:g} x that")


def mismatch(engine_samples, trainer_lps):
    d = torch.cat([(torch.tensor(s.logprobs) - lp).abs() for s, lp in zip(engine_samples, trainer_lps)])
    return d.mean().item()


def engine_and_sync(args, config, model_dir, device, results):
    """3. vLLM beside the trainer, and 4. one weight sync after an optimizer step."""
    if args.backend != "vllm":
        why = ("--backend hf" if importlib.util.find_spec("vllm") else "vLLM is not installed here") + \
              ": the engine is not checked (pip install -r requirements-cuda.txt, then run again)"
        skip("vLLM beside", why)
        skip("weight sync", why)
        return
    cfg = load_config(config)
    model = policy.load_policy(model_dir, cfg, device)
    engine = rollout.make_engine(model_dir, backend="vllm", dtype=cfg.dtype, seed=0,
                                 max_model_len=cfg.max_prompt_len + cfg.max_new_tokens,
                                 gpu_memory_utilization=cfg.gpu_memory_utilization)
    tokenizer = load_tokenizer(model_dir)
    rows, _ = generate_rows(8, seed=1)
    prompts = [build_prompt(tokenizer, r["problem"], DEMO_TEMPLATE) for r in rows]
    tol = TOL["mismatch"][0 if args.cpu else 1]

    def sample_and_score(seed):
        groups = engine.generate(prompts, n=2, max_new_tokens=cfg.max_new_tokens, temperature=1.0,
                                 top_p=1.0, seed=seed)
        samples = [s for g in groups for s in g]
        seqs = [Sequence((0, i // 2), s.prompt_ids, s.response_ids, 1.0, True, torch.zeros(1))
                for i, s in enumerate(samples)]
        return samples, seqs
    samples, seqs = sample_and_score(1)
    before = mismatch(samples, trainer_logprobs(model, seqs, device))
    memory = ""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info()
        memory = f"; GPU memory in use {(total - free) / 2**30:.1f} of {total / 2**30:.1f} GiB"
    report(results, "vLLM beside", f"mismatch/abs_mean {before:.2e}{memory}", before <= tol)

    engine.sleep()  # 4: as a step does: the engine asleep through the update
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4 if not args.cpu else 1e-2)
    batch = packing.collate(seqs, device)
    logp, _ = tepo.response_logprobs(model, batch, 1.0, False)
    (-(logp * batch["mask"]).sum() / batch["mask"].sum()).backward()
    opt.step()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    engine.wake()
    stale = mismatch(samples, trainer_logprobs(model, seqs, device))  # the engine's old weights
    engine.update_weights(policy.full_weights(model))
    samples, seqs = sample_and_score(2)
    after = mismatch(samples, trainer_logprobs(model, seqs, device))
    ok = after <= tol and stale >= TOL["sync_ratio"] * max(after, 1e-12)
    report(results, "weight sync", f"mismatch {after:.2e} after the sync, {stale:.2e} before it", ok)
    engine.close()


# The speed line's shape: the config's micro-batch filled with groups of this prompt and
# group_size responses of this length (gpu_plan's means; a tiny one on the CPU, so it cannot rot).
SPEED_SHAPE = {"gpu": (150, 700), "cpu": (20, 40, 512)}   # prompt, response[, micro_batch_tokens]


def matmul_peak(device, dtype):
    """FLOP/s of a large square matmul in `dtype`, measured here: the peak an MFU is a share of."""
    n = 8192 if device.type == "cuda" else 256
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    for _ in range(3):
        a @ b
    sync(device)
    reps, t0 = 10, time.perf_counter()
    for _ in range(reps):
        a @ b
    sync(device)
    return 2 * n ** 3 * reps / (time.perf_counter() - t0)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def speed_variants(cfg, layers, cpu):
    """The speed line's other settings, measured beside the config's own and printed under it (not
    judged): [(label, config overrides)]: the LM head of before (the model's logits), activation
    checkpointing the other way, on half the layers, and (on a GPU: on the CPU inductor's compile
    takes minutes) each layer compiled."""
    ckpt = cfg.activation_checkpointing
    out = [("lm_head logits (the path of before)", ["lm_head=logits"]),
           (f"checkpointing {'off' if ckpt else 'on'}", [f"activation_checkpointing={not ckpt}"]),
           (f"checkpointing {'off' if ckpt else 'on'}, lm_head logits",
            [f"activation_checkpointing={not ckpt}", "lm_head=logits"]),
           (f"checkpointing the first {layers // 2} of {layers} layers",
            ["activation_checkpointing=true", f"checkpoint_layers={layers // 2}"])]
    return out + ([] if cpu else [("each layer compiled", ["compile=true"])])


def speed(args, config, model_dir, device, results):
    """7. One training micro-batch of the config at its shape (micro_batch_tokens, train_dtype,
    activation checkpointing, the packed kernel, the LM head in chunks where exact, FSDP2 on one
    rank): forward + backward tokens per second, peak memory, MFU (6N FLOPs a token) of the matmul
    peak measured here; the same under speed_variants' settings (the logits' head, checkpointing
    off and on half the layers, compiled), one line each; and what gpu_plan's step estimate for the
    config on 8 such GPUs becomes at the config's speed."""
    import gpu_plan
    key = "cpu" if args.cpu else "gpu"
    prompt, resp, *budget = SPEED_SHAPE[key]
    base = [f"micro_batch_tokens={budget[0]}"] if budget else []
    cfg = load_config(config, base)
    group_size = load_config(args.config).group_size  # the config's, not the small step's 4
    g = torch.Generator().manual_seed(0)
    vocab = min(len(load_tokenizer(model_dir)), 30000)
    seqs, k = [], 0
    while sum(len(s.resp) for s in seqs) + prompt * k < cfg.micro_batch_tokens:
        ids = torch.randint(3, vocab, (prompt + group_size * resp,), generator=g).tolist()
        seqs += [Sequence((0, k), ids[:prompt], ids[prompt + i * resp:prompt + (i + 1) * resp], (-1.0) ** i, True,
                          torch.zeros(resp)) for i in range(group_size)]
        k += 1
    mb = packing.micro_batches(seqs, cfg.micro_batch_tokens, cfg.micro_batch_layout)[0]
    n_tokens = sum(len(s.resp) for s in mb)

    def measure(c):
        """(positions, seconds a forward + backward, peak bytes or None, N) under config `c`."""
        model = policy.load_policy(model_dir, c, device)
        batch = packing.collate(mb, device, c.micro_batch_layout, c.activation_checkpointing)

        def step():
            logp, _ = tepo.response_logprobs(model, batch, 1.0, False, c.lm_head)
            (-(batch["adv"][:, None] * logp * batch["mask"]).sum() / n_tokens).backward()
            model.zero_grad(set_to_none=True)
        step()  # the kernels' compilation and the allocator's first fill
        sync(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        reps, t0 = 3, time.perf_counter()
        for _ in range(reps):
            step()
        sync(device)
        seconds = (time.perf_counter() - t0) / reps
        peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else None
        N = sum(p.numel() for p in model.parameters())  # FSDP2's DTensors: the whole model's numbers
        positions = packing.computed_tokens([mb], c.micro_batch_layout, c.activation_checkpointing)
        return positions, seconds, peak, N

    def freed():
        if device.type == "cuda":
            torch.cuda.empty_cache()
    positions, seconds, peak_bytes, N = measure(cfg)
    freed()
    from transformers import AutoConfig
    L = AutoConfig.from_pretrained(model_dir).get_text_config().num_hidden_layers
    others = []
    for label, overrides in speed_variants(cfg, L, args.cpu):
        try:
            others.append((label, measure(load_config(config, base + overrides))))
        except torch.OutOfMemoryError:
            others.append((label, None))
        freed()
    # the dtype the forward and backward computed in (policy.load_policy's rule for "auto")
    dtype = getattr(torch, {"auto": "bfloat16" if device.type == "cuda" else "float32"}.get(cfg.train_dtype,
                                                                                        cfg.train_dtype))
    peak = matmul_peak(device, dtype)
    tps = positions / seconds
    mfu = 6 * N * tps / peak

    def memory(peak_bytes, N):  # one rank holds the whole model's fp32 weights and gradients (8N bytes)
        return (f"peak {peak_bytes / 2**30:.1f} GiB (with the unsharded fp32 weights and gradients, "
                f"{8 * N / 2**30:.1f} GiB, that a rank of 8 holds an eighth of)" if peak_bytes is not None
                else "peak memory: on a GPU")
    ok = math.isfinite(tps) and tps > 0
    report(results, "speed", f"{tps:,.0f} tokens/s forward+backward ({positions:,} positions in {seconds:.3f} s), "
           f"{memory(peak_bytes, N)}, MFU {mfu:.1%} (6N, N = {N / 1e9:.3g} B, of {peak / 1e12:.1f} TFLOP/s measured: a "
           f"{'bf16' if dtype == torch.bfloat16 else 'fp32'} matmul)", ok,
           f"{len(mb)} responses of {resp} after {len({s.gid for s in mb})} prompts of {prompt}, checkpointing "
           f"{'on' if cfg.activation_checkpointing else 'off'}, lm_head {cfg.lm_head}")
    for label, got in others:
        if got is None:
            print(f"      speed, {label}: out of memory", flush=True)
            continue
        n, secs, pk, _ = got
        print(f"      speed, {label}: {n / secs:,.0f} tokens/s ({secs:.3f} s), MFU {6 * N * n / secs / peak:.1%}, "
              f"{'peak ' + format(pk / 2**30, '.1f') + ' GiB' if pk is not None else 'peak memory: on a GPU'}",
              flush=True)
    # gpu_plan at this speed: its MFU counts FLOPs its own way (8N with checkpointing) of a spec sheet
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else ""
    gpu = next((k for k in gpu_plan.GPUS if k.upper() in name.upper()), None)
    where = gpu or "h100"
    m = gpu_plan.shapes_from_config(os.path.join(model_dir, "config.json"))
    plan_mfu = tps * gpu_plan.flops_per_token(m, prompt + resp, cfg.activation_checkpointing) / gpu_plan.GPUS[where][2]
    full = load_config(args.config)
    figures = {}
    for label, f in (("here", plan_mfu), ("default", gpu_plan.measured_mfu())):
        with contextlib.redirect_stdout(io.StringIO()):
            figures[label] = gpu_plan.plan(full, m, where, 8, f, 0.6, full.max_new_tokens // 2, 150, None, 0.4)
    here, default = figures["here"], figures["default"]
    print(f"      gpu_plan, {os.path.relpath(args.config, ROOT)} with this model on 8 x {gpu_plan.GPUS[where][0]}"
          f"{'' if gpu else ' (a stand-in: this is no GPU it knows)'}: {here['step_s']:.1f} s a step at this "
          f"speed (update {here['update_s']:.1f} s, old pass {here['old_s']:.1f} s); {default['step_s']:.1f} s at "
          f"its default ({gpu_plan.MEASURED['gpu']}'s measured speed)", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "math1.5b-tepo.yaml"))
    ap.add_argument("--model", help="the model to check with (default: the config's)")
    ap.add_argument("--cpu", action="store_true", help="the CPU form: a tiny model, fp32")
    ap.add_argument("--backend", choices=("vllm", "hf"),
                    help="the rollout engine (default: vllm where it can be imported, else hf)")
    ap.add_argument("--random-init", action="store_true",
                    help="--model is a directory with config.json and tokenizer files: random weights")
    args = ap.parse_args()
    if not args.cpu and not torch.cuda.is_available():
        raise SystemExit("no GPU here: run with --cpu for the CPU form of the checks")
    args.backend = args.backend or ("vllm" if importlib.util.find_spec("vllm") else "hf")
    if args.random_init and not args.model:
        raise SystemExit("--random-init needs --model DIR: the model's config.json and tokenizer files")
    print("\n".join(version_lines()), flush=True)
    results = []
    with tempfile.TemporaryDirectory() as work:
        if args.random_init:
            model_dir = random_model(args.model, work)
            print(f"random weights of {args.model}'s architecture (--random-init): rewards and accuracy mean "
                  f"nothing here; the path, the kernels and the speed are checked", flush=True)
        elif args.cpu:
            model_dir = args.model or make_tiny_model(os.path.join(work, "model"), hidden=64, layers=2,
                                                      heads=2, kv_heads=1, intermediate=128,
                                                      max_positions=512)
        else:
            model_dir = resolve_model(args.model or load_config(args.config).model)
        print(f"checking {model_dir} with {args.config} on {'the CPU' if args.cpu else torch.cuda.get_device_name()}"
              f", rollout engine {args.backend}", flush=True)
        config = small_config(args, model_dir, work)
        rl_step(config, results)
        # Checks 2-4 in this process: one rank's process group, as train.py's.
        rank, world, device = ranks.setup_distributed()
        for check in (packed_equals_own, engine_and_sync, kernel_gradients, speed):
            try:
                check(args, config, model_dir, device, results)
            except Exception as e:  # noqa: BLE001 - a check that crashes is a failed check, named
                report(results, check.__name__, f"{type(e).__name__}: {str(e)[:500]}", False)
    failed = results.count(False)
    print(f"{len(results) - failed} of {len(results)} checks passed" +
          (" (the engine's two skipped: --backend hf)" if args.backend != "vllm" else ""))
    ranks.end_distributed()
    sys.exit(failed)


if __name__ == "__main__":
    main()
