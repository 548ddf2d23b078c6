"""Checkpoints, written atomically and read back.

A checkpoint out_dir/step_XXXXXX is an HF model directory (transformers, vLLM and eval.py load it)
plus `optim/` (torch.distributed.checkpoint, one shard per rank), `trainer_state.json`,
`train_config.yaml` and each rank's RNG states. It is written to step_XXXXXX.tmp and renamed when
complete, so a kill at any moment leaves the newest complete checkpoint whole. Which checkpoint a
run resumes from, and the records of the run around it: runs.py.
"""
import json
import os
import random
import re
import shutil
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.distributed as dist
import yaml

from config import UserError, config_dict
from policy import full_weights
from ranks import all_ranks


@dataclass
class TrainState:
    """The trainer's counters: with the weights, optimizer and RNG states, all a resume needs."""
    step: int = 0          # RL steps done
    data_pos: int = 0      # prompts taken so far from the seeded, endless data stream
    bad_in_a_row: int = 0  # non-finite optimizer steps in a row (more than max_bad_steps: stop)
    skipped: int = 0       # non-finite optimizer steps skipped in all


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
            write_config_changes(cfg.out_dir, tmp)
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


CHANGES = "config_changes.jsonl"


def write_config_changes(out_dir, ckpt):
    """Copy out_dir/config_changes.jsonl (runs.record_config: what each resume changed, and after
    which step) into the checkpoint `ckpt`, empty when nothing changed: its train_config.yaml holds
    only the values of the last part of the run, and this record travels with it (to eval.py's
    results.json, table.py's configurations, and a branch resumed from it)."""
    src = os.path.join(out_dir, CHANGES)
    lines = open(src, "rb").read() if os.path.isfile(src) else b""
    with open(os.path.join(ckpt, CHANGES), "wb") as f:
        f.write(lines)


def read_config_changes(ckpt):
    """The records of config_changes.jsonl carried by checkpoint `ckpt` (write_config_changes), a
    list of {"step", "resumed_from", "changed": {key: [old, new]}}; None for a checkpoint written
    before checkpoints carried it (or a model directory that is no checkpoint)."""
    path = os.path.join(ckpt, CHANGES)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def prune_checkpoints(out_dir, step, keep_last):
    """After the checkpoint of `step` is published: remove the checkpoints older than it but the
    newest keep_last - 1 of them (keep_last 0: none). A newer one is never removed: it is not this
    run's to remove (and by step number alone, a run saving step 50 beside another run's step 150
    with keep_last 1 would delete its own step 50). One that holds evaluation results (eval.py
    writes CKPT/eval/results.json) keeps what they need, its weights, eval/ and train_config.yaml
    (a finished run extended with --resume --set steps=... would otherwise lose the evaluation of
    its old final checkpoint), and loses its optimizer and RNG states, two thirds of its size
    (drop_training_state); it is said once, and is the user's to delete. So evaluating
    every checkpoint as it appears keeps their weights, not every optimizer state until the disk is
    full. So does an evaluation under way (eval.py's eval/.running, EVAL_RUNNING_S old at most: one that
    outlasts `save_every x (keep_last - 1)` steps is not deleted under it); an eval/ with neither (an
    evaluation that failed or was killed long ago) protects nothing. -> the paths kept so."""
    older = [c for c in list_checkpoints(out_dir) if step_of(c) < step]
    kept = []
    for old in older[:max(0, len(older) - (keep_last - 1))] if keep_last else []:
        if not evaluated(old):
            shutil.rmtree(old, ignore_errors=True)
            continue
        kept.append(old)
        if drop_training_state(old):  # said when it happens: once
            print(f"keep_last {keep_last}: kept {old} for its evaluation results: its weights, eval/ and "
                  f"train_config.yaml; deleted its optimizer and RNG states (it can no longer be resumed "
                  f"from); delete it yourself when the results are no longer needed")
    return kept


EVAL_RUNNING_S = 24 * 3600  # an eval/.running older than this is a killed evaluation's: it protects nothing


def evaluated(ckpt):
    """Whether eval.py wrote its results into the checkpoint (ckpt/eval/results.json), or is
    evaluating it now (ckpt/eval/.running, under EVAL_RUNNING_S old)."""
    running = os.path.join(ckpt, "eval", ".running")
    return os.path.isfile(os.path.join(ckpt, "eval", "results.json")) or (
        os.path.isfile(running) and time.time() - os.path.getmtime(running) < EVAL_RUNNING_S)


def drop_training_state(ckpt):
    """Delete what only a resume reads (optim/ and each rank's RNG states) from checkpoint `ckpt`;
    optim/.metadata first, so that a kill midway leaves a checkpoint check_checkpoint refuses.
    -> whether there was anything to delete."""
    optim = os.path.join(ckpt, "optim")
    rng = [os.path.join(ckpt, f) for f in os.listdir(ckpt) if re.fullmatch(r"rng_rank\d+\.pt", f)]
    if not (os.path.isdir(optim) or rng):
        return False
    if os.path.isfile(os.path.join(optim, ".metadata")):
        os.remove(os.path.join(optim, ".metadata"))
    shutil.rmtree(optim, ignore_errors=True)
    for path in rng:
        os.remove(path)
    return True


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


def step_of(ckpt):
    """The RL step of a checkpoint directory's name (step_000050 -> 50; .old counts too)."""
    return int(re.search(r"step_(\d+)", os.path.basename(ckpt.rstrip("/"))).group(1))


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
    if "optim/.metadata" in missing and evaluated(ckpt):
        whole = [os.path.basename(c) for c in list_checkpoints(os.path.dirname(ckpt.rstrip("/")))
                 if os.path.isfile(os.path.join(c, "optim", ".metadata"))]
        raise UserError(f"--resume: {ckpt} was pruned to what its evaluation needs (keep_last kept its "
                        f"weights, eval/ and train_config.yaml, and deleted its optimizer and RNG states): "
                        f"resume from a checkpoint that has them ({', '.join(whole) or 'none beside it'}), "
                        f"or start a new run from its weights (--set model={ckpt})")
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
