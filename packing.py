"""How sequences become the rows a model computes: packed micro-batches, dealt over the ranks,
forwarded in lock-step, and the attention that keeps a packed row's sequences apart.

A *sequence* here is one response with its prompt, as train.py's `Sequence` holds it: `gid` (its
group: sequences of one gid share a prompt), `prompt` and `resp` (token ids), `adv`, and any of
the per-token (R,) values old_logp, old_entropy, ref_logp, rollout_logp, cov_sel, entropy_sel.
  micro_batches      sequences -> micro-batches of about `micro_batch_tokens` positions
  collate            a micro-batch -> the tensors of tepo.response_logprobs (one packed row)
  balance_ranks      each mini-batch's sequences dealt over the ranks, so that every phase of
                     the step (the update, the old and reference passes) costs each rank about
                     the same (deal: the rule, on every rank's sizes; exchange: each sequence
                     sent once, to its rank)
  lockstep_forwards  the forwards of a rank's micro-batches, as many calls on every rank
  packed_attention   attention over a packed row (PackedRow), one SDPA call per sequence or one
                     FlexAttention call per layer (use_packed_attention)
Not here: what a sequence's loss is (tepo.py), nor when each phase runs (train.py).
"""
import functools
import heapq
import io
import pickle
from dataclasses import dataclass
from types import SimpleNamespace

import torch
import torch.distributed as dist

import tepo
from config import UserError
from ranks import all_ranks

# ----------------------------------------------------------------------------- micro-batches


def groups_of(seqs):
    """seqs -> [the sequences of one group (one prompt)], in order of first appearance."""
    groups = {}
    for s in seqs:
        groups.setdefault(s.gid, []).append(s)
    return list(groups.values())


def cost(seqs):
    """The positions a forward of `seqs` computes in the packed layout: each prompt once, and every
    response token (computed_tokens, per micro-batch)."""
    return sum({s.gid: len(s.prompt) for s in seqs}.values()) + sum(len(s.resp) for s in seqs)


def micro_batches(seqs, budget, layout="packed"):
    """Split sequences into micro-batches (one forward and backward each) of about `budget`
    computed positions.

    "packed": each prompt's responses (its part of the set) with the prompt once, as a unit of
    p + sum(R_i) real tokens; units, largest first, fill micro-batches of at most `budget` tokens
    (a unit that alone passes it is cut into several, each with its own copy of the prompt).
    Nothing is padded. "grouped" (the layout of before): one prompt's responses, padded to the
    longest, b x (p + R) <= budget.
    """
    groups = groups_of(seqs)
    out = []
    if layout == "packed":
        units = []
        for group in groups:
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
    for group in groups:
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
        return sum(map(cost, mbs))
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
    for key in ("old_logp", "old_entropy", "ref_logp", "rollout_logp", "cov_sel", "entropy_sel"):
        if all(getattr(s, key, None) is not None for s in mb):
            out[key] = torch.zeros(len(mb), R, dtype=torch.bool if key.endswith("_sel") else torch.float32)
            for b, s in enumerate(mb):
                out[key][b, :len(s.resp)] = getattr(s, key)
    out = {k: v.to(device) if torch.is_tensor(v) else v for k, v in out.items()}
    if layout == "packed":
        out["row"] = PackedRow(out.pop("segments"), out["pos"][0])
    return out


# ----------------------------------------------------------------------------- over the ranks


