"""tepo.py against references written here from the spec's formulas, one token at a time."""
import math

import pytest
import torch

import tepo
from tepo import (METHODS, LossConfig, aggregate, group_advantages, kl_estimate,
                  policy_loss, token_logprobs_entropy)



@pytest.fixture(autouse=True)
def float64_by_default():
    """References in float64 here; restored after each test (a module-level set_default_dtype would
    run at collection and make every other file's tensors and models float64 too)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


# ----------------------------------------------------------------------------- advantages

def test_group_advantages_hand_computed():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 3.0])
    a = group_advantages(r, 4)
    # group 1: mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = 0.57735..; group 2 all equal -> 0;
    # group 3: mean 0.75, deviations (-0.75 x3, 2.25), unbiased std sqrt((3*0.5625+5.0625)/3) = 1.5
    s1 = math.sqrt(1 / 3)
    expected = [0.5 / s1, -0.5 / s1, -0.5 / s1, 0.5 / s1, 0, 0, 0, 0, -0.5, -0.5, -0.5, 1.5]
    assert torch.allclose(a.double(), torch.tensor(expected), atol=1e-5)
    assert torch.equal(a[4:8], torch.zeros(4, dtype=a.dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("normalize_std", [True, False])
def test_equal_rewards_give_exactly_zero_advantage(dtype, normalize_std):
    """A group whose rewards are all equal carries nothing to learn from: A = 0 exactly, at any
    reward scale (a float mean of eight 0.1 misses 0.1 by a rounding step, and that noise over
    std + 1e-6 once gave A = -0.0074), while a group beside it with spread keeps its advantages."""
    for value in (0.1, 0.6, 1 / 3, -0.7, 1e-8, 123.456, 2.0 ** 20 + 0.3):
        r = torch.tensor([value] * 8 + [0.0, 1.0] * 4, dtype=dtype)
        a = group_advantages(r, 8, normalize_std=normalize_std)
        assert torch.equal(a[:8], torch.zeros(8, dtype=a.dtype)), (value, a[:8])
        assert a[8] < 0 < a[9]


def test_group_advantages_without_std():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 2.0, 2.0])
    assert torch.allclose(group_advantages(r, 3, normalize_std=False).double(),
                          torch.tensor([2 / 3, -1 / 3, -1 / 3, -4 / 3, 2 / 3, 2 / 3]), atol=1e-6)


def test_group_advantages_bad_input():
    with pytest.raises(ValueError, match="groups of 4"):
        group_advantages(torch.zeros(6), 4)
    with pytest.raises(ValueError, match="1-D"):
        group_advantages(torch.zeros(2, 4), 4)


# ----------------------------------------------------------------------------- log-probs

def naive_logp_entropy(logits, targets, temperature):
    lp = torch.log_softmax(logits.float() / temperature, dim=-1)
    logp = lp.gather(-1, targets[..., None]).squeeze(-1)
    entropy = -(lp.exp() * lp).sum(-1)
    return logp, entropy


@pytest.mark.parametrize("chunk", [7 * 50, 2**24])  # several chunks per row, or one per sequence
def test_logprobs_match_naive_fp32(chunk):
    torch.manual_seed(0)
    logits = (3 * torch.randn(3, 11, 50, dtype=torch.float32)).requires_grad_()
    targets = torch.randint(0, 50, (3, 11))
    logp, ent = token_logprobs_entropy(logits, targets, temperature=0.7, max_chunk_elems=chunk)
    ref_logp, ref_ent = naive_logp_entropy(logits, targets, 0.7)
    assert logp.dtype == torch.float32 and ent.requires_grad  # an entropy bonus needs its grad
    assert torch.allclose(logp, ref_logp, atol=1e-5)
    assert torch.allclose(ent, ref_ent, atol=1e-5)
    w, v = torch.randn(3, 11, dtype=torch.float32), torch.randn(3, 11, dtype=torch.float32)
    # logp alone (the entropy's gradient is skipped), the entropy alone, and both together
    for f in (lambda lp, h: (lp * w).sum(), lambda lp, h: (h * v).sum(),
              lambda lp, h: (lp * w).sum() + (h * v).sum()):
        logp, ent = token_logprobs_entropy(logits, targets, temperature=0.7, max_chunk_elems=chunk)
        (g,) = torch.autograd.grad(f(logp, ent), logits)
        (g_ref,) = torch.autograd.grad(f(*naive_logp_entropy(logits, targets, 0.7)), logits)
        assert torch.allclose(g, g_ref, atol=1e-5), (g - g_ref).abs().max()


def test_logprobs_from_bf16_and_noncontiguous_view():
    torch.manual_seed(1)
    full = (2 * torch.randn(2, 9, 64)).to(torch.bfloat16).requires_grad_()
    logits = full[:, :-1]                                   # the usual shift: a strided view
    targets = torch.randint(0, 64, (2, 8))
    logp, ent = token_logprobs_entropy(logits, targets, temperature=1.3, max_chunk_elems=3 * 64)
    ref = full.detach().float().requires_grad_()            # same values, exact fp32 math
    ref_logp, ref_ent = naive_logp_entropy(ref[:, :-1], targets, 1.3)
    assert torch.allclose(logp, ref_logp, atol=1e-2)
    assert torch.allclose(ent, ref_ent, atol=1e-2)
    logp.sum().backward()
    ref_logp.sum().backward()
    assert full.grad.dtype == torch.bfloat16
    assert torch.allclose(full.grad.float(), ref.grad, atol=1e-2)
    assert torch.all(full.grad[:, -1] == 0)                 # the cut-off position gets nothing


def test_logprobs_bad_input():
    with pytest.raises(ValueError, match="targets"):
        token_logprobs_entropy(torch.zeros(2, 3, 5), torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs_entropy(torch.zeros(2, 3, 5), torch.zeros(2, 3, dtype=torch.long), 0.0)


def test_kl_estimators():
    logp, tgt = torch.tensor([-1.0, -2.0, -0.5]), torch.tensor([-1.5, -1.0, -0.5])
    d = tgt - logp
    assert torch.allclose(kl_estimate(logp, tgt, "k1"), -d)
    assert torch.allclose(kl_estimate(logp, tgt, "k2"), 0.5 * d * d)
    assert torch.allclose(kl_estimate(logp, tgt, "k3"), torch.exp(d) - d - 1)
    assert torch.isfinite(kl_estimate(torch.tensor([-500.0]), torch.tensor([0.0]), "k3")).all()
    with pytest.raises(ValueError, match="k4"):
        kl_estimate(logp, tgt, "k4")


# ----------------------------------------------------------------------------- losses

def reference_loss(logp, old, adv, mask, cfg, N, L, entropy=None, old_entropy=None, ref=None,
                   rollout=None, sel=None):
    """The spec, token by token, in plain Python floats."""
    B, T = len(logp), len(logp[0])
    lens = [sum(mask[i]) for i in range(B)]
    ntok = sum(lens)
    clamp = lambda x: max(-20.0, min(20.0, x))  # noqa: E731  (log-ratios, before exp)
    s = [math.exp(clamp(sum(mask[i][t] * (logp[i][t] - old[i][t]) for t in range(T)) / lens[i]))
         for i in range(B)]

    def agg(per_token, weights):
        if cfg.aggregation == "token-mean":
            return sum(weights[i][t] * per_token[i][t] for i in range(B) for t in range(T)) / ntok
        if cfg.aggregation == "seq-mean-token-mean":
            return sum(sum(weights[i][t] * per_token[i][t] for t in range(T)) / lens[i]
                       for i in range(B)) / N
        return sum(weights[i][t] * per_token[i][t] for i in range(B) for t in range(T)) / (N * L)

    def k3(lp, tgt):
        d = max(-20, min(20, tgt - lp))
        return math.exp(d) - d - 1

    def is_weight(i, t):  # pi_old / pi_rollout of the token, or of the whole sequence
        if cfg.is_level == "token":
            w = math.exp(old[i][t] - rollout[i][t])
        else:
            w = math.exp(sum(mask[i][u] * (old[i][u] - rollout[i][u]) for u in range(T)))
        if cfg.is_correction == "tis":
            return min(w, cfg.is_cap)
        return w if 1 / cfg.is_cap <= w <= cfg.is_cap else 0.0

    def gmpo_rho(i):  # NEWER_BASELINES.md: each token's log-ratio clipped the way A_i's sign favours
        sgn = (adv[i] > 0) - (adv[i] < 0)
        d = [sgn * min(sgn * x, sgn * max(-cfg.clip_low, min(cfg.clip_high, x)))
             for x in (logp[i][t] - old[i][t] for t in range(T))]
        return math.exp(clamp(sum(mask[i][t] * d[t] for t in range(T)) / lens[i]))

    pg = [[0.0] * T for _ in range(B)]
    for i in range(B):
        for t in range(T):
            rho = math.exp(clamp(logp[i][t] - old[i][t])) if cfg.ratio == "token" else s[i]
            clipped = min(max(rho, 1 - cfg.clip_low), 1 + cfg.clip_high)
            pg[i][t] = -min(rho * adv[i], clipped * adv[i])
            if cfg.surrogate == "gmpo":                    # -A_i rho_i on each token
                pg[i][t] = -adv[i] * gmpo_rho(i)
            if cfg.surrogate == "cispo":                   # the clipped ratio as a weight on logp
                pg[i][t] = -clipped * adv[i] * logp[i][t]
            if cfg.surrogate == "sapo":                    # the gate sigmoid(tau (r - 1)) 4 / tau
                tau = cfg.sapo_tau_pos if adv[i] > 0 else cfg.sapo_tau_neg
                pg[i][t] = -adv[i] * 4 / tau / (1 + math.exp(-tau * (rho - 1)))
            if cfg.cov == "clip" and sel[i][t]:            # Clip-Cov: no gradient, no loss
                pg[i][t] = 0.0
            if cfg.cov == "kl":                            # KL-Cov: no clip, |log r| if selected
                pg[i][t] = -rho * adv[i] + cfg.kl_cov_coef * abs(logp[i][t] - old[i][t]) * sel[i][t]
            if cfg.is_correction != "none":
                pg[i][t] *= is_weight(i, t)
    if cfg.top_entropy_frac:  # the 80/20 rule: H at or above its (1 - frac)-quantile, else 0
        q = torch.quantile(torch.tensor([entropy[i][t] for i in range(B) for t in range(T) if mask[i][t]],
                                        dtype=torch.float64), 1 - cfg.top_entropy_frac).item()
        pg = [[pg[i][t] * (entropy[i][t] >= q) for t in range(T)] for i in range(B)]
    loss = agg(pg, mask)
    if cfg.kl_coef > 0:
        loss += cfg.kl_coef * agg([[k3(logp[i][t], ref[i][t]) for t in range(T)]
                                   for i in range(B)], mask)
    if cfg.kl_mask:
        target = old if cfg.kl_mask_target == "old" else ref
        M = [[mask[i][t] * (adv[i] > 0) * (entropy[i][t] < old_entropy[i][t]) for t in range(T)]
             for i in range(B)]
        loss += cfg.kl_mask_coef * sum(M[i][t] * k3(logp[i][t], target[i][t])  # over sum m, for
                                       for i in range(B) for t in range(T)) / ntok  # any aggregation
    if cfg.entropy_coef:
        loss -= cfg.entropy_coef * agg(entropy, mask)
    return loss


def make_batch(B=12, T=7, seed=0, spread=0.3):
    """Random inputs whose ratios land both inside and outside every method's clip range."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g) * 3
    logp = old + spread * torch.randn(B, T, generator=g)
    mask = torch.ones(B, T)
    for i in range(B):                                       # ragged lengths, >= 2 tokens each
        mask[i, 2 + i % (T - 2):] = 0
    adv = torch.randn(B, generator=g)
    adv[0] = 0.0
    entropy = torch.rand(B, T, generator=g) * 2
    old_entropy = entropy + 0.5 * torch.randn(B, T, generator=g)
    ref = old + 0.2 * torch.randn(B, T, generator=g)
    rollout = old + 0.1 * torch.randn(B, T, generator=g)
    sel = (torch.rand(B, T, generator=g) < 0.25) & (mask > 0)  # Clip-Cov / KL-Cov's tokens, given
    return dict(logp=logp, old=old, adv=adv, mask=mask, entropy=entropy, old_entropy=old_entropy,
                ref=ref, rollout=rollout, sel=sel)


