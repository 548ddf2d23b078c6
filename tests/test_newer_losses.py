"""The losses that followed GRPO, DAPO and GSPO (../shared/NEWER_BASELINES.md): GMPO, CISPO, SAPO,
and the 80/20 rule on any method.

Each loss's value and gradient against a reference written here in float64 from the spec's
formulas, in their own form (GMPO a sequence at a time, as exp of the mean clipped log-ratio), and
against gradients derived by hand; the clip fractions they log; micro-batch sums equal to the
mini-batch's loss for any cut; the 80/20 rule's choice against torch.quantile (the quantile rule), and the
same over 1, 2 and 8 ranks however the tokens are dealt (in this process: each rank's n largest,
the n-th of their union, as ranks.global_nth; over real ranks: tests/test_cov_losses.py). Their
per-token values beside every other method's: tests/test_tepo.py's reference_loss.
"""
import math

import pytest
import torch

import tepo
from tepo import LossConfig, policy_loss

NEWER = ("gmpo", "cispo", "sapo")


@pytest.fixture(autouse=True)
def float64_by_default():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def make_batch(B=10, T=8, seed=0, spread=0.5):
    """Ragged responses (2-8 tokens), log-ratios spread past every preset's clip on both sides,
    advantages of both signs and one 0, distinct entropies."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g) * 3
    logp = old + spread * torch.randn(B, T, generator=g)
    mask = torch.ones(B, T)
    for i in range(B):
        mask[i, 2 + (3 * i) % (T - 1):] = 0
    adv = torch.randn(B, generator=g)
    adv[1] = 0.0
    entropy = torch.rand(B, T, generator=g) * 2
    return dict(logp=logp, old=old, adv=adv, mask=mask, entropy=entropy)


# ----------------------------------------------------------------------------- references (the spec)

def gmpo_reference(logp, old, adv, mask, eps_low, eps_high):
    """mean_i(-A_i rho_i), rho_i = exp(mean_t d[i,t]) over the response's tokens, d the log-ratio
    clipped in the direction that matters for A_i."""
    terms = []
    for i in range(len(adv)):
        delta = (logp[i] - old[i])[mask[i] > 0]
        sgn = torch.sign(adv[i])
        d = sgn * torch.minimum(sgn * delta, sgn * torch.clamp(delta, -eps_low, eps_high))
        terms.append(-adv[i] * torch.exp(d.mean()))
    return sum(terms) / len(terms)


def cispo_reference(logp, old, adv, mask, eps_low, eps_high):
    """token-mean(-sg(clamp(r, 1 - eps_low, 1 + eps_high)) A_i logp)."""
    w = torch.clamp(torch.exp(logp - old), 1 - eps_low, 1 + eps_high).detach()
    return (-w * adv[:, None] * logp * mask).sum() / mask.sum()


def sapo_reference(logp, old, adv, mask, tau_pos, tau_neg):
    """seq-mean-token-mean(-f(r, tau) A_i), f(r, tau) = sigmoid(tau (r - 1)) 4 / tau."""
    total = 0.0
    for i in range(len(adv)):
        tau = tau_pos if adv[i] > 0 else tau_neg
        f = torch.sigmoid(tau * (torch.exp(logp[i] - old[i]) - 1)) * 4 / tau
        total = total + (-f * adv[i] * mask[i]).sum() / mask[i].sum()
    return total / len(adv)


def reference(method, d, logp, cfg):
    args = (logp, d["old"], d["adv"], d["mask"])
    if method == "gmpo":
        return gmpo_reference(*args, cfg.clip_low, cfg.clip_high)
    if method == "cispo":
        return cispo_reference(*args, cfg.clip_low, cfg.clip_high)
    return sapo_reference(*args, cfg.sapo_tau_pos, cfg.sapo_tau_neg)


def ours(d, cfg, logp=None, **kw):
    logp = d["logp"] if logp is None else logp
    return policy_loss(logp, d["old"], d["adv"], d["mask"], cfg, num_tokens=d["mask"].sum(),
                       num_seqs=len(d["adv"]), entropy=d["entropy"], **kw)


SETTINGS = [("gmpo", {}), ("gmpo", {"clip_low": 0.1, "clip_high": 0.3}),
            ("cispo", {}), ("cispo", {"clip_low": 0.2, "clip_high": 0.28}),
            ("sapo", {}), ("sapo", {"sapo_tau_pos": 3.0, "sapo_tau_neg": 0.7})]


@pytest.mark.parametrize("method,extra", SETTINGS, ids=[f"{m}-{sorted(e.items())}" for m, e in SETTINGS])
@pytest.mark.parametrize("seed,spread", [(0, 0.5), (1, 0.05), (2, 1.5)])
def test_value_and_gradient_match_the_reference(method, extra, seed, spread):
    d = make_batch(seed=seed, spread=spread)
    cfg = LossConfig.preset(method, **extra)
    x, y = d["logp"].clone().requires_grad_(), d["logp"].clone().requires_grad_()
    loss, _ = ours(d, cfg, logp=x)
    want = reference(method, d, y, cfg)
    (g,), (g_want,) = torch.autograd.grad(loss, x), torch.autograd.grad(want, y)
    assert loss.item() == pytest.approx(want.item(), rel=1e-12, abs=1e-15)
    assert torch.allclose(g, g_want, rtol=1e-10, atol=1e-15)
    assert (g.abs() > 0).any()


def test_gmpo_gradient_by_hand():
    """d/d logp_t of -A_i exp(mean d) / N = -A_i rho_i / (N |y_i|) where the clip leaves the token
    alone, 0 where it acts (log-ratio past eps_high with A > 0, past -eps_low with A < 0)."""
    d = make_batch(seed=3, spread=0.6)
    cfg = LossConfig.preset("gmpo")
    x = d["logp"].clone().requires_grad_()
    loss, m = ours(d, cfg, logp=x)
    loss.backward()
    mask, A, delta = d["mask"] > 0, d["adv"][:, None], d["logp"] - d["old"]
    low, high = (delta < -0.4) & (A < 0) & mask, (delta > 0.4) & (A > 0) & mask
    assert low.any() and high.any()
    clipped_d = torch.where(low, -0.4, torch.where(high, 0.4, delta))
    lens = d["mask"].sum(1, keepdim=True)
    rho = torch.exp((clipped_d * d["mask"]).sum(1, keepdim=True) / lens)
    want = -A * rho * (mask & ~low & ~high) / (len(d["adv"]) * lens)
    assert torch.allclose(x.grad, want, atol=1e-14)
    assert loss.item() == pytest.approx((-A * rho).mean().item(), rel=1e-12)
    ntok = d["mask"].sum()
    assert m["actor/clip_frac_low"].item() == pytest.approx((low.sum() / ntok).item())
    assert m["actor/clip_frac_high"].item() == pytest.approx((high.sum() / ntok).item())


def test_cispo_gradient_by_hand_every_token_keeps_one():
    """d/d logp_t = -clamp(r_t) A_i / sum m on every response token of A != 0, the clamped ones
    too; the clip fractions count the weights clamped below and above, whatever A's sign."""
    d = make_batch(seed=4, spread=0.6)
    cfg = LossConfig.preset("cispo", clip_low=0.2, clip_high=0.28)
    x = d["logp"].clone().requires_grad_()
    loss, m = ours(d, cfg, logp=x)
    loss.backward()
    mask, A, r = d["mask"] > 0, d["adv"][:, None], torch.exp(d["logp"] - d["old"])
    assert torch.allclose(x.grad, -r.clamp(0.8, 1.28) * A * mask / d["mask"].sum(), atol=1e-15)
    assert torch.all(x.grad[mask & (A != 0)] != 0)
    ntok = d["mask"].sum()
    below, above = (r < 0.8) & mask, (r > 1.28) & mask
    assert (below & (A > 0)).any() and (above & (A < 0)).any()   # the sides PPO would not count
    assert m["actor/clip_frac_low"].item() == pytest.approx((below.sum() / ntok).item())
    assert m["actor/clip_frac_high"].item() == pytest.approx((above.sum() / ntok).item())
    # the preset: no floor (1 - 1 = 0), the weight capped at 5
    preset = LossConfig.preset("cispo")
    assert (preset.clip_low, preset.clip_high, preset.aggregation) == (1.0, 4.0, "token-mean")