def balance_ranks(minibatches, *, full_batch_metrics=True):
    """Deal each global mini-batch's sequences over the ranks so that every phase's forwards cost
    every rank about the same. A collective. -> this rank's mini-batches

    Each rank samples its own prompts, so one rank may hold far more tokens than another (response
    lengths vary widely, and a group whose rewards are all equal has A = 0 and is not trained),
    and lock-step makes every rank wait for the busiest. The loss and its gradient do not change:
    every normalisation is by global counts, and mini-batch k still holds the same sequences over
    all ranks. `full_batch_metrics` (the config key): whether the old pass forwards the sequences
    out of the loss too. The rule: deal.

    Only what the rule reads goes to every rank (sizes_of: a few numbers per sequence); each
    sequence then moves once, to the rank it is dealt to (exchange). Gathering the sequences
    themselves on every rank cost each rank the whole batch's unpickling every step
    (bench/bench_deal.py).
    """
    world, rank = dist.get_world_size(), dist.get_rank()
    if world == 1:
        return minibatches
    everyone = [None] * world
    dist.all_gather_object(everyone, sizes_of(minibatches))
    dealt = deal(placeholders(everyone), world, full_batch_metrics=full_batch_metrics)
    return exchange(minibatches, dealt, rank)


@dataclass(eq=False)
class Placeholder:
    """A sequence as deal sees it: its group, its prompt's and response's lengths (ranges: deal
    reads only their len), whether it is in the loss; and where the sequence is, `at` = (the rank
    that holds it, its mini-batch, its index there)."""
    gid: tuple
    prompt: range
    resp: range
    in_loss: bool
    at: tuple


def sizes_of(minibatches):
    """What deal reads of this rank's sequences: [[(gid, prompt length, response length, in_loss)
    for each sequence] for each mini-batch]."""
    return [[(s.gid, len(s.prompt), len(s.resp), s.in_loss) for s in mb] for mb in minibatches]


def placeholders(everyone):
    """Every rank's sizes_of -> the global mini-batches of Placeholders, in the order deal takes
    them: mini-batch k is rank 0's k-th list, then rank 1's, and so on."""
    return [[Placeholder(gid, range(p), range(n), in_loss, (r, k, i))
             for r, mine in enumerate(everyone) for i, (gid, p, n, in_loss) in enumerate(mine[k])]
            for k in range(len(everyone[0]))]


def exchange(minibatches, dealt, rank):
    """Send each of this rank's sequences to the rank deal gives it to, and receive this rank's
    from the others: one all-to-all of their sizes, one of the bytes (CPU tensors: the group's gloo
    backend, on GPUs too, ranks.process_group_backend). A collective. -> this rank's mini-batches"""
    out = parcels(minibatches, dealt, rank)
    sizes = torch.tensor([len(b) for b in out], dtype=torch.int64)
    their = torch.empty_like(sizes)
    dist.all_to_all_single(their, sizes)
    data = b"".join(out)
    send = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
    recv = torch.empty(int(their.sum()), dtype=torch.uint8)
    dist.all_to_all_single(recv, send, output_split_sizes=their.tolist(), input_split_sizes=sizes.tolist())
    ends = their.cumsum(0).tolist()
    received = [recv[e - n:e].numpy().tobytes() for e, n in zip(ends, their.tolist())]
    return unpack(minibatches, dealt, rank, received)


def parcels(minibatches, dealt, rank):
    """What this rank sends: for each rank r, its sequences dealt to r, pickled as a list in deal's
    order (mini-batch by mini-batch), b"" for itself and where it sends none. -> [bytes]"""
    out = []
    for r, mine in enumerate(dealt):
        seqs = [minibatches[k][i] for part in mine for p in part for src, k, i in [p.at] if src == rank]
        out.append(pickled(seqs) if seqs and r != rank else b"")
    return out


def unpack(minibatches, dealt, rank, received):
    """This rank's mini-batches from deal's placeholders for it: its own sequences where they are,
    the others' from `received` (the bytes each rank sent it, parcels' order). -> [[Sequence]]"""
    arrived = [iter(pickle.loads(b) if b else ()) for b in received]
    return [[minibatches[k][i] if src == rank else next(arrived[src]) for p in part for src, k, i in [p.at]]
            for part in dealt[rank]]


ARRAY_DTYPES = (torch.float32, torch.float64, torch.float16, torch.int64, torch.int32, torch.int16,
                torch.int8, torch.uint8, torch.bool)


