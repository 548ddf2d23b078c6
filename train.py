"""RL for math reasoning with TEPO and its baselines: one FSDP2 training loop, top to bottom.

    torchrun --nproc_per_node N train.py --config configs/tepo.yaml [--set key=value ...] [--resume]

Every rank holds a shard of the policy (FSDP2) and its own rollout engine (rollout.py), and samples
its own share of the prompts. One RL step, as `main` reads:
  1. sample    P prompts (P / N per rank), G responses each, with the rollout engine
  2. grade     with reward.py; DAPO's overlong shaping and dynamic sampling when configured
  3. prepare   group advantages; old log-probs and entropy (no grad); reference log-probs if needed
  4. update    `num_minibatches` optimizer steps, each accumulated over micro-batches that fit a
               token budget, the loss normalised by token/sequence counts all-reduced over ranks
  5. sync      full weights from FSDP2 into the engine; log metrics.jsonl; checkpoint
"""
import argparse
import dataclasses
import json
import math
import os
import random
import shutil
import signal
import socket
import sys
import threading
import time
import types
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist
import yaml
from tqdm import tqdm

import reward
import rollout
import tepo

UserError = rollout.UserError  # bad input: one line on stderr, no traceback (rollout.run_main)

# ----------------------------------------------------------------------------- config


@dataclass
class Config:
    """Every setting of a run; the README documents each. YAML keys map onto these fields."""
    model: str = ""                      # HF model directory or hub id: the initial policy (required)
    train_data: str = ""                 # JSONL with "problem" and "answer" per line (required)
    eval_data: str = ""                  # held-out JSONL: accuracy at start, every eval_every, end
    prompt_template: str | None = None   # "...{problem}..."; null: the chat template, else plain
    out_dir: str = "runs/run"            # metrics, samples and checkpoints go here
    seed: int = 0                        # data order, sampling seeds, initial RNG states
    method: str = "tepo"                 # grpo | drgrpo | dapo | gspo | tepo: the loss preset
    loss: dict = field(default_factory=dict)  # overrides of tepo.LossConfig fields, e.g. clip_high
    steps: int = 100                     # RL steps (one batch of P x G samples each)
    prompts_per_step: int = 16           # P over all ranks (divisible by the number of ranks)
    group_size: int = 8                  # G responses per prompt
    max_prompt_len: int = 512            # tokens; longer training prompts are dropped at load
    max_new_tokens: int = 1024           # response length cap (also Dr.GRPO's L_max)
    temperature: float = 1.0             # sampling temperature, also used for the trainer's log-probs
    top_p: float = 1.0                   # nucleus sampling (1.0 keeps sampler and trainer exact)
    num_minibatches: int = 4             # optimizer steps per RL step
    micro_batch_tokens: int = 16384      # padded tokens per forward/backward on one rank
    lr: float = 1e-6                     # AdamW peak learning rate
    lr_schedule: str = "constant"        # constant | cosine, after the warm-up
    warmup_steps: int = 0                # RL steps of linear warm-up
    min_lr_ratio: float = 0.0            # cosine floor, as a fraction of lr
    weight_decay: float = 0.0            # AdamW weight decay
    betas: tuple = (0.9, 0.999)          # AdamW betas
    grad_clip: float = 1.0               # max global gradient norm
    format_reward: float = 0.0           # reward of a wrong answer that is boxed (reward.py)
    no_answer_penalty: float = 0.0       # minus this for a response with no final answer
    dynamic_sampling: bool | None = None  # DAPO: drop groups with equal rewards; null: on for dapo
    max_sampling_tries: int = 3          # dynamic sampling: batches drawn per step at most
    overlong_buffer: int | None = None   # DAPO overlong shaping; null: max_new_tokens//4 for dapo
    overlong_factor: float = 1.0         # penalty at max_new_tokens
    backend: str = "vllm"                # rollout engine: vllm | hf (transformers generate)
    dtype: str = "auto"                  # rollout dtype; auto: bfloat16 on GPU, float32 on CPU
    train_dtype: str = "auto"            # trainer compute dtype (fp32 master weights); auto as dtype
    gpu_memory_utilization: float = 0.4  # GPU share of the vLLM engine (weights + KV cache)
    activation_checkpointing: bool = False  # recompute layer activations in the backward pass
    eval_every: int = 0                  # held-out evaluation period in steps (0: start, end)
    eval_n: int = 1                      # samples per held-out problem
    eval_max_problems: int = 0           # first N held-out problems (0: all)
    save_every: int = 0                  # checkpoint period in steps (0: only at the end)
    keep_last: int = 2                   # newest checkpoints kept in out_dir (0: keep all)
    log_samples_every: int = 10          # write a few graded responses to samples.jsonl (0: off)
    full_batch_metrics: bool = True      # entropy/Cov over all samples, not just the trained ones
    max_bad_steps: int = 5               # non-finite updates in a row before the run stops
    reward_timeout: float = 10.0         # seconds a reward call may take; over it: reward 0, counted
    max_reward_errors: float = 0.1       # share of a step's rewards that may raise or time out

    def __post_init__(self):
        try:
            self.loss_cfg = tepo.LossConfig.preset(self.method, **{
                "max_response_len": self.max_new_tokens, **self.loss})
        except (TypeError, ValueError) as e:
            raise UserError(f"config: {e}") from None
        if self.dynamic_sampling is None:
            self.dynamic_sampling = self.method == "dapo"
        if self.overlong_buffer is None:
            self.overlong_buffer = self.max_new_tokens // 4 if self.method == "dapo" else 0
        for name in ("model", "train_data"):
            if not getattr(self, name):
                raise UserError(f"config: `{name}` is required")
        for name, allowed in (("train_dtype", ("auto", "float32", "bfloat16")),
                              ("dtype", ("auto", "float32", "bfloat16", "float16"))):
            if getattr(self, name) not in allowed:
                raise UserError(f"config: {name} must be one of {allowed}, not {getattr(self, name)!r}")
        if self.keep_last < 0:
            raise UserError(f"config: keep_last must be >= 0 (0 keeps every checkpoint), not {self.keep_last}")
        if self.lr_schedule not in ("constant", "cosine"):
            raise UserError(f"config: lr_schedule must be constant or cosine, not {self.lr_schedule!r}")
        if self.backend not in rollout.BACKENDS:
            raise UserError(f"config: backend must be one of {rollout.BACKENDS}, not {self.backend!r}")
        for names, ok, what in (
                (("lr", "steps", "prompts_per_step", "max_prompt_len", "max_new_tokens", "temperature",
                  "num_minibatches", "micro_batch_tokens", "grad_clip", "max_sampling_tries", "eval_n",
                  "reward_timeout"), lambda v: v > 0, "> 0"),
                (("warmup_steps", "weight_decay", "eval_every", "eval_max_problems", "save_every",
                  "log_samples_every", "max_bad_steps", "format_reward", "no_answer_penalty",
                  "overlong_buffer", "overlong_factor"), lambda v: v >= 0, ">= 0"),
                (("top_p", "gpu_memory_utilization"), lambda v: 0 < v <= 1, "in (0, 1]"),
                (("min_lr_ratio", "max_reward_errors"), lambda v: 0 <= v <= 1, "in [0, 1]"),
                (("betas",), lambda v: len(v) == 2 and all(0 <= b < 1 for b in v), "two numbers in [0, 1)")):
            for name in names:
                if not ok(getattr(self, name)):
                    raise UserError(f"config: {name} must be {what}, got {getattr(self, name)!r}")
        if self.group_size < 2:
            raise UserError(f"config: group_size must be >= 2, got {self.group_size}: advantages are "
                            f"relative to the group, so a group of one has advantage 0 and never trains")


