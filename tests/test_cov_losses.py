"""The entropy-control baselines (ENTROPY_BASELINES.md): Clip-Cov, KL-Cov and the entropy bonus.

The losses themselves are also in test_tepo.py's per-token reference and θ = θ_old gradient tests
(every method there); here: the selection of tokens against a straightforward reference written as
verl writes it, gradients away from θ_old by hand, micro-batch sums with a selection, and the
selection over two ranks against one process.
"""
import json
import math
import os
import subprocess
import sys

import pytest
import torch

import tepo
import train
from tepo import LossConfig, cov_select, policy_loss

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make_batch(B=10, T=9, seed=0):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    logp = old + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)
    mask = torch.ones(B, T, dtype=torch.float64)
    for i in range(B):
        mask[i, 3 + i % (T - 3):] = 0
    adv = 2 * torch.randn(B, generator=g, dtype=torch.float64)
    keys = torch.rand(B, T, generator=g, dtype=torch.float64)
    return logp, old, adv, mask, keys


def verl_kl_cov(logp, adv, mask, ratio):
    """verl's kl_cov selection, as written there: flatten the valid tokens, centre, top-k."""
    valid = mask > 0
    idx = torch.nonzero(valid.reshape(-1), as_tuple=True)[0]
    a = adv[:, None].expand_as(logp)[valid]
    lp = logp[valid]
    cov = (a - a.mean()) * (lp - lp.mean())
    k = max(1, int(len(cov) * ratio))
    top = idx[torch.topk(cov, k, largest=True).indices]
    sel = torch.zeros(logp.numel(), dtype=torch.bool)
    sel[top] = True
    return sel.view_as(logp)


def verl_clip_cov_candidates(logp, old, adv, mask, cfg):
    """verl's clip_cov candidates: not clipped by the ordinary clip, cov strictly in the band."""
    A = adv[:, None].expand_as(logp)
    r = torch.exp(logp - old)
    l1, l2 = -A * r, -A * r.clamp(1 - cfg.clip_low, 1 + cfg.clip_high)
    clip_by_origin = (l2 > l1) & (mask > 0)
    valid = mask > 0
    cov = (A - A[valid].mean()) * (logp - logp[valid].mean())
    return (cov > cfg.cov_lb) & (cov < cfg.cov_ub) & valid & ~clip_by_origin


@pytest.mark.parametrize("ratio", [2e-4, 0.05, 0.2])
def test_kl_cov_selects_verls_top_k(ratio):
    logp, old, adv, mask, keys = make_batch()
    cfg = LossConfig.preset("klcov", cov_ratio=ratio)
    sel = cov_select(logp, old, adv, mask, cfg, keys)
    assert torch.equal(sel, verl_kl_cov(logp, adv, mask, ratio))
    assert int(sel.sum()) == max(1, int(ratio * mask.sum()))


@pytest.mark.parametrize("ratio", [2e-4, 0.05, 0.5])
def test_clip_cov_draws_its_count_from_verls_candidates(ratio):
    logp, old, adv, mask, keys = make_batch(seed=1)
    cfg = LossConfig.preset("clipcov", cov_ratio=ratio, cov_lb=0.05, cov_ub=1.0)
    cand = verl_clip_cov_candidates(logp, old, adv, mask, cfg)
    assert 5 < cand.sum() < mask.sum() / 2            # the band leaves some out, keeps several
    # some candidates of the band are left out because the ordinary clip already clipped them
    r = torch.exp(logp - old)
    assert (((r > 1 + cfg.clip_high) & (adv[:, None] > 0)) & ~cand & (mask > 0)).any()
    sel = cov_select(logp, old, adv, mask, cfg, keys)
    n = min(max(1, int(ratio * mask.sum())), int(cand.sum()))
    assert int(sel.sum()) == n and not (sel & ~cand).any()
    # uniformly at random among the candidates: the n of largest key
    want = cand & (keys >= keys[cand].sort(descending=True).values[n - 1])
    assert torch.equal(sel, want)