class _ArrayPickler(pickle.Pickler):
    def reducer_override(self, obj):
        if (type(obj) is torch.Tensor and obj.device.type == "cpu" and obj.layout == torch.strided
                and not obj.requires_grad and obj.dtype in ARRAY_DTYPES):
            return torch.from_numpy, (obj.numpy(),)
        return NotImplemented


def pickled(obj):
    """pickle.dumps, with each CPU tensor as a numpy array (dtypes numpy has): a sequence's
    (R,) log-probs pickle and unpickle in a third of the seconds of torch's own way (a torch.save
    per tensor), and come back as equal tensors. pickle.loads reads it. -> bytes"""
    buf = io.BytesIO()
    _ArrayPickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


def deal(minibatches, world, *, full_batch_metrics=True):
    """balance_ranks' rule: [the sequences of mini-batch k, every rank's] -> [[the sequences of
    mini-batch k dealt to rank r] for each rank r], the same on every rank. It reads a sequence's
    gid, in_loss and the lengths of its prompt and resp only (balance_ranks deals Placeholders).

    Each phase is balanced by what it forwards (train.py: old_logprobs, update_policy):
      1. the update, mini-batch by mini-batch (an optimizer step each, so each one waits for its
         busiest rank): the sequences in the loss (`in_loss`), by their tokens. The reference pass
         and the selection pass (Clip-Cov's, KL-Cov's, the 80/20 rule's) forward the same ones.
      2. the sequences out of the loss (A = 0), which only the old pass forwards (when
         `full_batch_metrics`), in a lock-step pass of their own after the trained ones (which it
         forwards mini-batch by mini-batch as step 1 dealt them): by their tokens, all together.
    Both steps deal with spread."""
    out = [[[] for _ in minibatches] for _ in range(world)]
    for k, mb in enumerate(minibatches):
        for r, part in enumerate(spread(groups_of([s for s in mb if s.in_loss]), [0] * world)):
            out[r][k] += part
    rest = [(k, g) for k, mb in enumerate(minibatches) for g in groups_of([s for s in mb if not s.in_loss])]
    mb_of = {id(s): k for k, g in rest for s in g}
    for r, part in enumerate(spread([g for _, g in rest], [0] * world)):
        for s in part:
            out[r][mb_of[id(s)]].append(s)
    return out


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
    return int(all_ranks({"n": n}, "max")["n"])


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
            logp, ent = tepo.response_logprobs(model, batch, cfg.temperature, with_entropy, cfg.lm_head)
        yield mb, batch, logp, ent
    for _ in range(busiest - len(mbs)):
        dummy_forward(model, backward=grad, layout=layout, rows=rows, lm_head=cfg.lm_head)


def dummy_forward(model, *, backward, layout, rows, lm_head="auto"):
    """The calls of a one-token micro-batch in `layout`, contributing nothing: see
    `lockstep_forwards`."""
    device = next(model.parameters()).device
    one = SimpleNamespace(gid=(0, 0), prompt=[0], resp=[0], adv=0.0, rollout_logp=torch.zeros(1))
    with torch.set_grad_enabled(backward):
        logp, _ = tepo.response_logprobs(model, collate([one], device, layout, rows), 1.0, False, lm_head)
    if backward:
        logp.sum().mul(0.0).backward()


# ----------------------------------------------------------------------------- attention


