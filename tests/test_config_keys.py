"""What defines a run, key by key (config.py's FREE_KEYS and FREE_UNLESS, the one definition a
resume and the table's seeds read): every key of Config and of LossConfig is either free or
defining, as listed here; a key free only where it is inert is free exactly there, and its inertness
is checked on the code that would read it (the loss, the shaping, the schedule, the sampling loop)."""
import dataclasses

import pytest
import torch
import yaml

import tepo
import train
from config import Config, config_changes, config_dict, free_keys, run_values

BASE = ["model=m", "train_data=d"]


def changes(settings, key, value):
    """config_changes from a run saved with `settings` to the same with `key` set to `value`."""
    saved = yaml.safe_load(yaml.safe_dump(config_dict(train.load_config(None, BASE + settings))))
    return config_changes(saved, train.load_config(None, BASE + settings + [f"{key}={value}"]))


# A value other than the default for every top-level key (a YAML literal, as --set takes it).
OTHER = {"model": "m2", "train_data": "d2", "eval_data": "e.jsonl", "prompt_template": "'Q: {problem}'",
         "out_dir": "runs/x", "seed": 1, "method": "grpo", "steps": 7, "prompts_per_step": 8,
         "group_size": 4, "max_prompt_len": 256, "max_new_tokens": 512, "temperature": 0.7,
         "num_minibatches": 2, "micro_batch_tokens": 512, "micro_batch_layout": "grouped",
         "packed_attention": "flex", "lr": 2e-6, "lr_schedule": "cosine", "warmup_steps": 3,
         "min_lr_ratio": 0.1, "weight_decay": 0.01, "betas": "[0.9, 0.95]", "grad_clip": 0.5,
         "reward": "rule", "format_reward": 0.1, "no_answer_penalty": 0.5, "wrong_reward": -0.5,
         "failed_reward": -2.0, "dynamic_sampling": "true", "max_sampling_tries": 5,
         "overlong_buffer": 100, "overlong_factor": 2.0, "backend": "hf", "dtype": "bfloat16",
         "train_dtype": "bfloat16", "gpu_memory_utilization": 0.8, "activation_checkpointing": "true",
         "checkpoint_layers": 3, "lm_head": "logits", "compile": "true",
         "eval_every": 5, "eval_n": 4, "eval_max_problems": 10, "save_every": 5, "keep_last": 3,
         "log_samples_every": 0, "full_batch_metrics": "false", "max_bad_steps": 2,
         "reward_timeout": 2.0, "max_reward_errors": 0.5, "loggers": "[jsonl, tensorboard]",
         "wandb_project": "p", "wandb_run_name": "n"}
# The keys that never define a run (config.FREE_KEYS): logging, evaluation, saving, fault limits, memory.
ALWAYS_FREE = {"out_dir", "eval_data", "eval_every", "eval_n", "eval_max_problems", "save_every",
               "keep_last", "log_samples_every", "full_batch_metrics", "loggers", "wandb_project",
               "wandb_run_name", "max_bad_steps", "max_reward_errors", "packed_attention",
               "activation_checkpointing", "checkpoint_layers", "lm_head", "compile", "gpu_memory_utilization"}
# Free on the default tepo run (constant schedule, no dynamic sampling, no overlong buffer, no
# Clip-Cov micro-batch selection), defining elsewhere: FREE_UNLESS below.
FREE_ON_TEPO = {"steps", "min_lr_ratio", "micro_batch_tokens", "micro_batch_layout",
                "max_sampling_tries", "overlong_factor"}


def test_every_key_is_free_or_defining_as_listed():
    """Each top-level key changed alone on the default tepo run: free exactly for ALWAYS_FREE and
    FREE_ON_TEPO, defining for every other key (top_p, temperature, reward_timeout, dtypes...).
    A key moved into FREE_KEYS by mistake (top_p: a resume would go on silently) fails here."""
    assert set(OTHER) == {f.name for f in dataclasses.fields(Config)} - {"loss", "top_p"}, \
        "a Config key without a value here: add it, and say whether it defines the run"
    # top_p takes one value in training, 1.0 (config.py says why): a run saved with another (before
    # that rule) and resumed changes what defines it
    saved = {**yaml.safe_load(yaml.safe_dump(config_dict(train.load_config(None, BASE)))), "top_p": 0.9}
    assert "top_p" in config_changes(saved, train.load_config(None, BASE))[0]
    wrong = {}
    for key, value in OTHER.items():
        defining, free = changes([], key, value)
        want_free = key in ALWAYS_FREE | FREE_ON_TEPO
        got = key in free and key not in defining if want_free else key in defining
        if not got:
            wrong[key] = (defining, free)
    assert not wrong, f"keys classified otherwise than listed: {wrong}"


