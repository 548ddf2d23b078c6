"""train.py: config parsing, batching arithmetic, and the log-probs it trains on."""
import pytest
import torch
import yaml

import data
import eval as ev
import packing
import rollout
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


def test_train_functions_take_at_most_five_positional_parameters():
    """train.py keeps a call's arguments readable: more than five go by keyword."""
    import ast
    tree = ast.parse(open(train.__file__).read())
    over = [(f.name, len(f.args.posonlyargs) + len(f.args.args)) for f in ast.walk(tree)
            if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
            and len(f.args.posonlyargs) + len(f.args.args) > 5]
    assert over == []


def test_the_held_out_line_says_step_accuracy_interval_and_n():
    """One line per held-out evaluation (train.evaluate prints it on rank 0): 3 of 4 problems right
    at one sample each -> 75.0%, and Student's t (3 df: 3.182) times the standard error over the
    problems, sqrt(((3 * 0.25^2 + 0.75^2) / 3) / 4) = 0.25 -> ± 79.5 points."""
    assert ev.held_out_line(10, [1.0, 0.0, 1.0, 1.0], 1) == \
        "step 10: held-out accuracy 75.0% ± 79.5 (95%, 4 problems x 1 sample)"
    # two samples per problem: the problem's share; all equal -> no spread
    assert ev.held_out_line(0, [0.5, 0.5], 2) == \
        "step 0: held-out accuracy 50.0% ± 0.0 (95%, 2 problems x 2 samples)"
    assert ev.held_out_line(3, [1.0], 4) == "step 3: held-out accuracy 100.0% (1 problem x 4 samples)"


def test_a_misspelled_key_is_named_with_the_closest_valid_one(tmp_path):
    """A typo gets "did you mean": the closest valid key (difflib), one per unknown key when there
    are several; a name close to none gets no guess."""
    ok = write_yaml(tmp_path, {"model": "m", "train_data": "d.jsonl"})
    with pytest.raises(ValueError, match=r"unknown config key\(s\) \['eval_evry'\] \(did you mean 'eval_every'\?\); valid"):
        train.load_config(ok, ["eval_evry=5"])
    with pytest.raises(ValueError, match=r"\(did you mean 'lr' for 'lrr', 'seed' for 'seeed'\?\)"):
        train.load_config(ok, ["lrr=1", "seeed=2"])
    with pytest.raises(ValueError, match=r"unknown loss key\(s\) \['clip_hgh'\] \(did you mean 'clip_high'\?\)"):
        train.load_config(ok, ["loss.clip_hgh=0.3"])
    with pytest.raises(ValueError, match=r"\['zzz'\]; valid keys"):
        train.load_config(ok, ["zzz=1"])


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


def ragged_seqs():
    return [train.Sequence((0, g), [0] * p, [0] * r, 0.0, True, torch.zeros(r))
            for g, p, rs in [(0, 5, (3, 17, 9, 9)), (1, 2, (30, 2, 11)), (2, 4, (1,))] for r in rs]


def test_grouped_micro_batches_hold_one_prompt_within_the_token_budget():
    seqs = ragged_seqs()
    mbs = packing.micro_batches(seqs, budget=60, layout="grouped")
    assert sorted(id(s) for mb in mbs for s in mb) == sorted(id(s) for s in seqs)
    for mb in mbs:
        assert len({s.gid for s in mb}) == 1                         # one prompt per micro-batch
        assert len(mb) * (len(mb[0].prompt) + max(len(s.resp) for s in mb)) <= 60 or len(mb) == 1
    assert len(packing.micro_batches(seqs, budget=10**6, layout="grouped")) == 3   # one per prompt
    assert packing.computed_tokens(mbs, "grouped") == sum(len(mb[0].prompt) + len(mb) * len(mb[0].resp)
                                                         for mb in mbs)


def test_packed_micro_batches_hold_each_prompt_once_and_no_padding():
    seqs = ragged_seqs()   # prompts of 5, 2, 4 tokens; responses (3, 17, 9, 9), (30, 2, 11), (1,)
    mbs = packing.micro_batches(seqs, budget=60, layout="packed")
    assert sorted(id(s) for mb in mbs for s in mb) == sorted(id(s) for s in seqs)
    # units (a prompt once + its responses): 5 + 38 = 43, 2 + 43 = 45, 4 + 1 = 5; largest first
    assert [[len(s.resp) for s in mb] for mb in mbs] == [[30, 2, 11], [3, 17, 9, 9, 1]]   # 45 | 43 + 5
    assert packing.computed_tokens(mbs, "packed") == 45 + 43 + 5 == sum(len(s.resp) for s in seqs) + 11
    # a group over the budget is cut into units, each with its prompt: 2 + 30 + 2 | 2 + 11
    mbs = packing.micro_batches(seqs, budget=44, layout="packed")
    assert [[len(s.resp) for s in mb] for mb in mbs] == [[3, 17, 9, 9], [30, 2], [11, 1]]
    assert [packing.computed_tokens([mb], "packed") for mb in mbs] == [43, 34, 2 + 11 + 4 + 1]


