"""train.py: config parsing, batching arithmetic, and the log-probs it trains on."""
import pytest
import torch
import yaml

import data
import tepo
import train
from demo import make_tiny_model


def write_yaml(tmp_path, d):
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(d))
    return str(p)


def test_config_presets_and_overrides(tmp_path):
    path = write_yaml(tmp_path, {"model": "m", "train_data": "d.jsonl", "method": "dapo",
                                 "max_new_tokens": 400, "loss": {"clip_high": 0.3}})
    cfg = train.load_config(path, ["lr=3e-6", "loss.clip_low=0.1", "group_size=4"])
    assert cfg.lr == 3e-6 and cfg.group_size == 4
    assert cfg.loss_cfg.clip_high == 0.3 and cfg.loss_cfg.clip_low == 0.1
    assert cfg.loss_cfg.aggregation == "token-mean" and cfg.loss_cfg.ratio == "token"
    assert cfg.dynamic_sampling and cfg.overlong_buffer == 100      # DAPO's extras, by preset
    tepo_cfg = train.load_config(path, ["method=tepo", "loss={}"])
    assert tepo_cfg.loss_cfg.kl_mask and not tepo_cfg.dynamic_sampling
    assert tepo_cfg.overlong_buffer == 0


def test_config_errors_name_the_problem(tmp_path):
    path = write_yaml(tmp_path, {"model": "m", "train_data": "d.jsonl", "learning_rate": 1})
    with pytest.raises(ValueError, match=r"unknown config key\(s\) \['learning_rate'\].*'lr'"):
        train.load_config(path)
    ok = write_yaml(tmp_path, {"model": "m", "train_data": "d.jsonl"})
    with pytest.raises(ValueError, match=r"unknown loss key\(s\) \['clip'\].*clip_high"):
        train.load_config(ok, ["loss.clip=0.2"])
    with pytest.raises(ValueError, match="'lr' must be a number"):
        train.load_config(ok, ["lr=fast"])
    with pytest.raises(ValueError, match="key=value"):
        train.load_config(ok, ["lr"])
    with pytest.raises(ValueError, match="unknown method"):
        train.load_config(ok, ["method=ppo"])
    with pytest.raises(ValueError, match="`model` is required"):
        train.load_config(None, ["train_data=x"])
    with pytest.raises(FileNotFoundError, match="nope.yaml"):
        train.load_config(str(tmp_path / "nope.yaml"))


def test_lr_schedule():
    cfg = train.Config(model="m", train_data="d", lr=1.0, warmup_steps=2, steps=12,
                       lr_schedule="cosine", min_lr_ratio=0.1)
    assert [train.lr_at(cfg, s) for s in (0, 1)] == [0.5, 1.0]
    assert train.lr_at(cfg, 2) == pytest.approx(1.0)
    assert train.lr_at(cfg, 7) == pytest.approx(0.1 + 0.9 * 0.5)   # halfway through the decay
    assert train.lr_at(cfg, 12) == pytest.approx(0.1)


def test_take_prompts_is_a_seeded_epoch_stream():
    rows = list(range(10))
    a = data.take_prompts(rows, 0, 25, seed=3)
    assert sorted(a[:10]) == rows and sorted(a[10:20]) == rows      # each epoch is a permutation
    assert a[:10] != a[10:20]                                        # reshuffled per epoch
    assert data.take_prompts(rows, 7, 6, seed=3) == a[7:13]         # position is all it needs
    assert data.take_prompts(rows, 0, 10, seed=4) != a[:10]


def test_micro_batches_hold_one_prompt_within_the_token_budget():
    seqs = [train.Sequence(g, [0] * p, [0] * r, 0.0, True, torch.zeros(r))
            for g, p, rs in [(0, 5, (3, 17, 9, 9)), (1, 2, (30, 2, 11)), (2, 4, (1,))] for r in rs]
    mbs = train.micro_batches(seqs, budget=60)
    assert sorted(id(s) for mb in mbs for s in mb) == sorted(id(s) for s in seqs)
    for mb in mbs:
        assert len({s.gid for s in mb}) == 1                         # one prompt per micro-batch
        assert len(mb) * (len(mb[0].prompt) + max(len(s.resp) for s in mb)) <= 60 or len(mb) == 1
    assert len(train.micro_batches(seqs, budget=10**6)) == 3          # one per prompt


def test_collate_takes_a_value_only_when_every_sequence_carries_it():
    # GRPO's reference pass: one prompt's responses split over mini-batches 0 and 1, where only
    # mini-batch 1's have old log-probs yet (mini-batch 0's come from the update's own forward)
    seqs = [train.Sequence(0, [5, 6], [7] * n, 0.5, True, torch.zeros(n)) for n in (3, 2, 4)]
    seqs[0].old_logp, seqs[0].old_entropy = torch.full((3,), -1.0), torch.ones(3)
    batch = train.collate(seqs, torch.device("cpu"))
    assert "old_logp" not in batch and "old_entropy" not in batch and batch["rollout_logp"].shape == (3, 4)
    for s in seqs:
        s.old_logp = torch.full((len(s.resp),), -2.0)
    got = train.collate(seqs, torch.device("cpu"))["old_logp"].tolist()
    assert got == [[-2.0] * 3 + [0.0], [-2.0] * 2 + [0.0] * 2, [-2.0] * 4]


@pytest.mark.parametrize("share_prompt", [True, False])
def test_response_logprobs_match_a_per_sequence_forward(tmp_path, share_prompt):
    """One prompt's padded responses, with or without the shared prompt pass, give the log-probs,
    entropies and gradients of a plain forward of each sequence alone."""
    from transformers import AutoModelForCausalLM
    path = make_tiny_model(str(tmp_path / "m"), hidden=64, layers=2, heads=2, kv_heads=1)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(2, 100, (6,), generator=g).tolist()
    seqs = [train.Sequence(0, prompt, torch.randint(2, 100, (n,), generator=g).tolist(), 0.5, True,
                           torch.zeros(n)) for n in (3, 1, 7, 6)]
    batch = train.collate(seqs, torch.device("cpu"))
    logp, ent = tepo.response_logprobs(model, batch, 0.8, True, share_prompt)
    weights = torch.randn(logp.shape, generator=g) * batch["mask"]
    grads = torch.autograd.grad((logp * weights).sum(), list(model.parameters()))
    total = 0
    for b, s in enumerate(seqs):
        n = len(s.resp)
        ids = torch.tensor([prompt + s.resp])
        lp = torch.log_softmax(model(input_ids=ids).logits[0] / 0.8, -1)[len(prompt) - 1:-1]
        want = lp.gather(1, torch.tensor(s.resp)[:, None]).squeeze(1)
        assert torch.allclose(logp[b, :n], want, atol=1e-5)
        assert torch.allclose(ent[b, :n], -(lp.exp() * lp).sum(-1), atol=1e-5)
        total = total + (want * weights[b, :n]).sum()
        assert batch["mask"][b].sum() == n
    ref = torch.autograd.grad(total, list(model.parameters()))
    for got, want in zip(grads, ref):
        assert torch.allclose(got, want, atol=1e-5)
