"""Run train.main with a test's patches: `python tests/train_patched.py [--toy-reward]
[--parity-reward] [--noisy-reward] [--nan-from-step K] [--flat-reward-after N] [--dump-rollouts DIR]
-- ARGS`.

--toy-reward: reward 1.0 when the response contains the character '7'. A random-weight model earns
  it about a fifth of the time, so groups have reward spread and every update moves the weights,
  which the loop's tests need (the real grader gives a random model 0 everywhere).
--parity-reward: 1.0 when the response has an even number of characters: spread for a model whose
  responses are random tokens of a large vocabulary (where a '7' is rare).
--noisy-reward: the toy reward plus 1e-3 x a draw from each of torch's, Python's and numpy's global
  RNGs, so that a resumed run equals an uninterrupted one only if it restores all three.
--nan-from-step K: the loss is NaN from RL step K (1-based) on, to exercise the non-finite guard.
--flat-reward-after N: after the first N reward calls of this process, every reward is 0.0 (so
  every group from then on has equal rewards, A = 0).
--dump-rollouts DIR: every engine.generate call appends one line to DIR/rank<RANK>.jsonl:
  {"seed": ..., "groups": [[Sample as a dict, ...] per prompt]}, for a reference to recompute from.
--slow-save S: every checkpoint publish waits S seconds first (the complete .tmp directory stays
  unpublished that long), so that a kill can land inside a save.
--reward-fails SHARE: the reward raises (ValueError) on a response whose hash falls in the first
  SHARE of the range, and sleeps 1000 s (a hang) on those in the next SHARE.
--enospc-at-save K: the K-th checkpoint save of this process fails with "No space left on device".
--corrupt-weight-at-step K: at the start of RL step K's update, one weight of the policy is NaN.
--count-collectives DIR: every collective call of this process (torch.distributed's, and the
  functional ones FSDP2's DTensors make) is counted by the phase of train.py it falls in (setup,
  sample_and_grade, balance_ranks, old_logprobs, update_policy, ..., evaluate, save_or_stop; what
  lies between them "between"): DIR/rank<RANK>.json, [{"phase", "calls": {function: count}}] in
  call order, written when train.main returns. A collective inside another (a functional one
  built on another) counts once.
--dump-eval DIR: every held-out evaluation appends one line to DIR/rank<RANK>.jsonl: this rank's
  problems as eval.sample_benchmark returns them, [{"index", "responses"}].
--flat-reward-on-ranks R,R,...: on these ranks every training reward is 0.0 (their groups have
  A = 0, out of the loss), the held-out evaluation's grading unchanged.
--dump-old-logprobs DIR: every step appends one line to DIR/rank<RANK>.jsonl: this rank's sequences
  as balance_ranks dealt them, each {"minibatch", "adv", "in_loss", "prompt", "resp", "old",
  "rollout"} (the trainer's old log-probs and the sampler's), for a test to compare them token by
  token with a reference or with the engine.
Works under torchrun too; train.main runs under ranks.run_main, as `python train.py` does.
"""
import dataclasses
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import reward  # noqa: E402
import checkpoint  # noqa: E402
import ranks  # noqa: E402
import rollout  # noqa: E402
import tepo  # noqa: E402
import train  # noqa: E402

# --count-collectives: torch.distributed's collectives (FSDP2 calls all_gather_single and
# reduce_scatter_single: torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py), and train.py's
# phases, which main calls by their module-level names.
DIST_COLLECTIVES = ("all_reduce", "all_gather", "all_gather_object", "all_gather_into_tensor",
                    "all_gather_single", "all_gather_coalesced", "all_reduce_coalesced", "reduce_scatter",
                    "reduce_scatter_tensor", "reduce_scatter_single", "broadcast", "broadcast_object_list",
                    "barrier", "monitored_barrier", "gather", "gather_object", "scatter",
                    "scatter_object_list", "reduce", "all_to_all", "all_to_all_single", "send", "recv",
                    "isend", "irecv", "batch_isend_irecv", "new_group", "new_subgroups")