# FREE_UNLESS: key, value to change it to, settings where it is inert (free), where it acts (defining).
FREE_UNLESS_CASES = [
    ("steps", 7, [], ["lr_schedule=cosine"]),
    ("min_lr_ratio", 0.1, [], ["lr_schedule=cosine"]),
    ("micro_batch_tokens", 512, ["method=clipcov"], ["method=clipcov", "loss.cov_batch=microbatch"]),
    ("micro_batch_layout", "grouped", ["method=klcov"], ["method=klcov", "loss.cov_batch=microbatch"]),
    ("max_sampling_tries", 7, ["method=grpo"], ["method=dapo"]),
    ("max_sampling_tries", 7, ["method=dapo", "dynamic_sampling=false"], ["method=grpo", "dynamic_sampling=true"]),
    ("overlong_factor", 2.0, ["method=grpo"], ["method=dapo"]),
    ("overlong_factor", 2.0, ["method=dapo", "overlong_buffer=0"], ["method=grpo", "overlong_buffer=8"]),
    ("overlong_buffer", 8, ["method=grpo", "overlong_factor=0"], ["method=grpo"]),
    ("loss.kl_kind", "k1", ["method=tepo"], ["method=grpo"]),
    ("loss.kl_kind", "k2", ["method=grpo", "loss.kl_coef=0"], ["method=tepo", "loss.kl_coef=0.01"]),
    ("loss.kl_mask_coef", 0.5, ["method=grpo"], ["method=tepo"]),
    ("loss.kl_mask_target", "ref", ["method=gspo"], ["method=tepo"]),
    ("loss.is_level", "sequence", ["method=tepo"], ["method=tepo", "loss.is_correction=tis"]),
    ("loss.is_cap", 1.05, ["method=tepo"], ["method=tepo", "loss.is_correction=mask"]),
    ("loss.cov_ratio", 0.5, ["method=grpo"], ["method=clipcov"]),
    ("loss.cov_batch", "microbatch", ["method=dapo"], ["method=klcov"]),
    ("loss.cov_tokens", "all", ["method=dapo"], ["method=clipcov"]),
    ("loss.cov_lb", -10.0, ["method=klcov"], ["method=clipcov"]),
    ("loss.cov_ub", 0.5, ["method=klcov"], ["method=clipcov"]),
    ("loss.kl_cov_coef", 0.1, ["method=clipcov"], ["method=klcov"]),
    ("loss.clip_low", 0.1, ["method=klcov"], ["method=clipcov"]),
    ("loss.clip_high", 0.1, ["method=klcov"], ["method=dapo"]),
    ("loss.max_new_tokens", 2048, ["method=grpo"], ["method=drgrpo"]),
    ("loss.clip_low", 0.1, ["method=sapo"], ["method=gmpo"]),
    ("loss.clip_high", 0.1, ["method=sapo"], ["method=cispo"]),
    ("loss.sapo_tau_pos", 2.0, ["method=grpo"], ["method=sapo"]),
    ("loss.sapo_tau_neg", 2.0, ["method=cispo", "loss.top_entropy_frac=0.2"], ["method=sapo"]),
]


def test_free_unless_cases_cover_every_such_key():
    import config
    assert {k for k, *_ in FREE_UNLESS_CASES} == set(config.FREE_UNLESS)


@pytest.mark.parametrize("key,value,inert,live", FREE_UNLESS_CASES,
                         ids=[f"{c[0]}-{'-'.join(c[2]) or 'tepo'}" for c in FREE_UNLESS_CASES])
def test_a_key_is_free_exactly_where_it_is_inert(key, value, inert, live):
    """Changed where nothing reads it: free (a resume goes on, the table keeps the seeds
    together). Changed where it acts: defining (a resume is refused without
    --allow-config-change). It was defining everywhere for max_sampling_tries, overlong_factor,
    loss.kl_mask_coef and loss.kl_kind, which contradicted the README."""
    defining, free = changes(inert, key, value)
    assert key in free and key not in defining, (inert, defining, free)
    defining, free = changes(live, key, value)
    assert key in defining, (live, defining, free)


