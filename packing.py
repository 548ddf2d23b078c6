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


def balance_ranks(minibatches):
    """Deal each global mini-batch's sequences over the ranks so that every rank computes about the
    same number of tokens. A collective. -> this rank's mini-batches

    Each rank samples its own prompts, so one rank may hold far more tokens than another (response
    lengths vary widely), and lock-step makes every rank wait for the busiest. The loss and its
    gradient do not change: every normalisation is by global counts, and mini-batch k still holds
    the same sequences over all ranks. The longest units go first, each to the least-loaded rank
    (ties: the lowest); a unit is the part of a group in the mini-batch, so that its prompt still
    runs once.
    """
    world, rank = dist.get_world_size(), dist.get_rank()
    if world == 1:
        return minibatches
    everyone = [None] * world
    dist.all_gather_object(everyone, minibatches)
    return [deal([part[k] for part in everyone])[rank] for k in range(len(minibatches))]


def deal(parts):
    """balance_ranks' rule on one mini-batch: [sequences held by rank r] -> [sequences dealt to
    rank r], the same on every rank. Units (a group's sequences: its prompt once, its responses),
    largest first, each to the least-loaded rank."""
    units = {}
    for part in parts:
        for s in part:
            units.setdefault(s.gid, []).append(s)
    cost = {key: len(u[0].prompt) + sum(len(s.resp) for s in u) for key, u in units.items()}
    load, out = [0] * len(parts), [[] for _ in parts]
    for key in sorted(units, key=lambda key: (-cost[key], key)):
        r = min(range(len(parts)), key=lambda r: (load[r], r))
        load[r] += cost[key]
        out[r] += units[key]
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