class PackedRow:
    """How one packed row (1, T) is laid out, as its attention needs it (collate makes it; the model
    call passes it to every layer as `packed_row`, and activation checkpointing's recompute too).

    `segments` [(start, end, prompt_start, prompt_end)]: a prompt (prompt_end 0) attends causally
    to itself; a response attends to its prompt and causally to itself, so one prompt serves every
    response packed after it and no token sees another sequence. `pos` (T,): each position's place
    in its sequence (a response goes on from its prompt's length): the model's position ids, and
    what a sliding window measures.

    Its masks are built once per row, on first use (`block_mask`, `segment_masks`), and kept on the
    row for every later layer and the recompute. Not a dataclass, so that every layer gets this very
    object: FSDP2's mixed precision casts each sharded module's inputs with
    torch.distributed.utils._apply_to_tensors, which rebuilds a dataclass (dataclasses.replace, each
    field copied, a dict into a new dict) and passes any other object as it is. A dataclass row gave
    each layer, and each layer's recompute, a copy with an empty cache: under bf16 the masks were
    built in every layer, and again in the recompute.
    """
    __slots__ = ("segments", "pos", "_masks")

    def __init__(self, segments, pos):
        self.segments, self.pos = segments, pos
        self._masks = {}  # (kernel, sliding window) -> the masks

    def block_mask(self, window=None):
        """The row's FlexAttention BlockMask (1, 1, T, T), for a sliding `window` or none
        (segment_block_mask, with its host syncs: once per row)."""
        if ("flex", window) not in self._masks:
            self._masks["flex", window] = segment_block_mask(self.segments, self.pos, window)
        return self._masks["flex", window]

    def segment_masks(self, window=None):
        """Each segment's SDPA mask, for a sliding `window` or none (causal_mask): without a window
        a CausalBias (no tensor); under a window shorter than its keys a (q, k) bool tensor. Kept
        through the row's forward and backward: one layer's set, which the layer computing held
        anyway while it was rebuilt per layer."""
        if ("sdpa", window) not in self._masks:
            self._masks["sdpa", window] = [causal_mask(e - s, e - s + pe - ps, window, self.pos.device)
                                           for s, e, ps, pe in self.segments]
        return self._masks["sdpa", window]


def row_intervals(segments, pos, window=None):
    """Which keys each query of a packed row sees: two half-open intervals per row, [lo1, hi1) its
    own sequence's keys up to itself and [lo2, hi2) its prompt's (empty for a prompt), narrowed to
    the keys within `window` positions of it. -> four (T,) long tensors on pos's device.

    In key positions, since a segment's positions rise by one per key: within its own segment a
    key k is within the window of query q when q - k < window, and a prompt key k (at position
    k - prompt_start) when pos[q] - (k - prompt_start) < window (transformers' rule: a key sees
    `window` positions, itself included)."""
    dev = pos.device
    seg = torch.tensor(segments, dtype=torch.long, device=dev)                   # (S, 4)
    size = seg[:, 1] - seg[:, 0]
    start, p0, p1 = (seg[:, i].repeat_interleave(size) for i in (0, 2, 3))       # (T,) each
    q = torch.arange(len(start), device=dev)
    lo1, hi1, lo2, hi2 = start, q + 1, p0, p1
    if window is not None:
        lo1 = torch.maximum(lo1, q - window + 1)
        lo2 = torch.maximum(lo2, p0 + pos - window + 1)
    return lo1, hi1, lo2, hi2


BLOCK = 128  # FlexAttention's tile: the block mask says, per (query tile, key tile), none, some or all