def typed(name, value, kind):
    """`value` as type `kind` (a field's annotation), or a ValueError naming the key.

    YAML reads 3e-6 (no dot) as a string, so number-like strings are accepted for numbers.
    """
    if isinstance(kind, types.UnionType):  # `X | None`: None, or an X
        if value is None:
            return None
        kind = next(t for t in kind.__args__ if t is not type(None))
    if kind is bool:
        if isinstance(value, bool):
            return value
        raise UserError(f"config key {name!r} must be true or false, got {value!r}")
    if kind in (int, float):
        try:
            number = float(value) if not isinstance(value, bool) else None
        except (TypeError, ValueError):
            number = None
        if number is None or not math.isfinite(number) or (kind is int and number != int(number)):
            raise UserError(f"config key {name!r} must be {'an integer' if kind is int else 'a number'}"
                             f", got {value!r}")
        return kind(number)
    if kind is tuple:  # AdamW betas
        if not isinstance(value, (list, tuple)):
            raise UserError(f"config key {name!r} must be a list of numbers, got {value!r}")
        return tuple(typed(f"{name}[{i}]", v, float) for i, v in enumerate(value))
    if not isinstance(value, kind):
        raise UserError(f"config key {name!r} must be a {kind.__name__}, got {value!r}")
    return value


def read_yaml_config(path):
    """A config file's keys, on top of those of the file its `base:` names (relative to it), if any;
    `loss` is merged key by key."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"config file not found: {path}")
    with open(path) as f:
        try:
            raw = yaml.safe_load(f) or {}
        except yaml.YAMLError as e:
            raise UserError(f"{path}: not valid YAML ({' '.join(str(e).split())})") from None
    if not isinstance(raw, dict):
        raise UserError(f"{path}: a config file must be a mapping of keys, got {type(raw).__name__}")
    if "base" not in raw:
        return raw
    base = read_yaml_config(os.path.join(os.path.dirname(path), str(raw.pop("base"))))
    loss = {**(base.get("loss") or {}), **(raw.get("loss") or {})}
    return {**base, **raw, **({"loss": loss} if loss else {})}


def load_config(path, overrides=()):
    """YAML file (and its `base:`) + `key=value` overrides -> Config. Unknown keys are errors
    listing valid ones."""
    raw = read_yaml_config(path) if path else {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise UserError(f"--set expects key=value, got {item!r}")
        target = raw
        *parents, leaf = key.strip().split(".")
        for p in parents:
            target = target.setdefault(p, {})
        target[leaf] = yaml.safe_load(value)
    valid = {f.name: f for f in dataclasses.fields(Config)}
    loss_valid = {f.name: f for f in dataclasses.fields(tepo.LossConfig) if f.name != "method"}
    loss = raw.get("loss") or {}
    if not isinstance(loss, dict):
        raise UserError(f"config key 'loss' must be a mapping of loss keys, got {loss!r}")
    for what, keys, ok in (("config", raw, valid), ("loss", loss, loss_valid)):
        if set(keys) - set(ok):
            raise UserError(f"unknown {what} key(s) {sorted(set(keys) - set(ok))}; valid keys: {sorted(ok)}")
    raw = {k: typed(k, v, valid[k].type) for k, v in raw.items() if k != "loss"}
    raw["loss"] = {k: typed(f"loss.{k}", v, loss_valid[k].type) for k, v in loss.items()}
    return Config(**raw)


# ----------------------------------------------------------------------------- distributed model


def load_model(path):
    """An HF causal LM in fp32 with every dropout off, set in the config before the model is built.

    The policy ratio compares two forward passes, which must agree exactly at theta = theta_old.
    Built modules copy their dropout rate from the config at construction (Qwen2's attention
    reads `attention_dropout` once), so zeroing the config afterwards would change nothing.
    """
    from transformers import AutoConfig, AutoModelForCausalLM
    config = AutoConfig.from_pretrained(path)
    for c in {id(c): c for c in (config, config.get_text_config())}.values():
        for key, value in vars(c).items():
            if ("dropout" in key or "pdrop" in key) and isinstance(value, float):
                setattr(c, key, 0.0)
    model = AutoModelForCausalLM.from_pretrained(path, config=config, dtype=torch.float32)
    for m in model.modules():  # and any nn.Dropout the config does not name
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    return model


def load_policy(path, cfg, device, trainable=True):
    """`load_model`, sharded with FSDP2: each decoder layer, then the root.

    Master weights and gradient reduction stay fp32; the forward/backward run in `cfg.train_dtype`
    (auto: bf16 on GPU, fp32 on CPU).
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    model = load_model(path)
    if cfg.activation_checkpointing and trainable:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    compute = {"auto": "bfloat16" if device.type == "cuda" else "float32"}.get(cfg.train_dtype,
                                                                                cfg.train_dtype)
    mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
          if compute == "bfloat16" else MixedPrecisionPolicy())
    model.to(device)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    # The loss is already normalised by global counts, so rank gradients must be summed, not
    # averaged (FSDP's default divides by the world size). Plain SUM: gloo has no PREMUL_SUM.
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)
    model.train(trainable)
    if not trainable:
        model.requires_grad_(False)
    return model


