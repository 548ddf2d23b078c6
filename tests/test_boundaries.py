"""Every `<` / `<=` boundary of config.py, data.py and the loops (train.py, packing.py, rollout.py,
eval.py), tested on both sides: the value at the boundary and the one past it. A comparison
written the other way round (`<` for `<=`) changes one of the two, so a boundary tested on one
side only could not see it. In this process, without a model where the rule does not need one."""
import json
import os
from types import SimpleNamespace

import pytest
import torch

import config
import data
import eval as ev
import packing
import rollout
import train
from by_hand import Scripted
from checkpoint import TrainState
from config import UserError


def cfg(**kw):
    return train.Config(model="m", train_data="d", **kw)


# ----------------------------------------------------------------------------- config.py


# (key, values that pass, values refused): each boundary's value and the one just past it
LIMITS = [("keep_last", [0], [-1]), ("group_size", [2], [1]),
          ("format_reward", [0.0, 0.999], [1.0, -1e-9]), ("overlong_buffer", [0, 8], [-1, 9]),
          ("top_p", [1.0], [0.0, 1.0 - 1e-9, 1.0 + 1e-9]), ("gpu_memory_utilization", [1e-9, 1.0], [0.0, 1.0 + 1e-9]),
          ("min_lr_ratio", [0.0, 1.0], [-1e-9, 1.0 + 1e-9]), ("max_reward_errors", [0.0, 1.0], [-1e-9, 1.0 + 1e-9]),
          ("betas", [(0.0, 0.0), (0.9, 0.999999)], [(1.0, 0.9), (0.9, 1.0), (-1e-9, 0.9)])]
LIMITS += [(k, [1], [0]) for k in ("steps", "prompts_per_step", "max_prompt_len", "max_new_tokens",
                                   "num_minibatches", "micro_batch_tokens", "max_sampling_tries", "eval_n")]
LIMITS += [(k, [1e-9], [0.0]) for k in ("lr", "temperature", "grad_clip", "reward_timeout")]
LIMITS += [(k, [0], [-1]) for k in ("warmup_steps", "eval_every", "eval_max_problems", "save_every",
                                    "log_samples_every", "max_bad_steps")]
LIMITS += [(k, [0.0], [-1e-9]) for k in ("weight_decay", "no_answer_penalty", "overlong_factor")]
# the loss keys a config passes on to tepo.LossConfig
LOSS_LIMITS = [("tepo", "is_cap", [1.0 + 1e-9], [1.0]), ("tepo", "clip_low", [0.0, 1.0], [-1e-9, 1.0 + 1e-9]),
               ("tepo", "clip_high", [0.0], [-1e-9]), ("klcov", "cov_ratio", [1e-9, 1.0], [0.0, 1.0 + 1e-9]),
               ("drgrpo", "max_new_tokens", [1], [0])]


@pytest.mark.parametrize("key,ok,bad", LIMITS, ids=[k for k, _, _ in LIMITS])
def test_config_limits_on_both_sides(key, ok, bad):
    extra = {"max_new_tokens": 8} if key == "overlong_buffer" else {}
    for value in ok:
        assert getattr(cfg(**{key: value}, **extra), key) == value
    for value in bad:
        with pytest.raises(UserError, match=key):
            cfg(**{key: value}, **extra)


@pytest.mark.parametrize("method,key,ok,bad", LOSS_LIMITS, ids=[k for _, k, _, _ in LOSS_LIMITS])
def test_loss_limits_on_both_sides(method, key, ok, bad):
    for value in ok:
        assert getattr(cfg(method=method, loss={key: value}).loss_cfg, key) == value
    for value in bad:
        with pytest.raises(UserError):
            cfg(method=method, loss={key: value})


def test_a_run_saved_before_failed_reward_is_named_from_one_token_of_overlong_shaping():
    """run_values: a config saved before `failed_reward` existed scored a failed call 0.0 unshaped;
    today's rule differs only where shaping is on (overlong_buffer > 0 and overlong_factor > 0)."""
    old = dict(method="tepo", max_new_tokens=8, overlong_factor=1.0)
    assert config.run_values({**old, "overlong_buffer": 0})["failed_reward"] == 0.0
    assert config.run_values({**old, "overlong_buffer": 1})["failed_reward"] == config.BEFORE_FAILED_REWARD
    assert config.run_values({**old, "overlong_buffer": 1, "overlong_factor": 0.0})["failed_reward"] == 0.0