def test_kl_cov_ties_are_broken_to_exactly_n():
    """A response sampled twice gives equal covariances: the count stays n, not n + ties."""
    logp, old, adv, mask, keys = make_batch(seed=2)
    for x in (logp, old, adv, mask):                    # the same response, ten times
        x[:] = x[:1]
    cfg = LossConfig.preset("klcov", cov_ratio=0.04)
    score, eligible, cov = tepo.cov_scores(logp, old, adv, mask, cfg, keys, mean_logp=-1.0, mean_adv=0.0)
    assert (cov == cov[mask > 0].max()).sum() == 10      # the best token, ten times
    for n in (1, 3):
        sel = tepo.at_or_above(score, keys, eligible, tepo.top_pairs(score, keys, eligible, n)[-1])
        assert int(sel.sum()) == n and (cov[sel] == cov[mask > 0].max()).all()
    sel = cov_select(logp, old, adv, mask, cfg, keys)
    assert int(sel.sum()) == max(1, int(0.04 * mask.sum())) == 1


def test_kl_cov_gradient_away_from_theta_old_by_hand():
    """d/d logp of (-A r + c |log r| sel) / sum m = (-A r + c sign(log r) sel) / sum m."""
    logp, old, adv, mask, keys = make_batch(seed=3)
    cfg = LossConfig.preset("klcov", cov_ratio=0.3, kl_cov_coef=0.7)
    sel = cov_select(logp, old, adv, mask, cfg, keys)
    x = logp.clone().requires_grad_()
    loss, m = policy_loss(x, old, adv, mask, cfg, num_tokens=mask.sum(), num_seqs=len(adv), cov_sel=sel)
    loss.backward()
    r = torch.exp(logp - old)
    want = (-adv[:, None] * r + 0.7 * torch.sign(logp - old) * sel) * mask / mask.sum()
    assert torch.allclose(x.grad, want, atol=1e-12)
    assert m["actor/clip_frac_low"] == 0 and m["actor/clip_frac_high"] == 0     # KL-Cov does not clip
    assert float(m["actor/cov_selected_frac"]) == pytest.approx(float(sel.sum() / mask.sum()))


@pytest.mark.parametrize("aggregation", tepo.AGGREGATIONS)
def test_entropy_bonus_gradient_by_hand(aggregation):
    """loss -= c agg(H): d loss / d H = -c m / (the aggregation's normaliser), for every method's
    aggregation; and the bonus is logged."""
    logp, old, adv, mask, _ = make_batch(seed=4)
    H = torch.rand_like(logp).requires_grad_()
    cfg = LossConfig.preset("grpo", kl_coef=0.0, entropy_coef=0.01, aggregation=aggregation,
                            max_new_tokens=9)
    loss, m = policy_loss(logp, old, adv, mask, cfg, num_tokens=mask.sum(), num_seqs=len(adv),
                          entropy=H)
    loss.backward()
    N, lens = len(adv), mask.sum(1, keepdim=True)
    norm = {"token-mean": mask.sum(), "seq-mean-token-mean": N * lens,
            "seq-mean-token-sum-norm": N * 9}[aggregation]
    assert torch.allclose(H.grad, -0.01 * mask / norm, atol=1e-15)
    assert float(m["loss/entropy_bonus"]) == pytest.approx(
        -0.01 * float(tepo.aggregate(H.detach(), mask, aggregation, num_tokens=mask.sum(),
                                     num_seqs=N, max_new_tokens=9)))
    with pytest.raises(ValueError, match="entropy"):
        policy_loss(logp, old, adv, mask, cfg, num_tokens=mask.sum(), num_seqs=N)


