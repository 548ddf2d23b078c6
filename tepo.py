"""TEPO and the baselines it is measured against: advantages, log-probs, and every policy loss.

Notation (one RL batch): P prompts, each sampled G times (a *group*), N = P*G responses y_i.
`mask` m[i,t] is 1 on response tokens (0 on prompt and padding); |y_i| = sum_t m[i,t].
`logp` = log pi_theta(y_t | x, y_<t) at the sampling temperature; `old_logp` the same under the
policy that sampled the batch (recomputed by the trainer, no grad); `ref_logp` under the frozen
initial policy; `entropy` H[i,t] of the full next-token distribution. sg() is stop-gradient.

    advantage      A_i     = (R_i - mean_group R) / (std_group R + eps)     (Dr.GRPO: no division)
    token ratio    r[i,t]  = exp(logp - old_logp)                             (log clamped to +-20)
    seq. ratio     s_i     = exp( sum_t m (logp - old_logp) / |y_i| )        (geometric mean of r)
                   s[i,t]  = sg(s_i) * exp(logp - sg(logp))     value s_i, gradient s_i * grad(logp)
    surrogate      l[i,t]  = -min(rho A_i, clip(rho, 1 - eps_low, 1 + eps_high) A_i),  rho = r or s

Aggregation over the *global* mini-batch (all ranks and micro-batches; hence `num_tokens` and
`num_seqs` are passed in, so micro-batch losses sum to exactly the mini-batch loss):
    token-mean               sum m*l / sum m
    seq-mean-token-mean      mean_i( sum_t m*l / |y_i| )
    seq-mean-token-sum-norm  sum m*l / (N * L_max)           (Dr.GRPO; L_max = max response length)

    method  ratio  eps_low/eps_high  aggregation              extra
    grpo    r      0.2 / 0.2         seq-mean-token-mean      + beta * KL(pi || pi_ref), k3, beta 0.04
    drgrpo  r      0.2 / 0.2         seq-mean-token-sum-norm  advantages not divided by std
    dapo    r      0.2 / 0.28        token-mean               (rewards +1/-1, dynamic sampling, overlong shaping: train.py)
    gspo    s      3e-4 / 4e-4       seq-mean-token-mean
    tepo    s      3e-4 / 4e-4       token-mean               + token-level KL mask (below)
    clipcov r      0.2 / 0.28        token-mean               Clip-Cov: a few tokens' gradient cut (below)
    klcov   r      (no clip)         token-mean               KL-Cov: |log r| on the top-cov tokens (below)
    gmpo    r      0.4 / 0.4 (log)   seq-mean-token-mean      geometric mean of clipped token ratios (below)
    cispo   r      1 / 4             token-mean               the clipped ratio a constant weight (below)
    sapo    r      (no clip)         seq-mean-token-mean      a smooth gate, tau 1.0 / 1.05 (below)

TEPO (Lin et al., arXiv 2510.09369 / ACL 2026): the group reward reaches every token through the
same sequence-likelihood ratio s_i, and the loss is a token-mean, so every token of the batch
weighs the same (GSPO instead averages per sequence first). Its KL mask penalises drift only where
the policy is sharpening on rewarded tokens:
    M[i,t] = m[i,t] * 1[A_i > 0] * 1[H[i,t] < H_old[i,t]]
    loss  += beta_mask * sum M * k3(target_logp, logp) / sum m      (target = pi_old, or pi_ref)
The parts the paper leaves open (clip range, beta_mask = 0.1, target pi_old) are our choices and
live in LossConfig.

The entropy-control baselines TEPO is set against (Cui et al. 2025, arXiv 2505.22617, as verl's
`clip_cov` and `kl_cov` losses; ../shared/ENTROPY_BASELINES.md). Both read each token's centred
covariance of log-prob and advantage over the tokens of the batch it is computed on:
    cov[i,t] = (A_i - mean_m A) * (sg(logp[i,t]) - mean_m sg(logp))
    n        = max(1, floor(cov_ratio * sum m))                            (cov_ratio 2e-4)
    Clip-Cov: the clipped surrogate l above; of the tokens the clip left alone with
              cov_lb < cov < cov_ub (1 and 5), n chosen uniformly at random get l * 0
    KL-Cov:   l = -A_i r (no clip); the n tokens of largest cov get + kl_cov_coef * |logp - old_logp|
The batch of the selection (`cov_batch`) is ours: "minibatch" (default) selects over the whole
mini-batch on all ranks, so the choice does not depend on how the batch is cut (train.py computes
it before the mini-batch's update, from an extra forward pass without grad); "microbatch" selects
within each micro-batch, as verl does. Its tokens (`cov_tokens`) are ours too: "trained" (default),
those of the responses with A != 0, which the update forwards anyway; "all", every response token,
as verl does (the update then forwards the A = 0 responses too: one forward and backward more).
Any method may add an entropy bonus, aggregated like the policy loss, over every response token
(those of A = 0 responses too):
    loss -= entropy_coef * agg(H)                                          (entropy_coef 0: off)

The losses that followed (../shared/NEWER_BASELINES.md; verl's `geo_mean`, `cispo`, `sapo`), each
a `surrogate` in place of the clipped l above, on the token log-ratio delta = logp - old_logp:
    GMPO:  d[i,t] = sign(A_i) min(sign(A_i) delta, sign(A_i) clamp(delta, -eps_low, eps_high))
           rho_i  = exp( sum_t m d / |y_i| ),   l[i,t] = -A_i sg(rho_i) exp(d - sg(d))
           (value -A_i rho_i on each token, so seq-mean-token-mean is mean_i(-A_i rho_i) and its
           gradient; delta not clamped to +-20, the mean of d is, before exp)
    CISPO: l[i,t] = -sg(clamp(r, 1 - eps_low, 1 + eps_high)) A_i logp       (every token keeps a grad)
    SAPO:  l[i,t] = -A_i sigmoid(tau (r - 1)) 4 / tau,  tau = tau_pos if A_i > 0 else tau_neg
The clip ranges of GMPO and CISPO and SAPO's temperatures are ours until checked (LossConfig).
And the 80/20 rule (Wang et al. 2025, arXiv 2506.01939; TRL's `top_entropy_quantile`), on any
method: the policy term only on the tokens whose entropy H (the policy's at the mini-batch's start,
as its update's forward computes it) is at or above the (1 - top_entropy_frac)-quantile of the
mini-batch's over all ranks (torch.quantile's linear interpolation), the rest 0 with the
denominators unchanged; chosen by train.py among the tokens of the responses with A != 0 (a KL
term that trains the others does not move the threshold: docs/CONFIG.md), by policy_loss alone
among all of its batch's response tokens (TRL's):
    l[i,t] *= 1[H[i,t] >= quantile_{1 - top_entropy_frac}(H)]               (top_entropy_frac 0: off)

Off by default, for every method: a correction of the sampler/trainer mismatch (the sampler's
kernels and dtype score tokens a little differently from the trainer): each token's surrogate
times a constant importance weight w = pi_old / pi_rollout, per token or per sequence, capped at
C (truncated IS) or dropped outside [1/C, C] (masked IS). See `is_weights`.
"""
import math
from dataclasses import dataclass, fields

import torch

METHODS = ("grpo", "drgrpo", "dapo", "gspo", "tepo", "clipcov", "klcov", "gmpo", "cispo", "sapo")
AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
KL_KINDS = ("k1", "k2", "k3")
COV_KINDS = ("none", "clip", "kl")
SURROGATES = ("clip", "gmpo", "cispo", "sapo")
MAX_LOG_RATIO = 20.0  # |log pi/pi_old| (token, or the sequence's mean) is clamped here before exp


