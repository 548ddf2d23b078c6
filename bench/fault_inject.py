"""Fault injection: SIGKILL every process of a 2-rank train.py run, again and again, resume it each
time, and check that the finished run is the uninterrupted one, number for number.

    python bench/fault_inject.py [--kills 20] [--steps 10] [--backend vllm] [--slow-save 1.5]
                                 [--seed 0] [--work DIR] [--json OUT]

The run: the tiny random Qwen2 model of demo.make_tiny_model (the tests' one), a toy data file of 40
arithmetic problems, 2 CPU ranks under torchrun (gloo), P=4 prompts x G=4, save_every 1, keep_last 2,
via tests/train_patched.py with --noisy-reward (the toy '7' reward plus draws from torch's, Python's
and numpy's global RNGs, so a resume that did not restore all three would differ) and --slow-save S
(each checkpoint waits S seconds, complete but unpublished, before its rename: a window to kill in).

1. A reference run, uninterrupted.
2. The same config in a fresh out_dir, always launched with --resume, killed `--kills` times: every
   process (torchrun and each worker, found as torchrun's descendants, which live in sessions of
   their own) gets SIGKILL at once. The first kill lands during start-up (before any checkpoint, so
   the first resume finds none); every third waits for a checkpoint save to start (a fresh
   step_*.tmp) and kills inside it; the others at a random moment 24-50 s after launch (start-up takes ~25 s here).
   A kill counts as "inside a save" when a step_*.tmp directory made by the killed launch existed.
   Each launch must print the checkpoint it resumes from, which must be the newest complete one in
   out_dir at launch time (checkpoint.list_checkpoints), or none.
3. After the last kill, one launch runs to the end. Whenever a launch completes the run (also
   before the last kill, when the kills so far let it reach its last step), metrics.jsonl is
   compared with the reference's, every field but the wall-clock ones (timing/*), and the
   run starts again from scratch for the remaining kills: the maximum absolute difference over all
   completed runs is reported.
Exit code 1 if any check fails.
"""
import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import psutil
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import checkpoint  # noqa: E402
from demo import make_tiny_model  # noqa: E402

VOLATILE = ("timing/",)  # wall clock: differs between any two runs


def write_config(work, name, model_dir, steps, backend, seed):
    data = os.path.join(work, "toy.jsonl")
    if not os.path.exists(data):
        with open(data, "w") as f:
            f.writelines(json.dumps({"problem": f"What is {i} + {i}?", "answer": str(2 * i)}) + "\n"
                         for i in range(40))
    cfg = dict(model=model_dir, train_data=data, out_dir=os.path.join(work, name), seed=seed,
               prompt_template="{problem} \\boxed{}\n", steps=steps, prompts_per_step=4, group_size=4,
               max_prompt_len=64, max_new_tokens=24, num_minibatches=2, micro_batch_tokens=256,
               lr=1e-3, log_samples_every=1, save_every=1, keep_last=2, backend=backend)
    path = os.path.join(work, f"{name}.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f)
    return path, cfg["out_dir"]


def launch(config, slow_save, log):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           os.path.join(ROOT, "tests", "train_patched.py"), "--noisy-reward", "--slow-save",
           str(slow_save), "--", "--config", config, "--resume"]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def kill_all(proc):
    """SIGKILL torchrun and every descendant at once; wait until they are gone."""
    try:
        procs = [psutil.Process(proc.pid)] + psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        procs = []
    for p in procs:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=30)
    proc.wait()


def tmp_dirs(out_dir):
    if not os.path.isdir(out_dir):
        return set()
    return {(n, os.stat(os.path.join(out_dir, n)).st_ino) for n in os.listdir(out_dir)
            if n.startswith("step_") and n.endswith(".tmp")}


def metrics(out_dir):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in rows]