def run_loss(d, cfg, logp=None, **kw):
    logp = d["logp"] if logp is None else logp
    N, ntok = d["mask"].shape[0], d["mask"].sum()
    return policy_loss(logp, d["old"], d["adv"], d["mask"], cfg, num_tokens=ntok, num_seqs=N,
                       entropy=d["entropy"], old_entropy=d["old_entropy"], ref_logp=d["ref"],
                       rollout_logp=d["rollout"], cov_sel=d["sel"], **kw)


CONFIGS = [LossConfig.preset(m, max_new_tokens=9) for m in METHODS] + [
    LossConfig.preset("grpo", entropy_coef=0.01),
    LossConfig.preset("drgrpo", entropy_coef=0.003, max_new_tokens=9),
    LossConfig.preset("tepo", entropy_coef=0.02),
    LossConfig.preset("klcov", kl_cov_coef=0.3, aggregation="seq-mean-token-mean"),
    LossConfig.preset("tepo", kl_mask_target="ref", is_correction="tis", is_cap=1.05),
    LossConfig.preset("grpo", aggregation="token-mean", kl_kind="k3", is_correction="tis"),
    LossConfig.preset("gspo", is_correction="tis", is_level="sequence", is_cap=1.2),
    LossConfig.preset("dapo", is_correction="mask", is_cap=1.1),
    LossConfig.preset("tepo", is_correction="mask", is_level="sequence", is_cap=1.3),
    # the 80/20 rule on methods of each kind of policy term (the selection made by policy_loss
    # within the batch, as no entropy_sel is given; 45 tokens: the 0.8-quantile between two)
    LossConfig.preset("dapo", top_entropy_frac=0.2),
    LossConfig.preset("tepo", top_entropy_frac=0.2, entropy_coef=0.01),
    LossConfig.preset("grpo", top_entropy_frac=0.5, is_correction="tis"),
    LossConfig.preset("gmpo", top_entropy_frac=0.2),
    LossConfig.preset("cispo", top_entropy_frac=0.3, aggregation="seq-mean-token-mean"),
    LossConfig.preset("sapo", top_entropy_frac=0.2, sapo_tau_pos=2.0, sapo_tau_neg=0.5),
    LossConfig.preset("gmpo", clip_low=0.1, clip_high=0.2, aggregation="token-mean"),
    LossConfig.preset("cispo", clip_low=0.2, clip_high=0.28, is_correction="mask", is_cap=1.1),
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"{c.method}-{c.aggregation}-{c.is_correction}"
                                                       f"-{c.is_level}-{c.top_entropy_frac}")