PHASES = ("setup", "evaluate", "sample_and_grade", "make_sequences", "balance_ranks", "old_logprobs",
          "update_policy", "old_policy_metrics", "sync_weights", "save_or_stop")


def count_collectives(out_dir):
    """--count-collectives: wrap the collectives and train.py's phases (see the docstring)."""
    import collections
    import re
    import threading

    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    records, running, between, inside = [], [], [None], threading.local()

    def count(name):
        if not running and between[0] is None:  # outside every phase: a record of its own
            between[0] = {"phase": "between", "calls": collections.Counter()}
            records.append(between[0])
        (running[-1] if running else between[0])["calls"][name] += 1

    def counted(module, name):
        real = getattr(module, name)

        def wrapper(*a, **kw):
            depth = getattr(inside, "depth", 0)
            if depth == 0:
                count(f"{module.__name__.rsplit('.', 1)[-1].lstrip('_')}.{name}")
            inside.depth = depth + 1
            try:
                return real(*a, **kw)
            finally:
                inside.depth = depth
        setattr(module, name, wrapper)

    for name in DIST_COLLECTIVES:
        if hasattr(dist, name):
            counted(dist, name)
    for name in dir(funcol):
        if re.match(r"(all_|reduce_scatter|broadcast|permute)", name) and \
                not name.endswith(("_backward", "_setup_context")) and callable(getattr(funcol, name)):
            counted(funcol, name)

    def phase(name):
        real = getattr(train, name)

        def wrapper(*a, **kw):
            record = {"phase": name, "calls": collections.Counter()}
            records.append(record)
            running.append(record)
            between[0] = None
            try:
                return real(*a, **kw)
            finally:
                running.pop()
        setattr(train, name, wrapper)

    for name in PHASES:
        phase(name)
    real_main = train.main

    def main(argv):
        real_main(argv)
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, f"rank{os.environ.get('RANK', '0')}.json"), "w") as f:
            json.dump([{"phase": r["phase"], "calls": dict(r["calls"])} for r in records], f)
    train.main = main


