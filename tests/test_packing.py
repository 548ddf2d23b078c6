"""packing.deal: every sequence stays in its mini-batch, and each phase's forwards are shared evenly
over the ranks, also when most groups are out of the loss (equal rewards, A = 0)."""
import numpy as np
import pytest
import torch

import packing
import tepo
from train import Sequence

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
    """(update work per mini-batch and rank, old-pass work per rank): what train.py forwards."""
    upd = [[packing.cost([s for s in per_rank[r][k] if s.in_loss]) for r in range(WORLD)] for k in range(K)]
    old = [packing.cost([s for k, mb in enumerate(per_rank[r]) for s in mb if not s.in_loss or k > 0])
           for r in range(WORLD)]
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
    assert busiest(old) <= 1.10, old
    assert sum(map(sum, upd)) <= 1.03 * whole  # a group split over ranks runs its prompt once more


def test_deal_is_the_same_on_every_rank_and_keeps_whole_groups_when_it_can():
    """A batch of equal groups that divides evenly is dealt as whole groups, identically each call."""
    seqs = [Sequence((0, g), [1] * 10, [2] * 90, 1.0, True, None) for g in range(WORLD) for _ in range(4)]
    a = packing.deal([seqs], WORLD)
    b = packing.deal([list(seqs)], WORLD)
    assert [[id(s) for s in d[0]] for d in a] == [[id(s) for s in d[0]] for d in b]
    assert all(len({s.gid for s in d[0]}) == 1 and len(d[0]) == 4 for d in a)