@pytest.mark.parametrize("spread", [0.0005, 0.3])
def test_loss_matches_per_token_reference(cfg, spread):
    d = make_batch(seed=3, spread=spread)
    loss, _ = run_loss(d, cfg)
    L = lambda k: d[k].tolist()  # noqa: E731
    expected = reference_loss(L("logp"), L("old"), L("adv"), L("mask"), cfg, 12, 9, L("entropy"),
                              L("old_entropy"), L("ref"), L("rollout"), L("sel"))
    assert loss.item() == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_inputs_cover_both_sides_of_the_clip():
    d = make_batch(seed=3, spread=0.3)
    for cfg in (LossConfig.preset("dapo"), LossConfig.preset("tepo")):
        _, m = run_loss(d, cfg)
        assert m["actor/clip_frac_low"] > 0 and m["actor/clip_frac_high"] > 0
        assert m["actor/ratio_min"] < 1 - cfg.clip_low and m["actor/ratio_max"] > 1 + cfg.clip_high


@pytest.mark.parametrize("method", METHODS)
def test_gradient_at_theta_old(method):
    """At theta = theta_old every ratio is 1: d loss / d logp is -A_i over the normaliser."""
    d = make_batch(seed=5)
    d["ref"] = d["old"].clone()                              # KL-to-ref gradient is 0 there too
    cfg = LossConfig.preset(method, max_new_tokens=9)
    logp = d["old"].clone().requires_grad_()
    loss, m = run_loss(d, cfg, logp=logp)
    loss.backward()
    mask, A = d["mask"], d["adv"][:, None]
    N, ntok, lens = mask.shape[0], mask.sum(), mask.sum(1, keepdim=True)
    norm = {"token-mean": ntok, "seq-mean-token-mean": N * lens,
            "seq-mean-token-sum-norm": N * 9}[cfg.aggregation]
    if cfg.cov == "clip":        # Clip-Cov's selected tokens get none (KL-Cov's |log r|: 0 at r = 1)
        mask = mask * ~d["sel"]
    assert torch.allclose(logp.grad, -A * mask / norm, atol=1e-12)
    assert m["loss/kl_mask"] == 0 and m["actor/clip_frac_low"] == 0 and m["actor/clip_frac_high"] == 0