@pytest.mark.parametrize("method", ["clipcov", "klcov"])
def test_microbatches_with_a_selection_sum_to_the_whole_batch(method):
    logp, old, adv, mask, keys = make_batch(seed=5)
    cfg = LossConfig.preset(method, cov_ratio=0.2, cov_lb=0.05, cov_ub=2.0, entropy_coef=0.003)
    sel = cov_select(logp, old, adv, mask, cfg, keys)
    assert sel.any()
    H = torch.rand_like(logp)
    kw = dict(num_tokens=mask.sum(), num_seqs=len(adv))
    x = logp.clone().requires_grad_()
    whole, m_whole = policy_loss(x, old, adv, mask, cfg, entropy=H, cov_sel=sel, **kw)
    (g_whole,) = torch.autograd.grad(whole, x)
    x2, total, frac = logp.clone().requires_grad_(), 0.0, 0.0
    for idx in ([0, 7, 3], [1, 2], [4, 5, 6, 8, 9]):
        loss, m = policy_loss(x2[idx], old[idx], adv[idx], mask[idx], cfg, entropy=H[idx],
                              cov_sel=sel[idx], **kw)
        loss.backward()
        total += loss.item()
        frac += float(m["actor/cov_selected_frac"])
    assert total == pytest.approx(whole.item(), abs=1e-12)
    assert torch.allclose(x2.grad, g_whole, atol=1e-14)
    assert frac == pytest.approx(float(m_whole["actor/cov_selected_frac"]))


def test_cov_settings_are_checked():
    with pytest.raises(ValueError, match="cov"):
        LossConfig.preset("klcov", cov="maybe")
    with pytest.raises(ValueError, match="cov_ratio"):
        LossConfig.preset("clipcov", cov_ratio=0.0)
    with pytest.raises(ValueError, match="token ratio"):
        LossConfig.preset("tepo", cov="kl")
    with pytest.raises(ValueError, match="cov_batch"):
        LossConfig.preset("klcov", cov_batch="rank")
    logp, old, adv, mask, _ = make_batch()
    with pytest.raises(ValueError, match="cov_sel"):
        policy_loss(logp, old, adv, mask, LossConfig.preset("klcov"), num_tokens=mask.sum(), num_seqs=10)


# ----------------------------------------------------------------------------- over the ranks

def token_entropy(i):
    """Response i's token entropies (3 + i % 6 of them) in SCRIPT and its reference; response 11's
    are response 5's (both of 8 tokens): equal entropies, on other ranks."""
    j = 5 if i == 11 else i
    return 2 * torch.rand(3 + j % 6, generator=torch.Generator().manual_seed(50 + j), dtype=torch.float64)


SCRIPT = r'''
import json, os, sys, torch, torch.distributed as dist
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]
import ranks, tepo, train
from test_cov_losses import token_entropy
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
g = torch.Generator().manual_seed(7)
items = []
for i in range(12):                      # 12 responses of 3-8 tokens
    lp = -3 * torch.rand(3 + i % 6, generator=g)
    items.append((lp, lp + 0.05 * torch.randn(len(lp), generator=g), float(2 * torch.randn(1, generator=g))))
# on 2 ranks rank 0 holds 3 responses (which hold 5 of the 6 largest covariances, see the test),
# rank 1 the rest; on 8 they are dealt unevenly, rank 3 holding none
idx = {1: [list(range(12))], 2: [[7, 10, 11], [0, 1, 2, 3, 4, 5, 6, 8, 9]],
       8: [[7, 10], [0], [1, 2], [], [3, 4, 5], [6], [8, 9], [11]]}[world][rank]
mine = [items[i] for i in idx]
# Each token's random key fixed by the token (not by the rank that holds it), so that Clip-Cov's
# draw over two ranks can be compared with one process's, token for token.
gk = torch.Generator().manual_seed(11)
token_keys = [torch.rand(len(lp), generator=gk, dtype=torch.float64) for lp, _, _ in items]
tepo.cov_keys = lambda shape, generator: torch.cat([token_keys[i] for i in idx] or [torch.zeros(0)])[:, None]
out = {}
for method, extra in (("klcov", {"cov_ratio": 0.1}), ("clipcov", {"cov_ratio": 0.1, "cov_lb": 0.05, "cov_ub": 3.0})):
    cfg = tepo.LossConfig.preset(method, **extra)
    keys = torch.Generator().manual_seed(100 + rank)
    sel = train.tepo.choose_cov(mine, cfg, sum(len(lp) for lp, _, _ in items), keys, sums=train.all_ranks,
                                nth=train.global_nth)
    out[method] = {idx[j]: s.nonzero()[:, 0].tolist() for j, s in enumerate(sel)}
# The 80/20 rule's choice as train.select_tokens makes it: the tokens' entropies (response 11's
# those of response 5: equal entropies, on other ranks), the 0.75-quantile over all ranks' tokens.
H = torch.cat([token_entropy(i) for i in idx] or [torch.zeros(0, dtype=torch.float64)])[:, None]
sel = tepo.top_entropy_select(H, torch.ones_like(H), 0.25, num_tokens=sum(len(lp) for lp, _, _ in items),
                              nth=ranks.global_nth)
sel = sel[:, 0].split([len(items[i][0]) for i in idx])
out["top_entropy"] = {i: s.nonzero()[:, 0].tolist() for i, s in zip(idx, sel)}
parts = [None] * world
dist.all_gather_object(parts, out)
if rank == 0:
    print("RESULT " + json.dumps(parts))
ranks.end_distributed()  # not a bare destroy_process_group: gloo's threads may abort the exit
'''


