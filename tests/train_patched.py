"""Run train.main with a test's patches: `python tests/train_patched.py [--toy-reward] [--nan-from K]
[--flat-reward-after N] [--dump-rollouts DIR] -- ARGS`.

--toy-reward: reward 1.0 when the response contains the character '7'. A random-weight model earns
  it about a fifth of the time, so groups have reward spread and every update moves the weights,
  which the loop's tests need (the real grader gives a random model 0 everywhere).
--nan-from K: the loss is NaN from the K-th loss call on, to exercise the non-finite guard.
--flat-reward-after N: after the first N reward calls of this process, every reward is 0.0 (so
  every group from then on has equal rewards, A = 0).
--dump-rollouts DIR: every engine.generate call appends one line to DIR/rank<RANK>.jsonl:
  {"seed": ..., "groups": [[Sample as a dict, ...] per prompt]}, for a reference to recompute from.
Works under torchrun too.
"""
import dataclasses
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import reward  # noqa: E402
import rollout  # noqa: E402
import tepo  # noqa: E402
import train  # noqa: E402

if __name__ == "__main__":
    argv = sys.argv[1:]
    ours, rest = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else ([], argv)
    if "--toy-reward" in ours:
        reward.math_reward = lambda response, gold, **kw: float("7" in response)
    if "--flat-reward-after" in ours:
        limit, seen, before = int(ours[ours.index("--flat-reward-after") + 1]), [0], reward.math_reward

        def flat_after(*a, **kw):
            seen[0] += 1
            return before(*a, **kw) if seen[0] <= limit else 0.0
        reward.math_reward = flat_after
    if "--nan-from" in ours:
        start, calls, real = int(ours[ours.index("--nan-from") + 1]), [0], tepo.policy_loss

        def nan_loss(*a, **kw):
            calls[0] += 1
            loss, m = real(*a, **kw)
            return (loss * float("nan") if calls[0] >= start else loss), m
        tepo.policy_loss = nan_loss
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
    train.main(rest)