# ----------------------------------------------------------------------------- advantages

def group_advantages(rewards, group_size, normalize_std=True, eps=1e-6):
    """(N,) rewards of P groups of `group_size` consecutive responses -> (N,) advantages.

    A_i = (R_i - mean) / (std + eps) within each group (std unbiased, as in GRPO); a group whose
    rewards are all equal gets exactly 0, since nothing in it tells good from bad (and train.py
    skips sequences with A = 0).
    """
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D (N,), got shape {tuple(rewards.shape)}")
    if group_size < 1 or rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    r = rewards.float().view(-1, group_size)
    centered = r - r.mean(dim=1, keepdim=True)
    if normalize_std and group_size > 1:
        centered = centered / (r.std(dim=1, keepdim=True) + eps)
    # Equal rewards: exactly 0. The float mean of equal values can miss them by a rounding step,
    # and that noise over a std of ~1e-9 + eps gave eight rewards of 0.1 A = -0.0074 each.
    flat = (r == r[:, :1]).all(dim=1, keepdim=True)           # (P, 1)
    return centered.masked_fill(flat, 0.0).view(-1)


# ----------------------------------------------------------------------------- log-probs

def _row_chunks(B, T, V, max_elems):
    """(b, t0, t1) ranges covering a (B, T, V) tensor, each at most ~max_elems logits."""
    rows = max(1, max_elems // V)
    for b in range(B):
        for t0 in range(0, T, rows):
            yield b, t0, min(T, t0 + rows)


class _ChunkedLogProb(torch.autograd.Function):
    """log softmax(logits / temperature)[target], one chunk of rows at a time, in fp32.

    Autograd through a plain log_softmax would keep an fp32 (B, T, V) copy for the backward
    pass, several times the size of bf16 logits. Here the forward keeps only the log-sum-exp per
    row (B, T); the backward recomputes each chunk's softmax and writes the gradient
    d logp / d logits = (onehot(target) - softmax) / temperature straight into a logits-sized
    buffer. Entropy comes from the same forward chunks; its gradient (an entropy bonus) is
    recomputed the same way, dH/dz = -p (log p + H), and costs nothing when no loss reads H.
    """

    @staticmethod
    def forward(ctx, logits, targets, temperature, with_entropy, max_elems):
        B, T, V = logits.shape
        logp = torch.empty(B, T, dtype=torch.float32, device=logits.device)
        lse = torch.empty_like(logp)
        entropy = torch.empty_like(logp) if with_entropy else None
        # Two chunk buffers, reused: fresh allocations per chunk cost page faults on CPU.
        rows = max(1, max_elems // V)
        z_buf = torch.empty(rows, V, dtype=torch.float32, device=logits.device)
        p_buf = torch.empty_like(z_buf) if with_entropy else None
        for b, t0, t1 in _row_chunks(B, T, V, max_elems):
            z = z_buf[: t1 - t0].copy_(logits[b, t0:t1])       # (c, V) in fp32
            if temperature != 1.0:
                z.div_(temperature)
            z_lse = torch.logsumexp(z, dim=-1)                 # (c,)
            z.sub_(z_lse[:, None])                             # z is now log-probabilities
            logp[b, t0:t1] = z.gather(1, targets[b, t0:t1, None]).squeeze(1)
            lse[b, t0:t1] = z_lse
            if with_entropy:                                   # H = -sum p log p
                p = torch.exp(z, out=p_buf[: t1 - t0])
                entropy[b, t0:t1] = -(p.mul_(z)).sum(-1)
        ctx.save_for_backward(logits, targets, lse, entropy)
        ctx.temperature, ctx.max_elems = temperature, max_elems
        ctx.set_materialize_grads(False)  # no entropy term in the loss: its gradient stays None
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        logits, targets, lse, entropy = ctx.saved_tensors
        B, T, V = logits.shape
        grad = torch.empty(B, T, V, dtype=logits.dtype, device=logits.device)
        g_all = (torch.zeros(B, T, dtype=torch.float32, device=logits.device) if grad_logp is None
                 else grad_logp.float() / ctx.temperature)
        g_ent = None if grad_entropy is None else grad_entropy.float() / ctx.temperature
        rows = max(1, ctx.max_elems // V)
        p_buf = torch.empty(rows, V, dtype=torch.float32, device=logits.device)
        z_buf = torch.empty_like(p_buf) if g_ent is not None else None
        for b, t0, t1 in _row_chunks(B, T, V, ctx.max_elems):
            p = p_buf[: t1 - t0].copy_(logits[b, t0:t1])
            if ctx.temperature != 1.0:
                p.div_(ctx.temperature)
            p.sub_(lse[b, t0:t1, None])                        # log-probabilities
            g = g_all[b, t0:t1, None]
            if g_ent is None:
                p.exp_().mul_(-g)                              # -g * softmax
            else:  # d(g_H H)/dz = -g_H p (log p + H); together: -p (g + g_H (log p + H))
                z = z_buf[: t1 - t0].copy_(p).add_(entropy[b, t0:t1, None]).mul_(g_ent[b, t0:t1, None])
                p.exp_().mul_(z.add_(g).neg_())
            p.scatter_add_(1, targets[b, t0:t1, None], g)
            grad[b, t0:t1] = p
        return grad, None, None, None, None


def token_logprobs_entropy(logits, targets, temperature=1.0, with_entropy=True,
                           max_chunk_elems=2**24):
    """(B, T, V) logits, (B, T) targets -> logp (B, T) fp32 with grad, entropy (B, T) fp32 or None.

    logp[b, t] = log softmax(logits[b, t] / temperature)[targets[b, t]] and entropy[b, t] the
    entropy of that distribution (with grad too: an entropy bonus). Computed in chunks of at most
    `max_chunk_elems` logits in fp32, whatever the logits' dtype, so memory beyond the logits and their gradient
    stays one chunk: a full-vocabulary fp32 log-softmax is never materialised. `logits` may be a
    non-contiguous view (e.g. `logits[:, :-1]`); it is not copied.
    """
    if logits.dim() != 3 or targets.shape != logits.shape[:2]:
        raise ValueError(f"logits must be (B, T, V) and targets (B, T); got "
                         f"{tuple(logits.shape)} and {tuple(targets.shape)}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    return _ChunkedLogProb.apply(logits, targets.long(), float(temperature), with_entropy,
                                 int(max_chunk_elems))


# The chunked LM head: log-probs and entropy from the last hidden states, never the logits.

HEAD_CHUNK_ELEMS = 2**26  # logits per chunk of _ChunkedHead (441 positions at a vocabulary of 151,936)
HEAD_GRAD_ROWS = 16384    # the weight gradient's rows per matmul where it sums in another dtype


def _head_logits(h, weight, bias, dtype, softcap):
    """(c, H) hidden states -> (c, V) logits in fp32 (fp64 for fp64 inputs): the head's matmul in
    `dtype` (the compute dtype: bf16 under mixed precision, as the model's own head), then the final
    soft-capping (Gemma's cap * tanh(z / cap); `softcap` None: none)."""
    z = torch.nn.functional.linear(h.to(dtype), weight, bias).to(torch.promote_types(dtype, torch.float32))
    if softcap is not None:
        z = torch.tanh(z.div_(softcap)).mul_(softcap)
    return z


class _ChunkedHead(torch.autograd.Function):
    """log softmax(cap(hidden @ W^T + b) / temperature)[target] and the entropy, a chunk of rows at
    a time: the (N, V) logits and their gradient never exist whole.

    The forward keeps the log-sum-exp and the entropy per row (N,); the backward recomputes each
    chunk's logits (one matmul more than a plain head's backward, the price of the memory) and
    accumulates d hidden = g_z W and d W = g_z^T hidden, with d logp / du = onehot(target) - p and
    d H / du = -p (log p + H) at u = logits / temperature, as _ChunkedLogProb; through the soft-cap
    d cap(z) / dz = 1 - (cap(z) / cap)^2. The weight's gradient sums over chunks in fp32, whatever
    the compute dtype, and is returned in the weight's dtype.
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature, softcap, with_entropy, rows):
        N = hidden.shape[0]
        dtype = hidden.dtype if not torch.is_autocast_enabled(hidden.device.type) else \
            torch.get_autocast_dtype(hidden.device.type)  # the dtype the model's own head computes in
        w, b = weight.to(dtype), None if bias is None else bias.to(dtype)
        logp = torch.empty(N, dtype=torch.promote_types(dtype, torch.float32), device=hidden.device)
        lse = torch.empty_like(logp)
        entropy = torch.empty_like(logp) if with_entropy else None
        with torch.autocast(hidden.device.type, enabled=False):
            for i in range(0, N, rows):
                z = _head_logits(hidden[i:i + rows], w, b, dtype, softcap)     # (c, V) fp32
                if temperature != 1.0:
                    z.div_(temperature)
                z_lse = torch.logsumexp(z, dim=-1)                             # (c,)
                z.sub_(z_lse[:, None])                                         # log-probabilities
                logp[i:i + rows] = z.gather(1, targets[i:i + rows, None]).squeeze(1)
                lse[i:i + rows] = z_lse
                if with_entropy:
                    entropy[i:i + rows] = -(z.exp().mul_(z)).sum(-1)
                del z  # before the next chunk's matmul: one (c, V) chunk alive, not two
        ctx.save_for_backward(hidden, weight, bias, targets, lse, entropy)
        ctx.temperature, ctx.softcap, ctx.rows, ctx.dtype = temperature, softcap, rows, dtype
        ctx.set_materialize_grads(False)  # no entropy term in the loss: its gradient stays None
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        hidden, weight, bias, targets, lse, entropy = ctx.saved_tensors
        T, cap, rows, dtype = ctx.temperature, ctx.softcap, ctx.rows, ctx.dtype
        N = hidden.shape[0]
        w, b = weight.to(dtype), None if bias is None else bias.to(dtype)
        acc = lse.dtype  # fp32 (fp64 for fp64 inputs): the softmax's, and the weight gradient's sum
        g_all = (torch.zeros(N, dtype=acc, device=hidden.device) if grad_logp is None
                 else grad_logp.to(acc) / T)
        g_ent = None if grad_entropy is None else grad_entropy.to(acc) / T
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_w else None
        grad_b = torch.zeros(bias.shape, dtype=acc, device=bias.device) if need_b else None
        with torch.autocast(hidden.device.type, enabled=False):
            for i in range(0, N, rows):
                h = hidden[i:i + rows].to(dtype)
                z = _head_logits(h, w, b, dtype, cap)
                if T != 1.0:
                    z.div_(T)
                lp = z.sub_(lse[i:i + rows, None])                             # log-probabilities
                g = g_all[i:i + rows, None]
                if g_ent is None:
                    gz = lp.exp().mul_(-g)                                     # -g * softmax
                else:  # -p (g + g_H (log p + H))
                    gz = (lp + entropy[i:i + rows, None]).mul_(g_ent[i:i + rows, None]).add_(g)
                    gz.mul_(lp.exp()).neg_()
                gz.scatter_add_(1, targets[i:i + rows, None], g)
                if cap is not None:  # cap(z) / cap = T (log p + lse) / cap
                    s = lp.add_(lse[i:i + rows, None]).mul_(T / cap)
                    gz.mul_(s.square_().neg_().add_(1.0))
                    del s
                if need_b:
                    grad_b.add_(gz.sum(0))
                gz = gz.to(dtype)                                              # (c, V) d loss / d logits
                if need_h:
                    grad_h[i:i + rows] = gz @ w
                if need_w:  # in place where the matmul's dtype is the sum's; else a slice of rows at a time
                    if dtype == acc:
                        grad_w.addmm_(gz.t(), h)
                    else:
                        for v in range(0, gz.shape[1], HEAD_GRAD_ROWS):
                            grad_w[v:v + HEAD_GRAD_ROWS].add_(gz[:, v:v + HEAD_GRAD_ROWS].t() @ h)
                del z, lp, gz  # before the next chunk's matmul: one (c, V) chunk alive at a time
        return (grad_h, None if grad_w is None else grad_w.to(weight.dtype),
                None if grad_b is None else grad_b.to(bias.dtype), None, None, None, None, None)


def head_logprobs_entropy(hidden, weight, bias, targets, temperature=1.0, with_entropy=True, softcap=None,
                          max_chunk_elems=None):
    """(..., H) last hidden states, the LM head's (V, H) weight and (V,) bias or None, (...) targets
    -> logp (...) with grad, entropy (...) or None, fp32 (fp64 for fp64 inputs): those
    token_logprobs_entropy gives on the logits softcap(hidden @ weight^T + bias), computed without
    them (_ChunkedHead: chunks of at most `max_chunk_elems` logits, None: HEAD_CHUNK_ELEMS).
    Gradients reach the hidden states, the weight (an embedding's, when tied) and the bias.
    `softcap`: the model's final logit soft-capping (Gemma's), or None.
    """
    if targets.shape != hidden.shape[:-1] or weight.dim() != 2 or hidden.shape[-1] != weight.shape[1]:
        raise ValueError(f"hidden must be (..., H), weight (V, H) and targets (...); got "
                         f"{tuple(hidden.shape)}, {tuple(weight.shape)} and {tuple(targets.shape)}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    rows = max(1, int(max_chunk_elems or HEAD_CHUNK_ELEMS) // weight.shape[0])
    flat = hidden.reshape(-1, hidden.shape[-1])
    logp, ent = _ChunkedHead.apply(flat, weight, bias, targets.reshape(-1).long(), float(temperature),
                                   None if softcap is None else float(softcap), with_entropy, rows)
    return logp.view(targets.shape), None if ent is None else ent.view(targets.shape)


def kl_estimate(logp, target_logp, kind="k3"):
    """Per-token estimate of KL(pi || pi_target) from log-probs of tokens sampled from pi. Any shape.

    With delta = target_logp - logp (Schulman's estimators): k1 = -delta (unbiased, can be
    negative), k2 = delta^2 / 2, k3 = exp(delta) - delta - 1 (unbiased and >= 0, GRPO's choice).
    delta is clamped to +-20 so one wild token cannot overflow exp.
    """
    delta = (target_logp - logp).clamp(-20.0, 20.0)
    if kind == "k1":
        return -delta
    if kind == "k2":
        return 0.5 * delta ** 2
    if kind == "k3":
        return torch.exp(delta) - delta - 1.0
    raise ValueError(f"unknown KL estimator {kind!r}; choose one of {KL_KINDS}")


def is_weights(old_logp, rollout_logp, mask, mode, level, cap):
    """(B, T) constant weights that correct for sampling from pi_rollout (vLLM, bf16 kernels)
    while the loss assumes pi_old (the trainer's log-probs of the same weights). All (B, T).

    w = pi_old / pi_rollout of each token (level "token"), or of the whole response, the product
    over its tokens, carried to each of them (level "sequence": the exact weight of a sequence,
    with a variance that grows with its length). mode "tis" (truncated IS): min(w, C), the bias of
    the cap traded for bounded variance. mode "mask" (masked IS): w where 1/C <= w <= C, else 0:
    the token (or the whole response) is dropped from the loss, its tokens still counted in the
    normaliser, as a weight of 0. Computed in log space, so a long response cannot overflow.
    """
    log_w = (old_logp - rollout_logp) * mask
    if level == "sequence":
        log_w = log_w.sum(1, keepdim=True).expand_as(log_w)
    log_c = math.log(cap)
    if mode == "tis":
        return torch.exp(log_w.clamp(max=log_c))
    return torch.where(log_w.abs() <= log_c, torch.exp(log_w.clamp(-log_c, log_c)), 0.0)


# ----------------------------------------------------------------------------- losses

@dataclass
class LossConfig:
    """Everything that defines a method's loss. `LossConfig.preset(method)` gives the defaults."""
    method: str = "tepo"
    ratio: str = "sequence"              # "token" (r) or "sequence" (s, GSPO/TEPO)
    clip_low: float = 3e-4               # eps_low
    clip_high: float = 4e-4              # eps_high
    aggregation: str = "token-mean"
    max_new_tokens: int = 0            # L_max of seq-mean-token-sum-norm (Dr.GRPO)
    adv_std_norm: bool = True            # divide advantages by the group std (Dr.GRPO: False)
    kl_coef: float = 0.0                 # beta of the KL-to-reference term (GRPO: 0.04)
    kl_kind: str = "k3"
    kl_mask: bool = False                # TEPO's token-level KL mask
    kl_mask_coef: float = 0.1            # beta_mask (ours)
    kl_mask_target: str = "old"          # "old" (ours) or "ref"
    # Rollout/trainer mismatch correction (off-policy by the sampler's kernels): is_weights().
    is_correction: str = "none"          # none | tis (truncated IS) | mask (masked IS)
    is_level: str = "token"              # token: pi_old/pi_rollout per token; sequence: the product
    is_cap: float = 2.0                  # C: tis caps the weight at C; mask drops it outside [1/C, C]
    entropy_coef: float = 0.0            # entropy bonus: loss -= entropy_coef * agg(H) (any method)
    # The covariance-selected tokens of Clip-Cov / KL-Cov (cov_select): defaults as verl's.
    cov: str = "none"                    # none | clip (Clip-Cov) | kl (KL-Cov); set by the presets
    cov_ratio: float = 2e-4              # the share n / sum m of tokens selected (at least one)
    cov_lb: float = 1.0                  # Clip-Cov: the band of cov its candidates lie in
    cov_ub: float = 5.0
    kl_cov_coef: float = 1.0             # KL-Cov: the weight of |logp - old_logp| on its tokens
    cov_batch: str = "minibatch"         # minibatch (over all ranks; ours) | microbatch (verl's)
    cov_tokens: str = "trained"          # the selection's tokens: trained (A != 0; ours) | all (verl's)
    # The surrogate of the policy term: PPO's clip, or a newer one (GMPO, CISPO, SAPO; set by the
    # presets); SAPO's gate temperatures (ours until checked against the paper: tau_neg > tau_pos).
    surrogate: str = "clip"              # clip | gmpo | cispo | sapo
    sapo_tau_pos: float = 1.0            # SAPO: tau where A > 0
    sapo_tau_neg: float = 1.05           # SAPO: tau where A <= 0 (larger: negative updates fade faster)
    # The 80/20 rule (any method): the policy term only on the mini-batch's top share of tokens by
    # entropy, over all ranks (top_entropy_select; train.py's selection over the mini-batch).
    top_entropy_frac: float = 0.0        # the share kept (the paper: 0.2); 0: off

    # Not a field (no annotation): the spec's table of method defaults.
    PRESETS = {
        "grpo": dict(ratio="token", clip_low=0.2, clip_high=0.2,
                     aggregation="seq-mean-token-mean", kl_coef=0.04),
        "drgrpo": dict(ratio="token", clip_low=0.2, clip_high=0.2,
                       aggregation="seq-mean-token-sum-norm", adv_std_norm=False),
        "dapo": dict(ratio="token", clip_low=0.2, clip_high=0.28, aggregation="token-mean"),
        "gspo": dict(ratio="sequence", clip_low=3e-4, clip_high=4e-4,
                     aggregation="seq-mean-token-mean"),
        "tepo": dict(ratio="sequence", clip_low=3e-4, clip_high=4e-4, aggregation="token-mean",
                     kl_mask=True),
        "clipcov": dict(ratio="token", clip_low=0.2, clip_high=0.28, aggregation="token-mean",
                        cov="clip"),
        "klcov": dict(ratio="token", clip_low=0.2, clip_high=0.28, aggregation="token-mean",
                      cov="kl"),  # the clip range is not used by KL-Cov's loss
        # The clip ranges of these three are ours (docs/CONFIG.md): GMPO's on the log-ratio, the
        # paper's (e^-0.4, e^0.4) as our notes give it; CISPO's weight with no floor (1 - 1 = 0)
        # and a cap of 5, "mainly from above" as the paper describes it. SAPO has no clip.
        "gmpo": dict(ratio="token", clip_low=0.4, clip_high=0.4, aggregation="seq-mean-token-mean",
                     surrogate="gmpo"),
        "cispo": dict(ratio="token", clip_low=1.0, clip_high=4.0, aggregation="token-mean",
                      surrogate="cispo"),
        "sapo": dict(ratio="token", aggregation="seq-mean-token-mean", surrogate="sapo"),
    }

    @classmethod
    def preset(cls, method, **overrides):
        """The spec's defaults for `method`, with any field overridden by keyword."""
        if method not in cls.PRESETS:
            raise ValueError(f"unknown method {method!r}; choose one of {METHODS}")
        return cls(method=method, **{**cls.PRESETS[method], **overrides})

    def __post_init__(self):
        choices = {"method": METHODS, "ratio": ("token", "sequence"), "aggregation": AGGREGATIONS,
                   "kl_kind": KL_KINDS, "kl_mask_target": ("old", "ref"),
                   "is_correction": ("none", "tis", "mask"), "is_level": ("token", "sequence"),
                   "cov": COV_KINDS, "cov_batch": ("minibatch", "microbatch"),
                   "cov_tokens": ("trained", "all"), "surrogate": SURROGATES}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"unknown {name} {getattr(self, name)!r}; choose one of {allowed}")
        if self.aggregation == "seq-mean-token-sum-norm" and self.max_new_tokens <= 0:
            raise ValueError("aggregation 'seq-mean-token-sum-norm' needs max_new_tokens > 0")
        if not self.is_cap > 1:
            raise ValueError(f"is_cap must be > 1 (the weights kept lie in [1/C, C]), got {self.is_cap}")
        if not (0 <= self.clip_low <= 1 and self.clip_high >= 0):
            raise ValueError(f"clip range must satisfy 0 <= clip_low <= 1 <= 1 + clip_high, got "
                             f"{self.clip_low}, {self.clip_high}")
        if self.cov != "none" and not 0 < self.cov_ratio <= 1:
            raise ValueError(f"cov_ratio must lie in (0, 1], got {self.cov_ratio}")
        if self.cov != "none" and self.ratio != "token":
            raise ValueError(f"cov {self.cov!r} (Clip-Cov / KL-Cov) is defined on the token ratio; "
                             f"got ratio {self.ratio!r}")
        if self.cov != "none" and self.surrogate != "clip":
            raise ValueError(f"cov {self.cov!r} (Clip-Cov / KL-Cov) is defined on PPO's clipped "
                             f"surrogate; got surrogate {self.surrogate!r}: set one or the other")
        if self.surrogate != "clip" and self.ratio != "token":
            raise ValueError(f"surrogate {self.surrogate!r} reads the token ratio; got ratio "
                             f"{self.ratio!r}: set ratio token")
        if not (self.sapo_tau_pos > 0 and self.sapo_tau_neg > 0):
            raise ValueError(f"sapo_tau_pos and sapo_tau_neg must be > 0, got {self.sapo_tau_pos}, "
                             f"{self.sapo_tau_neg}")
        if not 0 <= self.top_entropy_frac <= 1:
            raise ValueError(f"top_entropy_frac must lie in [0, 1] (the share of tokens kept; 0: "
                             f"off), got {self.top_entropy_frac}")

    @property
    def every_response_in_loss(self):
        """Whether a response with A = 0 still has a loss, so the update must forward it: a
        KL-to-reference term, an entropy bonus (over the tokens the normaliser counts), or a
        covariance selection over every response token (cov_tokens "all": its means and count
        take them in, and KL-Cov may penalise them). Else its gradient is 0 and the update skips
        it."""
        return (self.kl_coef > 0 or self.entropy_coef != 0
                or (self.cov != "none" and self.cov_tokens == "all"))

    @property
    def selects_over_minibatch(self):
        """Whether the update chooses tokens over the whole mini-batch before it (train.py's
        select_tokens: one more forward per mini-batch): Clip-Cov / KL-Cov's (cov_batch
        "minibatch"), the 80/20 rule's."""
        return (self.cov != "none" and self.cov_batch == "minibatch") or self.top_entropy_frac > 0

    @property
    def needs_ref(self):
        """Whether the loss reads reference-policy log-probs (so the trainer must compute them)."""
        return self.kl_coef > 0 or (self.kl_mask and self.kl_mask_target == "ref")

    def as_dict(self):
        return {f.name: getattr(self, f.name) for f in fields(self)}


def aggregate(x, mask, aggregation, *, num_tokens, num_seqs, max_new_tokens=0):
    """(B, T) per-token values -> scalar, normalised by the *global* counts of the mini-batch.

    Summing this over micro-batches (and ranks) gives the aggregate of the whole mini-batch,
    because every denominator is global and each sequence lives in exactly one micro-batch.
    """
    total = x * mask
    if aggregation == "token-mean":
        return total.sum() / num_tokens
    if aggregation == "seq-mean-token-mean":
        return (total.sum(1) / mask.sum(1)).sum() / num_seqs
    if aggregation == "seq-mean-token-sum-norm":
        return total.sum() / (num_seqs * max_new_tokens)
    raise ValueError(f"unknown aggregation {aggregation!r}; choose one of {AGGREGATIONS}")


def cov_scores(logp, old_logp, advantages, mask, cfg, keys, *, mean_logp, mean_adv):
    """Clip-Cov / KL-Cov: how each token ranks for the selection, and which may be chosen.

    logp, old_logp, mask, keys (B, T); advantages (B,); mean_logp, mean_adv the means over the
    masked-in tokens of the selection's batch (a micro-batch, or the mini-batch over all ranks),
    so the same tokens rank alike however the batch is cut. `keys` are uniform random numbers,
    one per token (float64: no two alike).
    -> score (B, T) float64 (KL-Cov: cov; Clip-Cov: the random key, so that taking the largest
    is a uniform draw), eligible (B, T) bool (KL-Cov: any response token; Clip-Cov: those with
    cov_lb < cov < cov_ub that the ordinary clip left alone), cov (B, T) float64.
    """
    m = mask > 0
    A = advantages.detach().double()[:, None]
    cov = (A - mean_adv) * (logp.detach().double() - mean_logp)
    if cfg.cov == "kl":
        return cov, m, cov
    r = torch.exp((logp.detach() - old_logp).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)).double()
    clipped = ((r > 1 + cfg.clip_high) & (A > 0)) | ((r < 1 - cfg.clip_low) & (A < 0))
    return keys, m & ~clipped & (cov > cfg.cov_lb) & (cov < cfg.cov_ub), cov


def cov_keys(shape, generator):
    """Uniform random keys (float64, so no two alike) that rank Clip-Cov's candidates and break
    KL-Cov's ties."""
    return torch.rand(shape, generator=generator, dtype=torch.float64)


def cov_count(num_tokens, cfg):
    """How many tokens Clip-Cov / KL-Cov select among `num_tokens`: max(1, floor(ratio * n))."""
    return max(1, int(cfg.cov_ratio * num_tokens))


def top_pairs(score, keys, eligible, n):
    """The n largest (score, key) pairs of the eligible tokens, in decreasing order (score first,
    the key breaking ties: equal scores are common, e.g. a response sampled twice). -> (k, 2)
    float64, k = min(n, eligible tokens)."""
    pairs = torch.stack([score[eligible], keys[eligible]], 1).double()
    pairs = pairs[torch.argsort(pairs[:, 1], descending=True, stable=True)]
    pairs = pairs[torch.argsort(pairs[:, 0], descending=True, stable=True)]
    return pairs[:n]


def at_or_above(score, keys, eligible, pair):
    """(B, T) bool: the eligible tokens whose (score, key) is at least `pair` (a (2,) threshold)."""
    s, k = pair[0].item(), pair[1].item()
    return eligible & ((score > s) | ((score == s) & (keys >= k)))


def cov_select(logp, old_logp, advantages, mask, cfg, keys):
    """(B, T) bool: the tokens Clip-Cov / KL-Cov select within this batch alone (means, count and
    ranking over its own tokens: `cov_batch: microbatch`, verl's). See cov_scores."""
    m = mask > 0
    score, eligible, _ = cov_scores(logp, old_logp, advantages, mask, cfg, keys,
                                    mean_logp=logp.detach().double()[m].mean(),
                                    mean_adv=advantages.double()[:, None].expand_as(mask)[m].mean())
    top = top_pairs(score, keys, eligible, cov_count(int(m.sum()), cfg))
    return at_or_above(score, keys, eligible, top[-1]) if len(top) else eligible


def top_entropy_count(num_tokens, frac):
    """How many of `num_tokens` tokens the 80/20 rule keeps: those whose entropy is at or above the
    (1 - frac)-quantile of all of them, linearly interpolated (torch.quantile's default), which
    are the num_tokens - ceil((1 - frac)(num_tokens - 1)) largest (in exact arithmetic: rounded to
    9 digits first), at least one of one or more; ties with the last one are kept too."""
    num_tokens = int(num_tokens)  # (a count summed over the ranks comes as a float)
    return num_tokens - math.ceil(round((1 - frac) * (num_tokens - 1), 9))


def top_entropy_select(entropy, mask, frac, *, num_tokens=None, nth=None):
    """(B, T) bool: the 80/20 rule's tokens: of the response tokens (mask (B, T)), those whose
    entropy (B, T) is at or above the n-th largest, n = top_entropy_count of the batch's tokens.
    Within this batch alone by default; over a mini-batch spread over the ranks given its
    `num_tokens` on all ranks and `nth(top, n)`, the n-th largest of every rank's `top` pairs
    (ranks.global_nth: train.py's select_tokens). No random key breaks ties: equal entropies are
    kept or left out together, so the choice is the same however the batch is cut or dealt."""
    m = mask > 0
    H = entropy.detach().double()
    ties = torch.zeros_like(H)
    n = top_entropy_count(int(m.sum()) if num_tokens is None else num_tokens, frac)
    if n == 0:  # no token of a response with A != 0 in the mini-batch (on any rank: n is global)
        return torch.zeros_like(m)
    top = top_pairs(H, ties, m, n)
    return at_or_above(H, ties, m, top[-1] if nth is None else nth(top, n))


def choose_cov(items, lcfg, num_tokens, keys, *, sums=None, nth=None):
    """Clip-Cov / KL-Cov's tokens of a mini-batch (cov_scores' rule): items [(logp (R,), old_logp (R,),
    A)] -> [(R,) bool], over `num_tokens` trained tokens. Within these items alone by default; spread
    over the ranks given `sums` (a dict's sum over the ranks: ranks.all_ranks) and `nth` (ranks.
    global_nth): the means over all ranks' tokens (summed in float64), each rank's n largest (score,
    key) pairs gathered, the n-th largest of them all the threshold: exactly the n tokens one process
    would pick from the whole mini-batch (train.py's select_tokens). `keys`: this rank's generator."""
    lens = [len(lp) for lp, _, _ in items]
    logp = torch.cat([lp for lp, _, _ in items] or [torch.zeros(0)]).double()[:, None]  # (N, 1)
    old = torch.cat([o for _, o, _ in items] or [torch.zeros(0)]).double()[:, None]
    adv = torch.tensor([a for (lp, _, a) in items for _ in range(len(lp))], dtype=torch.float64)
    total = (sums or (lambda d: d))({"logp": logp.sum(), "adv": adv.sum(), "n": len(adv)})
    n = cov_count(num_tokens, lcfg)
    key = cov_keys(logp.shape, keys)
    score, eligible, _ = cov_scores(logp, old, adv, torch.ones_like(logp), lcfg, key,
                                    mean_logp=total["logp"] / max(total["n"], 1),
                                    mean_adv=total["adv"] / max(total["n"], 1))
    top = top_pairs(score, key, eligible, n)
    threshold = nth(top, n) if nth else (top[n - 1] if len(top) >= n else None)  # (ranks.global_nth on one)
    sel = eligible if threshold is None else at_or_above(score, key, eligible, threshold)  # None: all of them
    return list(sel[:, 0].split(lens))


def newer_surrogate(logp, old_logp, ratio, A, mask, cfg):
    """The per-token loss (B, T) of GMPO, CISPO or SAPO (cfg.surrogate; the module docstring).
    logp (B, T) with grad, old_logp and mask (B, T), ratio the token ratio r (B, T; its log
    clamped to +-20), A (B, 1)."""
    if cfg.surrogate == "cispo":  # the clipped ratio, a constant weight: every token keeps grad(logp)
        return -ratio.clamp(1 - cfg.clip_low, 1 + cfg.clip_high).detach() * A * logp
    if cfg.surrogate == "sapo":   # slope 1 at r = 1 (the unclipped surrogate's), fading away from it
        tau = torch.where(A > 0, torch.full_like(A, cfg.sapo_tau_pos), torch.full_like(A, cfg.sapo_tau_neg))
        return -torch.sigmoid(tau * (ratio - 1)) * (4 / tau) * A
    # GMPO: each token's log-ratio clipped on the side its advantage favours (not clamped to +-20
    # first, as the reference implementation), their mean over the response the log of rho_i.
    # Carried to each token as the sequence ratio is: value rho_i, gradient rho_i * grad(d[i,t]),
    # so that seq-mean-token-mean gives mean_i(-A_i rho_i) and its exact gradient, and a token
    # masked out (the 80/20 rule) takes its own gradient along and nothing else.
    sign, log_r = torch.sign(A), logp - old_logp
    d = sign * torch.min(sign * log_r, sign * log_r.clamp(-cfg.clip_low, cfg.clip_high))
    log_rho = (d * mask).sum(1, keepdim=True) / mask.sum(1, keepdim=True)        # (B, 1)
    rho = torch.exp(log_rho.detach().clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))       # no inf past 88
    return -A * rho * torch.exp(d - d.detach())


def clip_sides(log_r, ratio, A, cfg):
    """(low, high) (B, T) bool: the tokens each side of the clip acts on. PPO's clip and GMPO's:
    the ratio past its bound on the side the advantage favours (below with A < 0, above with
    A > 0), where the token gets no gradient (GMPO: its log-ratio past -eps_low or eps_high).
    CISPO: the weight clamped below or above, whatever A (the token keeps its gradient). None for
    SAPO and KL-Cov, which do not clip. log_r, ratio (B, T) without grad; A (B, 1)."""
    if cfg.surrogate == "cispo":
        return ratio < 1 - cfg.clip_low, ratio > 1 + cfg.clip_high
    if cfg.surrogate == "gmpo":
        return (log_r < -cfg.clip_low) & (A < 0), (log_r > cfg.clip_high) & (A > 0)
    if cfg.surrogate == "sapo" or cfg.cov == "kl":
        return torch.zeros_like(ratio, dtype=torch.bool), torch.zeros_like(ratio, dtype=torch.bool)
    return (ratio < 1 - cfg.clip_low) & (A < 0), (ratio > 1 + cfg.clip_high) & (A > 0)


def _check_inputs(logp, old_logp, advantages, mask, cfg, num_tokens, num_seqs, optional):
    if logp.dim() != 2:
        raise ValueError(f"logp must be (B, T), got shape {tuple(logp.shape)}")
    B, T = logp.shape
    for name, t in [("old_logp", old_logp), ("mask", mask), *optional.items()]:
        if t is not None and t.shape != logp.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {(B, T)} like logp")
    if advantages.shape != (B,):
        raise ValueError(f"advantages must be (B,) = ({B},), got {tuple(advantages.shape)}")
    if not (mask.sum(1) > 0).all():
        raise ValueError("mask has a sequence with no response tokens (|y_i| = 0)")
    if not (num_tokens > 0 and num_seqs > 0):
        raise ValueError(f"num_tokens and num_seqs must be > 0, got {num_tokens}, {num_seqs}")
    own_top = cfg.top_entropy_frac > 0 and optional["entropy_sel"] is None  # chosen here, from H
    need = {"entropy": cfg.kl_mask or cfg.entropy_coef != 0 or own_top, "old_entropy": cfg.kl_mask,
            "ref_logp": cfg.needs_ref, "rollout_logp": cfg.is_correction != "none",
            "cov_sel": cfg.cov != "none"}
    for name, needed in need.items():
        if needed and optional[name] is None:
            raise ValueError(f"{cfg.method}: this LossConfig needs `{name}`")


def policy_loss(logp, old_logp, advantages, mask, cfg, *, num_tokens, num_seqs, entropy=None,
                old_entropy=None, ref_logp=None, rollout_logp=None, cov_sel=None, metric_tokens=None,
                entropy_sel=None):
    """The loss of one micro-batch and its diagnostics.

    logp (B, T) with grad; old_logp, mask, entropy (with grad for an entropy bonus), old_entropy,
    ref_logp, rollout_logp (B, T); advantages (B,); cov_sel (B, T) bool, the tokens Clip-Cov or
    KL-Cov selected (cov_select, or train.py's selection over the mini-batch); entropy_sel (B, T)
    bool, the 80/20 rule's tokens (train.py's choice over the mini-batch; None: chosen here by
    top_entropy_select from `entropy`, this batch taken as the whole mini-batch). `num_tokens` /
    `num_seqs` are the global counts of the whole mini-batch (all ranks and micro-batches), so
    the returned losses add up exactly across micro-batches.

    Returns (loss, metrics), the metrics under their metrics.jsonl names (loss/, actor/,
    mismatch/). Every metric is likewise a token mean normalised by a global count,
    `metric_tokens` (default `num_tokens`; e.g. the trained tokens when the caller leaves out
    sequences without gradient), so summing metrics over micro-batches and ranks gives the
    mini-batch value -- except those METRIC_REDUCE names, which reduce by min or max. With the KL
    mask (and logp with grad), actor/grad_w_policy and actor/grad_w_kl_mask: each term's
    sum over tokens of |d term / d logp_t|, normalised as the term is, so they add up alike.
    """
    optional = dict(entropy=entropy, old_entropy=old_entropy, ref_logp=ref_logp,
                    rollout_logp=rollout_logp, cov_sel=cov_sel, entropy_sel=entropy_sel)
    _check_inputs(logp, old_logp, advantages, mask, cfg, num_tokens, num_seqs, optional)
    mask = mask.to(logp.dtype)
    A = advantages.to(logp.dtype)[:, None]                     # (B, 1), broadcast over tokens
    log_r = logp - old_logp
    agg = dict(num_tokens=num_tokens, num_seqs=num_seqs, max_new_tokens=cfg.max_new_tokens)

    # log-ratios are clamped to +-MAX_LOG_RATIO before exp (as verl does): one token drifted past
    # ~88 nats (bf16, a bad sync) would give r = inf and inf * (A = 0) = NaN, and skip the step.
    if cfg.ratio == "token":
        clamped = log_r.detach().abs() > MAX_LOG_RATIO
        ratio = torch.exp(log_r.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))
    else:  # s_i carried to each token: value s_i, gradient s_i * grad(logp)
        log_s = (log_r * mask).sum(1, keepdim=True) / mask.sum(1, keepdim=True)   # (B, 1)
        clamped = (log_s.detach().abs() > MAX_LOG_RATIO).expand_as(log_r)
        ratio = torch.exp(log_s.detach().clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO) + logp - logp.detach())
    if cfg.surrogate != "clip":  # GMPO, CISPO, SAPO
        per_token = newer_surrogate(logp, old_logp, ratio, A, mask, cfg)
    elif cfg.cov == "kl":  # KL-Cov: no clip; |log r| holds its selected tokens near pi_old
        per_token = -ratio * A + cfg.kl_cov_coef * log_r.abs() * cov_sel.to(log_r.dtype)
    else:
        clipped = ratio.clamp(1 - cfg.clip_low, 1 + cfg.clip_high)
        per_token = -torch.min(ratio * A, clipped * A)
        if cfg.cov == "clip":  # Clip-Cov: the selected tokens' loss, and so gradient, is 0
            per_token = torch.where(cov_sel.bool(), 0.0, per_token)
    if cfg.is_correction != "none":  # rollout/trainer mismatch correction, a constant weight
        is_w = is_weights(old_logp, rollout_logp, mask, cfg.is_correction, cfg.is_level, cfg.is_cap)
        per_token = per_token * is_w
    if cfg.top_entropy_frac > 0:  # the 80/20 rule: the policy term on the high-entropy tokens alone
        if entropy_sel is None:
            entropy_sel = top_entropy_select(entropy, mask, cfg.top_entropy_frac)
        per_token = torch.where(entropy_sel.bool(), per_token, 0.0)  # the denominators unchanged
    pg_loss = aggregate(per_token, mask, cfg.aggregation, **agg)
    loss = pg_loss

    kl_ref_loss = kl_mask_loss = entropy_loss = torch.zeros((), device=logp.device)
    if cfg.entropy_coef != 0:  # the entropy bonus, aggregated as the policy term
        entropy_loss = -cfg.entropy_coef * aggregate(entropy, mask, cfg.aggregation, **agg)
        loss = loss + entropy_loss
    if cfg.kl_coef > 0:
        kl_ref_loss = cfg.kl_coef * aggregate(kl_estimate(logp, ref_logp, cfg.kl_kind), mask,
                                              cfg.aggregation, **agg)
        loss = loss + kl_ref_loss
    if cfg.kl_mask:
        # M = m * 1[A > 0] * 1[H < H_old]: tokens of rewarded responses whose entropy is falling.
        kl_m = mask * (A > 0) * (entropy.detach() < old_entropy)
        target = old_logp if cfg.kl_mask_target == "old" else ref_logp
        # Over sum m whatever the policy term's aggregation (TEPO_SPEC: beta_mask sum M k3 / sum m).
        kl_mask_loss = cfg.kl_mask_coef * aggregate(kl_m * kl_estimate(logp, target, "k3"),
                                                    mask, "token-mean", **agg)
        loss = loss + kl_mask_loss
    grad_w = {}
    if cfg.kl_mask and logp.requires_grad:
        # How hard the mask pulls beside the policy term: each term's sum over tokens of
        # |d term / d logp_t|, the weight it puts on the token's grad log pi (the backward through
        # the model carries both alike). Elementwise over (B, T): no pass through the model.
        for name, term in (("policy", pg_loss), ("kl_mask", kl_mask_loss)):
            g = torch.autograd.grad(term, logp, retain_graph=True, allow_unused=True)[0]
            grad_w[f"actor/grad_w_{name}"] = (g.detach().abs().double().sum() if g is not None
                                              else torch.zeros((), dtype=torch.float64))

    with torch.no_grad():
        n = metric_tokens or num_tokens
        # A token mean, globally normalised; in float64, as Cov(logp, A) subtracts two such sums.
        token_sum = lambda x: (x.double() * mask.double()).sum() / n  # noqa: E731
        r = ratio.detach()
        big = torch.finfo(r.dtype).max
        low, high = clip_sides(log_r.detach(), r, A, cfg)
        metrics = {
            "loss/policy": pg_loss.detach(), "loss/kl_ref": kl_ref_loss.detach(),
            "loss/kl_mask": kl_mask_loss.detach(),
            "actor/clip_frac_low": token_sum(low.float()), "actor/clip_frac_high": token_sum(high.float()),
            "actor/ratio_mean": token_sum(r),
            "actor/ratio_clamped_frac": token_sum(clamped.double()),
            "actor/ratio_min": torch.where(mask > 0, r, big).min(),
            "actor/ratio_max": torch.where(mask > 0, r, -big).max(),
            "actor/kl_old": token_sum(kl_estimate(logp.detach(), old_logp, "k3")),
        }
        if cfg.kl_mask:
            metrics["actor/kl_mask_frac"] = token_sum(kl_m)
            metrics.update(grad_w)
        if cfg.entropy_coef != 0:
            metrics["loss/entropy_bonus"] = entropy_loss.detach()
        if cfg.cov != "none":
            metrics["actor/cov_selected_frac"] = token_sum(cov_sel.bool().double())
        if cfg.top_entropy_frac > 0:
            metrics["actor/high_entropy_frac"] = token_sum(entropy_sel.bool().double())
        if ref_logp is not None:
            metrics["actor/kl_ref"] = token_sum(kl_estimate(logp.detach(), ref_logp, cfg.kl_kind))
        if cfg.is_correction != "none":
            metrics["mismatch/is_weight"] = token_sum(is_w)
            if cfg.is_correction == "mask":
                metrics["mismatch/masked_frac"] = token_sum((is_w == 0).double())
    return loss, metrics


