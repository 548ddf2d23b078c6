"""How sequences become the rows a model computes: packed micro-batches, dealt over the ranks,
forwarded in lock-step, and the attention that keeps a packed row's sequences apart.

A *sequence* here is one response with its prompt, as train.py's `Sequence` holds it: `gid` (its
group: sequences of one gid share a prompt), `prompt` and `resp` (token ids), `adv`, and any of
the per-token (R,) values old_logp, old_entropy, ref_logp, rollout_logp, cov_sel.
  micro_batches      sequences -> micro-batches of about `micro_batch_tokens` positions
  collate            a micro-batch -> the tensors of tepo.response_logprobs (one packed row)
  balance_ranks      each mini-batch's sequences dealt over the ranks by tokens (deal: the rule)
  lockstep_forwards  the forwards of a rank's micro-batches, as many calls on every rank
  segment_attention  attention over a packed row, one segment at a time (use_segment_attention)
Not here: what a sequence's loss is (tepo.py), and which sequences a phase forwards (train.py).
"""
import heapq
from types import SimpleNamespace

import torch
import torch.distributed as dist

import tepo

# ----------------------------------------------------------------------------- micro-batches


def micro_batches(seqs, budget, layout="packed"):
    """Split sequences into micro-batches (one forward and backward each) of about `budget`
    computed positions.

    "packed": each prompt's responses (its part of the set) with the prompt once, as a unit of
    p + sum(R_i) real tokens; units, largest first, fill micro-batches of at most `budget` tokens
    (a unit that alone passes it is cut into several, each with its own copy of the prompt).
    Nothing is padded. "grouped" (the layout of before): one prompt's responses, padded to the
    longest, b x (p + R) <= budget.
    """
    groups = {}
    for s in seqs:
        groups.setdefault(s.gid, []).append(s)
    out = []
    if layout == "packed":
        units = []
        for group in groups.values():
            cur, size = [], len(group[0].prompt)
            for s in group:
                if cur and size + len(s.resp) > budget:
                    units.append(cur)
                    cur, size = [], len(group[0].prompt)
                cur.append(s)
                size += len(s.resp)
            units.append(cur)
        size = lambda unit: len(unit[0].prompt) + sum(len(s.resp) for s in unit)  # noqa: E731
        cur = []
        for unit in sorted(units, key=size, reverse=True):
            if cur and sum(map(size, cur)) + size(unit) > budget:
                out.append([s for u in cur for s in u])
                cur = []
            cur.append(unit)
        return out + [[s for u in cur for s in u]] if cur else out
    for group in groups.values():
        group = sorted(group, key=lambda s: len(s.resp), reverse=True)
        cur = []
        for s in group:  # cur[0] is the longest: its length is the padded length
            if cur and (len(cur) + 1) * (len(s.prompt) + len(cur[0].resp)) > budget:
                out.append(cur)
                cur = []
            cur.append(s)
        out.append(cur)
    return out


def computed_tokens(mbs, layout="packed", rows=False):
    """The positions a forward of these micro-batches computes, padding included: each prompt once
    plus every response token (packed); p + b x R per micro-batch of one prompt (grouped), or
    b x (p + R) when every row holds its own prompt (`rows`: activation checkpointing)."""
    if layout == "packed":
        return sum(sum({s.gid: len(s.prompt) for s in mb}.values()) + sum(len(s.resp) for s in mb)
                   for mb in mbs)
    return sum((len(mb) if rows else 1) * len(mb[0].prompt) + len(mb) * max(len(s.resp) for s in mb)
               for mb in mbs)


def collate(mb, device, layout="packed", rows=False):
    """The tensors of one micro-batch for tepo.response_logprobs, in `layout` (see there):
    "packed": one row (1, T) of each prompt once then its responses, their positions (1, T), the
    attention segments, the K logits to keep and their targets (1, K), and each response's span
    in them (b, R); "grouped": the one prompt (1, p) (and `rows`: a copy in every row). Both: the
    responses right-padded to (b, R), and (b, R) response tensors: mask, and whichever per-token
    values all the sequences carry (old/ref/rollout log-probs). All: the reference pass takes
    trained responses from every mini-batch, and when a group is split over mini-batches only
    those past the first carry old log-probs yet."""
    R = max(len(s.resp) for s in mb)
    resp = torch.zeros(len(mb), R, dtype=torch.long)
    mask = torch.zeros(len(mb), R)
    for b, s in enumerate(mb):
        resp[b, :len(s.resp)] = torch.tensor(s.resp)
        mask[b, :len(s.resp)] = 1
    out = {"resp": resp, "mask": mask, "adv": torch.tensor([s.adv for s in mb], dtype=torch.float32)}
    if layout == "packed":
        ids, pos, segments, keep, targets, spans = [], [], [], [], [], torch.zeros(len(mb), R, dtype=torch.long)
        prompt_at = {}  # gid -> (start, end) of its prompt in the row
        for b, s in enumerate(mb):
            if s.gid not in prompt_at:
                prompt_at[s.gid] = (len(ids), len(ids) + len(s.prompt))
                segments.append((len(ids), len(ids) + len(s.prompt), 0, 0))
                ids += s.prompt
                pos += range(len(s.prompt))
            ps, pe = prompt_at[s.gid]
            start = len(ids)
            segments.append((start, start + len(s.resp), ps, pe))
            ids += s.resp
            pos += range(pe - ps, pe - ps + len(s.resp))
            spans[b] = len(keep) + torch.arange(R).clamp(max=len(s.resp) - 1)
            keep += [pe - 1] + list(range(start, start + len(s.resp) - 1))  # what predicts each token
            targets += s.resp
        out.update(ids=torch.tensor([ids]), pos=torch.tensor([pos]), keep=torch.tensor(keep),
                   targets=torch.tensor([targets]), spans=spans, segments=segments)
    else:
        out["prompt"] = torch.tensor([mb[0].prompt])
        out["rows"] = rows
    for key in ("old_logp", "old_entropy", "ref_logp", "rollout_logp", "cov_sel"):
        if all(getattr(s, key, None) is not None for s in mb):
            out[key] = torch.zeros(len(mb), R, dtype=torch.bool if key == "cov_sel" else torch.float32)
            for b, s in enumerate(mb):
                out[key][b, :len(s.resp)] = getattr(s, key)
    return {k: v.to(device) if torch.is_tensor(v) else v for k, v in out.items()}