def test_sapo_gradient_by_hand_and_its_gate():
    """d/d logp_t of -A f(r, tau) / (N |y_i|) = -A 4 sigmoid'(tau (r - 1)) r / (N |y_i|): the
    slope is 1 at r = 1 for either tau, and fades away from it, faster for the larger tau."""
    d = make_batch(seed=5, spread=0.6)
    cfg = LossConfig.preset("sapo")
    assert (cfg.sapo_tau_pos, cfg.sapo_tau_neg, cfg.aggregation) == (1.0, 1.05, "seq-mean-token-mean")
    x = d["logp"].clone().requires_grad_()
    loss, m = ours(d, cfg, logp=x)
    loss.backward()
    A, r = d["adv"][:, None], torch.exp(d["logp"] - d["old"])
    tau = torch.where(A > 0, 1.0, 1.05)
    sig = torch.sigmoid(tau * (r - 1))
    lens = d["mask"].sum(1, keepdim=True)
    assert torch.allclose(x.grad, -A * 4 * sig * (1 - sig) * r * d["mask"] / (len(A) * lens), atol=1e-15)
    assert m["actor/clip_frac_low"] == 0 and m["actor/clip_frac_high"] == 0   # no clip
    at_one = x.detach().clone().copy_(d["old"]).requires_grad_()
    ours(d, cfg, logp=at_one)[0].backward()
    assert torch.allclose(at_one.grad, -A * d["mask"] / (len(A) * lens), atol=1e-15)


