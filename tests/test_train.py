"""train.py: config parsing, batching arithmetic, and the log-probs it trains on."""
import pytest
import torch
import yaml

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
    a = train.take_prompts(rows, 0, 25, seed=3)
    assert sorted(a[:10]) == rows and sorted(a[10:20]) == rows      # each epoch is a permutation
    assert a[:10] != a[10:20]                                        # reshuffled per epoch
    assert train.take_prompts(rows, 7, 6, seed=3) == a[7:13]         # position is all it needs
    assert train.take_prompts(rows, 0, 10, seed=4) != a[:10]


def test_micro_batches_respect_the_token_budget():
    seqs = [{"ids": [0] * n} for n in (5, 17, 3, 9, 9, 30, 2, 11)]
    mbs = train.micro_batches(seqs, budget=30)
    assert sorted(len(s["ids"]) for mb in mbs for s in mb) == sorted(len(s["ids"]) for s in seqs)
    for mb in mbs:
        assert len(mb) * max(len(s["ids"]) for s in mb) <= 30
    assert len(train.micro_batches(seqs, budget=10**6)) == 1


def test_response_logprobs_match_a_per_sequence_forward(tmp_path):
    """The padded, shifted, gathered log-probs equal a plain forward of each sequence alone."""
    from transformers import AutoModelForCausalLM
    path = make_tiny_model(str(tmp_path / "m"), hidden=64, layers=2, heads=2, kv_heads=1)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    g = torch.Generator().manual_seed(0)
    seqs = []
    for plen, rlen in [(5, 3), (9, 1), (3, 7), (6, 6)]:
        ids = torch.randint(2, 100, (plen + rlen,), generator=g).tolist()
        seqs.append({"ids": ids, "plen": plen, "resp": ids[plen:], "adv": 0.5,
                     "rollout_logp": torch.zeros(rlen)})
    batch = train.collate(seqs, torch.device("cpu"))
    with torch.no_grad():
        logp, ent = train.response_logprobs(model, batch, temperature=0.8, with_entropy=True)
        for b, s in enumerate(seqs):
            logits = model(input_ids=torch.tensor([s["ids"]])).logits[0] / 0.8
            lp = torch.log_softmax(logits, -1)
            n = len(s["resp"])
            want = lp[s["plen"] - 1:-1].gather(1, torch.tensor(s["resp"])[:, None]).squeeze(1)
            assert torch.allclose(logp[b, :n], want, atol=1e-5)
            want_h = -(lp.exp() * lp).sum(-1)[s["plen"] - 1:-1]
            assert torch.allclose(ent[b, :n], want_h, atol=1e-5)
            assert batch["mask"][b].sum() == n