# ----------------------------------------------------------------------------- over the ranks


def balance_ranks(minibatches, *, rest_forwarded=True):
    """Deal each global mini-batch's sequences over the ranks so that every phase's forwards cost
    every rank about the same. A collective. -> this rank's mini-batches

    Each rank samples its own prompts, so one rank may hold far more tokens than another (response
    lengths vary widely, and a group whose rewards are all equal has A = 0 and is not trained),
    and lock-step makes every rank wait for the busiest. The loss and its gradient do not change:
    every normalisation is by global counts, and mini-batch k still holds the same sequences over
    all ranks. `rest_forwarded`: whether the old pass forwards the sequences out of the loss too
    (train.py's full_batch_metrics). The rule: deal.
    """
    world, rank = dist.get_world_size(), dist.get_rank()
    if world == 1:
        return minibatches
    everyone = [None] * world
    dist.all_gather_object(everyone, minibatches)
    dealt = deal([[s for part in everyone for s in part[k]] for k in range(len(minibatches))], world,
                 rest_forwarded=rest_forwarded)
    return dealt[rank]


def deal(minibatches, world, *, rest_forwarded=True):
    """balance_ranks' rule: [the sequences of mini-batch k, every rank's] -> [[the sequences of
    mini-batch k dealt to rank r] for each rank r], the same on every rank.

    Each phase is balanced by what it forwards (train.py: old_logprobs, update_policy):
      1. the update, mini-batch by mini-batch (an optimizer step each, so each one waits for its
         busiest rank): the sequences in the loss (`in_loss`), by their tokens. The reference pass
         and the covariance selection forward the same ones.
      2. the old pass, one lock-step pass over every mini-batch: it forwards the sequences of step
         1 past the first mini-batch (whose own forward gives the first its old values), and the
         sequences out of the loss (A = 0) when `rest_forwarded`; these are dealt last, to even
         out what step 1 left.
    Both steps deal with spread."""
    out = [[[] for _ in minibatches] for _ in range(world)]
    old_pass = [0] * world
    for k, mb in enumerate(minibatches):
        for r, part in enumerate(spread(groups_of([s for s in mb if s.in_loss]), [0] * world)):
            out[r][k] += part
            old_pass[r] += cost(part) if k > 0 else 0
    rest = [(k, g) for k, mb in enumerate(minibatches) for g in groups_of([s for s in mb if not s.in_loss])]
    mb_of = {id(s): k for k, g in rest for s in g}
    loads = old_pass if rest_forwarded else [0] * world
    for r, part in enumerate(spread([g for _, g in rest], loads)):
        for s in part:
            out[r][mb_of[id(s)]].append(s)
    return out


def groups_of(seqs):
    """seqs -> [the sequences of one group (one prompt)], in order of first appearance."""
    groups = {}
    for s in seqs:
        groups.setdefault(s.gid, []).append(s)
    return list(groups.values())


def cost(seqs):
    """The positions a forward of `seqs` computes in the packed layout: each prompt once, and every
    response token (computed_tokens of one micro-batch)."""
    return sum({s.gid: len(s.prompt) for s in seqs}.values()) + sum(len(s.resp) for s in seqs)