def loss_and_grad(lcfg, seed=0):
    """tepo.policy_loss of one random micro-batch (every input the loss may read, a Clip-Cov /
    KL-Cov selection included) -> (loss, gradient of logp): what a loss key can change."""
    g = torch.Generator().manual_seed(seed)
    B, T = 4, 6
    logp = (-torch.rand(B, T, generator=g) * 3).requires_grad_()
    old = logp.detach() + 0.3 * torch.randn(B, T, generator=g)
    mask = torch.ones(B, T)
    mask[0, 4:] = 0
    ent = torch.rand(B, T, generator=g).requires_grad_()
    loss, _ = tepo.policy_loss(logp, old, torch.tensor([1.0, -0.5, 0.7, -1.2]), mask, lcfg,
                               num_tokens=22, num_seqs=4, entropy=ent, old_entropy=ent.detach() + 0.1,
                               ref_logp=old - 0.2, rollout_logp=old + 0.1 * torch.randn(B, T, generator=g),
                               cov_sel=torch.rand(B, T, generator=g) < 0.3)
    loss.backward()
    return loss.detach(), logp.grad


def cov_choice(lcfg, seed=0):
    """tepo.cov_scores (score, eligible, cov) and cov_select of one random micro-batch."""
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(4, 6, generator=g) * 3
    old = logp + 0.3 * torch.randn(4, 6, generator=g)
    adv, mask = torch.tensor([1.0, -0.5, 0.7, -1.2]), torch.ones(4, 6)
    keys = torch.rand(4, 6, generator=g, dtype=torch.float64)
    m = mask > 0
    scores = tepo.cov_scores(logp, old, adv, mask, lcfg, keys, mean_logp=logp[m].mean(),
                             mean_adv=adv.mean())
    return (*scores, tepo.cov_select(logp, old, adv, mask, lcfg, keys))


@pytest.mark.parametrize("key,value,inert,live",
                         [c for c in FREE_UNLESS_CASES if c[0].startswith("loss.")],
                         ids=[f"{c[0]}-{'-'.join(c[2]) or 'tepo'}" for c in FREE_UNLESS_CASES
                              if c[0].startswith("loss.")])
def test_a_free_loss_key_changes_no_loss_and_no_gradient(key, value, inert, live):
    """Where a loss key is free its change leaves the loss, its gradient and what the update
    forwards (needs_ref, every_response_in_loss) exactly as they were; where it defines the run,
    it changes the loss or the gradient (so 'free' is not merely declared)."""
    name = key[len("loss."):]

    def both(settings):
        cfg = train.load_config(None, BASE + settings)
        other = tepo.LossConfig(**{**cfg.loss_cfg.as_dict(), name: type(getattr(cfg.loss_cfg, name))(value)
                                   if not isinstance(value, str) else value})
        return cfg.loss_cfg, other
    a, b = both(inert)
    (la, ga), (lb, gb) = loss_and_grad(a), loss_and_grad(b)
    assert torch.equal(la, lb) and torch.equal(ga, gb), f"{key}={value} changes the loss under {inert}"
    assert (a.needs_ref, a.every_response_in_loss) == (b.needs_ref, b.every_response_in_loss)
    if a.cov != "none":  # and Clip-Cov's / KL-Cov's choice of tokens, made before the loss
        assert all(torch.equal(x, y) for x, y in zip(cov_choice(a), cov_choice(b))), key
    a, b = both(live)
    if name in ("cov_ratio", "cov_lb", "cov_ub"):  # they act on the choice of tokens, not the loss
        assert not all(torch.equal(x, y) for x, y in zip(cov_choice(a), cov_choice(b))), key
        return
    if name in ("cov_batch", "cov_tokens"):
        return  # they act on which batch the choice is made over (train.select_cov): tests/test_train_e2e.py
    (la, ga), (lb, gb) = loss_and_grad(a), loss_and_grad(b)
    assert not (torch.equal(la, lb) and torch.equal(ga, gb)), f"{key}={value} changes nothing under {live}"


