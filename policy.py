"""The policy's weights and processes: the process group and reductions over it (all_ranks,
global_tail), the model loaded with dropout off and sharded with FSDP2, its full weights gathered,
and checkpoints saved atomically and restored (the run's logs cut back to the checkpoint resumed,
its config compared with the checkpoint's and put on record in out_dir).

A checkpoint out_dir/step_XXXXXX is an HF model directory (transformers, vLLM and eval.py load it)
plus `optim/` (torch.distributed.checkpoint, one shard per rank), `trainer_state.json`,
`train_config.yaml` and each rank's RNG states. It is written to step_XXXXXX.tmp and renamed when
complete, so a kill at any moment leaves the newest complete checkpoint whole.
"""
import json
import math
import os
import random
import re
import shutil
import socket
import sys
import threading
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.distributed as dist
import yaml

import packing
from config import UserError, config_changes, config_dict



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
    # Every rank past its connections before any goes on: a rank that stops at once on bad input
    # (its one-line error, os._exit) would otherwise close its end while a slower peer is still
    # connecting, and that peer would die with gloo's "Connection closed by peer" traceback.
    dist.barrier()
    return dist.get_rank(), dist.get_world_size(), device


EXIT_GRACE_S = 0.05  # end_distributed's pause with the GIL released


def end_distributed():
    """Leave the process group, last of all, on every rank: a barrier, destroy_process_group, then
    a pause of EXIT_GRACE_S with the GIL released.

    The pause works around a race in torch 2.13's gloo backend. A gloo worker thread frees a
    finished collective's tensors after the caller has gone on; one that Python has let go of
    needs the GIL to be freed, and if the interpreter is shutting down by then, the thread's wait
    for the GIL ends it inside a noexcept C++ frame: "terminate called without an active
    exception", SIGABRT, and torchrun calls a finished run a failure (exit code -6). After FSDP's
    all-gathers it hit 1 two-rank exit in 5 to 8 (bench/bench_exit.py); a barrier alone does not
    close it (the freeing thread may still be behind it), the pause does (the thread takes the GIL
    as soon as the main thread sleeps).
    """
    dist.barrier()
    dist.destroy_process_group()
    time.sleep(EXIT_GRACE_S)


def all_ranks(values, op="sum"):
    """Reduce a dict of named numbers over all ranks in one collective -> dict of floats.

    A collective: every rank must call it, as often, with the same keys."""
    keys = sorted(values)
    t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64)
    dist.all_reduce(t, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX,
                           "min": dist.ReduceOp.MIN}[op])
    return dict(zip(keys, t.tolist()))


def tail_size(n, q):
    """How many of the largest of n values reach down to their q-quantile (nearest rank: the
    ceil(q n)-th smallest, numpy's method="inverted_cdf")."""
    return n - math.ceil(round(q * n, 9)) + 1


def keep_largest(top, values, k):
    """The k largest of `top` and `values` (1-D tensors)."""
    both = torch.cat([top, values.float()])
    return torch.topk(both, min(k, len(both))).values


def global_tail(top, n, q):
    """(max, q-quantile) of n values spread over the ranks, from each rank's tail_size(n, q)
    largest (`top`). A collective."""
    tops = [None] * dist.get_world_size()
    dist.all_gather_object(tops, top.tolist())
    union = sorted((v for t in tops for v in t), reverse=True)
    return union[0], union[tail_size(n, q) - 1]


def run_main(main):
    """main(), with bad input (UserError, FileNotFoundError) reported as one `error: ...` line on
    stderr (report_error) and exit code 2, no traceback; other exceptions keep theirs (they are bugs
    or faults)."""
    try:
        return main()
    except (UserError, FileNotFoundError) as e:
        report_error(f"error: {e}")
        os._exit(2)  # not sys.exit: peers may be gone, and shutdown hooks would wait on them