def selections(tmp_path, nproc, monkeypatch, capsys):
    """SCRIPT's selections: on 2 or 8 ranks under torchrun; on one, in this process (its patch of
    tepo.cov_keys undone after the test)."""
    if nproc == 1:
        from conftest import free_port
        for key, value in dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                               MASTER_PORT=str(free_port())).items():
            monkeypatch.setenv(key, value)
        monkeypatch.setattr(tepo, "cov_keys", tepo.cov_keys)
        capsys.readouterr()
        exec(compile(f"ROOT = {ROOT!r}\n" + SCRIPT, "cov.py", "exec"), {})
        stdout = capsys.readouterr().out
    else:
        script = tmp_path / "cov.py"
        script.write_text(f"ROOT = {ROOT!r}\n" + SCRIPT)
        res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                              f"--nproc_per_node={nproc}", str(script)], capture_output=True, text=True,
                             timeout=300, cwd=ROOT)
        assert res.returncode == 0, res.stderr[-3000:]
        stdout = res.stdout
    parts = json.loads(next(ln for ln in stdout.splitlines() if ln.startswith("RESULT "))[7:])
    merged = {}
    for part in parts:
        for method, seqs in part.items():
            merged.setdefault(method, {}).update({int(i): v for i, v in seqs.items()})
    return {method: {(i, t) for i, ts in seqs.items() for t in ts} for method, seqs in merged.items()}