def full_weights(model):
    """Yield (name, full tensor) over the FSDP2 state dict; a collective: every rank must iterate."""
    for name, tensor in model.state_dict().items():
        yield name, tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def all_reduce(values, op=dist.ReduceOp.SUM, device="cpu"):
    """Reduce a list of floats over ranks in one collective -> list of floats."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=op)
    return t.tolist()


# ----------------------------------------------------------------------------- data


def load_rows(path, cfg, tokenizer, rank):
    """The rows of a JSONL data file whose prompt fits max_prompt_len, each with its prompt text.

    Longer prompts are dropped (and counted on the console): the engine's context is
    max_prompt_len + max_new_tokens, so they could not be sampled. Held-out accuracy is then over
    the rows kept. -> (rows, number dropped)
    """
    rows = rollout.load_problems(path)
    kept = []
    for row in rows:
        row["prompt"] = rollout.build_prompt(tokenizer, row["problem"], cfg.prompt_template)
        if len(tokenizer(row["prompt"]).input_ids) <= cfg.max_prompt_len:
            kept.append(row)
    if not kept:
        raise UserError(f"{path}: no prompt fits max_prompt_len={cfg.max_prompt_len} tokens (the shortest "
                        f"has {min(len(tokenizer(r['prompt']).input_ids) for r in rows)})")
    if rank == 0 and len(kept) < len(rows):
        print(f"{path}: dropped {len(rows) - len(kept)} of {len(rows)} prompts longer than "
              f"max_prompt_len={cfg.max_prompt_len}")
    return kept, len(rows) - len(kept)


def resolve_model(name):
    """A local directory for `model`: itself if it is one, else the hub's snapshot of it (downloaded
    once into the Hugging Face cache; ranks that start together share the download's locks)."""
    if os.path.isdir(name):
        if not os.path.isfile(os.path.join(name, "config.json")):
            raise UserError(f"model directory {name} has no config.json")
        return name
    if name.startswith((".", "/", "~")) or name.count("/") != 1:
        raise FileNotFoundError(f"model directory not found: {name}")
    from huggingface_hub import snapshot_download
    try:
        return snapshot_download(name, allow_patterns=["*.json", "*.safetensors", "*.txt",
                                                       "*.model", "*.tiktoken", "*.jinja"])
    except Exception as e:
        raise UserError(f"model {name!r} is not a local directory, and the hub did not "
                                f"give it ({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None


def take_prompts(rows, pos, count, seed):
    """Rows pos .. pos+count of an endless stream: the data set reshuffled each epoch, seeded."""
    out = []
    for p in range(pos, pos + count):
        epoch, i = divmod(p, len(rows))
        order = np.random.default_rng([seed, epoch]).permutation(len(rows))
        out.append(rows[order[i]])
    return out


# ----------------------------------------------------------------------------- batches


def micro_batches(seqs, budget):
    """Split sequences into micro-batches of responses to one prompt, of at most `budget` tokens.

    A micro-batch holds one prompt's responses (all G of them, or a part when they do not fit
    `budget` padded tokens), so the prompt can run once for all of them (`response_logprobs`);
    longest first, so responses of similar length are padded together.
    """
    groups = {}
    for s in seqs:
        groups.setdefault(s["gid"], []).append(s)
    out = []
    for group in groups.values():
        group = sorted(group, key=lambda s: len(s["resp"]), reverse=True)
        cur = []
        for s in group:  # cur[0] is the longest: its length is the padded length
            if cur and (len(cur) + 1) * (len(s["prompt"]) + len(cur[0]["resp"])) > budget:
                out.append(cur)
                cur = []
            cur.append(s)
        out.append(cur)
    return out


def padded(mbs):
    """Micro-batches padded with None to the largest count over ranks: every forward/backward of
    an FSDP model is a collective, so every rank must make as many (None: a dummy one)."""
    n = int(all_reduce([len(mbs)], dist.ReduceOp.MAX)[0])
    return mbs + [None] * (n - len(mbs))


def collate(mb, device):
    """One prompt (1, p) and its responses right-padded to (b, R), with (b, R) response tensors:
    mask, and whichever per-token values the sequences carry (old/ref/rollout log-probs)."""
    R = max(len(s["resp"]) for s in mb)
    resp = torch.zeros(len(mb), R, dtype=torch.long)
    mask = torch.zeros(len(mb), R)
    for b, s in enumerate(mb):
        resp[b, :len(s["resp"])] = torch.tensor(s["resp"])
        mask[b, :len(s["resp"])] = 1
    out = {"prompt": torch.tensor([mb[0]["prompt"]]), "resp": resp, "mask": mask,
           "adv": torch.tensor([s["adv"] for s in mb], dtype=torch.float32)}
    for key in ("old_logp", "old_entropy", "ref_logp", "rollout_logp"):
        if key in mb[0]:
            out[key] = torch.zeros(len(mb), R)
            for b, s in enumerate(mb):
                out[key][b, :len(s[key])] = s[key]
    return {k: v.to(device) for k, v in out.items()}


def response_logprobs(model, batch, temperature, with_entropy, share_prompt=True):
    """Log-probs (b, R) of one prompt's b responses under `model`, and their entropy (b, R) or None.

    With `share_prompt`, the prompt runs once and its KV cache is repeated for the b responses,
    which continue from it: (b - 1) prompt passes saved, the same values and gradients (they flow
    back through the cache). HF drops the cache under activation checkpointing, so then every row
    holds its own copy of the prompt. No attention mask: padding sits at the right end of the
    responses, and causal attention never looks right.
    """
    prompt, resp = batch["prompt"], batch["resp"]
    b, R = resp.shape
    if not share_prompt:
        ids = torch.cat([prompt.expand(b, -1), resp], dim=1)
        logits = model(input_ids=ids, logits_to_keep=R + 1, use_cache=False).logits[:, :-1]
        return tepo.token_logprobs_entropy(logits, resp, temperature, with_entropy)
    out = model(input_ids=prompt, logits_to_keep=1, use_cache=True)
    cache = out.past_key_values
    cache.batch_repeat_interleave(b)
    first = tepo.token_logprobs_entropy(out.logits.expand(b, 1, -1), resp[:, :1], temperature,
                                        with_entropy)           # the first token, from the prompt
    # Always a second call, even for R = 1 (its last position is dropped): every FSDP forward is a
    # collective, so each micro-batch must make the same calls on every rank (see `padded`).
    logits = model(input_ids=resp, past_key_values=cache, use_cache=True).logits[:, :-1]
    rest = tepo.token_logprobs_entropy(logits, resp[:, 1:], temperature, with_entropy)
    logp = torch.cat([first[0], rest[0]], dim=1)
    return logp, torch.cat([first[1], rest[1]], dim=1) if with_entropy else None


@torch.no_grad()
def no_grad_logprobs(model, seqs, prefix, cfg, device, share_prompt):
    """Set s[prefix + "_logp"] (R,) of every sequence under `model`, and s["old_entropy"] (R,)
    for prefix "old": the old policy's (or the reference's) values the loss compares against."""
    for mb in padded(micro_batches(seqs, cfg.micro_batch_tokens)):
        if mb is None:
            dummy_forward(model, False, share_prompt)
            continue
        logp, ent = response_logprobs(model, collate(mb, device), cfg.temperature,
                                      prefix == "old", share_prompt)
        for b, s in enumerate(mb):
            s[prefix + "_logp"] = logp[b, :len(s["resp"])]
            if ent is not None:
                s["old_entropy"] = ent[b, :len(s["resp"])]


def dummy_forward(model, backward, share_prompt):
    """The calls of a one-token micro-batch, contributing nothing: see `padded`."""
    device = next(model.parameters()).device
    tiny = {"prompt": torch.zeros(1, 1, dtype=torch.long, device=device),
            "resp": torch.zeros(1, 1, dtype=torch.long, device=device)}
    with torch.set_grad_enabled(backward):
        logp, _ = response_logprobs(model, tiny, 1.0, False, share_prompt)
    if backward:
        logp.sum().mul(0.0).backward()


# ----------------------------------------------------------------------------- checkpoints


def save_checkpoint(cfg, model, optimizer, tokenizer, state, rank, last=False, prune=True):
    """Write out_dir/step_XXXXXX: an HF model directory plus the training state, atomically.

    Everything goes to a `.tmp` directory that is renamed once complete (`publish`), so a crash
    mid-save never damages the last good checkpoint; then, with `prune`, all but the newest
    `keep_last` are removed (keep_last 0 keeps them all). `last`: also point the out_dir/final link at it.
    Every rank writes its optimizer shard and RNG state into the directory: out_dir must be
    shared by all nodes (`check_shared_dir`).
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    final = os.path.join(cfg.out_dir, f"step_{state['step']:06d}")
    tmp, prev = final + ".tmp", (list_checkpoints(cfg.out_dir) or ["none"])[-1]
    local = [p.to_local() if hasattr(p, "to_local") else p for p in model.parameters()]
    if not all_reduce([all(bool(torch.isfinite(p).all()) for p in local)], dist.ReduceOp.MIN)[0]:
        raise RuntimeError(f"step {state['step']}: the weights are not finite; not saved (the last "
                           f"good checkpoint, {prev}, is kept)")
    weights = dict(full_weights(model))
    if getattr(model.config, "tie_word_embeddings", False):
        weights.pop("lm_head.weight", None)  # the same tensor as the embeddings: save it once
    error = None  # an OSError (disk full, no permission) on any rank fails the save on every rank
    if rank == 0:
        try:
            shutil.rmtree(tmp, ignore_errors=True)
            os.makedirs(tmp)
            model.save_pretrained(tmp, state_dict={k: v.cpu() for k, v in weights.items()})
            tokenizer.save_pretrained(tmp)
            with open(os.path.join(tmp, "train_config.yaml"), "w") as f:
                yaml.safe_dump(config_dict(cfg), f)
            with open(os.path.join(tmp, "trainer_state.json"), "w") as f:
                json.dump(state, f)
        except OSError as e:
            error = e
    del weights
    _, optim_sd = get_state_dict(model, optimizer)
    if not all_reduce([error is not None], dist.ReduceOp.MAX)[0]:  # also: tmp exists for all ranks
        try:  # dcp.save raises on every rank when one rank's write fails
            dcp.save({"optim": optim_sd}, checkpoint_id=os.path.join(tmp, "optim"))
            torch.save({"torch": torch.get_rng_state(), "python": random.getstate(),
                        "numpy": np.random.get_state()}, os.path.join(tmp, f"rng_rank{rank}.pt"))
        except Exception as e:
            error = e
    if all_reduce([error is not None], dist.ReduceOp.MAX)[0]:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise UserError(f"cannot write checkpoint {tmp}: "
                        f"{' '.join(str(error).split())[:300] if error else 'another rank failed'}; the "
                        f"previous checkpoint ({prev}) is intact")
    if rank == 0:
        publish(tmp, final)
        for old in list_checkpoints(cfg.out_dir)[:-cfg.keep_last] if prune and cfg.keep_last else []:
            shutil.rmtree(old, ignore_errors=True)
        if last:  # a new link renamed over the old one: `final` always points somewhere whole
            tmp_link = os.path.join(cfg.out_dir, f"final.{os.getpid()}.tmp")
            os.symlink(os.path.basename(final), tmp_link)
            os.replace(tmp_link, os.path.join(cfg.out_dir, "final"))
            print(f"final checkpoint: {final} (also {os.path.join(cfg.out_dir, 'final')})")
    dist.barrier()
    return final


def publish(tmp, final):
    """Rename the complete checkpoint `tmp` to `final`. A `final` already there (the same step saved
    again) is first renamed to `final.old` and removed only after the swap, so a kill at any moment
    leaves one whole copy, which `list_checkpoints` finds."""
    old = final + ".old"
    if os.path.exists(final):
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)


def list_checkpoints(out_dir):
    """The complete checkpoints in out_dir, oldest first: step_XXXXXX directories, and a
    step_XXXXXX.old whose re-save was cut off between publish's two renames."""
    names = set(os.listdir(out_dir)) if os.path.isdir(out_dir) else set()
    steps = {n for n in names if n.startswith("step_") and n[5:].isdigit()}
    steps |= {n for n in names if n.endswith(".old") and n[:-4] not in names and n[5:-4].isdigit()}
    return [os.path.join(out_dir, n) for n in sorted(steps)]


def check_shared_dir(out_dir, rank, world):
    """Fail early unless every rank sees out_dir as rank 0 does (a collective).

    Checkpoints are written by every rank into one directory, so a multi-node run needs out_dir
    on a filesystem all nodes mount; on node-local disks a save would fail or come out partial.
    """
    token = [f"{socket.gethostname()}-{os.getpid()}-{time.time_ns()}" if rank == 0 else None]
    dist.broadcast_object_list(token, src=0)
    probe, error = os.path.join(out_dir, f".shared-check-{token[0]}"), [None]
    if rank == 0:
        try:
            os.makedirs(out_dir, exist_ok=True)
            open(probe, "w").close()
        except OSError as e:
            error = [f"out_dir {out_dir} is not writable ({e.strerror}: {e.filename})"]
    dist.broadcast_object_list(error, src=0)
    if error[0]:
        raise UserError(error[0])
    blind = [None] * world
    dist.all_gather_object(blind, None if os.path.exists(probe) else f"{rank} ({socket.gethostname()})")
    dist.barrier()
    if rank == 0:
        os.remove(probe)
    blind = [b for b in blind if b]
    if blind:
        raise RuntimeError(f"out_dir {out_dir} is not shared: rank(s) {', '.join(blind)} cannot see "
                           f"the file rank 0 wrote there. Multi-node runs need out_dir on a "
                           f"filesystem that every node mounts (NFS, Lustre, ...).")


def check_checkpoint(ckpt, model_dir, world):
    """A UserError unless `ckpt` is a complete checkpoint of `model_dir`'s architecture, saved by
    `world` ranks: not a half-written .tmp, not some other directory, not another model's."""
    if ckpt.rstrip("/").endswith(".tmp"):
        raise UserError(f"--resume: {ckpt} is a half-written checkpoint (a save cut off); resume from a "
                        f"complete one: {(list_checkpoints(os.path.dirname(ckpt.rstrip('/'))) or ['none'])[-1]}")
    if not os.path.isfile(os.path.join(ckpt, "trainer_state.json")):
        raise UserError(f"--resume: {ckpt} is not a checkpoint (no trainer_state.json)")
    missing = [f for f in ["config.json", "optim/.metadata"] + [f"rng_rank{r}.pt" for r in range(world)]
               if not os.path.isfile(os.path.join(ckpt, f))]
    if missing:
        raise UserError(f"--resume: {ckpt} lacks {', '.join(missing)} (incomplete, or saved by another "
                        f"number of ranks than {world})")
    ours, theirs = (json.load(open(os.path.join(d, "config.json"))) for d in (model_dir, ckpt))
    keys = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "intermediate_size")
    diff = [f"{k} {theirs.get(k)} vs {ours.get(k)}" for k in keys if ours.get(k) != theirs.get(k)]
    if diff:
        raise UserError(f"--resume: {ckpt} is a checkpoint of another model than {model_dir} "
                        f"({', '.join(diff)})")