# How policy_loss's metrics combine over micro-batches and ranks: these by min or max, every other
# one by its sum (each is normalised by a global count, so the sum is the mini-batch's value).
METRIC_REDUCE = {"actor/ratio_min": "min", "actor/ratio_max": "max"}


def step_metrics(reduced, *, optimizer_steps, mask_steps):
    """policy_loss's metrics of one RL step from `reduced` {name: its sum over every micro-batch and
    rank, or its min or max (METRIC_REDUCE)}: each sum averaged over the step's optimizer steps, the
    KL mask's gradient weights (actor/grad_w_*) over the `mask_steps` of them that read them (where
    the mask can act: train.update_policy), and the mask's share of the two. -> {name: float}"""
    metrics = {k: v if k in METRIC_REDUCE else v / max(mask_steps if k.startswith("actor/grad_w_")
                                                       else optimizer_steps, 1) for k, v in reduced.items()}
    if "actor/grad_w_kl_mask" in metrics:  # TEPO's mask: its share of the per-token gradient weight
        w = metrics["actor/grad_w_kl_mask"] + metrics["actor/grad_w_policy"]
        metrics["actor/kl_mask_grad_share"] = metrics["actor/grad_w_kl_mask"] / w if w > 0 else 0.0
    return metrics


# ----------------------------------------------------------------------------- a model's log-probs