def test_the_overlong_keys_are_free_exactly_when_the_other_is_zero():
    values = lambda **kw: config.run_values(dict(method="tepo", max_new_tokens=8, **kw))  # noqa: E731
    assert "overlong_factor" in config.free_keys(values(overlong_buffer=0))
    assert "overlong_factor" not in config.free_keys(values(overlong_buffer=1))
    assert "overlong_buffer" in config.free_keys(values(overlong_buffer=1, overlong_factor=0.0))
    assert "overlong_buffer" not in config.free_keys(values(overlong_buffer=1, overlong_factor=1e-9))


# ----------------------------------------------------------------------------- data.py


def test_a_prompt_of_exactly_max_prompt_len_tokens_is_kept(tmp_path, tiny_model_dir, capsys):
    """load_rows keeps a prompt of max_prompt_len tokens and drops one of max_prompt_len + 1 (the
    engine's context is max_prompt_len + max_new_tokens), counting and saying it only then."""
    tok = data.load_tokenizer(tiny_model_dir)
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"problem": p, "answer": "1"}) + "\n" for p in ("12 + 1?", "123 + 1?")))
    lens = [len(data.encode_prompt(tok, p, "Q: {problem}")[1]) for p in ("12 + 1?", "123 + 1?")]
    assert lens[1] == lens[0] + 1
    for limit, kept in ((lens[1], 2), (lens[0], 1), (lens[0] - 1, 0)):
        c = cfg(max_prompt_len=max(limit, 1), prompt_template="Q: {problem}")
        if kept == 0:
            with pytest.raises(UserError, match="no prompt fits"):
                data.load_rows(str(path), c, tok, 0)
            continue
        rows, dropped = data.load_rows(str(path), c, tok, 0)
        assert (len(rows), dropped) == (kept, 2 - kept)
        said = capsys.readouterr().out
        assert ("dropped" in said) == (kept == 1) and ("dropped 1 of 2 prompts" in said) == (kept == 1)


def test_last_boxed_finds_a_box_at_the_first_character():
    assert data.last_boxed("\\boxed{5} is it") == "5"
    assert data.last_boxed("no box here") is None and data.last_boxed("") is None


@pytest.mark.parametrize("code,tries", [(399, 3), (400, 1), (404, 1), (429, 3), (499, 1), (500, 3)])
def test_a_client_error_is_not_retried_but_a_server_error_or_429_is(monkeypatch, code, tries):
    """data._download gives up at once on 4xx (a missing file stays missing), but for 429 (too many
    requests); a 5xx and anything below 400 are retried FETCH_TRIES times."""
    import time
    import urllib.error
    import urllib.request
    calls = []

    def urlopen(url, timeout=None):
        calls.append(url)
        raise urllib.error.HTTPError(url, code, "x", {}, None)
    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    monkeypatch.setattr(time, "sleep", lambda s: None)
    body, why, answered = data._download("http://example.invalid/f", "f")
    assert body is None and answered and f"HTTP {code}" in why
    assert len(calls) == tries == (1 if 400 <= code < 500 and code != 429 else data.FETCH_TRIES)


# ----------------------------------------------------------------------------- train.py: rollouts


class Canned:
    """An engine answering every prompt with responses of the given lengths (token ids 5, 6, ...),
    log-probs -1.0 each."""

    def __init__(self, lengths=(2, 2)):
        self.lengths, self.calls = lengths, 0

    def generate(self, prompts, n=1, **kw):
        self.calls += 1
        return [[rollout.Sample(list(p), [5] * self.lengths[j % len(self.lengths)], "x",
                                [-1.0] * self.lengths[j % len(self.lengths)], "stop") for j in range(n)]
                for p in prompts]


def fake_run(c, script, lengths=(2, 2)):
    rows = [{"problem": f"p{i}", "prompt": f"p{i}", "prompt_ids": [i + 1], "answer": "7"} for i in range(40)]
    return SimpleNamespace(cfg=c, rank=0, world=1, engine=Canned(lengths), grader=Scripted(script), rows=rows,
                           state=TrainState())