def load_training_state(ckpt, model, optimizer, rank):
    """Restore the optimizer state from a checkpoint. -> (trainer counters, this rank's RNG states)"""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.load({"optim": optim_sd}, checkpoint_id=os.path.join(ckpt, "optim"))
    set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)
    rng = torch.load(os.path.join(ckpt, f"rng_rank{rank}.pt"), weights_only=False)
    with open(os.path.join(ckpt, "trainer_state.json")) as f:
        return json.load(f), rng


def set_rng_states(rng):
    """Put back the torch, Python and numpy RNG states a checkpoint saved."""
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])


def config_dict(cfg):
    return {f.name: (list(v) if isinstance(v := getattr(cfg, f.name), tuple) else v)
            for f in dataclasses.fields(cfg)}


# ----------------------------------------------------------------------------- evaluation


def evaluate(engine, rows, cfg, rank, world, seed):
    """Held-out accuracy: mean correctness of eval_n samples per problem, over all ranks."""
    mine = rows[rank::world]
    outs = engine.generate([r["prompt"] for r in mine], n=cfg.eval_n,
                           max_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
                           top_p=cfg.top_p, seed=seed) if mine else []
    correct = sum(reward.math_reward(s.text, r["answer"]) >= 1.0
                  for r, group in zip(mine, outs) for s in group)
    total = all_reduce([correct, len(mine) * cfg.eval_n])
    return total[0] / max(total[1], 1)