# The causal LMs whose logits are lm_head(the base model's last hidden state), soft-capped after it
# where the config has Gemma's final_logit_softcapping (the forwards of transformers'
# Qwen2/Qwen3/Llama/Gemma3ForCausalLM): their log-probs can come from the hidden states through the
# head's weight (head_logprobs_entropy). Any other model's come from its logits, as it computes them.
HEAD_MODEL_TYPES = ("qwen2", "qwen3", "llama", "gemma3_text")
LM_HEADS = ("auto", "chunked", "logits")  # config `lm_head`: auto is chunked where the head is reachable


def unreachable_head(model):
    """Why `model`'s log-probs cannot come from its last hidden states through its head here, or
    None: a forward whose logits this code does not know to be lm_head(hidden states)."""
    kind = model.config.model_type
    if kind not in HEAD_MODEL_TYPES:
        return f"model_type {kind}: its logits are not known here to be lm_head(the last hidden states)"
    if not isinstance(model.get_output_embeddings(), torch.nn.Linear) or \
            not isinstance(getattr(model, "model", None), torch.nn.Module):
        return f"model_type {kind}: no linear lm_head after a base model `model`"
    return None


def chunked_head(model, lm_head):
    """Whether `model`'s log-probs come through head_logprobs_entropy under config `lm_head`: auto,
    where the head can be reached; chunked, or a ValueError saying why it cannot; logits, never."""
    if lm_head not in LM_HEADS:
        raise ValueError(f"lm_head must be one of {LM_HEADS}, not {lm_head!r}")
    why = unreachable_head(model) if lm_head != "logits" else "lm_head: logits"
    if why and lm_head == "chunked":
        raise ValueError(f"lm_head chunked: {why}; set lm_head: logits (or auto)")
    return why is None


