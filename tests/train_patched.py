"""Run train.main with a test's patches: `python tests/train_patched.py [--toy-reward] [--nan-from K] -- ARGS`.

--toy-reward: reward 1.0 when the response contains the character '7'. A random-weight model earns
  it about a fifth of the time, so groups have reward spread and every update moves the weights,
  which the loop's tests need (the real grader gives a random model 0 everywhere).
--nan-from K: the loss is NaN from the K-th loss call on, to exercise the non-finite guard.
Works under torchrun too.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import reward  # noqa: E402
import tepo  # noqa: E402
import train  # noqa: E402

if __name__ == "__main__":
    argv = sys.argv[1:]
    ours, rest = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else ([], argv)
    if "--toy-reward" in ours:
        reward.math_reward = lambda response, gold, **kw: float("7" in response)
    if "--nan-from" in ours:
        start, calls, real = int(ours[ours.index("--nan-from") + 1]), [0], tepo.policy_loss

        def nan_loss(*a, **kw):
            calls[0] += 1
            loss, m = real(*a, **kw)
            return (loss * float("nan") if calls[0] >= start else loss), m
        tepo.policy_loss = nan_loss
    train.main(rest)