def max_difference(a, b):
    if [r["step"] for r in a] != [r["step"] for r in b]:
        return float("inf"), f"steps differ: {[r['step'] for r in a]} vs {[r['step'] for r in b]}"
    worst, where = 0.0, None
    for ra, rb in zip(a, b):
        if ra.keys() != rb.keys():
            return float("inf"), f"step {ra['step']}: keys differ {set(ra) ^ set(rb)}"
        for k in ra:
            x, y = ra[k], rb[k]
            d = 0.0 if x == y else abs(x - y) if isinstance(x, (int, float)) and isinstance(
                y, (int, float)) else float("inf")
            if d > worst:
                worst, where = d, f"step {ra['step']} {k}: {x} vs {y}"
    return worst, where


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--backend", default="vllm", choices=("vllm", "hf"))
    ap.add_argument("--slow-save", type=float, default=1.5)
    ap.add_argument("--seed", type=int, default=0, help="seeds the kill times (and the run)")
    ap.add_argument("--work", help="working directory (default: a temporary one, removed)")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="fault_inject_")
    os.makedirs(work, exist_ok=True)
    rng = random.Random(args.seed)
    model_dir = make_tiny_model(os.path.join(work, "model"), hidden=64, layers=2, heads=2,
                                kv_heads=1, intermediate=128, vocab_size=128, seed=0)
    t0 = time.time()
    ref_cfg, ref_out = write_config(work, "reference", model_dir, args.steps, args.backend, args.seed)
    shutil.rmtree(ref_out, ignore_errors=True)
    with open(os.path.join(work, "reference.log"), "w") as log:
        proc = launch(ref_cfg, args.slow_save, log)
        if proc.wait():
            sys.exit(f"the reference run failed: see {work}/reference.log")
    ref_time = time.time() - t0
    print(f"reference run: {args.steps} steps in {ref_time:.0f}s", flush=True)

    cfg, out = write_config(work, "killed", model_dir, args.steps, args.backend, args.seed)
    shutil.rmtree(out, ignore_errors=True)
    fig = {"kills": 0, "kills_inside_a_save": 0, "resumes": 0, "resumed_from_none": 0,
           "wrong_resume_point": 0, "launches": 0, "kill_log": []}
    while True:
        if fig["launches"] > 4 * args.kills + 10:  # a bound, whatever the timing
            sys.exit(f"{fig['launches']} launches placed only {fig['kills']} of {args.kills} kills")
        expected = (checkpoint.list_checkpoints(out) or [None])[-1]
        stale = tmp_dirs(out)
        log_path = os.path.join(work, f"launch{fig['launches']:02d}.log")
        with open(log_path, "w") as log:
            proc = launch(cfg, args.slow_save, log)
            fig["launches"] += 1
            started, mode, killed = time.time(), None, False
            if fig["kills"] < args.kills:
                mode = ("start-up" if fig["kills"] == 0 else
                        "aimed at a save" if fig["kills"] % 3 == 2 else "random")
                # Relative to the uninterrupted run's duration: on a fast machine a fixed delay
                # could outlast every run, and the loop would restart runs for ever.
                if mode == "start-up":
                    deadline = started + rng.uniform(0.05, 0.3) * ref_time
                elif mode == "random":
                    deadline = started + rng.uniform(0.3, 0.95) * ref_time
                else:
                    deadline = None
                while proc.poll() is None:
                    if deadline is None and tmp_dirs(out) - stale:
                        deadline = time.time() + rng.uniform(0.1, 0.8 * args.slow_save)
                    if deadline is not None and time.time() >= deadline:
                        in_save = bool(tmp_dirs(out) - stale)
                        kill_all(proc)
                        killed = True
                        break
                    time.sleep(0.05)
            rc = proc.wait()
        text = open(log_path).read()
        said = re.search(r"--resume: from (\S+)", text)
        said_none = "--resume: no checkpoint in" in text
        if said or said_none:
            fig["resumes"] += 1 if fig["launches"] > 1 else 0
            got = said.group(1) if said else None
            if said_none:
                fig["resumed_from_none"] += 1
            if (os.path.normpath(got) if got else None) != (os.path.normpath(expected) if expected else None):
                fig["wrong_resume_point"] += 1
                print(f"  launch {fig['launches']}: resumed from {got}, newest complete was {expected}")
        if killed:
            fig["kills"] += 1
            fig["kills_inside_a_save"] += in_save
            fig["kill_log"].append({"mode": mode, "after_s": round(time.time() - started, 1),
                                    "inside_save": in_save, "resumed_from": expected,
                                    "newest_after": (checkpoint.list_checkpoints(out) or [None])[-1]})
            print(f"kill {fig['kills']:2d} ({mode}, {time.time() - started:5.1f}s after launch, "
                  f"{'inside a save' if in_save else 'outside a save'}): launch resumed from "
                  f"{os.path.basename(expected) if expected else 'nothing'}, newest now "
                  f"{os.path.basename(fig['kill_log'][-1]['newest_after'] or 'none')}", flush=True)
            continue
        if rc != 0:
            sys.exit(f"launch {fig['launches']} failed with exit code {rc}: see {log_path}")
        diff, where = max_difference(metrics(ref_out), metrics(out))  # the run is complete: compare
        fig["completed_runs"] = fig.get("completed_runs", 0) + 1
        if diff >= fig.get("max_difference", 0.0):
            fig["max_difference"], fig["first_difference"] = diff, where
        print(f"run {fig['completed_runs']} complete after {fig['kills']} kills in all: max difference "
              f"to the uninterrupted run {diff}", flush=True)
        if fig["kills"] >= args.kills:
            break
        shutil.rmtree(out)  # start the run again to place the remaining kills
    diff, where = fig["max_difference"], fig["first_difference"]
    fig.update(steps=args.steps, backend=args.backend,
               slow_save_s=args.slow_save, reference_run_s=round(ref_time), total_s=round(time.time() - t0))
    print(f"kills: {fig['kills']}, kills inside a save: {fig['kills_inside_a_save']}, resumes: "
          f"{fig['resumes']} ({fig['resumed_from_none']} with no checkpoint yet), resumes not from the "
          f"newest complete checkpoint: {fig['wrong_resume_point']}, max difference of metrics.jsonl "
          f"to the uninterrupted run: {diff}{f' ({where})' if where else ''}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(fig, f, indent=1)
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    ok = diff == 0.0 and not fig["wrong_resume_point"] and fig["kills"] >= args.kills
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
