"""The policy's weights and processes: the process group, the model loaded with dropout off and
sharded with FSDP2, its full weights gathered, and checkpoints saved atomically and restored.

A checkpoint out_dir/step_XXXXXX is an HF model directory (transformers, vLLM and eval.py load it)
plus `optim/` (torch.distributed.checkpoint, one shard per rank), `trainer_state.json`,
`train_config.yaml` and each rank's RNG states. It is written to step_XXXXXX.tmp and renamed when
complete, so a kill at any moment leaves the newest complete checkpoint whole.
"""
import json
import os
import random
import shutil
import socket
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.distributed as dist
import yaml

from config import config_dict



def process_group_backend(cuda):
    """The torch.distributed backend string: gloo for CPU tensors always, nccl for CUDA ones.

    An nccl-only group fails the first collective on a CPU tensor ("No backend type associated
    with device type cpu"), and train.py reduces its metrics on the CPU; vLLM's external launcher
    also asks for both ('cpu:gloo,cuda:nccl').
    """
    return "cpu:gloo,cuda:nccl" if cuda else "cpu:gloo"


def setup_distributed():
    """Join torchrun's process group, or make a group of one on a free port. -> (rank, world, device)

    Used by train.py and eval.py alike. Call it before make_engine: in a process without a
    group, vLLM would make its own.
    """
    if "RANK" not in os.environ:  # plain `python train.py`: a group of one
        import socket
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = str(s.getsockname()[1])
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=os.environ.get("MASTER_PORT", port))
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(process_group_backend(cuda), device_id=device if cuda else None)
    return dist.get_rank(), dist.get_world_size(), device


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


@dataclass
class TrainState:
    """The trainer's counters: with the weights, optimizer and RNG states, all a resume needs."""
    step: int = 0          # RL steps done
    data_pos: int = 0      # prompts taken so far from the seeded, endless data stream
    bad_in_a_row: int = 0  # non-finite optimizer steps in a row (more than max_bad_steps: stop)
    skipped: int = 0       # non-finite optimizer steps skipped in all


def full_weights(model):
    """Yield (name, full tensor) over the FSDP2 state dict; a collective: every rank must iterate."""
    for name, tensor in model.state_dict().items():
        yield name, tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


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

    final = os.path.join(cfg.out_dir, f"step_{state.step:06d}")
    tmp = final + ".tmp"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
    dist.barrier()
    weights = dict(full_weights(model))
    if getattr(model.config, "tie_word_embeddings", False):
        weights.pop("lm_head.weight", None)  # the same tensor as the embeddings: save it once
    if rank == 0:
        model.save_pretrained(tmp, state_dict={k: v.cpu() for k, v in weights.items()})
        tokenizer.save_pretrained(tmp)
        with open(os.path.join(tmp, "train_config.yaml"), "w") as f:
            yaml.safe_dump(config_dict(cfg), f)
        with open(os.path.join(tmp, "trainer_state.json"), "w") as f:
            json.dump(asdict(state), f)
    del weights
    _, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"optim": optim_sd}, checkpoint_id=os.path.join(tmp, "optim"))
    torch.save({"torch": torch.get_rng_state(), "python": random.getstate(),
                "numpy": np.random.get_state()}, os.path.join(tmp, f"rng_rank{rank}.pt"))
    dist.barrier()
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
    probe = os.path.join(out_dir, f".shared-check-{token[0]}")
    if rank == 0:
        os.makedirs(out_dir, exist_ok=True)
        open(probe, "w").close()
    dist.barrier()
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


def load_training_state(ckpt, model, optimizer, rank):
    """Restore the optimizer state from a checkpoint. -> (TrainState, this rank's RNG states)"""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.load({"optim": optim_sd}, checkpoint_id=os.path.join(ckpt, "optim"))
    set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)
    rng = torch.load(os.path.join(ckpt, f"rng_rank{rank}.pt"), weights_only=False)
    with open(os.path.join(ckpt, "trainer_state.json")) as f:
        return TrainState(**json.load(f)), rng


def set_rng_states(rng):
    """Put back the torch, Python and numpy RNG states a checkpoint saved."""
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
