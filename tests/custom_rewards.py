"""Rewards of one's own for tests/test_custom_reward.py, named in a config as
`reward: tests.custom_rewards:has_seven` (train.py runs from the repository's root, where `tests`
is importable as a namespace package)."""


def has_seven(response, gold, *, format_reward=0.0, no_answer_penalty=0.0, rel_tol=1e-4):
    """1.0 when the response holds a '7' (a random tiny model's do about a fifth of the time, so its
    groups have reward spread and the update runs), else format_reward; it raises on a '#', so that
    the tests see its failures guarded and counted as a built-in grader's are."""
    if "#" in response:
        raise ValueError("a '#' in the response")
    return 1.0 if "7" in response else float(format_reward)


def one_argument(response):
    """Not math_reward's signature: no gold, no format_reward."""
    return 0.0


NOT_A_FUNCTION = 3


def plus_minus_one(response, gold, *, format_reward=0.0, no_answer_penalty=0.0, rel_tol=1e-4):
    """+1 right, -1 wrong (below the built-in graders' lowest, 0); it stalls on "STALL", so that a
    test can make it time out."""
    if "STALL" in response:
        import time
        time.sleep(5)
    import reward
    return 1.0 if reward.grade(response, gold, second_opinion=False)[1] else -1.0


def even_length(response, gold, *, format_reward=0.0, no_answer_penalty=0.0, rel_tol=1e-4):
    """1.0 when the response has an even number of characters, else format_reward: about half of a
    random model's responses, whatever its vocabulary, so its groups have reward spread and a
    held-out accuracy near 50% tells one set of responses from another (the real grader gives a
    random model 0 on both)."""
    return 1.0 if len(response) % 2 == 0 else float(format_reward)