if __name__ == "__main__":
    argv = sys.argv[1:]
    ours, rest = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else ([], argv)
    if "--toy-reward" in ours:
        reward.math_reward = lambda response, gold, **kw: float("7" in response)
    if "--parity-reward" in ours:
        reward.math_reward = lambda response, gold, **kw: float(len(response) % 2 == 0)
    if "--noisy-reward" in ours:
        import random

        import numpy as np
        import torch
        reward.math_reward = lambda response, gold, **kw: float("7" in response) + 1e-3 * (
            torch.rand(()).item() + random.random() + np.random.rand())
    if "--nan-from-step" in ours:
        start, step, real_loss, real_lr = int(ours[ours.index("--nan-from-step") + 1]), [0], \
            tepo.policy_loss, train.lr_at

        def lr_at(cfg, s):  # called at the start of each RL step's update: note the step
            step[0] = s + 1
            return real_lr(cfg, s)

        def nan_loss(*a, **kw):
            loss, m = real_loss(*a, **kw)
            return (loss * float("nan") if step[0] >= start else loss), m
        train.lr_at, tepo.policy_loss = lr_at, nan_loss
    if "--flat-reward-after" in ours:
        limit, seen, before = int(ours[ours.index("--flat-reward-after") + 1]), [0], reward.math_reward

        def flat_after(*a, **kw):
            seen[0] += 1
            return before(*a, **kw) if seen[0] <= limit else 0.0
        reward.math_reward = flat_after
    if "--dump-rollouts" in ours:
        dump_dir, make = ours[ours.index("--dump-rollouts") + 1], rollout.make_engine

        def dumping_engine(*a, **kw):
            engine = make(*a, **kw)
            generate = engine.generate

            def dumping_generate(prompts, *ga, **gkw):
                groups = generate(prompts, *ga, **gkw)
                os.makedirs(dump_dir, exist_ok=True)
                with open(os.path.join(dump_dir, f"rank{os.environ.get('RANK', '0')}.jsonl"), "a") as f:
                    f.write(json.dumps({"seed": gkw.get("seed"), "groups": [
                        [dataclasses.asdict(s) for s in g] for g in groups]}) + "\n")
                return groups
            engine.generate = dumping_generate
            return engine
        rollout.make_engine = dumping_engine
    if "--slow-save" in ours:
        import time
        delay, real_publish = float(ours[ours.index("--slow-save") + 1]), checkpoint.publish

        def slow_publish(tmp, final):
            time.sleep(delay)
            return real_publish(tmp, final)
        checkpoint.publish = slow_publish
    if "--reward-fails" in ours:
        import time
        import zlib
        share, inner = float(ours[ours.index("--reward-fails") + 1]), reward.math_reward

        def failing(response, gold, **kw):
            h = zlib.crc32(response.encode()) / 2 ** 32
            if h < share:
                raise ValueError("grader bug")
            if h < 2 * share:
                time.sleep(1000)
            return inner(response, gold, **kw)
        reward.math_reward = failing
    if "--enospc-at-save" in ours:
        import errno

        import torch
        at, saves, real_save = int(ours[ours.index("--enospc-at-save") + 1]), [0], torch.save

        def full_disk(obj, f, *a, **kw):
            if str(f).endswith(".pt") and "rng_rank" in str(f):
                saves[0] += 1
                if saves[0] == at:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(f))
            return real_save(obj, f, *a, **kw)
        torch.save = full_disk
    if "--corrupt-weight-at-step" in ours:
        import torch
        at, real_lr, real_load, models = int(ours[ours.index("--corrupt-weight-at-step") + 1]), \
            train.lr_at, train.load_policy, []

        def keep_policy(*a, **kw):
            models.append(real_load(*a, **kw))
            return models[-1]

        def corrupting_lr(cfg, s):
            if s + 1 == at:
                p = next(models[0].parameters())
                with torch.no_grad():
                    (p.to_local() if hasattr(p, "to_local") else p).view(-1)[0] = float("nan")
            return real_lr(cfg, s)
        train.load_policy, train.lr_at = keep_policy, corrupting_lr
    if "--count-collectives" in ours:
        count_collectives(ours[ours.index("--count-collectives") + 1])
    if "--dump-eval" in ours:
        import eval as ev
        eval_dir, real_sample = ours[ours.index("--dump-eval") + 1], ev.sample_benchmark

        def dumping_sample(*a, **kw):
            records = real_sample(*a, **kw)
            os.makedirs(eval_dir, exist_ok=True)
            with open(os.path.join(eval_dir, f"rank{os.environ.get('RANK', '0')}.jsonl"), "a") as f:
                f.write(json.dumps([{"index": r["index"], "responses": [x["response"] for x in r["samples"]]}
                                    for r in records]) + "\n")
            return records
        ev.sample_benchmark = dumping_sample
    if "--flat-reward-on-ranks" in ours:
        if os.environ.get("RANK", "0") in ours[ours.index("--flat-reward-on-ranks") + 1].split(","):
            train.shaped_reward = lambda *a, **kw: (0.0, False)
    if "--dump-old-logprobs" in ours:
        old_dir, real_old_metrics = ours[ours.index("--dump-old-logprobs") + 1], train.old_policy_metrics

        def dumping_old_metrics(minibatches):  # called once per step, after the update
            os.makedirs(old_dir, exist_ok=True)
            with open(os.path.join(old_dir, f"rank{os.environ.get('RANK', '0')}.jsonl"), "a") as f:
                f.write(json.dumps([{"minibatch": k, "adv": s.adv, "in_loss": s.in_loss, "prompt": s.prompt,
                                     "resp": s.resp, "old": s.old_logp.tolist(),
                                     "rollout": s.rollout_logp.tolist()}
                                    for k, mb in enumerate(minibatches) for s in mb
                                    if s.old_logp is not None]) + "\n")
            return real_old_metrics(minibatches)
        train.old_policy_metrics = dumping_old_metrics
    ranks.run_main(lambda: train.main(rest))
