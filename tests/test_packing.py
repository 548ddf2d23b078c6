"""packing.deal: every sequence stays in its mini-batch, and each phase's forwards are shared evenly
over the ranks, also when most groups are out of the loss (equal rewards, A = 0)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import packing
import tepo
from train import Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORLD, PROMPTS, G, K = 8, 16, 8, 4


def sampled(equal, seed=0, every_response_in_loss=False):
    """[[rank r's sequences of mini-batch k]]: WORLD ranks of PROMPTS groups of G log-normal
    responses (mean 700, sd 500, cap 3072), a share `equal` of the groups all right or all wrong."""
    rng = np.random.default_rng(seed)
    per_rank = []
    for r in range(WORLD):
        seqs = []
        for g in range(PROMPTS):
            prompt = [1] * int(rng.integers(50, 301))
            rewards = [float(rng.integers(0, 2))] * G if rng.random() < equal else \
                [1.0, 0.0] + rng.integers(0, 2, G - 2).astype(float).tolist()
            lens = np.clip(np.rint(rng.lognormal(np.log(700) - 0.205, 0.64, G)), 1, 3072).astype(int)
            for a, n in zip(tepo.group_advantages(torch.tensor(rewards), G).tolist(), lens):
                seqs.append(Sequence((r, g), prompt, [2] * int(n), a,
                                     in_loss=a != 0 or every_response_in_loss, rollout_logp=None))
        per_rank.append([seqs[i * len(seqs) // K:(i + 1) * len(seqs) // K] for i in range(K)])
    return per_rank


def loads(per_rank):
    """(update work per mini-batch and rank, old-pass work per lock-step pass and rank): what
    train.py forwards; the old pass makes one pass per later mini-batch (its trained sequences, as
    the update forwards them) and one of the A = 0 sequences."""
    upd = [[packing.cost([s for s in per_rank[r][k] if s.in_loss]) for r in range(WORLD)] for k in range(K)]
    old = upd[1:] + [[packing.cost([s for mb in per_rank[r] for s in mb if not s.in_loss]) for r in range(WORLD)]]
    return upd, old


def busiest(xs):
    return max(xs) / (sum(xs) / len(xs))


def test_deal_keeps_every_sequence_in_its_mini_batch_once():
    per_rank = sampled(0.4)
    dealt = packing.deal([[s for p in per_rank for s in p[k]] for k in range(K)], WORLD)
    for k in range(K):
        given = sorted(id(s) for p in per_rank for s in p[k])
        assert sorted(id(s) for d in dealt for s in d[k]) == given


@pytest.mark.parametrize("equal", [0.0, 0.4, 0.6])
def test_deal_shares_the_update_and_the_old_pass_evenly(equal):
    per_rank = sampled(equal, seed=int(equal * 10))
    upd, old = loads(per_rank)
    assert max(busiest(u) for u in upd) > 1.15  # as sampled, the ranks are uneven: the test can fail
    whole = sum(map(sum, upd))  # each group's prompt once per mini-batch
    dealt = packing.deal([[s for p in per_rank for s in p[k]] for k in range(K)], WORLD)
    upd, old = loads(dealt)
    for k, u in enumerate(upd):  # each mini-batch is an optimizer step: it waits for its busiest rank
        assert busiest(u) <= 1.10, (k, u)
    assert all(busiest(o) <= 1.10 for o in old if sum(o)), old  # each lock-step pass of the old pass
    if equal:
        assert sum(old[-1])  # the A = 0 sequences' pass has work: its evenness was checked
    assert sum(map(sum, upd)) <= 1.03 * whole  # a group split over ranks runs its prompt once more


def test_deal_is_the_same_on_every_rank_and_keeps_whole_groups_when_it_can():
    """A batch of equal groups that divides evenly is dealt as whole groups, identically each call."""
    seqs = [Sequence((0, g), [1] * 10, [2] * 90, 1.0, True, None) for g in range(WORLD) for _ in range(4)]
    a = packing.deal([seqs], WORLD)
    b = packing.deal([list(seqs)], WORLD)
    assert [[id(s) for s in d[0]] for d in a] == [[id(s) for s in d[0]] for d in b]
    assert all(len({s.gid for s in d[0]}) == 1 and len(d[0]) == 4 for d in a)


# ----------------------------------------------------------------------------- attention


def packed_row(prompts, resps, seed=0):
    """A collated packed batch of random token ids: prompts[g] tokens each, resps[g] responses."""
    g = torch.Generator().manual_seed(seed)
    seqs = []
    for gid, (p, rs) in enumerate(zip(prompts, resps)):
        prompt = torch.randint(2, 100, (p,), generator=g).tolist()
        seqs += [Sequence((0, gid), prompt, torch.randint(2, 100, (n,), generator=g).tolist(), 0.5,
                          True, torch.zeros(n)) for n in rs]
    return seqs, packing.collate(seqs, torch.device("cpu"))


def dense_rule(segments, pos, window):
    """(T, T) bool: which key each query sees, straight from the rule (a test's reference)."""
    T = len(pos)
    allowed = torch.zeros(T, T, dtype=torch.bool)
    for s, e, ps, pe in segments:
        for q in range(s, e):
            keys = list(range(s, q + 1)) + list(range(ps, pe))
            for k in keys:
                allowed[q, k] = window is None or pos[q] - pos[k] < window
    return allowed


@pytest.mark.parametrize("window", [None, 7, 200])
def test_the_block_mask_is_the_rule_tile_by_tile(window):
    """The BlockMask built from a row's segments (no (T, T) tensor) has, for every 128 x 128 tile,
    the partial and full tiles of the dense rule, and its mask_mod is the rule itself."""
    _, batch = packed_row([150, 3, 260, 40], [[5, 300, 17], [1, 2], [129, 128, 90, 1], [400]])
    row = batch["row"]
    T = len(row.pos)
    want = dense_rule(row.segments, row.pos.tolist(), window)
    bm = row.block_mask(window)
    q, k = torch.arange(T)[:, None], torch.arange(T)[None]
    assert torch.equal(bm.mask_mod(0, 0, q, k), want)
    nb = -(-T // packing.BLOCK)
    tiles = [[want[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128] for j in range(nb)] for i in range(nb)]

    def listed(num, idx):
        return [set(idx[0, 0, i, :num[0, 0, i]].tolist()) for i in range(nb)]
    partial, full = listed(bm.kv_num_blocks, bm.kv_indices), listed(bm.full_kv_num_blocks, bm.full_kv_indices)
    for i in range(nb):
        assert full[i] == {j for j in range(nb) if tiles[i][j].all()}, i
        assert partial[i] == {j for j in range(nb) if tiles[i][j].any() and not tiles[i][j].all()}, i


def own_forward_logprobs(path, seqs):
    """Each sequence alone through the model with its own attention (transformers' SDPA and its
    masks, sliding windows included): [(R,) log-probs]."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")
    out = []
    with torch.no_grad():
        for s in seqs:
            lp = torch.log_softmax(model(input_ids=torch.tensor([s.prompt + s.resp])).logits[0], -1)
            out.append(lp[len(s.prompt) - 1:-1].gather(1, torch.tensor(s.resp)[:, None])[:, 0])
    return out


def sliding_model(tmp_path):
    """A tiny Qwen2 with a sliding window of 6 positions in its second layer (use_sliding_window)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, use_sliding_window=True,
                         sliding_window=6, max_window_layers=1, max_position_embeddings=512)
    path = str(tmp_path / "sliding")
    Qwen2ForCausalLM(config).float().save_pretrained(path)
    return path


def check_against_own_forward(path, kernel):
    from transformers import AutoModelForCausalLM
    seqs, batch = packed_row([9, 4, 13], [[12, 3, 20], [1, 30], [7, 9]], seed=2)
    model = packing.use_packed_attention(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), kernel)
    with torch.no_grad():
        logp, _ = tepo.response_logprobs(model, batch, 1.0, False)
    for b, (s, want) in enumerate(zip(seqs, own_forward_logprobs(path, seqs))):
        assert torch.allclose(logp[b, :len(s.resp)], want, atol=1e-5), (b, kernel)


def test_a_sliding_window_model_gets_its_own_forwards_numbers_packed(tmp_path):
    """Qwen2 with use_sliding_window: packed log-probs (sdpa kernel) equal the model's own forward
    of each sequence alone; with the window dropped they would not (the test can fail)."""
    path = sliding_model(tmp_path)
    check_against_own_forward(path, "sdpa")
    from transformers import AutoModelForCausalLM
    seqs, batch = packed_row([9, 4, 13], [[12, 3, 20], [1, 30], [7, 9]], seed=2)
    full = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    full.config.layer_types = ["full_attention"] * 2   # the same weights, no window
    for layer in full.model.layers:
        layer.self_attn.sliding_window = None
    packing.use_packed_attention(full, "sdpa")
    with torch.no_grad():
        logp, _ = tepo.response_logprobs(full, batch, 1.0, False)
    want = own_forward_logprobs(path, seqs)
    assert max((logp[b, :len(s.resp)] - w).abs().max().item() for b, (s, w) in enumerate(zip(seqs, want))) > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("sliding", [False, True])
def test_flex_kernel_gets_each_sequences_own_numbers(tmp_path, tiny_model_dir, sliding):
    """The flex kernel (compiled flex_attention over the row's BlockMask: the GPU's path), run on the
    CPU: log-probs equal each sequence's own forward, with and without a sliding window. (Forward
    only: torch 2.13's flex_attention has no backward on the CPU; its backward reads the same
    BlockMask, whose every tile is checked above.)"""
    check_against_own_forward(sliding_model(tmp_path) if sliding else tiny_model_dir, "flex")


def test_a_model_whose_attention_cannot_be_packed_is_refused_at_start():
    """Gemma 2 caps its attention logits (attn_logit_softcapping): packed micro-batches would drop
    that, so loading it for them is a one-line error naming the setting and the way out."""
    from transformers import Gemma2Config, Gemma2ForCausalLM
    from config import UserError
    model = Gemma2ForCausalLM(Gemma2Config(vocab_size=128, hidden_size=64, intermediate_size=128,
                                           num_hidden_layers=2, num_attention_heads=2,
                                           num_key_value_heads=1, head_dim=32))
    with pytest.raises(UserError, match="attn_logit_softcapping.*micro_batch_layout: grouped"):
        packing.use_packed_attention(model, "sdpa")


BUILDS_SCRIPT = r'''
import json, os, shutil, sys
import torch
sys.path.insert(0, ROOT)
from types import SimpleNamespace
import config, packing, policy, ranks, tepo
from demo import make_tiny_model
torch.set_num_threads(1)
calls = {"segment_block_mask": 0, "window_mask": 0}
for name in calls:
    def counted(*a, real=getattr(packing, name), name=name, **k):
        calls[name] += 1
        return real(*a, **k)
    setattr(packing, name, counted)

def dense_flex(query, key, value, block_mask, scale):
    """flex's numbers without its kernel (torch has no flex backward on the CPU): the BlockMask's
    own rule, dense."""
    i = torch.arange(query.shape[2])
    allowed = block_mask.mask_mod(0, 0, i[:, None], i[None])
    return torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=allowed,
                                                            scale=scale, enable_gqa=True)
packing.flex = dense_flex
ranks.setup_distributed()
out = sys.argv[1]
plain = make_tiny_model(os.path.join(out, "plain"), layers=4)
windowed = shutil.copytree(plain, os.path.join(out, "windowed"))
with open(os.path.join(windowed, "config.json")) as f:
    hf_config = json.load(f)
hf_config.update(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=0,
              layer_types=["sliding_attention"] * 4)
with open(os.path.join(windowed, "config.json"), "w") as f:
    json.dump(hf_config, f)
counts = {}
for name, path, kernel in (("flex", plain, "flex"), ("flex, windowed", windowed, "flex"),
                           ("sdpa, windowed", windowed, "sdpa")):
    policy.packed_kernel = lambda cfg, device: kernel
    cfg = config.Config(model=path, train_data="x", train_dtype=DTYPE, activation_checkpointing=True)
    model = policy.load_policy(path, cfg, torch.device("cpu"))
    for key in calls:
        calls[key] = 0
    for mb in ROWS:
        seqs = [SimpleNamespace(gid=(0, g), prompt=[3] * p, resp=[4] * r, adv=1.0) for g, p, r in mb]
        logp, _ = tepo.response_logprobs(model, packing.collate(seqs, torch.device("cpu")), 1.0, False)
        logp.sum().backward()
    counts[name] = dict(calls)
print("COUNTS", json.dumps(counts), flush=True)
ranks.end_distributed()
'''

WINDOW = 6
ROWS = [[(0, 5, 3), (0, 5, 9)], [(1, 8, 2), (1, 8, 1)]]  # two rows: (group, prompt length, response length)


@pytest.mark.slow
def test_a_rows_masks_are_built_once_under_fsdp_mixed_precision(tmp_path):
    """The GPU's setting, on the CPU: FSDP2 casting each layer's inputs to bf16 (load_policy's
    MixedPrecisionPolicy), activation checkpointing on, a 4-layer Qwen2, a forward and backward of
    two packed rows. Each row's masks are built once, for every layer and the recompute: one
    BlockMask per row (flex), and (sdpa, all layers windowed) one window mask per segment whose keys
    pass the window. (A row rebuilt by the cast built them in every layer, again in the recompute.)
    ~12 s: a process of its own (its process group, 3 models)."""
    script = tmp_path / "builds.py"
    script.write_text(f"ROOT = {ROOT!r}\nDTYPE = 'bfloat16'\nWINDOW = {WINDOW}\nROWS = {ROWS!r}\n" + BUILDS_SCRIPT)
    run = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0 and "COUNTS" in run.stdout, run.stdout[-2000:] + run.stderr[-4000:]
    counts = json.loads(run.stdout.split("COUNTS", 1)[1])
    # Per row: a prompt's keys are its own, a response's its prompt's and its own.
    windowed = sum(p > WINDOW for mb in ROWS for p in {g: p for g, p, _ in mb}.values()) + \
        sum(p + r > WINDOW for mb in ROWS for _, p, r in mb)
    assert counts["flex"]["segment_block_mask"] == len(ROWS), counts
    assert counts["flex, windowed"]["segment_block_mask"] == len(ROWS), counts
    assert counts["sdpa, windowed"]["window_mask"] == windowed, counts


# ----------------------------------------------------------------------------- the deal's traffic


def distinct(per_rank, seed=1):
    """per_rank with every sequence told apart by its values (a response token of its own, random
    rollout log-probs), so that a sequence in the wrong place or order shows."""
    g = torch.Generator().manual_seed(seed)
    n = 0
    for mine in per_rank:
        for mb in mine:
            for s in mb:
                s.resp = [3 + n] + s.resp[1:]
                s.rollout_logp = -torch.rand(len(s.resp), generator=g)
                n += 1
    return per_rank


def values(mbs):
    return [[(s.gid, s.prompt, s.resp, s.adv, s.in_loss, s.rollout_logp.tolist()) for s in mb] for mb in mbs]


@pytest.mark.parametrize("full_batch_metrics", [True, False])
def test_balance_ranks_gives_each_rank_what_gathering_everything_gave_it(full_batch_metrics):
    """balance_ranks' parts, over WORLD ranks simulated in one process (each rank's sizes gathered,
    the placeholders dealt, each sequence sent in its parcel): every rank ends with the mini-batches,
    sequence for sequence in the same order, that deal gives it over every rank's sequences
    gathered (the way of before), and of its own sequences it keeps the very objects."""
    import pickle
    per_rank = distinct(sampled(0.4, seed=3))
    want = packing.deal([[s for p in per_rank for s in p[k]] for k in range(K)], WORLD,
                        full_batch_metrics=full_batch_metrics)
    everyone = [pickle.loads(pickle.dumps(packing.sizes_of(mine))) for mine in per_rank]
    dealt = packing.deal(packing.placeholders(everyone), WORLD, full_batch_metrics=full_batch_metrics)
    sent = [packing.parcels(per_rank[r], dealt, r) for r in range(WORLD)]
    moved = 0
    for r in range(WORLD):
        got = packing.unpack(per_rank[r], dealt, r, [sent[src][r] for src in range(WORLD)])
        assert values(got) == values(want[r]), r
        mine = {id(s) for mb in per_rank[r] for s in mb}
        assert [[id(s) in mine for s in mb] for mb in got] == [[id(s) in mine for s in mb] for mb in want[r]]
        moved += sum(id(s) not in mine for mb in got for s in mb)
    assert moved > WORLD  # sequences did change ranks: the test can fail


def test_pickled_tensors_come_back_equal():
    """packing.pickled's tensors as arrays: the same dtype, shape and values, any strides; a
    tensor numpy cannot hold (bf16) goes torch's own way."""
    import pickle
    for t in (torch.rand(5), torch.arange(6.).reshape(2, 3).t(), torch.tensor([True, False]),
              torch.rand(3, dtype=torch.float64), torch.rand(4).to(torch.bfloat16), torch.zeros(0)):
        back = pickle.loads(packing.pickled({"t": t}))["t"]
        assert back.dtype == t.dtype and back.shape == t.shape and torch.equal(back, t), t


TWO_RANKS = r'''
import json, pickle, sys
sys.path.insert(0, ROOT); sys.path.insert(0, ROOT + "/tests")
import torch, torch.distributed as dist
dist.init_process_group("gloo")
import packing
from test_packing import distinct, values
from train import Sequence
rank = dist.get_rank()
# Rank 0 sampled long responses and rank 1 short ones: the deal moves sequences both ways.
g = torch.Generator().manual_seed(rank)
seqs = []
for k in range(6):
    prompt = torch.randint(0, 150000, (40 + 30 * k,), generator=g).tolist()
    for j in range(4):
        n = int(torch.randint(1, 400 if rank == 0 else 60, (1,), generator=g))
        seqs.append(Sequence((rank, k), prompt, [0] * n, (-1.0) ** j if k % 3 else 0.0, in_loss=k % 3 > 0,
                             rollout_logp=None))
mine = [seqs[:12], seqs[12:]]
distinct([mine], seed=rank)
everyone = [None] * 2
dist.all_gather_object(everyone, mine)           # the way of before, the reference
want = packing.deal([[s for part in everyone for s in part[k]] for k in range(2)], 2)[rank]
received = []
gather, a2a = dist.all_gather_object, dist.all_to_all_single
def counting_gather(out, obj, *a, **kw):
    gather(out, obj, *a, **kw)
    received.append(sum(len(pickle.dumps(o)) for o in out))
def counting_a2a(out, inp, *a, **kw):
    a2a(out, inp, *a, **kw)
    received.append(out.numel() * out.element_size())
dist.all_gather_object, dist.all_to_all_single = counting_gather, counting_a2a
got = packing.balance_ranks(mine)
ids = {id(s) for mb in mine for s in mb}
arrived = [s for mb in got for s in mb if id(s) not in ids]
sys.stdout.write("RESULT " + json.dumps({"same": values(got) == values(want), "received": sum(received),
                                         "arrived": len(packing.pickled(arrived)), "arrived_n": len(arrived),
                                         "gathered": sum(len(packing.pickled(p)) for p in everyone)}) + "\n")
sys.stdout.flush()
dist.destroy_process_group()
'''


@pytest.mark.slow
def test_balance_ranks_on_two_gloo_ranks_deals_as_before_and_moves_each_sequence_once(tmp_path):
    """balance_ranks on two gloo ranks: each rank's mini-batches are those of gathering every
    sequence on every rank and dealing them (the way of before), and the bytes a rank receives are
    those of the sequences dealt to it from the other rank (plus the deal's sizes, a few bytes a
    sequence), not the whole batch."""
    import re
    script = tmp_path / "two_ranks.py"
    script.write_text(f"ROOT = {ROOT!r}\n" + TWO_RANKS)
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                          str(script)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    results = [json.loads(r) for r in re.findall(r"RESULT (\{[^}]*\})", run.stdout)]
    assert len(results) == 2, run.stdout[-2000:] + run.stderr[-3000:]
    assert all(r["same"] for r in results), results
    assert all(r["arrived_n"] > 0 for r in results), results  # both ranks receive sequences
    for r in results:
        assert r["received"] <= r["arrived"] + 64 * 24 + 1024, r  # 24 sequences' sizes, a little framing
        assert r["received"] < r["gathered"] / 2, r