def spread(groups, loads):
    """Deal groups of sequences (each sharing a prompt) over ranks that already carry `loads`, so
    that the ranks end about even. -> [the sequences dealt to rank r]

    Largest first, each to the least-loaded rank (ties: the lowest); a group that would carry that
    rank past an even share (the mean of the final loads) by more than its prompt is split: the
    rank takes the longest of its responses that fit its share (at least one), and the rest goes
    back in line. Whole groups keep their prompt computed once; splitting costs a prompt more per
    part, and is what lets a batch of a few large groups (most groups of equal reward out of the
    loss) be shared evenly."""
    loads, out = list(loads), [[] for _ in loads]
    share = (sum(loads) + sum(map(cost, groups))) / len(loads)
    line = [(-cost(g), n, g) for n, g in enumerate(groups)]  # a heap: the largest first
    heapq.heapify(line)
    n = len(groups)
    while line:
        _, _, g = heapq.heappop(line)
        r = min(range(len(loads)), key=lambda r: (loads[r], r))
        room = share - loads[r]
        if cost(g) > room + len(g[0].prompt) and len(g) > 1:
            take, size = [], len(g[0].prompt)
            for s in sorted(g, key=lambda s: -len(s.resp)):  # stable: ties keep their order
                if not take or size + len(s.resp) <= room:
                    take.append(s)
                    size += len(s.resp)
            taken = {id(s) for s in take}
            rest = [s for s in g if id(s) not in taken]
            if rest:
                heapq.heappush(line, (-cost(rest), n, rest))
                n += 1
            g = [s for s in g if id(s) in taken]
        loads[r] += cost(g)
        out[r] += g
    return out


def most_over_ranks(n):
    """The largest `n` of any rank. A collective."""
    t = torch.tensor([float(n)], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def lockstep_forwards(model, seqs, *, cfg, device, with_entropy, grad=False):
    """Yield (micro-batch, collated batch, logp (b, R), entropy (b, R) or None) for `seqs`, in
    micro-batches of about cfg.micro_batch_tokens tokens (micro_batches; cfg.micro_batch_layout).
    A collective.

    Why lock-step: every forward of an FSDP2 model all-gathers its weights with the other ranks,
    and every backward reduce-scatters the gradients, so all ranks must make the same number of
    calls whatever their share of the work. After its own micro-batches a rank makes one-token
    dummy calls (contributing nothing) until it has made as many as the busiest rank. With `grad`,
    the caller runs each yielded batch's backward before asking for the next.
    """
    layout, rows = cfg.micro_batch_layout, cfg.activation_checkpointing  # rows: HF keeps no cache
    mbs = micro_batches(seqs, cfg.micro_batch_tokens, layout)
    busiest = most_over_ranks(len(mbs))
    for mb in mbs:
        batch = collate(mb, device, layout, rows)
        with torch.set_grad_enabled(grad):
            logp, ent = tepo.response_logprobs(model, batch, cfg.temperature, with_entropy)
        yield mb, batch, logp, ent
    for _ in range(busiest - len(mbs)):
        dummy_forward(model, backward=grad, layout=layout, rows=rows)


def dummy_forward(model, *, backward, layout, rows):
    """The calls of a one-token micro-batch in `layout`, contributing nothing: see
    `lockstep_forwards`."""
    device = next(model.parameters()).device
    one = SimpleNamespace(gid=(0, 0), prompt=[0], resp=[0], adv=0.0, rollout_logp=torch.zeros(1))
    with torch.set_grad_enabled(backward):
        logp, _ = tepo.response_logprobs(model, collate([one], device, layout, rows), 1.0, False)
    if backward:
        logp.sum().mul(0.0).backward()


# ----------------------------------------------------------------------------- attention


def segment_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                      segments=None, **kwargs):
    """Attention over a packed row, one segment at a time: the exact variable-length path on any
    device. query (1, H, T, D), key and value (1, KVH, T, D) -> (1, T, H, D).

    `segments` (from the model call's keyword arguments; HF passes them through every layer, and
    through activation checkpointing's recompute) lists (start, end, prompt_start, prompt_end): a
    prompt attends causally to itself (prompt_end = 0); a response attends to its prompt and
    causally to itself (bottom-right causal over prompt + response keys). So one prompt serves all
    the responses packed after it, and no token sees another sequence. Without `segments` this is
    SDPA as usual (prompt-only and dummy calls, the reference model's other uses).
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    if segments is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling,
                                      dropout=dropout, **kwargs)
    from torch.nn.attention.bias import causal_lower_right
    sdpa = torch.nn.functional.scaled_dot_product_attention
    out = []
    for s, e, ps, pe in segments:
        if pe == 0:
            out.append(sdpa(query[:, :, s:e], key[:, :, s:e], value[:, :, s:e], is_causal=True,
                            scale=scaling, enable_gqa=True))
        else:
            k = torch.cat([key[:, :, ps:pe], key[:, :, s:e]], dim=2)
            v = torch.cat([value[:, :, ps:pe], value[:, :, s:e]], dim=2)
            out.append(sdpa(query[:, :, s:e], k, v, attn_mask=causal_lower_right(e - s, k.shape[2]),
                            scale=scaling, enable_gqa=True))
    return torch.cat(out, dim=2).transpose(1, 2).contiguous(), None


def use_segment_attention(model):
    """Make `model` (a transformers model) attend with segment_attention: the same as SDPA until a
    call passes `segments`. -> model"""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask
    AttentionInterface.register("tepo_segments", segment_attention)
    AttentionMaskInterface.register("tepo_segments", sdpa_mask)  # else HF builds no mask at all
    model.set_attn_implementation("tepo_segments")
    return model