# ----------------------------------------------------------------------------- the loop


def lr_at(cfg, step):
    """Learning rate for RL step `step`: linear warm-up, then constant or cosine decay."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if cfg.lr_schedule == "constant":
        return cfg.lr
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def informative_groups(groups):
    """DAPO's dynamic-sampling filter: the groups whose answers are neither all right nor all wrong.

    It looks at correctness, not at the shaped reward: an overlong penalty or a format reward
    spreads the rewards of a group that is all right (or all wrong) without telling a good answer
    from a bad one.
    """
    return [g for g in groups if 0 < sum(g[3]) < len(g[3])]


def sample_seed(*parts):
    """A 32-bit sampling seed from (run seed, step, try, rank): a resumed run samples the same."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0])


def grade(cfg, sample, answer):
    """-> (reward, correct). DAPO's overlong shaping: a penalty growing linearly over the last
    `overlong_buffer` tokens before max_new_tokens."""
    r = reward.math_reward(sample.text, answer, format_reward=cfg.format_reward,
                           no_answer_penalty=cfg.no_answer_penalty)
    B, n = cfg.overlong_buffer, len(sample.response_ids)
    penalty = min(0.0, -(n - (cfg.max_new_tokens - B)) / B * cfg.overlong_factor) if B > 0 else 0.0
    return r + penalty, r >= 1.0