def test_gmpo_mean_log_ratio_is_clamped_not_inf():
    """GMPO leaves a token's log-ratio unclamped (the reference implementation), and with A < 0 it
    keeps its upper side: a response whose tokens all drifted +100 (a bad sync) would give
    exp(100) = inf in float32, and inf * A a NaN loss that skips the step. The response's mean is
    clamped at +-20 before exp: finite, and the other responses' gradients as they were."""
    d = {k: v.float() for k, v in make_batch(seed=9).items()}
    d["adv"][0] = -0.5
    d["logp"][0] = d["old"][0] + 100.0
    x = d["logp"].clone().requires_grad_()
    loss, _ = ours(d, LossConfig.preset("gmpo"), logp=x)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(x.grad).all()
    y = d["logp"][1:].clone().requires_grad_()
    rest = {k: v[1:] for k, v in d.items()}
    (g_rest,) = torch.autograd.grad(gmpo_reference(y, rest["old"], rest["adv"], rest["mask"], 0.4, 0.4), y)
    assert torch.allclose(x.grad[1:], g_rest * 9 / 10, rtol=1e-5, atol=1e-9)   # (mean over 10, not 9)


@pytest.mark.parametrize("method", NEWER)
def test_newer_settings_are_checked(method):
    with pytest.raises(ValueError, match="surrogate 'gmpo' reads the token ratio"):
        LossConfig.preset("gmpo", ratio="sequence")
    with pytest.raises(ValueError, match="PPO's clipped surrogate"):
        LossConfig.preset(method, cov="clip")
    with pytest.raises(ValueError, match="unknown surrogate"):
        LossConfig.preset(method, surrogate="ppo")
    with pytest.raises(ValueError, match="sapo_tau_pos and sapo_tau_neg must be > 0"):
        LossConfig.preset(method, sapo_tau_neg=0.0)
    for frac in (-0.1, 1.5):
        with pytest.raises(ValueError, match="top_entropy_frac must lie in"):
            LossConfig.preset(method, top_entropy_frac=frac)


