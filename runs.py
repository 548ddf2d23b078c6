"""A run's out_dir and its resume rules: which checkpoint a run starts from (checkpoint_to_resume),
with no other run's files mixed in or lost; its logs cut back to the step resumed (cut_back_log);
its config compared with the checkpoint's (resumed_config) and put on record (record_config).
"""
import json
import math
import os
import re
import shutil
import socket
import time

import torch.distributed as dist
import yaml

from checkpoint import CHANGES, list_checkpoints, read_config_changes, step_of
from config import UserError, config_changes, config_dict


# What a run writes into out_dir besides its checkpoints (--overwrite removes exactly these).
RUN_FILES = ("metrics.jsonl", "samples.jsonl", "config.yaml", "config_changes.jsonl", "final",
             "tensorboard", "wandb", "wandb_run_id")


def earlier_run(out_dir):
    """A description of the run out_dir already holds (its checkpoints, its metrics), or None."""
    ckpts = list_checkpoints(out_dir)
    metrics = os.path.join(out_dir, "metrics.jsonl")
    lines = sum(1 for _ in open(metrics, "rb")) if os.path.isfile(metrics) else 0
    evaluated = [os.path.basename(c) for c in ckpts if os.path.isfile(os.path.join(c, "eval", "results.json"))]
    parts = ([f"{len(ckpts)} checkpoint(s) up to {os.path.basename(ckpts[-1])}"] if ckpts else []) + \
        ([f"evaluated by eval.py: {', '.join(evaluated)}"] if evaluated else []) + \
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


def check_resume_path(resume):
    """--resume CKPT names a checkpoint that exists, checked before anything is written (a missing
    one used to be answered about newer checkpoints, and left an empty out_dir behind)."""
    if resume in (None, "latest") or os.path.isdir(resume):
        return
    where = os.path.dirname(os.path.abspath(resume))
    have = [os.path.basename(c) for c in list_checkpoints(where)] if os.path.isdir(where) else []
    raise UserError(f"--resume {resume}: no such checkpoint"
                    + (f" ({where} holds {', '.join(have)}; a run keeps its newest keep_last)" if have else "")
                    + ": give one that exists, or --resume alone to continue from out_dir's newest")


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


def config_changes_before(ckpt):
    """What resumes changed in the run of checkpoint `ckpt` before it was saved: the records of
    config_changes.jsonl it carries (checkpoint.write_config_changes); for a checkpoint written
    before checkpoints carried them, the lines of its own out_dir's file before its step (a line
    torn by a kill skipped); [] for a directory that is no checkpoint of a run."""
    carried = read_config_changes(ckpt)
    if carried is not None:
        return carried
    real = os.path.realpath(ckpt)
    path = os.path.join(os.path.dirname(real), CHANGES)
    if not (os.path.isfile(path) and re.fullmatch(r"step_\d+", os.path.basename(real))):
        return []
    out = []
    for line in open(path, "rb").read().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("step", math.inf) < step_of(real):
            out.append(record)
    return out


def record_config(cfg, ckpt, step, changes):
    """Put the run's config on record in out_dir: config.yaml, the config its records start with
    (written at step 0, or by a branch into a new out_dir; a resume never rewrites it), and
    config_changes.jsonl, one line per resume that changed a key: {"step": the checkpoint's step,
    after which the new values hold, "resumed_from", "changed": {key: [old, new]}}. A resume from
    step K starts from the record of the run up to K (config_changes_before: a branch keeps the
    changes of the run it branches off; the lines of K and later, of a branch it replaces or of
    this resume's first try, are dropped), then adds its own."""
    path, changed = os.path.join(cfg.out_dir, "config.yaml"), os.path.join(cfg.out_dir, CHANGES)
    if not ckpt and os.path.exists(changed):
        os.remove(changed)
    before = config_changes_before(ckpt) if ckpt else []
    if before or (ckpt and os.path.exists(changed)):  # the run's record up to the checkpoint
        with open(changed + ".tmp", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in before)
        os.replace(changed + ".tmp", changed)
    if ckpt and changes:
        with open(changed, "a") as f:
            f.write(json.dumps({"step": step, "resumed_from": os.path.realpath(ckpt), "changed": changes}) + "\n")
    if not ckpt or not os.path.exists(path):
        with open(path, "w") as f:
            yaml.safe_dump(config_dict(cfg), f)


def resumed_config(ckpt, cfg, allow_change):
    """The changes `cfg` makes to the config that produced checkpoint `ckpt` (its
    train_config.yaml): {key: [saved value, new value]}, or a UserError naming them when one of them
    defines the run (config.free_keys says which do not) and `allow_change` is not set: going on
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