@pytest.mark.parametrize("script,draws,kept", [
    ([1, 0, 0, 1, 1, 0], 1, 2),            # exactly P = 2 informative groups at the first draw
    ([1, 0, 0, 0, 1, 0], 2, 2),            # 1 < P: a second draw (which holds 2 more: 3, keep 2)
    ([0, 0, 1, 1, 0, 0] * 2, 2, 0),        # none in max_sampling_tries = 2 draws: trains on none
    ([1, 0, 1, 1, 1, 1, 0, 0], 2, 1)])     # 1, then none: after the last try it keeps the 1
def test_dynamic_sampling_stops_once_it_holds_p_informative_groups(one_rank, script, draws, kept):
    """P = 2 groups of 2 a draw, at most 2 draws: sample_and_grade draws again while it holds fewer
    than P informative groups, and stops as soon as it holds P (`>=`), keeping P."""
    c = cfg(method="dapo", prompts_per_step=2, group_size=2, max_sampling_tries=2, overlong_buffer=0)
    run = fake_run(c, script)
    out = train.sample_and_grade(run, step=0)
    assert run.engine.calls == draws and len(out.drawn) == 2 * draws and len(out.groups) == kept
    assert run.state.data_pos == 2 * draws
    assert out.metrics["rollout/samples_drawn"] == 4 * draws
    assert out.metrics["reward/groups_kept"] == kept / (2 * draws)


def test_a_group_is_spread_from_two_distinct_rewards(one_rank):
    run = SimpleNamespace(cfg=cfg(), rank=0, world=1)
    s = rollout.Sample([1], [5], "x", [-1.0], "stop")
    groups = [train.Group({}, [s, s], r, [x >= 1 for x in r]) for r in ([1.0, 1.0], [1.0, 0.9], [0.0, 0.0])]
    m = train.rollout_metrics(run, groups=groups, drawn=groups, seconds={"rollout": 1.0, "reward": 0.0})
    assert m["rollout/groups_spread"] == 1


@pytest.mark.parametrize("share,failures,stops", [(0.0, 0, False), (0.0, 1, True), (0.25, 1, False),
                                                  (0.25, 2, True), (1.0, 4, False)])
def test_reward_failures_stop_the_run_only_past_the_share(one_rank, share, failures, stops):
    """More than max_reward_errors x the step's rewards (4) failing stops the run, naming the
    first; exactly that many does not. max_reward_errors 0 with no failure goes on."""
    run = SimpleNamespace(cfg=cfg(max_reward_errors=share), world=1)
    failed = {"errors": failures, "timeouts": 0, **({"first": "ValueError: x"} if failures else {})}
    group = train.Group({}, [None] * 4, [0.0] * 4, [False] * 4)
    if stops:
        with pytest.raises(UserError, match="first: ValueError: x"):
            train.reward_failures(run, step=0, failed=failed, drawn=[group])
    else:
        assert train.reward_failures(run, step=0, failed=failed, drawn=[group]) == {
            "reward/errors": failures, "reward/timeouts": 0}


def test_a_reward_of_one_is_right_and_one_below_is_wrong():
    c = cfg(method="dapo", max_new_tokens=8, overlong_buffer=0)
    assert train.shape(c, 1.0, 3) == (1.0, True)
    r, correct = train.shape(c, 0.999, 3)
    assert r == pytest.approx(0.999 - 1.0) and correct is False


@pytest.mark.parametrize("n,penalty", [(5, 0.0), (6, -2 / 3), (7, -4 / 3), (8, -2.0)])
def test_the_overlong_penalty_starts_after_max_new_tokens_minus_the_buffer(n, penalty):
    """Buffer 3 of 8 tokens, factor 2: 0 up to 5 tokens, then -2/3 a token, -2 at 8."""
    c = cfg(method="dapo", max_new_tokens=8, overlong_buffer=3, overlong_factor=2.0)
    assert train.shape(c, 1.0, n) == (pytest.approx(1.0 + penalty), True)
    assert train.shape(cfg(method="dapo", max_new_tokens=8, overlong_buffer=0), 1.0, 8) == (1.0, True)


def test_a_group_is_informative_with_one_right_and_with_one_wrong():
    groups = [train.Group({}, [], [], c) for c in ([False] * 3, [True, False, False], [True, True, False], [True] * 3)]
    assert train.informative_groups(groups) == groups[1:3]


@pytest.mark.parametrize("have,total,want", [([1, 3], 3, [1, 2]), ([1, 3], 4, [1, 3]), ([2, 2], 3, [2, 1]),
                                             ([3, 0, 1], 1, [1, 0, 0]), ([3, 0, 1], 4, [3, 0, 1])])