def test_collate_takes_a_value_only_when_every_sequence_carries_it():
    # GRPO's reference pass: one prompt's responses split over mini-batches 0 and 1, where only
    # mini-batch 1's have old log-probs yet (mini-batch 0's come from the update's own forward)
    seqs = [train.Sequence((0, 0), [5, 6], [7] * n, 0.5, True, torch.zeros(n)) for n in (3, 2, 4)]
    seqs[0].old_logp, seqs[0].old_entropy = torch.full((3,), -1.0), torch.ones(3)
    batch = packing.collate(seqs, torch.device("cpu"))
    assert "old_logp" not in batch and "old_entropy" not in batch and batch["rollout_logp"].shape == (3, 4)
    for s in seqs:
        s.old_logp = torch.full((len(s.resp),), -2.0)
    got = packing.collate(seqs, torch.device("cpu"))["old_logp"].tolist()
    assert got == [[-2.0] * 3 + [0.0], [-2.0] * 2 + [0.0] * 2, [-2.0] * 4]


def test_responses_with_zero_advantage_are_in_the_loss_only_when_a_term_reads_them():
    """An equal-reward group's responses (A = 0) carry no policy gradient, so the update skips
    them, unless another term of the loss reads them: GRPO's KL to the reference, an entropy
    bonus, which is over every response token (its normaliser counts them all; skipping them cut
    the bonus by the share of equal-reward groups and left those responses out of it), or a
    covariance selection over every token (cov_tokens "all", verl's)."""
    def group(rewards):
        samples = [rollout.Sample([1, 2], [3] * (2 + i), "x", [-1.0] * (2 + i), "stop")
                   for i in range(len(rewards))]
        return train.Group({}, samples, rewards, [r > 0 for r in rewards])
    groups = [group([0.0, 0.0]), group([1.0, 0.0])]
    for method, loss, want in (("dapo", {}, [False, False, True, True]),
                               ("dapo", {"entropy_coef": 0.01}, [True] * 4),
                               ("tepo", {"entropy_coef": -0.01}, [True] * 4),
                               ("grpo", {}, [True] * 4),
                               ("clipcov", {}, [False, False, True, True]),
                               ("klcov", {"cov_tokens": "all"}, [True] * 4)):
        cfg = train.Config(model="m", train_data="d", method=method, group_size=2, num_minibatches=1,
                           loss=loss)
        seqs = [s for mb in train.make_sequences(groups, cfg=cfg) for s in mb]
        assert [s.adv == 0 for s in seqs] == [True, True, False, False]
        assert [s.in_loss for s in seqs] == want, (method, loss)


@pytest.mark.parametrize("layout,rows", [("packed", False), ("grouped", False), ("grouped", True)])
def test_response_logprobs_match_a_per_sequence_forward(tmp_path, layout, rows):
    """A micro-batch's responses, packed after their prompts (of different lengths, each once), or
    one prompt's responses padded after its shared pass (or with a copy per row), give the
    log-probs, entropies and gradients of a plain forward of each sequence alone."""
    from transformers import AutoModelForCausalLM
    path = make_tiny_model(str(tmp_path / "m"), hidden=64, layers=2, heads=2, kv_heads=1)
    model = packing.use_packed_attention(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32))
    g = torch.Generator().manual_seed(0)
    shared = torch.randint(2, 100, (6,), generator=g).tolist()
    prompts = [torch.randint(2, 100, (p,), generator=g).tolist() for p in (6, 2, 9)]
    grouped = layout == "grouped"
    seqs = [train.Sequence((0, 0 if grouped else k), shared if grouped else prompts[k],
                           torch.randint(2, 100, (n,), generator=g).tolist(), 0.5, True, torch.zeros(n))
            for k, n in ((2, 9), (0, 7), (1, 6), (0, 6), (2, 3), (1, 1))]
    batch = packing.collate(seqs, torch.device("cpu"), layout, rows)
    if layout == "packed":   # each prompt once, every response token once: no padding
        assert batch["ids"].shape == (1, 6 + 2 + 9 + 9 + 7 + 6 + 6 + 3 + 1)
    logp, ent = tepo.response_logprobs(model, batch, 0.8, True)
    weights = torch.randn(logp.shape, generator=g) * batch["mask"]
    grads = torch.autograd.grad((logp * weights).sum(), list(model.parameters()))
    total = 0
    for b, s in enumerate(seqs):
        n = len(s.resp)
        ids = torch.tensor([s.prompt + s.resp])
        lp = torch.log_softmax(model(input_ids=ids).logits[0] / 0.8, -1)[len(s.prompt) - 1:-1]
        want = lp.gather(1, torch.tensor(s.resp)[:, None]).squeeze(1)
        assert torch.allclose(logp[b, :n], want, atol=1e-5)
        assert torch.allclose(ent[b, :n], -(lp.exp() * lp).sum(-1), atol=1e-5)
        total = total + (want * weights[b, :n]).sum()
        assert batch["mask"][b].sum() == n
    ref = torch.autograd.grad(total, list(model.parameters()))
    for got, want in zip(grads, ref):
        assert torch.allclose(got, want, atol=1e-5)