def last_hidden(model, keep, **inputs):
    """The model's own call with its head on no position -> (the last hidden states (B, K, H) at
    `keep` (as logits_to_keep: an int n for the last n positions, 0 for all, or indices), its output).

    The model is called as a whole, not its base model alone, so that FSDP2's hooks on the root run
    as ever: the root's parameters (embeddings, final norm, lm_head) are gathered for the forward and
    stay so until its backward (fully_shard never reshards the root after forward), when their
    gradients are reduce-scattered with every other. head_params reads them there."""
    caught = []
    hook = model.model.register_forward_hook(lambda module, args, out: caught.append(out.last_hidden_state))
    try:
        none = torch.zeros(0, dtype=torch.long, device=inputs["input_ids"].device)
        out = model(**inputs, logits_to_keep=none)                               # logits (B, 0, V)
    finally:
        hook.remove()
    return caught[-1][:, slice(-keep, None) if isinstance(keep, int) else keep], out


def head_params(model):
    """(weight (V, H), bias (V,) or None, final soft-cap or None) of the model's LM head, as its
    forward has just used them: under FSDP2 the root's unsharded parameters (in the compute dtype
    under mixed precision), so the weight's gradient (the embedding's, when tied) reaches the
    parameter FSDP2 reduce-scatters."""
    head = model.get_output_embeddings()
    if hasattr(head.weight, "full_tensor"):
        raise RuntimeError("the LM head's weight is a shard (DTensor) after the forward: the model's "
                           "root was sharded with reshard_after_forward=True; use fully_shard's default")
    text = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return head.weight, head.bias, getattr(text, "final_logit_softcapping", None)