@pytest.mark.slow
def test_the_selection_over_two_ranks_is_the_whole_mini_batchs(tmp_path, monkeypatch, capsys):
    """12 responses (66 tokens, n = 6), 3 on rank 0 and 9 on rank 1. KL-Cov's top share over two
    ranks is exactly one process's, and the reference's on the whole batch; per rank (each its own
    means and its own n = max(1, 10% of its tokens)) it would not be. Clip-Cov draws n = 6 tokens
    from the whole mini-batch's candidates over two ranks as over one: with each token's random key
    fixed, the same 6, the candidates with the largest keys. The 80/20 rule keeps the same tokens
    over two ranks as over one, the quantile rule's on the whole mini-batch, not each rank's own."""
    one, two = selections(tmp_path, 1, monkeypatch, capsys), selections(tmp_path, 2, monkeypatch, capsys)
    g = torch.Generator().manual_seed(7)
    items = []
    for i in range(12):
        lp = -3 * torch.rand(3 + i % 6, generator=g)
        items.append((lp, lp + 0.05 * torch.randn(len(lp), generator=g), float(2 * torch.randn(1, generator=g))))
    T = max(len(lp) for lp, _, _ in items)
    logp, old, mask = (torch.zeros(12, T, dtype=torch.float64) for _ in range(3))
    for i, (lp, o, _) in enumerate(items):
        logp[i, :len(lp)], old[i, :len(lp)], mask[i, :len(lp)] = lp, o, 1
    adv = torch.tensor([a for _, _, a in items], dtype=torch.float64)
    n = max(1, int(0.1 * mask.sum()))
    want = verl_kl_cov(logp, adv, mask, 0.1)
    want = {(int(i), int(t)) for i, t in want.nonzero()}
    assert len(want) == n == 6
    assert one["klcov"] == two["klcov"] == want
    # a top share per rank would differ: rank 0's own top-k of its 3 responses, rank 1's of its 9
    per_rank = set()
    for rows in ([7, 10, 11], [0, 1, 2, 3, 4, 5, 6, 8, 9]):
        own = verl_kl_cov(logp[rows], adv[rows], mask[rows], 0.1)
        per_rank |= {(rows[int(i)], int(t)) for i, t in own.nonzero()}
    assert per_rank != want
    cfg = LossConfig.preset("clipcov", cov_ratio=0.1, cov_lb=0.05, cov_ub=3.0)
    cand = verl_clip_cov_candidates(logp, old, adv, mask, cfg)
    cand = {(int(i), int(t)) for i, t in cand.nonzero()}
    assert len(cand) > n
    # the draw: the n candidates with the largest keys of the whole mini-batch, on one rank or two
    gk = torch.Generator().manual_seed(11)
    token_keys = [torch.rand(len(lp), generator=gk, dtype=torch.float64) for lp, _, _ in items]
    drawn = set(sorted(cand, key=lambda it: token_keys[it[0]][it[1]].item(), reverse=True)[:n])
    assert one["clipcov"] == two["clipcov"] == drawn
    # each rank drawing its own max(1, 10%) from its own candidates would not give that
    per_rank = set()
    for rows in ([7, 10, 11], [0, 1, 2, 3, 4, 5, 6, 8, 9]):
        own = verl_clip_cov_candidates(logp[rows], old[rows], adv[rows], mask[rows], cfg)
        own = [(rows[int(i)], int(t)) for i, t in own.nonzero()]
        k = max(1, int(0.1 * mask[rows].sum()))
        per_rank |= set(sorted(own, key=lambda it: token_keys[it[0]][it[1]].item(), reverse=True)[:k])
    assert per_rank != drawn
    # the 80/20 rule over two ranks as over one: the quantile rule on the whole mini-batch, not per rank
    assert one["top_entropy"] == two["top_entropy"] == top_entropy_reference(range(12))
    assert top_entropy_reference([7, 10, 11]) | top_entropy_reference([0, 1, 2, 3, 4, 5, 6, 8, 9]) != \
        one["top_entropy"]


def top_entropy_reference(rows):
    """The tokens (i, t) of responses `rows` whose token_entropy is at or above torch.quantile of
    all of theirs at 0.75 (top_entropy_frac 0.25)."""
    q = torch.quantile(torch.cat([token_entropy(i) for i in rows]), 0.75).item()
    return {(i, t) for i in rows for t, h in enumerate(token_entropy(i).tolist()) if h >= q}


@pytest.mark.slow
def test_the_selections_over_eight_ranks_are_one_processs(tmp_path, monkeypatch, capsys):
    """SCRIPT on 8 ranks, the 12 responses dealt unevenly (rank 3 holds none, response 5 and its
    equal-entropy copy 11 on other ranks): KL-Cov's, Clip-Cov's (each token's key fixed) and the
    80/20 rule's choices are exactly those of one process, and the 80/20 rule's is the quantile
    rule on the whole mini-batch."""
    one, eight = selections(tmp_path, 1, monkeypatch, capsys), selections(tmp_path, 8, monkeypatch, capsys)
    assert one == eight
    assert eight["klcov"] and eight["clipcov"]
    assert eight["top_entropy"] == top_entropy_reference(range(12))


def test_every_preset_is_in_the_readmes_losses_table():
    """README's "The losses in one screen": a row per method, with its preset's ratio, clip range
    (KL-Cov, SAPO: none) and aggregation."""
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    table = text.split("## The losses in one screen", 1)[1].split("\n\n## ", 1)[0]
    rows = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if len(cells) == 5 and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = cells
    assert set(rows) == set(tepo.METHODS)
    for method, (_, ratio, clip, aggregation, _) in rows.items():
        cfg = LossConfig.preset(method, max_new_tokens=9)
        assert ratio.split()[0] == cfg.ratio, method
        want = "none" if cfg.cov == "kl" or cfg.surrogate == "sapo" else [cfg.clip_low, cfg.clip_high]
        assert (clip if clip == "none" else [float(x) for x in clip.split(" / ")]) == want, method
        assert aggregation == cfg.aggregation, method