# ----------------------------------------------------------------------------- micro-batches

CUTS = [[[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]], [[3], [0, 9, 4], [1, 2, 5, 6, 7, 8]],
        [[i] for i in range(10)], [[9, 8, 7, 6, 5], [4, 3, 2, 1, 0]]]


@pytest.mark.parametrize("method", NEWER + ("dapo", "tepo"))
@pytest.mark.parametrize("frac", [0.0, 0.25])
def test_microbatches_sum_to_the_mini_batch_for_any_cut(method, frac):
    """Any cut of the mini-batch into micro-batches, with the global counts and (80/20 rule) the
    mini-batch's selection: the losses, the gradient and the summed metrics are the mini-batch's."""
    d = make_batch(seed=6, spread=0.5)
    d["old_entropy"] = d["entropy"] + 0.3
    cfg = LossConfig.preset(method, top_entropy_frac=frac, entropy_coef=0.01)
    sel = tepo.top_entropy_select(d["entropy"], d["mask"], frac) if frac else None
    kw = dict(num_tokens=d["mask"].sum(), num_seqs=10)
    x = d["logp"].clone().requires_grad_()
    whole, m_whole = policy_loss(x, d["old"], d["adv"], d["mask"], cfg, entropy=d["entropy"],
                                 old_entropy=d["old_entropy"], entropy_sel=sel, **kw)
    (g_whole,) = torch.autograd.grad(whole, x)
    for cut in CUTS:
        x2, total, sums = d["logp"].clone().requires_grad_(), 0.0, {}
        for idx in cut:
            loss, m = policy_loss(x2[idx], d["old"][idx], d["adv"][idx], d["mask"][idx], cfg,
                                  entropy=d["entropy"][idx], old_entropy=d["old_entropy"][idx],
                                  entropy_sel=None if sel is None else sel[idx], **kw)
            loss.backward()
            total += loss.item()
            for k, v in m.items():
                sums[k] = sums.get(k, 0.0) + v if k not in tepo.METRIC_REDUCE else v
        assert total == pytest.approx(whole.item(), abs=1e-13), cut
        assert torch.allclose(x2.grad, g_whole, atol=1e-15), cut
        for k in ("loss/policy", "actor/clip_frac_low", "actor/clip_frac_high", "actor/kl_old") + (
                ("actor/high_entropy_frac",) if frac else ()):
            assert float(sums[k]) == pytest.approx(float(m_whole[k]), abs=1e-13), (cut, k)


# ----------------------------------------------------------------------------- the 80/20 rule

def quantile_rule(H, mask, frac):
    """The tokens whose entropy is at or above torch.quantile(the batch's entropies, 1 - frac)."""
    return (H >= torch.quantile(H[mask > 0], 1 - frac)) & (mask > 0)


@pytest.mark.parametrize("frac", [0.2, 0.05, 0.5, 0.37, 1.0])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_top_entropy_select_is_the_quantile_rule(frac, seed):
    d = make_batch(seed=seed, B=30, T=9)
    sel = tepo.top_entropy_select(d["entropy"], d["mask"], frac)
    assert torch.equal(sel, quantile_rule(d["entropy"], d["mask"], frac))
    n = int(d["mask"].sum())
    assert int(sel.sum()) == tepo.top_entropy_count(n, frac) == n - math.ceil(round((1 - frac) * (n - 1), 9))