def segment_block_mask(segments, pos, window=None):
    """The FlexAttention BlockMask of a packed row, built from its segments' intervals (row_intervals)
    in O(T + (T / BLOCK)^2): no (T, T) tensor is made. A key tile is "full" for a query tile when
    every query of the tile sees every key of it (no mask computed there), "partial" when some do
    (mask_mod decides there), else skipped.

    Counted with difference arrays over key tiles: each query row adds +1 from the first to past
    the last tile its interval touches (partial or full), and +1 over the tiles its interval covers
    whole; a tile is full when all the rows of the query tile cover it. A row's two intervals are
    disjoint, so no tile is counted twice for one row."""
    from torch.nn.attention.flex_attention import BlockMask
    lo1, hi1, lo2, hi2 = row_intervals(segments, pos, window)
    T, dev = len(pos), pos.device
    nb = -(-T // BLOCK)
    qb = torch.arange(T, device=dev) // BLOCK
    touched = torch.zeros(nb, nb + 1, dtype=torch.int32, device=dev)
    covered = torch.zeros_like(touched)
    for lo, hi in ((lo1, hi1), (lo2, hi2)):
        some = hi > lo
        first, past = lo // BLOCK, (hi - 1) // BLOCK + 1
        touched.index_put_((qb[some], first[some]), torch.ones_like(first[some], dtype=torch.int32), accumulate=True)
        touched.index_put_((qb[some], past[some]), -torch.ones_like(past[some], dtype=torch.int32), accumulate=True)
        # Tiles inside [lo, hi): from ceil(lo / BLOCK) to hi // BLOCK, the last (short) tile too at hi == T.
        f0, f1 = (lo + BLOCK - 1) // BLOCK, torch.where(hi >= T, nb, hi // BLOCK)
        whole = some & (f1 > f0)
        covered.index_put_((qb[whole], f0[whole]), torch.ones_like(f0[whole], dtype=torch.int32), accumulate=True)
        covered.index_put_((qb[whole], f1[whole]), -torch.ones_like(f1[whole], dtype=torch.int32), accumulate=True)
    rows = torch.bincount(qb, minlength=nb)[:, None]                             # (nb, 1) queries per tile
    full = covered.cumsum(1)[:, :nb] == rows                                       # (nb, nb)
    partial = (touched.cumsum(1)[:, :nb] > 0) & ~full

    def indices(tiles):  # (nb, nb) bool -> counts (1, 1, nb) and the tiles first (1, 1, nb, nb)
        order = torch.argsort((~tiles).to(torch.int8), dim=1, stable=True)
        return tiles.sum(1, dtype=torch.int32)[None, None], order.to(torch.int32)[None, None]

    def mask_mod(b, h, q, kv):  # the same rule, per (query, key), for the partial tiles
        own = (kv >= lo1[q]) & (kv < hi1[q])
        return own | ((kv >= lo2[q]) & (kv < hi2[q]))
    return BlockMask.from_kv_blocks(*indices(partial), *indices(full), BLOCK_SIZE=BLOCK,
                                    mask_mod=mask_mod, seq_lengths=(T, T))


_compiled_flex = None


def flex(query, key, value, block_mask, scale):
    """flex_attention, compiled (once per process, for every length: dynamic shapes): a fused
    kernel that skips the masked tiles. Uncompiled, it would materialise the (T, T) scores."""
    global _compiled_flex
    if _compiled_flex is None:
        from torch.nn.attention.flex_attention import flex_attention
        _compiled_flex = torch.compile(flex_attention, dynamic=True)
    return _compiled_flex(query, key, value, block_mask=block_mask, scale=scale, enable_gqa=True)


def window_mask(q_len, k_len, window, device):
    """(q_len, k_len) bool: causal with the queries at the end of the keys, within `window`."""
    i = torch.arange(q_len, device=device)[:, None] + (k_len - q_len)
    j = torch.arange(k_len, device=device)[None]
    return (j <= i) & (j > i - window)


def causal_mask(q_len, k_len, window, device):
    """The SDPA mask of q_len queries at the end of k_len keys (a KV cache or a prompt before them),
    causal and within a sliding `window` (None: none): a (q_len, k_len) bool when the window is
    shorter than the keys, else a CausalBias (no tensor), or None for one query."""
    from torch.nn.attention.bias import causal_lower_right
    if window is not None and k_len > window:
        return window_mask(q_len, k_len, window, device)
    return causal_lower_right(q_len, k_len) if q_len > 1 else None


def sdpa(query, key, value, mask, scaling):
    """SDPA of query (b, H, q, D) over key and value (b, KVH, k, D) under `mask` -> (b, H, q, D)."""
    return torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask,
                                                            scale=scaling, enable_gqa=True)