@pytest.mark.parametrize("method", ["dapo", "grpo", "gspo", "tepo"])
def test_pessimistically_clipped_tokens_get_no_gradient(method):
    d = make_batch(seed=7, spread=0.5)
    cfg = LossConfig.preset(method, kl_coef=0.0, kl_mask=False)
    logp = d["logp"].clone().requires_grad_()
    run_loss(d, cfg, logp=logp)[0].backward()
    A = d["adv"][:, None].expand_as(logp)
    if cfg.ratio == "token":
        rho = torch.exp(d["logp"] - d["old"])
    else:
        s = torch.exp(((d["logp"] - d["old"]) * d["mask"]).sum(1) / d["mask"].sum(1))
        rho = s[:, None].expand_as(logp)
    dead = ((rho > 1 + cfg.clip_high) & (A > 0)) | ((rho < 1 - cfg.clip_low) & (A < 0))
    live = ~dead & (d["mask"] > 0) & (A != 0)
    assert dead.any() and live.any()
    assert torch.all(logp.grad[dead] == 0)
    assert torch.all(logp.grad[live] != 0)


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean",
                                         "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("ratio", ["token", "sequence"])
def test_microbatches_sum_to_the_whole_batch(aggregation, ratio):
    d = make_batch(B=8, T=7, seed=11, spread=0.2)
    cfg = LossConfig(method="tepo", ratio=ratio, clip_low=0.1, clip_high=0.15,
                     aggregation=aggregation, max_new_tokens=9, kl_coef=0.05, kl_mask=True,
                     is_correction="mask", is_level=ratio, is_cap=1.2)
    N, ntok = 8, d["mask"].sum()
    logp = d["logp"].clone().requires_grad_()
    whole, m_whole = run_loss(d, cfg, logp=logp)
    (g_whole,) = torch.autograd.grad(whole, logp)
    total, sums = 0.0, {}
    logp2 = d["logp"].clone().requires_grad_()
    for idx in ([0, 5, 2], [1], [3, 4, 6, 7]):               # uneven, shuffled micro-batches
        sub = {k: v[idx] for k, v in d.items()}
        loss, m = policy_loss(logp2[idx], sub["old"], sub["adv"], sub["mask"], cfg,
                              num_tokens=ntok, num_seqs=N, entropy=sub["entropy"],
                              old_entropy=sub["old_entropy"], ref_logp=sub["ref"],
                              rollout_logp=sub["rollout"])
        loss.backward()
        total += loss.item()
        for k, v in m.items():
            sums[k] = sums.get(k, 0) + v if k not in tepo.METRIC_REDUCE else v
    assert total == pytest.approx(whole.item(), abs=1e-6)
    assert torch.allclose(logp2.grad, g_whole, atol=1e-6)
    for k in ("actor/clip_frac_low", "actor/clip_frac_high", "actor/kl_mask_frac", "actor/kl_old",
              "actor/kl_ref", "loss/policy", "mismatch/is_weight", "mismatch/masked_frac",
              "actor/grad_w_policy", "actor/grad_w_kl_mask"):
        assert float(sums[k]) == pytest.approx(float(m_whole[k]), abs=1e-6), k