def test_share_out_fills_each_rank_up_to_what_it_holds(have, total, want):
    assert train.share_out(have, total) == want


# ----------------------------------------------------------------------------- train.py: the update


def test_the_masks_share_is_zero_without_weight_and_the_ratio_with(one_rank):
    run = SimpleNamespace(cfg=cfg(), world=1, state=TrainState())
    steps = [train.OptimizerStep(1.0, True)]
    for w_mask, w_policy, share in ((0.0, 0.0, 0.0), (1e-300, 0.0, 1.0), (1.0, 3.0, 0.25)):
        m = train.update_metrics(run, sums={"actor/grad_w_kl_mask": w_mask, "actor/grad_w_policy": w_policy},
                                 steps=steps, step=0, mask_steps=1)
        assert m["actor/kl_mask_grad_share"] == share


@pytest.mark.parametrize("n,selected", [(4, 3), (3, 3), (2, 2), (1, 1)])
def test_kl_cov_takes_every_candidate_when_it_has_no_more_than_n(one_rank, n, selected):
    """tepo.choose_cov over 3 tokens: n >= 3 takes all three (fewer candidates than n, or exactly n);
    n < 3 the n of largest cov."""
    lcfg = train.tepo.LossConfig.preset("klcov", cov_ratio=1.0)
    items = [(torch.tensor([-1.0, -3.0]), torch.tensor([-1.0, -3.0]), 1.0),
             (torch.tensor([-2.0]), torch.tensor([-2.0]), -1.0)]
    # cov = (A - mean A)(logp - mean logp), mean A = 1/3, mean logp = -2: 2/3, -2/3, 0
    sel = train.tepo.choose_cov(items, lcfg, n, torch.Generator().manual_seed(0), sums=train.all_ranks,
                                nth=train.global_nth)
    picked = torch.cat(sel)
    assert int(picked.sum()) == selected
    assert picked.tolist() == [[True, True, True], [True, True, True], [True, False, True],
                               [True, False, False]][4 - n]


@pytest.mark.parametrize("warmup,step,lr", [(2, 0, 0.5), (2, 1, 1.0), (2, 2, 1.0), (0, 0, 1.0)])
def test_the_warm_up_ends_after_warmup_steps(warmup, step, lr):
    assert train.lr_at(cfg(lr=1.0, warmup_steps=warmup, steps=10), step) == lr


def test_the_cosine_starts_at_the_end_of_the_warm_up():
    c = cfg(lr=1.0, warmup_steps=2, steps=4, lr_schedule="cosine", min_lr_ratio=0.2)
    assert [train.lr_at(c, s) for s in range(4)] == pytest.approx([0.5, 1.0, 1.0, 0.6])


@pytest.mark.parametrize("bad,stops", [(2, False), (3, True)])
def test_the_run_stops_after_more_than_max_bad_steps_in_a_row(monkeypatch, bad, stops):
    saved = []
    monkeypatch.setattr(train, "save_checkpoint", lambda *a, **kw: saved.append(kw) or "ckpt")
    run = SimpleNamespace(cfg=cfg(max_bad_steps=2, steps=10), state=TrainState(bad_in_a_row=bad),
                          model=None, optimizer=None, tokenizer=None, rank=0)
    if stops:
        with pytest.raises(RuntimeError, match="3 optimizer steps in a row"):
            train.save_or_stop(run, step=0)
        assert saved == [dict(last=False, prune=False)]
    else:
        train.save_or_stop(run, step=0)
        assert saved == []


@pytest.mark.parametrize("every,step,due", [(0, 0, False), (2, 0, False), (2, 1, True), (2, 2, False), (1, 0, True)])
def test_a_periodic_job_runs_on_multiples_of_its_period(every, step, due):
    assert train.due(every, step) == due


# ----------------------------------------------------------------------------- train.py: held out


def held_out_run(texts, judge, eval_n, problems=3):
    c = cfg(eval_n=eval_n, max_new_tokens=8, eval_data="held.jsonl", reward="rule")
    return SimpleNamespace(cfg=c, rank=0, world=1, engine=ev_engine(texts), judge=judge, state=TrainState(),
                           eval_rows=[{"problem": f"p{i}", "prompt": f"p{i}", "prompt_ids": [i + 1], "answer": "7"}
                                      for i in range(problems)])