@pytest.mark.parametrize("method", tepo.METHODS)
def test_packed_gives_the_loss_and_gradient_of_the_layout_of_before(tmp_path, method):
    """One mini-batch (3 prompts x 4 responses of widely varying length) through the per-prompt
    layout of before (grouped: padded to each prompt's longest) and packed (every prompt once, no
    padding, several prompts per row): the same loss and gradient, to 1e-5 relative, for every
    method."""
    from transformers import AutoModelForCausalLM
    path = make_tiny_model(str(tmp_path / "m"), hidden=64, layers=2, heads=2, kv_heads=1)
    model = packing.use_packed_attention(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32))
    g = torch.Generator().manual_seed(1)
    seqs = []
    for gid, p in enumerate((5, 11, 3)):
        prompt = torch.randint(2, 100, (p,), generator=g).tolist()
        for n in (2 + gid, 25 - 3 * gid, 7, 1 + 4 * gid):
            seqs.append(train.Sequence((0, gid), prompt, torch.randint(2, 100, (n,), generator=g).tolist(),
                                       float(torch.randn(1, generator=g)), True, torch.zeros(n)))
    with torch.no_grad():  # pi_old, pi_ref, H_old near the current policy: ratios != 1, some clipped
        for s in seqs:
            logp, ent = tepo.response_logprobs(model, packing.collate([s], "cpu", "grouped"), 1.0, True)
            s.old_logp = logp[0] - 0.3 * torch.randn(len(s.resp), generator=g)
            s.ref_logp = logp[0] + 0.2 * torch.randn(len(s.resp), generator=g)
            s.old_entropy = ent[0] + 0.1 * torch.randn(len(s.resp), generator=g)
            s.rollout_logp = s.old_logp + 0.01 * torch.randn(len(s.resp), generator=g)
            s.cov_sel = torch.rand(len(s.resp), generator=g) < 0.2   # Clip-Cov / KL-Cov's tokens
    # with an entropy bonus: its gradient flows back through either layout's logits too
    cfg = tepo.LossConfig.preset(method, max_new_tokens=30, is_correction="tis", entropy_coef=0.01)
    counts = dict(num_tokens=sum(len(s.resp) for s in seqs), num_seqs=len(seqs))
    results = {}
    for layout in ("grouped", "packed"):
        model.zero_grad()
        total = 0.0
        mbs = packing.micro_batches(seqs, budget=80, layout=layout)
        assert len(mbs) > 1                                   # several micro-batches each way
        for mb in mbs:
            b = packing.collate(mb, "cpu", layout)
            logp, ent = tepo.response_logprobs(model, b, 1.0, True)
            loss, _ = tepo.policy_loss(logp, b["old_logp"], b["adv"], b["mask"], cfg, entropy=ent,
                                       old_entropy=b["old_entropy"], ref_logp=b["ref_logp"],
                                       rollout_logp=b["rollout_logp"], cov_sel=b["cov_sel"],
                                       **counts)
            loss.backward()
            total += loss.item()
        results[layout] = total, {n: p.grad.clone() for n, p in model.named_parameters()}
    loss_old, grad_old = results["grouped"]
    for layout in ("packed",):
        loss, grad = results[layout]
        assert loss == pytest.approx(loss_old, rel=1e-5, abs=1e-7), layout
        for n in grad:
            scale = grad_old[n].abs().max().item()
            assert scale > 0 and (grad[n] - grad_old[n]).abs().max().item() <= 1e-5 * scale, (layout, n)