def test_aggregate_rejects_unknown_mode():
    with pytest.raises(ValueError, match="token-sum"):
        aggregate(torch.ones(2, 2), torch.ones(2, 2), "token-sum", num_tokens=4, num_seqs=2)


def test_kl_mask_acts_exactly_where_spec_says():
    d = make_batch(B=6, T=7, seed=13)
    cfg = LossConfig.preset("tepo")
    expected = (d["mask"] > 0) & (d["adv"][:, None] > 0) & (d["entropy"] < d["old_entropy"])
    assert expected.any() and (~expected & (d["mask"] > 0)).any()
    logp = d["logp"].clone().requires_grad_()
    loss_on, m = run_loss(d, cfg, logp=logp)
    assert m["actor/kl_mask_frac"].item() == pytest.approx(expected.sum().item() / d["mask"].sum().item())
    # The mask term's gradient (loss with mask minus loss without) lives exactly on M.
    (g_on,) = torch.autograd.grad(loss_on, logp)
    logp_off = d["logp"].clone().requires_grad_()
    (g_off,) = torch.autograd.grad(run_loss(d, LossConfig.preset("tepo", kl_mask=False),
                                            logp=logp_off)[0], logp_off)
    kl_grad = g_on - g_off
    assert torch.all(kl_grad[~expected] == 0)
    # d/dlogp of beta * k3 / ntok = beta * (1 - exp(old - logp)) / ntok
    analytic = cfg.kl_mask_coef * (1 - torch.exp(d["old"] - d["logp"])) / d["mask"].sum()
    assert torch.allclose(kl_grad[expected], analytic[expected], atol=1e-12)
    # the logged weights: each term's sum of |d term / d logp_t| (the mask's share of the pull)
    assert m["actor/grad_w_kl_mask"].item() == pytest.approx(analytic[expected].abs().sum().item(), rel=1e-9)
    assert m["actor/grad_w_policy"].item() == pytest.approx(g_off.abs().sum().item(), rel=1e-9)
    # without grad (a metrics-only call) they are not computed
    _, m_nograd = run_loss(d, cfg)
    assert "actor/grad_w_kl_mask" not in m_nograd