def ev_engine(texts):
    """Problem i's j-th sample is texts[i][j]."""
    class Engine:
        def generate(self, prompts, n=1, **kw):
            return [[rollout.Sample(list(p), [5], texts[p[0] - 1][j], [-1.0], "stop") for j in range(n)]
                    for p in prompts]
    return Engine()


@pytest.mark.parametrize("eval_n,ks", [(1, [1]), (3, [1, 2]), (4, [1, 2, 4]), (5, [1, 2, 4])])
def test_held_out_pass_at_k_for_every_power_of_two_up_to_eval_n(one_rank, eval_n, ks):
    judge = lambda text, gold: (text, text == "7")  # noqa: E731
    out = train.evaluate(held_out_run([["7", "8", "8", "8", "8"]] * 3, judge, eval_n))
    assert sorted(k for k in out if k.startswith("eval/pass@")) == [f"eval/pass@{k}" for k in ks]


@pytest.mark.parametrize("problems", [1, 2])
def test_the_held_out_interval_needs_two_problems(one_rank, problems):
    judge = lambda text, gold: (text, text == "7")  # noqa: E731
    out = train.evaluate(held_out_run([["7", "8"], ["7", "7"]], judge, 2, problems=problems))
    assert ("eval/accuracy_ci95" in out) == (problems > 1)
    assert ev.held_out_interval([0.5])[1] is None and ev.held_out_interval([0.5, 0.5])[1] == 0.0


# ----------------------------------------------------------------------------- packing.py


def seq(gid, prompt, resp):
    return SimpleNamespace(gid=gid, prompt=list(range(prompt)), resp=list(range(resp)), in_loss=True)


def test_a_group_fills_a_micro_batch_to_exactly_the_budget():
    """packed: a prompt of 4 and responses of 3 and 5 are one unit of 12 positions; a budget of 12
    holds it, 11 cuts it in two (each part with its prompt); two units fill one micro-batch up to
    the budget, not past it."""
    g = [seq(0, 4, 3), seq(0, 4, 5)]
    assert [[len(s.resp) for s in mb] for mb in packing.micro_batches(g, 12)] == [[3, 5]]
    assert sorted([len(s.resp) for s in mb] for mb in packing.micro_batches(g, 11)) == [[3], [5]]
    two = [seq(0, 4, 3), seq(1, 2, 3)]  # units of 7 and 5
    assert len(packing.micro_batches(two, 12)) == 1 and len(packing.micro_batches(two, 11)) == 2


def test_a_grouped_micro_batch_holds_rows_up_to_exactly_the_budget():
    """grouped: b rows of prompt + the longest response, b x (p + R) <= budget."""
    g = [seq(0, 4, 6), seq(0, 4, 6)]
    assert len(packing.micro_batches(g, 20, "grouped")) == 1
    assert len(packing.micro_batches(g, 19, "grouped")) == 2


def test_spread_splits_a_group_only_past_an_even_share_by_more_than_its_prompt():
    """Two ranks, one group: responses summing to its prompt's length (4) go whole to one rank; one
    token more and the group is split over the two."""
    whole = packing.spread([[seq(0, 4, 2), seq(0, 4, 2)]], [0, 0])
    assert [len(part) for part in whole] == [2, 0]
    split = packing.spread([[seq(0, 4, 2), seq(0, 4, 3)]], [0, 0])
    assert [len(part) for part in split] == [1, 1]


def test_spread_takes_responses_that_fit_the_share_exactly():
    """A group of a 1-token prompt and responses of 1, 2 and 2 tokens onto ranks loaded 0 and 2
    (share 4): rank 0's room is 4, and it takes, longest first, the responses while prompt +
    responses <= 4: a 2 and the 1 (1 + 2 + 1 = 4), one part in the group's order; rank 1 the
    other 2. (Taking only while < 4, rank 0 took the 2 alone, then the 1 as a second part.)"""
    a, b, c = seq(0, 1, 1), seq(0, 1, 2), seq(0, 1, 2)
    assert packing.spread([[a, b, c]], [0, 2]) == [[a, b], [c]]