def causal_attention(query, key, value, scaling, window):
    """SDPA, causal with the queries at the end of the keys (a KV cache before them, or none), and
    within a sliding `window` (None: none). query (b, H, q, D), key and value (b, KVH, k, D)."""
    return sdpa(query, key, value, causal_mask(query.shape[2], key.shape[2], window, query.device), scaling)


def packed_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                     packed_row=None, sliding_window=None, kernel="sdpa", **kwargs):
    """The attention function transformers calls in every layer (use_packed_attention): over a
    packed row, the row's segments kept apart (PackedRow); on any other call, causal attention as
    the model's own (transformers builds no mask for it: causal_attention). query (b, H, q, D),
    key and value (b, KVH, k, D) -> (b, q, H, D), None.

    Two kernels for a packed row, the same numbers: "sdpa", one SDPA call per segment (a response's
    keys are its prompt's and its own, concatenated), exact and memory-light on any device; "flex",
    one FlexAttention call over the whole row with the row's BlockMask (compiled: the fused GPU
    kernel). `sliding_window` (a layer's, as transformers passes it) is kept by both. Either's
    masks are the row's, built in the first layer and reused by the others and the recompute
    (PackedRow.segment_masks, PackedRow.block_mask)."""
    if kwargs.get("softcap") is not None or kwargs.get("s_aux") is not None:
        raise NotImplementedError("packed attention has no logit softcapping or attention sinks")
    if packed_row is None:
        out = causal_attention(query, key, value, scaling, sliding_window)
        return out.transpose(1, 2).contiguous(), None
    if kernel == "flex":
        out = flex(query, key, value, packed_row.block_mask(sliding_window), scaling)
        return out.transpose(1, 2).contiguous(), None
    out = []
    for (s, e, ps, pe), mask in zip(packed_row.segments, packed_row.segment_masks(sliding_window)):
        k, v = key[:, :, s:e], value[:, :, s:e]
        if pe:  # a response: its prompt's keys, then its own
            k = torch.cat([key[:, :, ps:pe], k], dim=2)
            v = torch.cat([value[:, :, ps:pe], v], dim=2)
        out.append(sdpa(query[:, :, s:e], k, v, mask, scaling))
    return torch.cat(out, dim=2).transpose(1, 2).contiguous(), None


KERNELS = ("sdpa", "flex")


def unpackable(config):
    """Why a model's attention cannot run over packed rows here (a setting its attention reads that
    packed_attention does not compute), or None."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if getattr(text, "attn_logit_softcapping", None) is not None:
        return f"attn_logit_softcapping={text.attn_logit_softcapping} (logit softcapping)"
    if getattr(text, "use_bidirectional_attention", False):
        return "use_bidirectional_attention=true"
    if text.model_type in ("gpt_oss",):
        return f"model_type {text.model_type} (attention sinks)"
    return None


def use_packed_attention(model, kernel="sdpa"):
    """Make `model` (a transformers model) attend with packed_attention and `kernel`. transformers
    then builds no attention mask at all (none is registered for it): a packed row needs none, and
    positions that restart per sequence would otherwise make it build a (1, 1, T, T) one.
    -> model"""
    from transformers import AttentionInterface
    if kernel not in KERNELS:
        raise ValueError(f"unknown packed attention kernel {kernel!r}; choose one of {KERNELS}")
    why = unpackable(model.config)
    if why:
        raise UserError(f"model_type {model.config.model_type}: {why} is not supported by packed "
                        f"micro-batches; set micro_batch_layout: grouped")
    name = f"tepo_packed_{kernel}"
    # Hidden from torch.compile (config `compile` compiles each layer around it): the sdpa kernel's
    # loop over the row's segments would be unrolled and recompiled per row; flex is compiled apart.
    AttentionInterface.register(name, torch.compiler.disable(functools.partial(packed_attention, kernel=kernel)))
    model.set_attn_implementation(name)
    return model