def report_error(line):
    """Print `line` on stderr on a line of its own, once per launcher.

    Under torchrun every rank usually fails alike: the first rank of this node to get here prints
    it (a file made with O_EXCL beside the ranks' error files decides), and every rank writes it as
    its error file (TORCHELASTIC_ERROR_FILE), which torchrun's failure report then shows as the
    root cause's `traceback :` line, last of all, instead of a link to its documentation. Other
    launchers of several processes: each rank prints it, prefixed with its rank. One write, so
    that two processes' lines never interleave (print writes the text and the newline apart).
    """
    sys.stdout.flush()
    sys.stderr.flush()
    error_file, first = os.environ.get("TORCHELASTIC_ERROR_FILE"), True
    if error_file:
        try:
            with open(error_file, "w") as f:  # the format of torch.distributed.elastic's @record
                json.dump({"message": {"message": line, "extraInfo": {
                    "py_callstack": line, "timestamp": str(int(time.time()))}}}, f)
            os.close(os.open(os.path.join(os.path.dirname(os.path.dirname(error_file)), "error_shown"),
                             os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            first = False
        except OSError:
            pass
    elif int(os.environ.get("WORLD_SIZE", 1)) > 1:
        line = f"[rank {os.environ['RANK']}] {line}"
    if first:
        os.write(2, (line + "\n").encode())


LAUNCHER_POLL_S = 1.0  # a torchrun worker checks its launcher is alive this often


def watch_launcher(parent, period=LAUNCHER_POLL_S):
    """Under torchrun: exit this worker within `period` seconds of the death of the launcher `parent`.

    torchrun starts each worker in a session of its own, so when torchrun alone is killed (an OOM
    killer's choice) nothing signals the workers; ones waiting in a rendezvous or a collective
    would sit holding their GPUs. A daemon thread, started when this module is imported (early in
    train.py and eval.py: a worker still importing vLLM is covered too), watches the parent pid:
    it changes when the parent dies and the worker is re-parented. Exit code 3.
    """
    if "TORCHELASTIC_RUN_ID" not in os.environ or getattr(watch_launcher, "started", False):
        return
    rank = os.environ.get("RANK", "?")

    def watch():
        while os.getppid() == parent:
            time.sleep(period)
        print(f"[rank {rank}] error: the launcher (pid {parent}) died; exiting", file=sys.stderr,
              flush=True)
        os._exit(3)
    threading.Thread(target=watch, name="launcher-watch", daemon=True).start()
    watch_launcher.started = True


def load_model(path, packed_kernel=None):
    """An HF causal LM in fp32 with every dropout off, set in the config before the model is built;
    attending with packing.packed_attention by `packed_kernel` ("sdpa" or "flex") for packed
    micro-batches, or (None) with the model's own attention (the grouped layout).

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


def full_tensor(t):
    """A tensor as a whole: FSDP2's DTensor (a shard per rank) gathered from every rank, a plain
    tensor as it is. A collective for a DTensor: every rank must call it."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def full_weights(model):
    """Yield (name, full tensor) over the FSDP2 state dict; a collective: every rank must iterate."""
    for name, tensor in model.state_dict().items():
        yield name, full_tensor(tensor)


def save_checkpoint(cfg, model, optimizer, tokenizer, state, rank, last=False, prune=True):
    """Write out_dir/step_XXXXXX: an HF model directory plus the training state, atomically.

    Everything goes to a `.tmp` directory that is renamed once complete (`publish`), so a crash
    mid-save never damages the last good checkpoint; then, with `prune`, the checkpoints older than
    it are removed but for the newest `keep_last` - 1 of them (keep_last 0 keeps them all). `last`: also point the out_dir/final link at it.
    Every rank writes its optimizer shard and RNG state into the directory: out_dir must be
    shared by all nodes (`check_shared_dir`).
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    final = os.path.join(cfg.out_dir, f"step_{state.step:06d}")
    tmp, prev = final + ".tmp", (list_checkpoints(cfg.out_dir) or ["none"])[-1]
    local = [p.to_local() if hasattr(p, "to_local") else p for p in model.parameters()]
    if not all_ranks({"finite": all(bool(torch.isfinite(p).all()) for p in local)}, "min")["finite"]:
        raise RuntimeError(f"step {state.step}: the weights are not finite; not saved (the last "
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
                json.dump(asdict(state), f)
        except OSError as e:
            error = e
    del weights
    _, optim_sd = get_state_dict(model, optimizer)
    if not all_ranks({"failed": error is not None}, "max")["failed"]:  # also: tmp exists for all ranks
        try:  # dcp.save raises on every rank when one rank's write fails
            dcp.save({"optim": optim_sd}, checkpoint_id=os.path.join(tmp, "optim"))
            torch.save({"torch": torch.get_rng_state(), "python": random.getstate(),
                        "numpy": np.random.get_state()}, os.path.join(tmp, f"rng_rank{rank}.pt"))
        except Exception as e:
            error = e
    if all_ranks({"failed": error is not None}, "max")["failed"]:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise UserError(f"cannot write checkpoint {tmp}: "
                        f"{' '.join(str(error).split())[:300] if error else 'another rank failed'}; the "
                        f"previous checkpoint ({prev}) is intact")
    if rank == 0:
        publish(tmp, final)
        if prune:
            prune_checkpoints(cfg.out_dir, state.step, cfg.keep_last)
        if last:  # a new link renamed over the old one: `final` always points somewhere whole
            tmp_link = os.path.join(cfg.out_dir, f"final.{os.getpid()}.tmp")
            os.symlink(os.path.basename(final), tmp_link)
            os.replace(tmp_link, os.path.join(cfg.out_dir, "final"))
            print(f"final checkpoint: {final} (also {os.path.join(cfg.out_dir, 'final')})")
    dist.barrier()
    return final


def prune_checkpoints(out_dir, step, keep_last):
    """After the checkpoint of `step` is published: remove the checkpoints older than it but the
    newest keep_last - 1 of them (keep_last 0: none). A newer one is never removed: it is not this
    run's to remove (and by step number alone, a run saving step 50 beside another run's step 150
    with keep_last 1 would delete its own step 50)."""
    older = [c for c in list_checkpoints(out_dir) if step_of(c) < step]
    for old in older[:max(0, len(older) - (keep_last - 1))] if keep_last else []:
        shutil.rmtree(old, ignore_errors=True)


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


# What a run writes into out_dir besides its checkpoints (--overwrite removes exactly these).
RUN_FILES = ("metrics.jsonl", "samples.jsonl", "config.yaml", "config_changes.jsonl", "final",
             "tensorboard", "wandb", "wandb_run_id")


def step_of(ckpt):
    """The RL step of a checkpoint directory's name (step_000050 -> 50; .old counts too)."""
    return int(re.search(r"step_(\d+)", os.path.basename(ckpt.rstrip("/"))).group(1))


def earlier_run(out_dir):
    """A description of the run out_dir already holds (its checkpoints, its metrics), or None."""
    ckpts = list_checkpoints(out_dir)
    metrics = os.path.join(out_dir, "metrics.jsonl")
    lines = sum(1 for _ in open(metrics, "rb")) if os.path.isfile(metrics) else 0
    parts = ([f"{len(ckpts)} checkpoint(s) up to {os.path.basename(ckpts[-1])}"] if ckpts else []) + \
        ([f"metrics.jsonl with {lines} line(s)"] if lines else [])
    return " and ".join(parts) or None


def clear_run(out_dir):
    """Remove an earlier run from out_dir: its checkpoints (complete, .tmp, .old) and RUN_FILES;
    any other file stays."""
    for name in os.listdir(out_dir):
        path = os.path.join(out_dir, name)
        if re.fullmatch(r"step_\d+(\.tmp|\.old)?", name) or name in RUN_FILES:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.remove(path)


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


def checkpoint_to_resume(out_dir, resume, overwrite, rank):
    """The checkpoint a run starts from (None: step 0), after making sure it cannot mix with, or
    lose, another run's files in out_dir. A collective (with --overwrite: rank 0 clears, all wait).

    resume None (a fresh start): out_dir must hold no checkpoint and no metrics, unless `overwrite`,
    which removes them first. "latest": the newest checkpoint in out_dir, or none yet. A path in
    out_dir: it, provided out_dir holds nothing newer (which a later plain --resume would pick
    instead). A path elsewhere (a branch off another run): out_dir must hold no run, as for a fresh
    start (its metrics would go on from another run's, its checkpoints be pruned by this one).
    """
    if resume not in (None, "latest") and os.path.dirname(os.path.realpath(resume)) != os.path.realpath(out_dir):
        return branch_into(out_dir, resume, overwrite, rank)
    if resume is None:
        found = earlier_run(out_dir)
        if found and not overwrite:
            raise UserError(f"out_dir {out_dir} holds another run ({found}): continue it with "
                            f"--resume, choose a new out_dir (--set out_dir=...), or start over "
                            f"with --overwrite, which deletes it")
        clear_for(out_dir, found, rank)
        return None
    if overwrite:
        raise UserError("--overwrite starts a run afresh: it does not go with --resume of out_dir's "
                        "own checkpoints")
    found = list_checkpoints(out_dir)
    if resume == "latest":
        if not found and rank == 0:
            print(f"--resume: no checkpoint in {out_dir} yet; starting from step 0")
        return found[-1] if found else None
    newer = [c for c in found if step_of(c) > step_of(os.path.realpath(resume))] \
        if re.search(r"step_\d+", os.path.basename(os.path.realpath(resume))) else []
    if newer:
        raise UserError(f"--resume {resume}: out_dir {out_dir} holds newer checkpoints (up to "
                        f"{os.path.basename(newer[-1])}), which a later --resume would take for this "
                        f"run's: continue from the newest with --resume alone, or branch off into a new "
                        f"out_dir (--set out_dir=...)")
    return resume


def branch_into(out_dir, ckpt, overwrite, rank):
    """--resume of a checkpoint of another out_dir: a branch, which starts its records in out_dir.
    -> ckpt, once out_dir holds no run (`overwrite`: rank 0 removes the one there). A collective."""
    if not os.path.exists(ckpt):
        raise UserError(f"--resume: {ckpt} does not exist")
    found = earlier_run(out_dir)
    if found and not overwrite:
        raise UserError(f"--resume {ckpt}: out_dir {out_dir} holds another run ({found}), which this "
                        f"branch's metrics would go on from and its saves prune: branch into a new "
                        f"out_dir (--set out_dir=...), continue that run with --resume alone, or delete "
                        f"it first with --overwrite")
    clear_for(out_dir, found, rank)
    return ckpt


def clear_for(out_dir, found, rank):
    """--overwrite's removal of the run `found` in out_dir by rank 0 (nothing when None), all ranks
    waiting for it. A collective."""
    if found and rank == 0:
        clear_run(out_dir)
        print(f"--overwrite: removed the earlier run in {out_dir} ({found})")
    dist.barrier()  # nobody reads out_dir before rank 0 has cleared it


def cut_back_log(path, step):
    """Keep the lines of a JSONL log up to `step` (a resumed run logs the later ones again; None:
    none, a fresh start). A line cut off by a kill or a full disk mid-write is dropped, and said."""
    lines = open(path, "rb").read().splitlines(keepends=True) if step is not None and os.path.exists(path) else []
    kept, torn = [], 0
    for line in lines:
        try:
            if json.loads(line)["step"] <= step:
                kept.append(line if line.endswith(b"\n") else line + b"\n")
        except (ValueError, KeyError, TypeError):  # half a line; JSONDecodeError is a ValueError
            torn += 1
    if torn:
        print(f"--resume: dropped {torn} torn line(s) of {path} (a write cut off by a kill or a full "
              f"disk); kept the {len(kept)} whole line(s) up to step {step}")
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.writelines(kept)
    os.replace(tmp, path)


def record_config(cfg, ckpt, step, changes):
    """Put the run's config on record in out_dir: config.yaml, the config its records start with
    (written at step 0, or by a branch into a new out_dir; a resume never rewrites it), and
    config_changes.jsonl, one line per resume that changed a key: {"step": the checkpoint's step,
    after which the new values hold, "resumed_from", "changed": {key: [old, new]}}; a resume from
    step K drops the lines of K and later (of a branch it replaces, or of this resume's first try)."""
    path, changed = os.path.join(cfg.out_dir, "config.yaml"), os.path.join(cfg.out_dir, "config_changes.jsonl")
    if not ckpt and os.path.exists(changed):
        os.remove(changed)
    if ckpt and os.path.exists(changed):
        cut_back_log(changed, step - 1)
    if ckpt and changes:
        with open(changed, "a") as f:
            f.write(json.dumps({"step": step, "resumed_from": os.path.realpath(ckpt), "changed": changes}) + "\n")
    if not ckpt or not os.path.exists(path):
        with open(path, "w") as f:
            yaml.safe_dump(config_dict(cfg), f)


def check_checkpoint(ckpt, model_dir, world):
    """A UserError unless `ckpt` is a complete checkpoint of `model_dir`'s architecture: not a
    half-written .tmp, not some other directory, not another model's. -> the number of ranks that
    saved it (one rng_rank<r>.pt each), which may differ from this run's `world`."""
    if ckpt.rstrip("/").endswith(".tmp"):
        raise UserError(f"--resume: {ckpt} is a half-written checkpoint (a save cut off); resume from a "
                        f"complete one: {(list_checkpoints(os.path.dirname(ckpt.rstrip('/'))) or ['none'])[-1]}")
    if not os.path.isfile(os.path.join(ckpt, "trainer_state.json")):
        raise UserError(f"--resume: {ckpt} is not a checkpoint (no trainer_state.json)")
    ranks = [int(m[1]) for f in os.listdir(ckpt) if (m := re.fullmatch(r"rng_rank(\d+)\.pt", f))]
    saved = max(ranks, default=-1) + 1
    missing = [f for f in ["config.json", "train_config.yaml", "optim/.metadata"] +
               [f"rng_rank{r}.pt" for r in range(max(saved, 1))]
               if not os.path.isfile(os.path.join(ckpt, f))]
    if missing:
        raise UserError(f"--resume: {ckpt} lacks {', '.join(missing)} (incomplete)")
    ours, theirs = (json.load(open(os.path.join(d, "config.json"))) for d in (model_dir, ckpt))
    keys = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "intermediate_size")
    diff = [f"{k} {theirs.get(k)} vs {ours.get(k)}" for k in keys if ours.get(k) != theirs.get(k)]
    if diff:
        raise UserError(f"--resume: {ckpt} is a checkpoint of another model than {model_dir} "
                        f"({', '.join(diff)})")
    return saved