@pytest.mark.parametrize("extra", [-1, 0, 1])
def test_the_block_mask_at_a_row_of_one_tile_less_exactly_and_more(extra):
    """segment_block_mask on rows of 2 x 128 - 1, 2 x 128 and 2 x 128 + 1 positions (the last tile
    short, whole, or of one position): every tile full or partial exactly as the dense rule says."""
    from test_packing import dense_rule, packed_row
    _, batch = packed_row([100, 20], [[100, 36 + extra], [1]])
    row = batch["row"]
    T = len(row.pos)
    assert T == 2 * packing.BLOCK + 1 + extra
    want = dense_rule(row.segments, row.pos.tolist(), None)
    bm = row.block_mask(None)
    nb = -(-T // packing.BLOCK)
    B = packing.BLOCK
    tiles = [[want[i * B:(i + 1) * B, j * B:(j + 1) * B] for j in range(nb)] for i in range(nb)]
    for num, idx, rule in ((bm.full_kv_num_blocks, bm.full_kv_indices, lambda t: t.all()),
                           (bm.kv_num_blocks, bm.kv_indices, lambda t: t.any() and not t.all())):
        for i in range(nb):
            assert set(idx[0, 0, i, :num[0, 0, i]].tolist()) == {j for j in range(nb) if rule(tiles[i][j])}, i


def test_causal_masks_at_the_window_and_one_past_it():
    from torch.nn.attention.bias import CausalBias
    assert isinstance(packing.causal_mask(3, 5, 5, "cpu"), CausalBias)      # the window holds every key
    m = packing.causal_mask(3, 6, 5, "cpu")                                 # one key past it
    assert m.tolist() == [[True, True, True, True, False, False], [True, True, True, True, True, False],
                          [False, True, True, True, True, True]]
    assert packing.causal_mask(1, 5, None, "cpu") is None and packing.causal_mask(1, 5, 5, "cpu") is None
    assert packing.causal_mask(1, 6, 5, "cpu").tolist() == [[False, True, True, True, True, True]]
    assert isinstance(packing.causal_mask(2, 5, None, "cpu"), CausalBias)


# ----------------------------------------------------------------------------- rollout.py


def test_generate_arguments_on_both_sides():
    check = rollout._check_generate_args
    check([], 1, 1, 0.0, 1.0)
    check([], 2, 1, 1e-9, 1e-9)
    for bad in (dict(n=0), dict(max_new_tokens=0), dict(temperature=-1e-9), dict(temperature=0.0, n=2),
                dict(top_p=0.0), dict(top_p=1.0 + 1e-9)):
        args = {**dict(n=1, max_new_tokens=1, temperature=1.0, top_p=1.0), **bad}
        with pytest.raises(ValueError):
            check([], args["n"], args["max_new_tokens"], args["temperature"], args["top_p"])


def test_a_prompt_must_leave_one_token_to_generate():
    assert rollout._tokenize_prompts(None, [[1, 2, 3]], 4) == [[1, 2, 3]]
    with pytest.raises(ValueError, match="leaves no room"):
        rollout._tokenize_prompts(None, [[1, 2, 3, 4]], 4)


def test_max_model_len_of_two_is_the_least(tiny_model_dir):
    with pytest.raises(ValueError, match="max_model_len"):
        rollout.make_engine(tiny_model_dir, backend="hf", max_model_len=1)
    assert rollout.make_engine(tiny_model_dir, backend="hf", max_model_len=2).max_model_len == 2


def test_cpu_lists_one_per_local_rank(monkeypatch):
    """VLLM_CPU_OMP_THREADS_BIND: local rank r takes the r-th list; one past the last is an error.
    (The lists hold every CPU this process may use, so pinning changes nothing here.)"""
    every = ",".join(map(str, sorted(os.sched_getaffinity(0))))
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", f"{every}|{every}")
    assert rollout._bind_cpus(1, 2) == sorted(os.sched_getaffinity(0))
    with pytest.raises(ValueError, match="no CPU list for local rank 2"):
        rollout._bind_cpus(2, 3)


def test_temperature_zero_is_greedy_and_above_it_samples(tiny_model_dir):
    """The transformers engine samples when temperature > 0 (two seeds, two responses) and takes
    the argmax at 0 (whatever the seed), with log-probs at temperature 1 there."""
    from by_hand import plain_logprobs, plain_model
    engine = rollout.make_engine(tiny_model_dir, backend="hf", max_model_len=32)
    prompt = [3, 4, 5]
    greedy = [engine.generate([prompt], n=1, max_new_tokens=6, temperature=0.0, top_p=1.0, seed=s)[0][0]
              for s in (1, 2)]
    assert greedy[0].response_ids == greedy[1].response_ids
    model = plain_model(tiny_model_dir, engine.model.state_dict())
    ids = list(prompt)
    for tok in greedy[0].response_ids:
        with torch.no_grad():
            assert tok == int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
        ids.append(tok)
    (logp, _), = plain_logprobs(model, [SimpleNamespace(prompt=prompt, resp=greedy[0].response_ids)], 1.0)
    assert greedy[0].logprobs == pytest.approx(logp.tolist(), abs=1e-5)
    sampled = [engine.generate([prompt], n=1, max_new_tokens=6, temperature=1.0, top_p=1.0, seed=s)[0][0]
               for s in (1, 2)]
    assert sampled[0].response_ids != sampled[1].response_ids


@pytest.mark.parametrize("experts,why", [(0, False), (1, True)])
def test_one_expert_is_a_mixture(tmp_path, experts, why):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "m", "num_experts": experts}))
    assert (rollout.cannot_sync(str(tmp_path), "vllm") is not None) == (why and not torch.cuda.is_available())