@pytest.mark.parametrize("aggregation", ["seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_kl_mask_term_is_over_all_response_tokens_whatever_the_aggregation(aggregation):
    """beta_mask * sum M k3 / sum m (the spec; README): with GSPO's per-sequence mean (or Dr.GRPO's
    norm) for the policy term, the mask term still divides by the batch's response tokens."""
    d = make_batch(B=6, T=7, seed=29)
    cfg = LossConfig.preset("gspo", aggregation=aggregation, max_new_tokens=9, kl_mask=True)
    M = (d["mask"] > 0) & (d["adv"][:, None] > 0) & (d["entropy"] < d["old_entropy"])
    delta = d["old"] - d["logp"]
    expected = cfg.kl_mask_coef * ((torch.exp(delta) - delta - 1) * M).sum() / d["mask"].sum()
    _, m = run_loss(d, cfg)
    assert M.any() and m["loss/kl_mask"].item() == pytest.approx(expected.item(), rel=1e-12)


def test_kl_mask_empty_at_theta_old():
    d = make_batch(seed=17)
    d["entropy"] = d["old_entropy"].clone()                 # same policy, same entropy
    _, m = run_loss(d, LossConfig.preset("tepo"), logp=d["old"])
    assert m["actor/kl_mask_frac"] == 0 and m["loss/kl_mask"] == 0


def test_metrics_values():
    d = make_batch(seed=19)
    cfg = LossConfig.preset("dapo", is_correction="tis")
    _, m = run_loss(d, cfg)
    mask, ntok = d["mask"] > 0, d["mask"].sum()
    r = torch.exp(d["logp"] - d["old"])
    A = d["adv"][:, None].expand_as(r)
    assert m["actor/clip_frac_high"].item() == pytest.approx(((r > 1.28) & (A > 0) & mask).sum() / ntok)
    assert m["actor/clip_frac_low"].item() == pytest.approx(((r < 0.8) & (A < 0) & mask).sum() / ntok)
    assert m["actor/ratio_max"].item() == pytest.approx(r[mask].max().item())


def test_bad_input_is_a_clear_error():
    d = make_batch()
    cfg = LossConfig.preset("tepo")
    with pytest.raises(ValueError, match="old_logp has shape"):
        policy_loss(d["logp"], d["old"][:, :3], d["adv"], d["mask"], cfg, num_tokens=1, num_seqs=1)
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(d["logp"], d["old"], d["adv"][:2], d["mask"], cfg, num_tokens=1, num_seqs=1)
    empty = d["mask"].clone()
    empty[2] = 0
    with pytest.raises(ValueError, match="no response tokens"):
        policy_loss(d["logp"], d["old"], d["adv"], empty, cfg, num_tokens=1, num_seqs=1)
    with pytest.raises(ValueError, match="entropy"):
        policy_loss(d["logp"], d["old"], d["adv"], d["mask"], cfg, num_tokens=1, num_seqs=1)
    with pytest.raises(ValueError, match="ref_logp"):
        policy_loss(d["logp"], d["old"], d["adv"], d["mask"], LossConfig.preset("grpo"),
                    num_tokens=1, num_seqs=1)
    with pytest.raises(ValueError, match="num_tokens"):
        policy_loss(d["logp"], d["old"], d["adv"], d["mask"], LossConfig.preset("dapo"),
                    num_tokens=0, num_seqs=1)
    with pytest.raises(ValueError, match="unknown method 'ppo'"):
        LossConfig.preset("ppo")
    with pytest.raises(ValueError, match="unknown aggregation"):
        LossConfig(aggregation="sum")
    with pytest.raises(ValueError, match="max_new_tokens"):
        LossConfig.preset("drgrpo")


def test_metric_tokens_normalise_the_metrics_not_the_loss():
    d = make_batch(seed=23)
    cfg = LossConfig.preset("dapo")
    ntok = d["mask"].sum()
    loss_a, m_a = run_loss(d, cfg)
    loss_b, m_b = run_loss(d, cfg, metric_tokens=ntok / 4)
    assert loss_a.item() == loss_b.item()
    assert m_b["actor/clip_frac_high"].item() == pytest.approx(4 * m_a["actor/clip_frac_high"].item())
    assert m_b["actor/ratio_max"].item() == m_a["actor/ratio_max"].item()


# ----------------------------------------------------------------------------- mismatch correction

def test_is_weights_by_hand():
    """Two responses of 3 and 2 tokens (the last slot of the second is padding), C = 2:
    log w per token = old - rollout = [ln 3, ln 1.5, -ln 4] and [ln 0.8, 0.5 | pad]."""
    old = torch.log(torch.tensor([[3.0, 1.5, 0.25], [0.8, 1.0, 7.0]]))
    rollout = torch.zeros(2, 3)
    old[1, 1], rollout[1, 1] = 0.0, math.log(2.0)          # w = 1/2 exactly at the lower edge
    mask = torch.tensor([[1.0, 1, 1], [1, 1, 0]])
    w = lambda mode, level: tepo.is_weights(old, rollout, mask, mode, level, 2.0)  # noqa: E731
    # token level: tis caps 3 at 2; mask drops 3 and 1/4, keeps 1.5, 0.8 and 1/2 (the edge).
    assert torch.allclose(w("tis", "token")[:, :2], torch.tensor([[2.0, 1.5], [0.8, 0.5]]))
    assert w("tis", "token")[0, 2].item() == pytest.approx(0.25)
    assert torch.allclose(w("mask", "token")[0], torch.tensor([0.0, 1.5, 0.0]))
    assert torch.allclose(w("mask", "token")[1, :2], torch.tensor([0.8, 0.5]))
    # sequence level: products 3 * 1.5 / 4 = 1.125 and 0.8 * 0.5 = 0.4 (the padding's 7 left out).
    seq_tis, seq_mask = w("tis", "sequence"), w("mask", "sequence")
    assert torch.allclose(seq_tis[0], torch.full((3,), 1.125))
    assert torch.allclose(seq_tis[1, :2], torch.full((2,), 0.4))
    assert torch.allclose(seq_mask[0], torch.full((3,), 1.125))
    assert torch.all(seq_mask[1, :2] == 0)                   # 0.4 < 1/2: the whole response dropped
    # No overflow for a long response far off: log w = 300 -> tis gives C, mask gives 0.
    far = tepo.is_weights(torch.full((1, 100), 3.0), torch.zeros(1, 100), torch.ones(1, 100),
                          "tis", "sequence", 2.0)
    assert torch.allclose(far, torch.full((1, 100), 2.0))
    assert torch.all(tepo.is_weights(torch.full((1, 100), 3.0), torch.zeros(1, 100),
                                     torch.ones(1, 100), "mask", "sequence", 2.0) == 0)


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_masked_is_metrics_and_gradient(level):
    """mismatch/masked_frac is the share of (trained) tokens whose weight is 0, mismatch/is_weight
    their mean weight; dropped tokens get no gradient, kept ones their weight times DAPO's."""
    d = make_batch(seed=23, spread=0.05)
    d["rollout"] = d["old"] + 0.3 * torch.randn(d["old"].shape, generator=torch.Generator().manual_seed(1))
    cfg = LossConfig.preset("dapo", is_correction="mask", is_level=level, is_cap=1.25)
    logp = d["logp"].clone().requires_grad_()
    loss, m = run_loss(d, cfg, logp=logp)
    loss.backward()
    mask = d["mask"] > 0
    log_w = (d["old"] - d["rollout"]) * d["mask"]
    if level == "sequence":
        log_w = log_w.sum(1, keepdim=True).expand_as(log_w)
    kept = log_w.abs() <= math.log(1.25)
    assert (kept & mask).any() and (~kept & mask).any(), "the batch should have both"
    ntok = d["mask"].sum()
    assert m["mismatch/masked_frac"].item() == pytest.approx(((~kept) & mask).sum().item() / ntok.item())
    assert m["mismatch/is_weight"].item() == pytest.approx(
        (torch.exp(log_w) * kept)[mask].sum().item() / ntok.item())
    assert torch.all(logp.grad[~kept & mask] == 0)
    plain = d["logp"].clone().requires_grad_()
    run_loss(d, LossConfig.preset("dapo"), logp=plain)[0].backward()
    assert torch.allclose(logp.grad[kept & mask], (plain.grad * torch.exp(log_w))[kept & mask],
                          atol=1e-12)


def test_is_correction_is_checked():
    with pytest.raises(ValueError, match="is_correction"):
        LossConfig.preset("tepo", is_correction="clip")
    with pytest.raises(ValueError, match="is_level"):
        LossConfig.preset("tepo", is_level="batch")
    with pytest.raises(ValueError, match="is_cap"):
        LossConfig.preset("tepo", is_cap=1.0)


@pytest.mark.parametrize("method", METHODS)
def test_a_log_ratio_of_100_is_clamped_not_nan(method):
    """One token whose log-ratio is 100 (bf16 drift, a bad sync) in float32: exp would give inf,
    and inf * (A = 0) NaN, which skips the whole step. Clamped at +-20 before exp (verl's bound),
    the loss and gradient stay finite and the clamped tokens are counted."""
    d = {k: v.float() for k, v in make_batch(seed=23).items()}
    d["adv"][0], d["adv"][1] = 0.0, 0.7                  # the wild token in an A = 0 sequence ...
    d["logp"][0, 1] = d["old"][0, 1] + 100.0
    d["logp"][1, 0] = d["old"][1, 0] - 100.0             # ... and one far below in a rewarded one
    cfg = LossConfig.preset(method, max_new_tokens=9)
    logp = d["logp"].clone().requires_grad_()
    loss, m = run_loss(d, cfg, logp=logp)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all()
    assert m["actor/ratio_max"] <= math.exp(tepo.MAX_LOG_RATIO) * (1 + 1e-6)
    if cfg.ratio == "token":                             # the two tokens, of all response tokens
        assert m["actor/ratio_clamped_frac"].item() == pytest.approx(2 / d["mask"].sum().item())
    else:  # a sequence's mean log-ratio: +100/len and -100/len, over 20 only for the short ones
        lens = d["mask"].sum(1)
        over = [i for i in (0, 1) if 100 / lens[i] > tepo.MAX_LOG_RATIO]
        want = sum(lens[i].item() for i in over) / d["mask"].sum().item()
        assert m["actor/ratio_clamped_frac"].item() == pytest.approx(want)