def resumed_config(ckpt, cfg, allow_change):
    """The changes `cfg` makes to the config that produced checkpoint `ckpt` (its
    train_config.yaml): {key: [saved value, new value]}, or a UserError naming them when one of them
    defines the run (config.FREE_KEYS says which do not) and `allow_change` is not set: going on
    silently would leave a run whose steps ran under two configs, only the last one on record."""
    path = os.path.join(ckpt, "train_config.yaml")
    try:
        with open(path) as f:
            saved = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as e:
        raise UserError(f"--resume: cannot read {path} ({' '.join(str(e).split())[:200]})") from None
    if not isinstance(saved, dict):
        raise UserError(f"--resume: {path} is not a mapping of config keys")
    defining, free = config_changes(saved, cfg)
    if defining and not allow_change:
        with open(os.path.join(ckpt, "trainer_state.json")) as f:
            step = json.load(f)["step"]
        raise UserError(f"--resume: the config changes what defines the run of {ckpt}: "
                        f"{', '.join(f'{k} {a!r} -> {b!r}' for k, (a, b) in defining.items())}; resume "
                        f"with its values, or pass --allow-config-change to go on with these after step "
                        f"{step} (recorded in {cfg.out_dir}/config_changes.jsonl)")
    return {**defining, **free}


def load_training_state(ckpt, model, optimizer, rank, same_world=True):
    """Restore the optimizer state from a checkpoint; distributed checkpointing reshards it when
    this run has another number of ranks than the one that saved it. -> (TrainState, this rank's
    RNG states, or None when the number of ranks changed: the per-rank streams no longer apply)"""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.load({"optim": optim_sd}, checkpoint_id=os.path.join(ckpt, "optim"))
    set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)
    rng = torch.load(os.path.join(ckpt, f"rng_rank{rank}.pt"), weights_only=False) if same_world else None
    with open(os.path.join(ckpt, "trainer_state.json")) as f:
        return TrainState(**json.load(f)), rng


def set_rng_states(rng):
    """Put back the torch, Python and numpy RNG states a checkpoint saved."""
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])


watch_launcher(os.getppid())