# ----------------------------------------------------------------------------- eval.py


def test_pass_at_k_and_maj_at_k_take_their_bounds():
    assert ev.pass_at_k(4, 0, 1) == 0.0 and ev.pass_at_k(4, 4, 4) == 1.0 and ev.pass_at_k(4, 1, 4) == 1.0
    for n, c, k in ((4, 5, 1), (4, -1, 1), (4, 1, 0), (4, 1, 5)):
        with pytest.raises(ValueError):
            ev.pass_at_k(n, c, k)
    assert ev.maj_at_k(["1", "2"], [True, False], 1, str.__eq__) is True
    assert ev.maj_at_k(["1", "2"], [True, False], 2, str.__eq__) is True  # a tie: the first
    for k in (0, 3):
        with pytest.raises(ValueError):
            ev.maj_at_k(["1", "2"], [True, False], k, str.__eq__)


def test_the_accuracys_standard_error_needs_two_problems():
    one = {"metrics": {"accuracy": 0.5, "pass@1": 0.5, "maj@1": 0.0},
           "samples": [{"finish_reason": "stop", "tokens": 1}]}
    assert ev.summarize([one], [1])["accuracy_se"] is None
    assert ev.summarize([one, one], [1])["accuracy_se"] == 0.0


@pytest.mark.parametrize("size,n", [(99, 32), (100, 4)])
def test_the_paper_protocols_n_changes_at_100_problems(size, n):
    args = SimpleNamespace(n=None, n_rule={"below_100": 32, "else": 4}, k=None)
    assert ev.samples_and_ks(args, size) == (n, sorted({1, 8, 16} & set(range(n + 1)) | {n}))


@pytest.mark.parametrize("n,ks", [(7, [1, 7]), (8, [1, 8]), (16, [1, 8, 16]), (17, [1, 8, 16, 17])])
def test_default_ks_up_to_n(n, ks):
    assert ev.samples_and_ks(SimpleNamespace(n=n, n_rule=None, k=None), 0)[1] == ks


class ContextEngine:
    """Refuses, as both real engines do, a prompt that leaves no room to generate."""

    def __init__(self, context):
        self.context = context

    def generate(self, prompts, n=1, **kw):
        rollout._tokenize_prompts(None, prompts, self.context)
        return [[rollout.Sample(list(p), [5], "7", [-1.0], "stop") for _ in range(n)] for p in prompts]


@pytest.mark.parametrize("length,sampled", [(4, True), (5, False)])
def test_a_prompt_that_fills_the_context_is_counted_not_sent(length, sampled):
    """sample_benchmark sends the engine only prompts shorter than the context (one token left to
    generate); one that fills it gets n empty wrong samples, "prompt_too_long"."""
    judge = lambda text, gold: (text, text == gold)  # noqa: E731
    rows = [{"problem": "p", "answer": "7"}]
    (rec,) = ev.sample_benchmark(ContextEngine(5), "b", rows, [list(range(1, length + 1))], n=2, max_new_tokens=4,
                                 temperature=1.0, top_p=1.0, seed=0, chunk_size=8, ks=[1], judge=judge,
                                 reward_timeout=5.0, context=5)
    assert [s["finish_reason"] for s in rec["samples"]] == (["stop"] * 2 if sampled else ["prompt_too_long"] * 2)
    assert rec["metrics"]["accuracy"] == (1.0 if sampled else 0.0)


