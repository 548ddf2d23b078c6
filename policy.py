"""The policy: an HF causal LM loaded in fp32 with every dropout off, sharded with FSDP2 under the
run's mixed precision, and its full weights gathered from the shards (for the rollout engine's
weight sync and for checkpoints).
"""
import time
from types import SimpleNamespace

import torch
import torch.distributed as dist

import packing
import tepo
from config import UserError


def load_model(path, packed_kernel=None, config=None):
    """An HF causal LM in fp32 with every dropout off, set in the config before the model is built;
    attending with packing.packed_attention by `packed_kernel` ("sdpa" or "flex") for packed
    micro-batches, or (None) with the model's own attention (the grouped layout). `config`: a
    transformers config to build it with instead of path's own (bench/gpu_check's cut-down copy).

    The policy ratio compares two forward passes, which must agree exactly at theta = theta_old.
    Built modules copy their dropout rate from the config at construction (Qwen2's attention
    reads `attention_dropout` once), so zeroing the config afterwards would change nothing.
    """
    from transformers import AutoConfig, AutoModelForCausalLM
    config = config or AutoConfig.from_pretrained(path)
    for c in {id(c): c for c in (config, config.get_text_config())}.values():
        for key, value in vars(c).items():
            if ("dropout" in key or "pdrop" in key) and isinstance(value, float):
                setattr(c, key, 0.0)
    model = AutoModelForCausalLM.from_pretrained(path, config=config, dtype=torch.float32)
    for m in model.modules():  # and any nn.Dropout the config does not name
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    return packing.use_packed_attention(model, packed_kernel) if packed_kernel else model


def packed_kernel(cfg, device):
    """The packed row's attention kernel for cfg on `device` (auto: flex on GPU, where its fused
    kernel is one call per layer; sdpa on CPU, with no compilation), or None when the layout is
    not packed."""
    if cfg.micro_batch_layout != "packed":
        return None
    if cfg.packed_attention == "flex" and device.type == "cpu":
        raise UserError("config: packed_attention flex needs a GPU (torch's flex_attention has no "
                        "backward on the CPU); use sdpa, or auto")
    return {"auto": "flex" if device.type == "cuda" else "sdpa"}.get(cfg.packed_attention, cfg.packed_attention)


def load_policy(path, cfg, device, trainable=True):
    """`load_model`, sharded with FSDP2: each decoder layer, then the root.

    Master weights and gradient reduction stay fp32; the forward/backward run in `cfg.train_dtype`
    (auto: bf16 on GPU, fp32 on CPU).
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    model = load_model(path, packed_kernel(cfg, device))
    why = tepo.unreachable_head(model)
    if why and cfg.lm_head == "chunked":
        raise UserError(f"config: lm_head chunked: {why}; set lm_head: logits (or auto)")
    if cfg.activation_checkpointing and trainable:
        checkpoint_layers(model, cfg.checkpoint_layers)
    if cfg.compile:
        compile_layers(model)
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
    if trainable and dist.get_rank() == 0:
        print(f"update: {head_line(cfg.lm_head, why)}", flush=True)
    if cfg.compile and trainable:
        seconds = compile_now(model, cfg)
        if dist.get_rank() == 0:
            print(f"update: its {len(model.model.layers)} decoder layers compiled (torch.compile) in "
                  f"{seconds:.1f} s", flush=True)
    return model


def head_line(lm_head, why):
    """What the start summary says of how the update's log-probs come from the model: `why` the
    head cannot be reached (tepo.unreachable_head) or None."""
    if lm_head == "logits":
        return "log-probs from the model's logits (lm_head: logits)"
    if why:
        return f"log-probs from the model's logits: {why} (lm_head: auto falls back)"
    return (f"log-probs from the last hidden states through the LM head in chunks of {tepo.HEAD_CHUNK_ELEMS:,} "
            f"logits (lm_head: {lm_head}): no (positions x vocabulary) logits")


# compile_layers' backend: inductor, torch.compile's default (Triton kernels on a GPU, C++ on the
# CPU). The tests set "aot_eager": dynamo's capture and guards, dynamic shapes and AOT autograd's
# backward graph, without inductor's lowering, fusion and kernels (its own guards and numerics are
# not seen there), which on the CPU take ~70-90 s a model with a cold cache. (Flex attention is
# compiled by inductor always: packing.py.)
COMPILE_BACKEND = "inductor"


def compile_layers(model):
    """torch.compile each decoder layer's forward, in place (torchtitan compiles each block): its
    norms, projections, rotary embedding, MLP and residual adds fused; the attention runs apart,
    eagerly (use_packed_attention hides it from the compiler; flex is compiled on its own). The
    modules, their parameters' names and FSDP2's hooks stay as they are. Dynamic shapes: one graph
    for every row length (a forward, and a forward under grad with its backward)."""
    # Every layer shares one code object, so its graphs count together against dynamo's limit (8,
    # then eager): with grad and without, requires_grad of the input (the first layer's), under
    # activation checkpointing and in its recompute, the policy's and the reference's.
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    for layer in model.model.layers:
        layer.forward = torch.compile(layer.forward, dynamic=True, backend=COMPILE_BACKEND)


def compile_now(model, cfg):
    """The compilation, at start and timed: one sequence (a prompt of 8 tokens, a response of 9,
    contributing nothing) forwarded without grad, as the old pass, and with grad and its backward,
    as the update. A row of 17 positions: a length the compiled graphs keep symbolic (0 and 1 are
    specialised, and a size equal to another dimension, e.g. 2 heads, would be tied to it).
    A collective (FSDP2's forwards). -> seconds"""
    started = time.perf_counter()
    seq = SimpleNamespace(gid=(0, 0), prompt=[0] * 8, resp=[0] * 9, adv=0.0)
    device = next(model.parameters()).device
    batch = packing.collate([seq], device, cfg.micro_batch_layout, cfg.activation_checkpointing)
    with torch.no_grad():
        tepo.response_logprobs(model, batch, 1.0, False, cfg.lm_head)
    logp, _ = tepo.response_logprobs(model, batch, 1.0, False, cfg.lm_head)
    logp.sum().mul(0.0).backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - started


def checkpoint_layers(model, n):
    """Activation checkpointing (transformers', non-reentrant) on the first `n` decoder layers, or
    all (None): a checkpointed layer keeps only its input and recomputes the rest in the backward;
    the others keep their activations (memory for a forward less)."""
    layers = model.model.layers
    if n is not None and n > len(layers):
        raise UserError(f"config: checkpoint_layers {n} is more than the model's {len(layers)} decoder "
                        f"layers; set at most {len(layers)} (or null: all)")
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    for layer in list(layers)[n:] if n is not None else []:
        layer.gradient_checkpointing = False


def full_tensor(t):
    """A tensor as a whole: FSDP2's DTensor (a shard per rank) gathered from every rank, a plain
    tensor as it is. A collective for a DTensor: every rank must call it."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def full_weights(model):
    """Yield (name, full tensor) over the FSDP2 state dict; a collective: every rank must iterate."""
    for name, tensor in model.state_dict().items():
        yield name, full_tensor(tensor)