class RewardTimeout(BaseException):
    """Raised by SIGALRM in a reward call over cfg.reward_timeout (a BaseException, so that the
    grader's own `except Exception` cannot swallow it)."""


def _reward_alarm(signum, frame):
    raise RewardTimeout


def guarded_grade(cfg, sample, answer, failed):
    """grade(), except that a call that raises or runs over cfg.reward_timeout seconds gives
    (0.0, False) and is counted in failed["errors"] / failed["timeouts"] (the first one described
    in failed["first"]). The timeout is a SIGALRM timer (two setitimer calls per response; main
    thread only), which also interrupts a grader stuck in a sleep or a pure-Python loop."""
    timer = threading.current_thread() is threading.main_thread()
    try:
        try:
            if timer:
                if signal.getsignal(signal.SIGALRM) is not _reward_alarm:
                    signal.signal(signal.SIGALRM, _reward_alarm)
                signal.setitimer(signal.ITIMER_REAL, cfg.reward_timeout)
            out = grade(cfg, sample, answer)
        finally:
            if timer:
                signal.setitimer(signal.ITIMER_REAL, 0)
        return out
    except RewardTimeout:
        kind, what = "timeouts", f"took over reward_timeout={cfg.reward_timeout}s"
    except Exception as e:
        kind, what = "errors", f"{type(e).__name__}: {e}"
    failed[kind] += 1
    failed.setdefault("first", f"{what} (rank {os.environ.get('RANK', '0')}, response {sample.text[:60]!r})")
    return 0.0, False


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--config", help="YAML file of Config fields")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config key (repeatable; loss.clip_high=0.0005 for loss keys)")
    ap.add_argument("--resume", nargs="?", const="latest", metavar="CKPT",
                    help="continue from the newest checkpoint in out_dir, or from CKPT")
    args = ap.parse_args(argv)
    cfg = load_config(args.config, args.set)
    rank, world, device = rollout.setup_distributed()
    if cfg.prompts_per_step % world:
        raise UserError(f"config: prompts_per_step={cfg.prompts_per_step} must divide by the {world} ranks")
    model_dir = resolve_model(cfg.model)
    tokenizer = rollout.load_tokenizer(model_dir)
    rows, _ = load_rows(cfg.train_data, cfg, tokenizer, rank)
    eval_rows, eval_dropped = load_rows(cfg.eval_data, cfg, tokenizer, rank) if cfg.eval_data else ([], 0)
    eval_rows = eval_rows[:cfg.eval_max_problems or None]
    check_shared_dir(cfg.out_dir, rank, world)

    ckpt = None
    if args.resume == "latest":
        found = list_checkpoints(cfg.out_dir)
        ckpt = found[-1] if found else None
        if ckpt is None and rank == 0:
            print(f"--resume: no checkpoint in {cfg.out_dir} yet; starting from step 0")
    elif args.resume:
        ckpt = args.resume
    if ckpt:
        check_checkpoint(ckpt, model_dir, world)
        if rank == 0:
            print(f"--resume: from {ckpt}")
    start = ckpt or model_dir
    torch.manual_seed(cfg.seed + rank)
    model = load_policy(start, cfg, device)
    ref_model = load_policy(model_dir, cfg, device, trainable=False) if cfg.loss_cfg.needs_ref else None
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=cfg.betas,
                                  weight_decay=cfg.weight_decay)
    state = {"step": 0, "data_pos": 0, "bad_in_a_row": 0, "skipped": 0}
    if ckpt:
        state, rng = load_training_state(ckpt, model, optimizer, rank)
    engine = rollout.make_engine(start, backend=cfg.backend, dtype=cfg.dtype, seed=cfg.seed + rank,
                                 max_model_len=cfg.max_prompt_len + cfg.max_new_tokens,
                                 gpu_memory_utilization=cfg.gpu_memory_utilization)
    if ckpt:  # after the engine: vLLM seeds the global RNGs with its own seed when it starts
        set_rng_states(rng)

    metrics_path = os.path.join(cfg.out_dir, "metrics.jsonl")
    if rank == 0:
        os.makedirs(cfg.out_dir, exist_ok=True)
        old = open(metrics_path).readlines() if ckpt and os.path.exists(metrics_path) else []
        with open(metrics_path, "w") as f:  # a resumed run drops lines logged after its checkpoint
            f.writelines(ln for ln in old if json.loads(ln)["step"] <= state["step"])
        with open(os.path.join(cfg.out_dir, "config.yaml"), "w") as f:
            yaml.safe_dump(config_dict(cfg), f)

    def log(record):
        if rank == 0:
            with open(metrics_path, "a") as f:
                f.write(json.dumps(record) + "\n")

    if eval_rows and state["step"] == 0:
        log({"step": 0, "eval_accuracy": evaluate(engine, eval_rows, cfg, rank, world,
                                                  sample_seed(cfg.seed, 0, 99, rank)),
             **({"eval_dropped_long_prompts": eval_dropped} if eval_dropped else {})})
    G, lcfg = cfg.group_size, cfg.loss_cfg
    share = not cfg.activation_checkpointing  # see response_logprobs
    bar = tqdm(range(state["step"], cfg.steps), disable=rank != 0, desc="RL", initial=state["step"],
               total=cfg.steps)
    for step in bar:
        t = dict.fromkeys(["rollout", "reward", "old_logprobs", "update", "sync"], 0.0)
        t_step = time.perf_counter()

        # 1-2. Sample and grade. Dynamic sampling keeps only groups with some reward spread and
        # samples fresh prompts until every rank holds its quota (or the tries run out).
        quota, groups, drawn, failed = cfg.prompts_per_step // world, [], [], {"errors": 0, "timeouts": 0}
        for attempt in range(cfg.max_sampling_tries if cfg.dynamic_sampling else 1):
            prompts = take_prompts(rows, state["data_pos"], cfg.prompts_per_step, cfg.seed)
            prompts = prompts[rank::world]
            state["data_pos"] += cfg.prompts_per_step
            t0 = time.perf_counter()
            outs = engine.generate([r["prompt"] for r in prompts], n=G, max_tokens=cfg.max_new_tokens,
                                   temperature=cfg.temperature, top_p=cfg.top_p,
                                   seed=sample_seed(cfg.seed, step, attempt, rank))
            t1 = time.perf_counter()
            new = []
            for row, samples in zip(prompts, outs):
                graded = [guarded_grade(cfg, s, row["answer"], failed) for s in samples]
                new.append((row, samples, [g[0] for g in graded], [g[1] for g in graded]))
            groups, drawn = groups + new, drawn + new
            t["rollout"] += t1 - t0
            t["reward"] += time.perf_counter() - t1
            if not cfg.dynamic_sampling:
                break
            groups = informative_groups(groups)[:quota]
            if all_reduce([len(groups) < quota], dist.ReduceOp.MAX)[0] == 0:
                break
        failed["n"] = all_reduce([failed["errors"], failed["timeouts"], sum(len(g[1]) for g in drawn)])
        if sum(failed["n"][:2]) > cfg.max_reward_errors * failed["n"][2]:
            firsts = [None] * world
            dist.all_gather_object(firsts, failed.get("first"))
            raise UserError(f"step {step + 1}: {failed['n'][0]:.0f} reward calls raised and {failed['n'][1]:.0f} "
                            f"timed out of {failed['n'][2]:.0f} (max_reward_errors={cfg.max_reward_errors}); "
                            f"first: {next(f for f in firsts if f)}")
        engine.sleep()  # GPU: free the engine's memory for the update (no-op on CPU)

        # 3. Advantages; then old log-probs and entropy (no grad) and reference log-probs where
        # needed. A sequence with A = 0 carries no gradient (unless a KL-to-reference term is on),
        # so the update skips it; the old pass still gives it entropy for the metrics (unless
        # full_batch_metrics is off). Before the
        # first optimizer step theta = theta_old, so the first mini-batch's trained sequences get
        # their old log-probs from their own forward in step 4, with no extra pass.
        t0 = time.perf_counter()
        seqs = []
        for gid, (row, samples, rewards, _) in enumerate(groups):
            adv = tepo.group_advantages(torch.tensor(rewards), G, lcfg.adv_std_norm)
            for s, a in zip(samples, adv.tolist()):
                seqs.append({"gid": gid, "prompt": s.prompt_ids, "resp": s.response_ids, "adv": a,
                             "train": a != 0 or lcfg.kl_coef > 0,
                             "rollout_logp": torch.tensor(s.logprobs, dtype=torch.float32)})
        minibatches = [[seqs[i] for i in idx]
                       for idx in np.array_split(np.arange(len(seqs)), cfg.num_minibatches)]
        counts = all_reduce([x for mb in minibatches for x in (
            sum(len(s["resp"]) for s in mb), len(mb), sum(len(s["resp"]) for s in mb if s["train"]))])
        need_old = [s for k, mb in enumerate(minibatches) for s in mb
                    if (k > 0 and s["train"]) or (not s["train"] and cfg.full_batch_metrics)]
        no_grad_logprobs(model, need_old, "old", cfg, device, share)
        if ref_model is not None:
            no_grad_logprobs(ref_model, [s for s in seqs if s["train"]], "ref", cfg, device, share)
        t["old_logprobs"] = time.perf_counter() - t0

        # 4. Mini-batch updates: gradients accumulate over micro-batches; the loss of each is
        # normalised by the global token/sequence counts of its mini-batch, all sequences counted.
        t0 = time.perf_counter()
        for group in optimizer.param_groups:
            group["lr"] = lr_at(cfg, step)
        sums, stats, updated, skipped_before = {}, [], False, state["skipped"]
        for k, mb_seqs in enumerate(minibatches):
            num_tokens, num_seqs, trained_tokens = counts[3 * k: 3 * k + 3]
            if trained_tokens == 0:
                continue  # no sequence of this mini-batch carries a gradient: no optimizer step
            optimizer.zero_grad(set_to_none=True)
            loss_sum = 0.0
            for mb in padded(micro_batches([s for s in mb_seqs if s["train"]], cfg.micro_batch_tokens)):
                if mb is None:
                    dummy_forward(model, True, share)
                    continue
                batch = collate(mb, device)
                logp, ent = response_logprobs(model, batch, cfg.temperature, True, share)
                if k == 0:  # theta = theta_old: this forward is the old pass
                    batch["old_logp"], batch["old_entropy"] = logp.detach(), ent
                    for b, s in enumerate(mb):
                        s["old_logp"], s["old_entropy"] = logp[b, :len(s["resp"])].detach(), ent[b, :len(s["resp"])]
                loss, m = tepo.policy_loss(logp, batch["old_logp"], batch["adv"], batch["mask"], lcfg,
                                           num_tokens=num_tokens, num_seqs=num_seqs,
                                           metric_tokens=trained_tokens, entropy=ent,
                                           old_entropy=batch["old_entropy"],
                                           ref_logp=batch.get("ref_logp"),
                                           rollout_logp=batch["rollout_logp"])
                loss.backward()
                loss_sum += loss.item()
                for key, v in m.items():
                    reduce = min if key == "ratio_min" else max if key == "ratio_max" else None
                    sums[key] = reduce(sums.get(key, v), v) if reduce else sums.get(key, 0.0) + v
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            grad_norm = float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)
            loss_finite = all_reduce([math.isfinite(loss_sum)], dist.ReduceOp.MIN)[0]
            if math.isfinite(grad_norm) and loss_finite:
                optimizer.step()
                updated, state["bad_in_a_row"] = True, 0
            else:
                state["skipped"] += 1
                state["bad_in_a_row"] += 1
            stats.append((loss_sum, grad_norm))
        optimizer.zero_grad(set_to_none=True)
        t["update"] = time.perf_counter() - t0
        # 5. Weight sync (only if the weights changed), metrics, samples, checkpoint.
        t0 = time.perf_counter()
        engine.wake()
        if updated:
            engine.update_weights(full_weights(model))
        t["sync"] = time.perf_counter() - t0
        state["step"] = step + 1
        record = step_metrics(cfg, step, drawn, groups, seqs, sums, stats, t,
                              time.perf_counter() - t_step, state)
        record["reward/errors"], record["reward/timeouts"] = failed["n"][:2]
        if eval_rows and ((cfg.eval_every and (step + 1) % cfg.eval_every == 0) or step + 1 == cfg.steps):
            record["eval_accuracy"] = evaluate(engine, eval_rows, cfg, rank, world,
                                               sample_seed(cfg.seed, step + 1, 99, rank))
        log(record)
        # kl_old (0 at the first mini-batch, theta = theta_old) and the sampler/trainer mismatch on
        # the bar: a dtype or kernel mismatch shows here in the first minute of a GPU run.
        bar.set_postfix(reward=f"{record['reward']:.3f}", acc=f"{record['accuracy']:.3f}",
                        kl_old=f"{record.get('kl_old') or 0:.1e}",
                        mismatch=f"{record.get('mismatch') or 0:.1e}",
                        s_per_step=f"{record['time/step']:.1f}")
        skipped = state["skipped"] > skipped_before  # a skipped update: its batch goes on record
        if rank == 0 and ((cfg.log_samples_every and step % cfg.log_samples_every == 0) or skipped):
            with open(os.path.join(cfg.out_dir, "samples.jsonl"), "a") as f:
                f.writelines(json.dumps({"step": step + 1, "prompt": row["prompt"], "answer": row["answer"],
                                         "response": s.text, "reward": r}) + "\n"
                             for row, samples, rewards, _ in drawn[:2] for s, r in zip(samples[:2], rewards))
        # Too many non-finite updates in a row: save this step's state as it is (the bad updates
        # were skipped, so the weights are finite) without pruning older checkpoints, and stop.
        stop = state["bad_in_a_row"] > cfg.max_bad_steps
        if stop or (cfg.save_every and (step + 1) % cfg.save_every == 0) or step + 1 == cfg.steps:
            path = save_checkpoint(cfg, model, optimizer, tokenizer, state, rank,
                                   last=step + 1 == cfg.steps and not stop, prune=not stop)
        if stop:
            raise RuntimeError(f"{state['bad_in_a_row']} optimizer steps in a row had a non-finite "
                               f"loss or gradient (max_bad_steps={cfg.max_bad_steps}); stopped after "
                               f"step {step + 1}, saved in {path} (older checkpoints kept)")
    dist.destroy_process_group()