def response_logprobs(model, batch, temperature, with_entropy, lm_head="auto"):
    """Log-probs (b, R) of a micro-batch's b responses under `model`, and their entropy (b, R) or
    None. Two layouts (packing.collate makes them):

    "packed" (train.py's): one row (1, T) holding each prompt once, then its responses, with no
    padding: "ids", "pos" (positions: a response goes on from its prompt's length), "row"
    (packing.PackedRow: which keys each segment sees), "keep" (K,) the row positions
    whose logits predict the K response tokens "targets" (1, K) (a response's first token is
    predicted from its prompt's last position, so that position is kept once per response), and
    "spans" (b, R) where each response's tokens lie in those K (padding: any). Every position
    computed is a real token.

    "grouped" (the layout of before, to measure against): "prompt" (1, p) and its b responses
    "resp" (b, R) right-padded to the longest; the prompt runs once and its KV cache is repeated
    for the responses, unless "rows" asks for every row to hold its own copy (HF keeps no cache
    under activation checkpointing).

    `lm_head` (config's): how the kept positions become log-probs. "chunked": the model's last
    hidden states (K, H) through its head's weight in chunks (head_logprobs_entropy), no (K, V)
    logits nor their gradient; "logits": the model's own logits (K, V), kept for the backward
    (token_logprobs_entropy); "auto": chunked where the head can be reached (unreachable_head).
    """
    chunked = chunked_head(model, lm_head)

    def run(keep, **inputs):  # -> ((B, K, H) hidden states or (B, K, V) logits at `keep`, the output)
        if chunked:
            return last_hidden(model, keep, **inputs)
        out = model(**inputs, logits_to_keep=keep)
        return out.logits, out

    def score(x, targets):  # x from run -> logp, entropy (B, K)
        if chunked:
            weight, bias, softcap = head_params(model)
            return head_logprobs_entropy(x, weight, bias, targets, temperature, with_entropy, softcap)
        return token_logprobs_entropy(x, targets, temperature, with_entropy)

    resp = batch["resp"]
    b, R = resp.shape
    if "ids" in batch:
        x, _ = run(batch["keep"], input_ids=batch["ids"], position_ids=batch["pos"], use_cache=False,
                   packed_row=batch["row"])                                            # (1, K, .)
        logp, ent = score(x, batch["targets"])
        spans = batch["spans"]                                                     # (b, R)
        return logp[0][spans], ent[0][spans] if with_entropy else None
    prompt = batch["prompt"]
    if batch.get("rows"):
        ids = torch.cat([prompt.expand(b, -1), resp], dim=1)
        x, _ = run(R + 1, input_ids=ids, use_cache=False)
        return score(x[:, :-1], resp)
    x, out = run(1, input_ids=prompt, use_cache=True)
    cache = out.past_key_values
    cache.batch_repeat_interleave(b)
    first = score(x.expand(b, 1, -1), resp[:, :1])              # the first token, from the prompt
    # Always a second call, even for R = 1 (its last position is dropped): every FSDP forward is a
    # collective, so each micro-batch must make the same calls on every rank
    # (packing.lockstep_forwards).
    x, _ = run(0, input_ids=resp, past_key_values=cache, use_cache=True)
    rest = score(x[:, :-1], resp[:, 1:])
    logp = torch.cat([first[0], rest[0]], dim=1)
    return logp, torch.cat([first[1], rest[1]], dim=1) if with_entropy else None