def test_top_entropy_count_by_hand_and_ties_kept_together():
    """N = 11 tokens, frac 0.2: the 0.8-quantile sits on the 9th smallest (0.8 * 10 = 8, from 0):
    3 kept. N = 10: 0.8 * 9 = 7.2, between the 8th and 9th smallest: 2 kept. Two tokens of equal
    entropy at the threshold are kept together (a response sampled twice)."""
    assert tepo.top_entropy_count(11, 0.2) == 3 and tepo.top_entropy_count(10, 0.2) == 2
    assert tepo.top_entropy_count(1, 0.2) == 1 and tepo.top_entropy_count(7, 1.0) == 7
    assert tepo.top_entropy_count(11.0, 0.2) == 3    # a count summed over the ranks (a float)
    H = torch.tensor([[0.1, 0.9, 0.5, 0.7, 0.3], [0.2, 0.9, 0.5, 0.7, 0.8]])
    mask = torch.ones(2, 5)
    mask[1, 4] = 0                      # 9 tokens: 0.8 * 8 = 6.4 -> the 8th smallest (0.9) and up: 2
    sel = tepo.top_entropy_select(H, mask, 0.2)
    assert sel.nonzero().tolist() == [[0, 1], [1, 1]]
    H[1, 1] = 0.7                       # now 0.9 once, 0.7 three times: the 8th smallest is 0.7
    sel = tepo.top_entropy_select(H, mask, 0.2)
    assert sel.nonzero().tolist() == [[0, 1], [0, 3], [1, 1], [1, 3]]
    assert torch.equal(sel, quantile_rule(H, mask, 0.2))


@pytest.mark.parametrize("method", tepo.METHODS)
def test_the_8020_rule_leaves_the_policy_term_on_the_kept_tokens_only(method):
    """With only the policy term: the dropped tokens get no gradient, the kept ones exactly the
    gradient they have without the rule (the denominators unchanged), for every method; the terms
    beside it (an entropy bonus) are left whole; actor/high_entropy_frac is the kept share of the
    metric's tokens."""
    d = make_batch(seed=7, spread=0.3)
    sel = (torch.rand(d["logp"].shape, generator=torch.Generator().manual_seed(3)) < 0.3) & (d["mask"] > 0)
    cov_sel = torch.zeros_like(sel)
    base = dict(max_new_tokens=9, kl_coef=0.0, kl_mask=False)
    grads = {}
    for frac in (0.0, 0.2):
        cfg = LossConfig.preset(method, top_entropy_frac=frac, **base)
        x = d["logp"].clone().requires_grad_()
        loss, m = ours(d, cfg, logp=x, entropy_sel=sel, cov_sel=cov_sel, metric_tokens=40)
        grads[frac] = torch.autograd.grad(loss, x)[0]
    assert torch.all(grads[0.2][~sel] == 0)
    assert torch.equal(grads[0.2][sel], grads[0.0][sel]) and (grads[0.2][sel] != 0).any()
    assert m["actor/high_entropy_frac"].item() == pytest.approx(sel.sum().item() / 40)
    # an entropy bonus beside it: its gradient on every token, the rule or not
    H = d["entropy"].clone().requires_grad_()
    for frac in (0.0, 0.2):
        cfg = LossConfig.preset(method, top_entropy_frac=frac, entropy_coef=0.1, **base)
        loss, _ = policy_loss(d["logp"], d["old"], d["adv"], d["mask"], cfg, num_tokens=d["mask"].sum(),
                              num_seqs=10, entropy=H, entropy_sel=sel, cov_sel=cov_sel)
        grads[frac] = torch.autograd.grad(loss, H)[0]
    assert torch.equal(grads[0.0], grads[0.2]) and (grads[0.2][~sel & (d["mask"] > 0)] != 0).all()