def step_metrics(cfg, step, drawn, groups, seqs, sums, stats, t, step_time, state):
    """One metrics.jsonl record: every diagnostic of the spec, reduced over ranks."""
    samples = [(s, r, c) for _, ss, rs, cs in drawn for s, r, c in zip(ss, rs, cs)]
    lens = [len(s.response_ids) for s, _, _ in samples]
    tot = all_reduce([sum(r for _, r, _ in samples), sum(c for _, _, c in samples), len(samples),
                      sum(lens), sum(s.finish_reason == "length" for s, _, _ in samples), len(groups),
                      len(drawn)])
    mx = all_reduce([max(lens, default=0)], dist.ReduceOp.MAX)[0]
    # The batch at theta_old, over every response token (or the trained ones: full_batch_metrics):
    # entropy, Cov(logp, A), mismatch; null when there are none.
    sums_b, seqs = [0.0] * 6, [s for s in seqs if "old_logp" in s]
    if seqs:
        cat = lambda key: torch.cat([s[key].detach().cpu().double() for s in seqs])  # noqa: E731
        lp, adv = cat("old_logp"), torch.cat([torch.full((len(s["resp"]),), s["adv"]) for s in seqs])
        sums_b = [float(x) for x in (cat("old_entropy").sum(), (lp * adv).sum(), lp.sum(), adv.sum(),
                                     (cat("rollout_logp") - lp).abs().sum(), len(lp))]
    tok = all_reduce(sums_b)
    n_tok = tok[5] or math.nan
    batch = {k: (None if math.isnan(v) else v) for k, v in {
        "entropy": tok[0] / n_tok, "mismatch": tok[4] / n_tok,
        "cov_logp_adv": tok[1] / n_tok - (tok[2] / n_tok) * (tok[3] / n_tok)}.items()}
    # Update metrics (over the trained tokens): add over ranks (min/max for the ratio extremes),
    # then average over mini-batches. A rank that trained on nothing has no keys: gather them.
    key_sets = [None] * dist.get_world_size()
    dist.all_gather_object(key_sets, sorted(k for k in sums if k not in batch and not k.startswith("cov/")))
    keys = sorted(set().union(*key_sets))
    fill = {"ratio_min": math.inf, "ratio_max": -math.inf}
    vals = [float(sums.get(k, fill.get(k, 0.0))) for k in keys]
    summed = all_reduce(vals)
    mins, maxs = all_reduce(vals, dist.ReduceOp.MIN), all_reduce(vals, dist.ReduceOp.MAX)
    update = {k: lo if k == "ratio_min" else hi if k == "ratio_max" else s / max(len(stats), 1)
              for k, s, lo, hi in zip(keys, summed, mins, maxs)}
    n = max(tot[2], 1)
    record = {"step": step + 1, "reward": tot[0] / n, "accuracy": tot[1] / n,
              "response_len": tot[3] / n, "response_len_max": mx, "truncated": tot[4] / n,
              **batch, **update, "optimizer_steps": len(stats),
              "grad_norm": sum(g for _, g in stats) / max(len(stats), 1),
              "lr": lr_at(cfg, step), "skipped_updates": state["skipped"],
              "time/step": step_time, **{f"time/{k}": v for k, v in t.items()},
              "tokens_per_s": tot[3] / max(t["rollout"], 1e-9)}
    if cfg.dynamic_sampling:
        record["groups_kept"] = tot[5] / max(tot[6], 1)
    return record


if __name__ == "__main__":
    rollout.run_main(main)