def test_free_top_level_keys_change_no_reward_and_no_learning_rate():
    """overlong_factor without an overlong buffer changes no shaped reward; min_lr_ratio under the
    constant schedule (and steps) no learning rate; max_sampling_tries without dynamic sampling no
    draw (sample_and_grade draws once: test_train_steps.py). Where they act, they do."""
    plain = train.load_config(None, BASE + ["method=grpo"])
    other = dataclasses.replace(plain, overlong_factor=3.0)
    for n in (1, 500, 1024):
        for r in (1.0, 0.0, 0.3):
            assert train.shape(plain, r, n) == train.shape(other, r, n)
    dapo = train.load_config(None, BASE + ["method=dapo"])
    assert train.shape(dapo, 1.0, 1024) != train.shape(dataclasses.replace(dapo, overlong_factor=3.0), 1.0, 1024)
    const = train.load_config(None, BASE)
    for step in range(0, 100, 7):
        assert train.lr_at(const, step) == train.lr_at(dataclasses.replace(const, min_lr_ratio=0.5, steps=7), step)
    cos = train.load_config(None, BASE + ["lr_schedule=cosine"])
    assert train.lr_at(cos, 90) != train.lr_at(dataclasses.replace(cos, min_lr_ratio=0.5), 90)


def test_run_values_lists_every_loss_key():
    """run_values names every LossConfig field (but method, and L_max where it follows
    max_new_tokens), so that no loss key escapes the comparison."""
    values = run_values(config_dict(train.load_config(None, BASE)))
    names = {f"loss.{f.name}" for f in dataclasses.fields(tepo.LossConfig)} - {"loss.method", "loss.max_new_tokens"}
    assert names <= set(values)
    assert free_keys(values) >= ALWAYS_FREE


@pytest.mark.parametrize("settings,matters", [
    (["method=dapo"], True), (["method=grpo", "no_answer_penalty=0.5"], True),
    (["method=grpo", "overlong_buffer=8"], True), (["method=tepo", "wrong_reward=-0.5"], True),
    (["method=grpo"], False), (["method=tepo", "format_reward=0.1"], False),
    (["method=grpo", "overlong_buffer=8", "overlong_factor=0"], False)])
def test_a_checkpoint_from_before_failed_reward_names_it_where_the_rule_changed(tmp_path, settings, matters):
    """A train_config.yaml without failed_reward was written by a train.py that scored a failed
    grading call 0.0 with no shaping; today it scores a wrong answer's reward, with wrong_reward and
    the overlong penalty. Where these differ (DAPO's -1, an overlong buffer, a no-answer penalty,
    a wrong_reward) the resume names failed_reward as a defining change (it saw none); where they
    agree, nothing."""
    from config import UserError
    from runs import resumed_config
    cfg = train.load_config(None, BASE + settings)
    saved = yaml.safe_load(yaml.safe_dump(config_dict(cfg)))
    del saved["failed_reward"]
    defining, _ = config_changes(saved, cfg)
    assert ("failed_reward" in defining) == matters, defining
    if matters:
        ckpt = tmp_path / "step_000002"
        ckpt.mkdir()
        (ckpt / "train_config.yaml").write_text(yaml.safe_dump(saved))
        (ckpt / "trainer_state.json").write_text('{"step": 2}')
        with pytest.raises(UserError, match=r"failed_reward '0\.0 unshaped \(a config saved before "
                                            r"failed_reward existed\)' -> "):
            resumed_config(str(ckpt), cfg, False)


def test_dr_grpos_l_max_is_loss_max_new_tokens_where_it_is_set():
    """Dr.GRPO normalises by L_max, `loss.max_new_tokens`, which follows max_new_tokens unless set:
    the loss the run computes and the values it records (run_values) say the same. Laid the other
    way round when the preset resolved, max_new_tokens overrode the key while the run's recorded
    values still said the key's."""
    cfg = train.load_config(None, BASE + ["method=drgrpo", "max_new_tokens=64", "loss.max_new_tokens=100"])
    assert cfg.loss_cfg.max_new_tokens == 100
    assert run_values(config_dict(cfg))["loss.max_new_tokens"] == 100
    follows = train.load_config(None, BASE + ["method=drgrpo", "max_new_tokens=64"])
    assert follows.loss_cfg.max_new_tokens == 64 and "loss.max_new_tokens" not in run_values(config_dict(follows))
    # the loss itself: seq-mean-token-sum-norm divides the summed token losses by num_seqs * L_max
    logp = torch.zeros(1, 4, requires_grad=True)
    for c, lmax in ((cfg, 100), (follows, 64)):
        loss, _ = tepo.policy_loss(logp, logp.detach(), torch.tensor([1.0]), torch.ones(1, 4), c.loss_cfg,
                                   num_tokens=4, num_seqs=1)
        assert loss.item() == pytest.approx(-4 / lmax)