@pytest.mark.parametrize("lengths,clipped,unfit", [([6], False, 0), ([7], True, 0), ([9], True, 0),
                                                   ([10], False, 1), ([6, 10], False, 1)])
def test_eval_says_which_prompts_the_context_clips_or_leaves_out(lengths, clipped, unfit):
    """Context 10, cap 4: a prompt of 6 leaves the cap whole, 7 to 9 clip it, 10 does not fit."""
    args = SimpleNamespace(ckpt="c", template="T", sources={"prompt_template": "x", "max_new_tokens": "y"},
                           max_new_tokens=4, temperature=1.0, top_p=1.0, seed=0, chunk_size=1)
    lines = ev.start_lines(args, prompt="T", chat=False, plan={"b": (1, [1])},
                           prompts={"b": [list(range(n)) for n in lengths]}, context=10, world=1)
    text = "\n".join(lines)
    assert ("clips it" in text) == clipped
    assert (f"warning: {unfit} prompts do not fit" in text) == bool(unfit)


@pytest.mark.parametrize("flag,bad,good", [("--max-problems", "0", "1"), ("-n", "0", "1"),
                                           ("--max-new-tokens", "0", "1"), ("--chunk-size", "0", "1"),
                                           ("--k", "3", "2"), ("--k", "0", "1"), ("-n", "2", "1")])
def test_eval_flags_on_both_sides(tmp_path, tiny_model_dir, flag, bad, good):
    """Each flag's least value passes and the one below it is refused; --k up to n (2); n > 1 is
    refused at temperature 0 (n identical samples), n = 1 is not."""
    rows = tmp_path / "b.jsonl"
    rows.write_text(json.dumps({"problem": "p", "answer": "1"}) + "\n")
    base = ["--ckpt", tiny_model_dir, "--data", str(rows), "--grader", "rule"]
    base += ["-n", "2"] if flag in ("--k",) else []
    base += ["--temperature", "0"] if (flag, bad) == ("-n", "2") else []
    assert ev.parse_args(base + [flag, good])
    with pytest.raises(SystemExit):
        ev.parse_args(base + [flag, bad])


@pytest.mark.parametrize("size,n,named", [(99, 32, False), (100, 32, True), (100, 4, False), (99, 4, True)])
def test_the_paper_protocols_n_named_as_a_departure_by_the_size_of_100(size, n, named):
    """preset_overrides names `-n` where a benchmark's samples are not the paper's for its size:
    32 under 100 problems, 4 from 100 on."""
    args = SimpleNamespace(preset="paper", data=[], greedy=False, given={}, max_problems=None,
                           grader=ev.reward.DEFAULT_GRADER, n=n)
    rows = [{"problem": f"p{i}", "answer": "1"} for i in range(size)]
    assert (f"-n {n}" in ev.preset_overrides(args, {"mine": (n, [1])}, {"mine": rows})) == named


@pytest.mark.parametrize("cut,warned", [(2, False), (3, True)])
def test_eval_warns_when_more_than_half_the_responses_hit_the_cap(tmp_path, tiny_model_dir, monkeypatch,
                                                                  capsys, cut, warned):
    """2 problems x 2 samples: 2 of 4 cut at the cap is not a warning, 3 of 4 is."""
    reasons = iter(["length"] * cut + ["stop"] * (4 - cut))

    class Engine:
        def generate(self, prompts, n=1, **kw):
            return [[rollout.Sample(list(p), [5], "x", [-1.0], next(reasons)) for _ in range(n)] for p in prompts]
    monkeypatch.setattr(rollout, "make_engine", lambda *a, **kw: Engine())
    rows = tmp_path / "b.jsonl"
    rows.write_text("".join(json.dumps({"problem": p, "answer": "1"}) + "\n" for p in ("a", "b")))
    out = ev.main(["--ckpt", tiny_model_dir, "--data", str(rows), "--grader", "rule", "-n", "2",
                   "--backend", "hf", "--out", str(tmp_path / "r.json"), "--max-new-tokens", "4"])
    assert out["benchmarks"]["b"]["truncation_rate"] == cut / 4
    assert ("hit the length limit" in capsys.readouterr().out) == warned