def deal_and_choose(H, mask, frac, parts):
    """The 80/20 choice with the responses dealt to ranks (`parts`: each rank's rows, some none):
    each rank's n largest entropies, the n-th largest of their union the threshold for all, as
    ranks.global_nth gathers them. -> (B, T) bool, the ranks' choices put back in place."""
    total = int(mask.sum())
    n = tepo.top_entropy_count(total, frac)
    tops = [tepo.top_pairs(H[rows].double(), torch.zeros(len(rows), H.shape[1]), mask[rows] > 0, n)
            for rows in parts]
    union = sorted((tuple(p) for top in tops for p in top.tolist()), reverse=True)
    nth = lambda top, k: torch.tensor(union[k - 1])  # noqa: E731
    out = torch.zeros_like(mask, dtype=torch.bool)
    for rows in parts:
        if rows:
            out[rows] = tepo.top_entropy_select(H[rows], mask[rows], frac, num_tokens=total, nth=nth)
    return out


@pytest.mark.parametrize("frac", [0.2, 0.05, 0.6])
def test_the_choice_is_the_same_on_1_2_and_8_ranks(frac):
    """The same tokens on 1, 2 and 8 ranks however the responses are dealt (a rank of 8 with none),
    equal entropies included; each rank choosing its own top share would not give them."""
    d = make_batch(seed=8, B=20, T=9)
    H, mask = d["entropy"], d["mask"]
    H[5], mask[5] = H[4], mask[4]                          # a response sampled twice: equal entropies
    # and a tie at the threshold: the token just below the n-th largest raised to it, both kept
    n = tepo.top_entropy_count(int(mask.sum()), frac)
    order = torch.where(mask > 0, H, -1.0).flatten().argsort(descending=True)
    H.view(-1)[order[n]] = H.view(-1)[order[n - 1]]
    want = quantile_rule(H, mask, frac)
    assert int(want.sum()) >= n + 1
    deals = {1: [list(range(20))], 2: [[0, 3, 17], [i for i in range(20) if i not in (0, 3, 17)]],
             8: [[7, 1], [4], [5, 12, 13, 14], [], [0, 2, 3], [6, 8, 9, 10, 11], [15, 16], [17, 18, 19]]}
    for world, parts in deals.items():
        assert sorted(r for p in parts for r in p) == list(range(20))
        assert torch.equal(deal_and_choose(H, mask, frac, parts), want), world
    own = torch.zeros_like(want)
    for rows in deals[2]:
        own[rows] = tepo.top_entropy_select(H[rows], mask[rows], frac)
    assert not torch.equal(own, want)


def test_the_8020_pool_is_the_tokens_with_an_advantage_whatever_else_is_in_the_loss(one_rank, tiny_model_dir):
    """train.select_tokens takes the 80/20 rule's quantile over the tokens of the responses with
    A != 0: a KL or entropy term that puts the A = 0 responses in the loss too (in_loss) does not
    change which tokens keep their policy term (before, their entropies moved the threshold)."""
    from types import SimpleNamespace

    import policy
    import train
    cfg = train.Config(model=tiny_model_dir, train_data="d", micro_batch_tokens=64, method="dapo",
                       loss={"top_entropy_frac": 0.3})
    model = policy.load_policy(tiny_model_dir, cfg, torch.device("cpu"))
    run = SimpleNamespace(model=model, cfg=cfg, device=torch.device("cpu"))
    g = torch.Generator().manual_seed(3)
    seqs = []
    for k in range(6):  # A = 0 for every other response
        resp = torch.randint(3, 60, (4 + k,), generator=g).tolist()
        seqs.append(train.Sequence((0, k), [5, 6, 7], resp, 0.0 if k % 2 else 1.0 - k / 4, True, torch.zeros(len(resp))))

    def chosen(pool):
        counts = train.global_counts([pool])[0]
        train.select_tokens(run, pool, counts=counts, keys=torch.Generator().manual_seed(0))
        return {s.gid: s.entropy_sel.tolist() for s in pool}

    alone = chosen([s for s in seqs if s.adv != 0])
    beside = chosen(seqs)
    assert {gid: sel for gid, sel in beside.items() if gid in alone} == alone
    assert not any(any(sel) for gid, sel in beside.items() if gid not in alone)  # A = 0: nothing kept
    assert 0 < sum(map(sum, alone.values())) < sum(map(len, alone.values()))
