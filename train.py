"""RL for math reasoning with TEPO and its baselines: one FSDP2 training loop, top to bottom.

    torchrun --nproc_per_node N train.py --config configs/demo.yaml [--set key=value ...] [--resume]

Every rank holds a shard of the policy (FSDP2) and its own rollout engine (rollout.py), and samples
its own share of the prompts. One RL step is five phases in `main`, each a function below, in
this order, taking keyword arguments and returning a record or its metrics:
  1. sample_and_grade  P prompts (P / N per rank), G responses each; graded by reward.py, with
                       DAPO's overlong shaping and dynamic sampling where configured -> Rollouts
  2. make_sequences    group advantages; one Sequence per response; `num_minibatches` mini-batches,
     balance_ranks     dealt over the ranks by what each phase forwards (packing.deal)
  3. old_logprobs      log-probs and entropy of the policy that sampled (no grad); reference's
  4. update_policy     one optimizer step per mini-batch, accumulated over micro-batches that
                       pack each prompt once and its responses into a token budget, the loss
                       normalised by counts summed over all ranks (Clip-Cov / KL-Cov, the 80/20
                       rule: their tokens chosen first, over the mini-batch: select_tokens) -> Update
  5. sync_weights      full weights from FSDP2 into the engine; then the step's record goes to
                       metrics.jsonl (and the trackers), with the held-out evaluation when due;
                       samples.jsonl and a checkpoint when due (save_or_stop)
The ranks work in lock-step wherever the model runs (every forward and backward of an FSDP2 model
is a collective): lockstep_forwards, global_counts and the metric reductions say so.
Settings: config.py. Data and prompts: data.py. The process group and reductions over it: ranks.py.
Model loading and FSDP2: policy.py. Checkpoints: checkpoint.py; the run's records in out_dir and
what a resume may change: runs.py.
How sequences become micro-batches, dealt over the ranks and forwarded in lock-step: packing.py.
TensorBoard and wandb besides metrics.jsonl (config `loggers`): trackers.py.
"""
import argparse
import json
import math
import os
import random
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from tqdm import tqdm

import reward
import rollout
import tepo
from config import Config, UserError, load_config  # noqa: F401  (train.Config too)
from data import load_rows, load_tokenizer, resolve_model, take_prompts
import eval as ev
from packing import balance_ranks, lockstep_forwards
from checkpoint import TrainState, check_checkpoint, load_training_state, save_checkpoint, set_rng_states
from policy import full_tensor, full_weights, load_policy
from ranks import (all_ranks, end_distributed, global_nth, global_tail, keep_largest, on_every_rank,
                   placement, run_main, setup_distributed, tail_size)
from runs import (check_resume_path, check_shared_dir, checkpoint_to_resume, cut_back_log, record_config,
                  resumed_config)
from trackers import check_installed, open_trackers

# ----------------------------------------------------------------------------- the records of a step


@dataclass
class Group:
    """One prompt of this rank and its G graded responses."""
    row: dict                # the data row: problem, answer, prompt (text)
    samples: list            # G rollout.Sample: token ids, sampler log-probs, text
    rewards: list            # G shaped rewards (float)
    correct: list            # G correctness flags (bool): what DAPO's filter and accuracy read


@dataclass
class Rollouts:
    """Phase 1's result on this rank."""
    groups: list             # [Group] to train on (DAPO: the informative ones, this rank's share)
    drawn: list              # [Group] every group drawn, informative or not
    metrics: dict            # reward/, response/, timing/rollout and /reward: over all ranks


@dataclass
class Sequence:
    """One response as the update sees it. Per-token tensors are (R,), R = len(resp); the old and
    reference values are filled in by exactly one pass each (old_logprobs, or the first
    mini-batch's own forward: keep_as_old)."""
    gid: tuple               # its group (prompt): (the rank that sampled it, index there)
    prompt: list             # prompt token ids
    resp: list               # response token ids (R,)
    adv: float               # A_i, broadcast over its tokens
    in_loss: bool            # the update computes its loss: A != 0, or another term reads it
    rollout_logp: torch.Tensor               # (R,) the sampler's log-probs
    old_logp: torch.Tensor | None = None     # (R,) pi_old's, no grad
    old_entropy: torch.Tensor | None = None  # (R,) H_old
    ref_logp: torch.Tensor | None = None     # (R,) pi_ref's, when a KL term needs them
    cov_sel: torch.Tensor | None = None      # (R,) bool: Clip-Cov / KL-Cov's tokens (select_tokens)
    entropy_sel: torch.Tensor | None = None  # (R,) bool: the 80/20 rule's tokens (select_tokens)


@dataclass
class Counts:
    """One mini-batch's sizes summed over all ranks: the loss's denominators (global_counts)."""
    tokens: int              # response tokens
    seqs: int                # responses
    trained: int             # response tokens of the sequences in the loss
    scored: int              # response tokens with A != 0: the 80/20 rule's pool, whatever else is in the loss


@dataclass
class OptimizerStep:
    """One mini-batch's optimizer step (clip_and_step)."""
    grad_norm: float         # the global gradient norm before clipping
    taken: bool              # False: the loss or gradient was not finite on some rank, so skipped


@dataclass
class Update:
    """Phase 4's result."""
    steps: list              # [OptimizerStep], one per mini-batch with trained tokens
    metrics: dict            # actor/, loss/, mismatch/ (the update's), timing/update: over all ranks

    @property
    def changed(self):
        """Whether the weights moved, so the engine needs them."""
        return any(s.taken for s in self.steps)


@dataclass
class Run:
    """What the phases of a step share; made once by `setup`."""
    cfg: Config
    rank: int
    world: int
    device: torch.device
    tokenizer: object
    model: torch.nn.Module               # the policy: this rank's FSDP2 shard
    ref_model: torch.nn.Module | None    # pi_ref, only when a KL term reads it
    optimizer: torch.optim.Optimizer
    engine: object                       # rollout.make_engine's: generate, update_weights, ...
    grader: object                       # reward.make_grader(cfg.reward): math_reward's signature
    judge: object                        # eval.make_judge(cfg.reward): (text, gold) -> (answer, correct)
    rows: list                           # training rows (dicts with "prompt")
    eval_rows: list                      # held-out rows
    eval_dropped: int                    # held-out rows dropped for a prompt over max_prompt_len
    state: TrainState
    trackers: list                       # open_trackers's (rank 0): TensorBoard, wandb, if chosen


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--config", help="YAML file of Config fields (config.py)")
    ap.add_argument("--set", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                    help="override config keys: --set seed=1 out_dir=runs/x (repeatable; "
                         "loss.clip_high=0.0005 for loss keys)")
    ap.add_argument("--resume", nargs="?", const="latest", metavar="CKPT",
                    help="continue from the newest checkpoint in out_dir, or from CKPT")
    ap.add_argument("--overwrite", action="store_true",
                    help="start afresh (or branch off with --resume CKPT of another out_dir) in an "
                         "out_dir that holds another run, deleting that run")
    ap.add_argument("--allow-config-change", action="store_true",
                    help="--resume with a config that differs from the checkpoint's in what defines "
                         "the run (recorded in out_dir/config_changes.jsonl)")
    args = ap.parse_args(argv)
    run = setup(load_config(args.config, args.set), resume=args.resume, overwrite=args.overwrite,
                allow_config_change=args.allow_config_change)
    cfg = run.cfg
    if run.eval_rows and run.state.step == 0:
        dropped = {"eval/dropped_long_prompts": run.eval_dropped} if run.eval_dropped else {}
        log(run, {"step": 0, **evaluate(run), **dropped})
    bar = tqdm(range(run.state.step, cfg.steps), disable=run.rank != 0, desc="RL",
               initial=run.state.step, total=cfg.steps)
    for step in bar:
        started = time.perf_counter()
        rollouts = sample_and_grade(run, step=step)                                  # 1
        run.engine.sleep()  # GPU: free the engine's memory for the update (no-op on CPU)
        minibatches = balance_ranks(make_sequences(rollouts.groups, cfg=cfg, rank=run.rank),  # 2
                                    full_batch_metrics=cfg.full_batch_metrics)
        old_pass = old_logprobs(run, minibatches=minibatches)                        # 3
        update = update_policy(run, minibatches=minibatches, step=step)              # 4
        synced = sync_weights(run, changed=update.changed)                           # 5
        run.state.step = step + 1
        record = {"step": step + 1, **rollouts.metrics, **old_policy_metrics(minibatches),
                  **update.metrics, **old_pass, **synced, "timing/step": time.perf_counter() - started}
        if run.eval_rows and (due(cfg.eval_every, step) or step + 1 == cfg.steps):
            record.update(evaluate(run))
        log(run, record)
        if due(cfg.log_samples_every, step) or not all(s.taken for s in update.steps):
            write_samples(run, step=step, groups=rollouts.drawn)  # a skipped update: its batch on record
        save_or_stop(run, step=step)
        # kl_old (0 at the first mini-batch, theta = theta_old) and the sampler/trainer mismatch on
        # the bar: a dtype or kernel mismatch shows here in the first minute of a GPU run.
        bar.set_postfix(reward=f"{record['reward/mean']:.3f}", acc=f"{record['reward/accuracy']:.3f}",
                        kl_old=f"{record.get('actor/kl_old') or 0:.1e}",
                        mismatch=f"{record.get('mismatch/abs_mean') or 0:.1e}",
                        s_per_step=f"{record['timing/step']:.1f}")
    end_distributed()  # first, on every rank alike: rank 0's trackers take a while
    for tracker in run.trackers:
        tracker.close()


def setup(cfg, *, resume, overwrite=False, allow_config_change=False):
    """Join the process group; read the data; build policy, reference, optimizer and engine;
    restore a checkpoint if `resume` ("latest" or a path) finds one, with the config it was saved
    with but for the keys a resume may change (`allow_config_change`: any key); prepare out_dir,
    which a fresh start or a branch shares with no other run (`overwrite` deletes one found there).
    -> Run"""
    rank, world, device = setup_distributed()
    if rank == 0:
        for line in placement(world, device):
            if line:
                print(line, flush=True)
    if cfg.prompts_per_step % world:
        raise UserError(f"config: prompts_per_step={cfg.prompts_per_step} must divide by the {world} ranks")
    check_installed(cfg.loggers)  # before the loading: a missing tracker package stops the run now
    check_resume_path(resume)
    model_dir = resolve_model(cfg.model)
    why = rollout.cannot_sync(model_dir, cfg.backend)
    if why:
        raise UserError(f"model {cfg.model}: {why}; not supported with backend {cfg.backend} here")
    tokenizer = load_tokenizer(model_dir)
    rows, _ = load_rows(cfg.train_data, cfg, tokenizer, rank)
    eval_rows, eval_dropped = load_rows(cfg.eval_data, cfg, tokenizer, rank) if cfg.eval_data else ([], 0)
    check_shared_dir(cfg.out_dir, rank, world)
    ckpt = checkpoint_to_resume(cfg.out_dir, resume, overwrite, rank)
    saved_world, changes = world, {}
    if ckpt:
        saved_world = check_checkpoint(ckpt, model_dir, world)
        changes = resumed_config(ckpt, cfg, allow_config_change)
        if rank == 0:
            print(f"--resume: from {ckpt}")
        if rank == 0 and saved_world != world:  # e.g. a node lost: go on with the ranks left
            print(f"--resume: {ckpt} was saved by {saved_world} ranks, this run has {world}: the "
                  f"optimizer state is resharded and the data order kept; each rank's random streams "
                  f"start afresh, so the run goes on but does not repeat an uninterrupted one exactly")
    start = ckpt or model_dir
    # The global RNGs of torch, Python and numpy, seeded as vLLM's start seeds them (with its seed,
    # cfg.seed + rank): a reward of one's own that draws from them repeats on either backend (with
    # transformers' generate they were left unseeded, so such a run never repeated).
    torch.manual_seed(cfg.seed + rank)
    random.seed(cfg.seed + rank)
    np.random.seed(cfg.seed + rank)
    model = load_policy(start, cfg, device)
    ref_model = load_policy(model_dir, cfg, device, trainable=False) if cfg.loss_cfg.needs_ref else None
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=cfg.betas,
                                  weight_decay=cfg.weight_decay)
    state, rng = TrainState(), None
    if ckpt:
        state, rng = load_training_state(ckpt, model, optimizer, rank, same_world=saved_world == world)
    engine = rollout.make_engine(start, backend=cfg.backend, dtype=cfg.dtype, seed=cfg.seed + rank,
                                 max_model_len=cfg.max_prompt_len + cfg.max_new_tokens,
                                 gpu_memory_utilization=cfg.gpu_memory_utilization)
    if rng is not None:  # after the engine: vLLM seeds the global RNGs with its own seed when it starts
        set_rng_states(rng)
    if rank == 0:
        for name in ("metrics.jsonl", "samples.jsonl"):
            cut_back_log(os.path.join(cfg.out_dir, name), state.step if ckpt else None)
        record_config(cfg, ckpt, state.step, changes)
    eval_rows = eval_rows[:cfg.eval_max_problems or None]
    return Run(cfg=cfg, rank=rank, world=world, device=device, tokenizer=tokenizer, model=model,
               ref_model=ref_model, optimizer=optimizer, engine=engine,
               grader=reward.make_grader(cfg.reward), judge=ev.make_judge(cfg.reward), rows=rows,
               eval_rows=eval_rows, eval_dropped=eval_dropped, state=state,
               trackers=open_trackers(cfg, state.step, resumed=bool(ckpt)) if rank == 0 else [])


# ----------------------------------------------------------------------------- 1. sample and grade


def sample_and_grade(run, *, step):
    """1. Sample G responses to each of this rank's P / N prompts, and grade them. A collective.

    DAPO's dynamic sampling keeps only groups whose answers are neither all right nor all wrong,
    and draws fresh prompts until the ranks together hold P such groups (or max_sampling_tries run
    out; then it trains on what there is); a rank with more than its share makes up for one with
    fewer (share_out). Advances state.data_pos by P per draw.
    A reward call that raises or runs over reward_timeout is a wrong answer (guarded_reward) and is
    counted; more than max_reward_errors of them stop the run (reward_failures). -> Rollouts
    """
    cfg, state = run.cfg, run.state
    groups, drawn, failed = [], [], {"errors": 0, "timeouts": 0}
    seconds = {"rollout": 0.0, "reward": 0.0}
    for attempt in range(cfg.max_sampling_tries if cfg.dynamic_sampling else 1):
        prompts = take_prompts(run.rows, state.data_pos, cfg.prompts_per_step, cfg.seed)
        prompts = prompts[run.rank::run.world]
        state.data_pos += cfg.prompts_per_step
        t0 = time.perf_counter()
        outs = run.engine.generate([r["prompt_ids"] for r in prompts], n=cfg.group_size,
                                   max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
                                   top_p=cfg.top_p, seed=rollout.derive_seed(cfg.seed, step, attempt, run.rank))
        t1 = time.perf_counter()
        new = []
        for row, samples in zip(prompts, outs):
            graded = [guarded_reward(cfg, run.grader, s, row["answer"], failed=failed, prompt=row["prompt"])
                      for s in samples]
            new.append(Group(row, samples, [g[0] for g in graded], [g[1] for g in graded]))
        groups, drawn = groups + new, drawn + new
        seconds["rollout"] += t1 - t0
        seconds["reward"] += time.perf_counter() - t1
        if not cfg.dynamic_sampling:
            break
        groups = informative_groups(groups)
        have = per_rank(run, len(groups))
        if sum(have) >= cfg.prompts_per_step:
            groups = groups[:share_out(have, cfg.prompts_per_step)[run.rank]]
            break
    failures = reward_failures(run, step=step, failed=failed, drawn=drawn)
    return Rollouts(groups, drawn, {**rollout_metrics(run, groups=groups, drawn=drawn, seconds=seconds),
                                    **failures})


def rollout_metrics(run, *, groups, drawn, seconds):
    """The sampled batch's rewards, accuracy and lengths over all ranks (every group drawn), and the
    seconds of sampling and grading (this rank's). A collective."""
    samples = [(s, r, c) for g in drawn for s, r, c in zip(g.samples, g.rewards, g.correct)]
    lens = [len(s.response_ids) for s, _, _ in samples]
    tot = all_ranks({"reward": sum(r for _, r, _ in samples), "correct": sum(c for _, _, c in samples),
                     "samples": len(samples), "tokens": sum(lens),
                     "truncated": sum(s.finish_reason == "length" for s, _, _ in samples),
                     "groups": len(groups), "drawn": len(drawn),
                     "neg_logp": -sum(sum(s.logprobs) for s, _, _ in samples),
                     "spread": sum(len(set(g.rewards)) > 1 for g in groups)})
    longest = all_ranks({"len": max(lens, default=0)}, "max")["len"]
    n = max(tot["samples"], 1)
    metrics = {"reward/mean": tot["reward"] / n, "reward/accuracy": tot["correct"] / n,
               "response/length_mean": tot["tokens"] / n, "response/length_max": longest,
               "response/truncated_frac": tot["truncated"] / n,
               "timing/rollout": seconds["rollout"], "timing/reward": seconds["reward"],
               "timing/rollout_tokens_per_s": tot["tokens"] / max(seconds["rollout"], 1e-9),
               # the step's budget (a study compares variants at equal budgets): every sample drawn
               # (dynamic sampling's extra draws too), and the groups kept whose rewards differ (A != 0)
               "rollout/samples_drawn": tot["samples"], "rollout/groups_spread": tot["spread"],
               # -log pi_sampler of the sampled tokens, per token over every sample drawn: the
               # sampling policy's entropy in expectation, over all prompts drawn (actor/entropy
               # covers the groups kept, which dynamic sampling chooses)
               "rollout/entropy_sampled": tot["neg_logp"] / max(tot["tokens"], 1)}
    if run.cfg.dynamic_sampling:
        metrics["reward/groups_kept"] = tot["groups"] / max(tot["drawn"], 1)
    return metrics


def reward_failures(run, *, step, failed, drawn):
    """Reward calls that raised or timed out, over all ranks; more than max_reward_errors of them
    (a share of the calls) stop the run, naming the first. A collective.
    -> {"reward/errors", "reward/timeouts"}"""
    n = all_ranks({"errors": failed["errors"], "timeouts": failed["timeouts"],
                   "rewards": sum(len(g.samples) for g in drawn)})
    if n["errors"] + n["timeouts"] > run.cfg.max_reward_errors * n["rewards"]:
        firsts = [None] * run.world
        dist.all_gather_object(firsts, failed.get("first"))
        raise UserError(f"step {step + 1}: {n['errors']:.0f} reward calls raised and {n['timeouts']:.0f} "
                        f"timed out of {n['rewards']:.0f} (max_reward_errors={run.cfg.max_reward_errors}); "
                        f"first: {next(f for f in firsts if f)}")
    return {"reward/errors": n["errors"], "reward/timeouts": n["timeouts"]}


def shaped_reward(cfg, grader, sample, answer, prompt=""):
    """-> (reward, correct). `correct` is the grader's verdict: its reward is 1.0 for a right answer
    only (format_reward < 1), whatever the shaping adds. A wrong answer's reward gets wrong_reward
    (DAPO: right +1, wrong -1); then DAPO's overlong shaping: a penalty growing linearly over the
    last `overlong_buffer` tokens before max_new_tokens, -overlong_factor at max_new_tokens, on every
    response token, a thinking model's thinking included. A response to a `prompt` that opened a
    think block is graded as "<think>" + response (reward.thinking_opened)."""
    text = ("<think>" if reward.thinking_opened(prompt) else "") + sample.text
    r = grader(text, answer, format_reward=cfg.format_reward, no_answer_penalty=cfg.no_answer_penalty)
    return shape(cfg, r, len(sample.response_ids))


def shape(cfg, r, n):
    """(reward, correct) of a grader's reward `r` for a response of `n` tokens: wrong_reward added
    to a wrong answer's, then the overlong penalty (shaped_reward)."""
    correct = r >= 1.0
    if not correct:
        r += cfg.wrong_reward
    B = cfg.overlong_buffer
    penalty = min(0.0, -(n - (cfg.max_new_tokens - B)) / B * cfg.overlong_factor) if B > 0 else 0.0
    return r + penalty, correct


def guarded_reward(cfg, grader, sample, answer, *, failed, prompt=""):
    """shaped_reward(), except that a call that raises, runs over cfg.reward_timeout seconds or loses
    math-verify's second opinion is counted (reward.guarded) and scored as a wrong answer: the
    grader's lowest reward (cfg.failed_reward: a built-in grader's is the lower of format_reward and
    -no_answer_penalty; a reward of one's own says its own), then wrong_reward and the overlong
    penalty of its length. So no response pays more by making the grader fail than by being wrong
    (a failure scored 0 did: above DAPO's -1 and its penalty)."""
    out = reward.guarded(cfg.reward_timeout, lambda: shaped_reward(cfg, grader, sample, answer, prompt),
                         sample.text, failed)
    if out is None:
        return shape(cfg, cfg.failed_reward, len(sample.response_ids))
    return out


def informative_groups(groups):
    """DAPO's dynamic-sampling filter: the groups whose answers are neither all right nor all wrong.
    Correctness, not the shaped reward: an overlong penalty or a format reward spreads the rewards
    of a group that is all right (or all wrong) without telling a good answer from a bad one."""
    return [g for g in groups if 0 < sum(g.correct) < len(g.correct)]


def per_rank(run, n):
    """[every rank's n], the same list on every rank. A collective."""
    have = all_ranks({f"rank{r}": n if r == run.rank else 0 for r in range(run.world)})
    return [int(have[f"rank{r}"]) for r in range(run.world)]


def share_out(have, total):
    """How many of its groups each rank keeps so that they add up to `total` (<= sum(have)): one
    slot per rank in turn, skipping ranks that have none left, so the kept groups stay spread over
    the ranks. have: [groups on rank r] -> [kept on rank r]."""
    keep = [0] * len(have)
    while sum(keep) < total:
        for r in range(len(have)):
            if keep[r] < have[r] and sum(keep) < total:
                keep[r] += 1
    return keep


# ----------------------------------------------------------------------------- 2. sequences


def make_sequences(groups, *, cfg, rank=0):
    """2. Group advantages, one Sequence per response, in `num_minibatches` mini-batches.

    A sequence with A = 0 carries no gradient, so the update leaves it out of the loss
    (in_loss=False), unless some other term of the loss reads it (LossConfig.every_response_in_loss).
    -> list of mini-batches, each a list of Sequence (this rank's share of the global mini-batch:
    every rank's k-th list together; balance_ranks deals them anew)
    """
    seqs = []
    for gid, g in enumerate(groups):
        adv = tepo.group_advantages(torch.tensor(g.rewards), cfg.group_size, cfg.loss_cfg.adv_std_norm)
        for s, a in zip(g.samples, adv.tolist()):
            seqs.append(Sequence((rank, gid), s.prompt_ids, s.response_ids, a,
                                 in_loss=a != 0 or cfg.loss_cfg.every_response_in_loss,
                                 rollout_logp=torch.tensor(s.logprobs, dtype=torch.float32)))
    return [[seqs[i] for i in idx] for idx in np.array_split(np.arange(len(seqs)), cfg.num_minibatches)]


# ----------------------------------------------------------------------------- 3. the old policy


@torch.no_grad()
def old_logprobs(run, *, minibatches):
    """3. Fill old_logp and old_entropy (pi_old = the weights that sampled), and ref_logp where a
    KL term reads pi_ref, with no grad. A collective. -> {"timing/old_logprobs": seconds}

    Left out: the first mini-batch's sequences in the loss, whose old values the update takes from
    its own first forward (keep_as_old: one forward pass saved). Each later mini-batch's trained
    sequences are forwarded as the update will forward them (the same list: the same rows, order
    and micro-batch cuts), so that where the policy has not moved the inputs of every kernel are
    the update's own: a GPU's matmul picks its tiling by the shape, so a sequence packed into
    another row could round differently in bf16, and TEPO's sequence clip (1 +- 3e-4) and its
    mask's H < H_old read exactly such differences. log r is then exactly 0 wherever the kernels
    are deterministic and compute alike with and without grad (this CPU's; on a GPU the update's
    forward under grad may pick another attention kernel: gpu_check's floor measures it). Sequences out of the loss (A = 0) get old values apart, only for
    the batch metrics (old_policy_metrics), unless full_batch_metrics is off.
    """
    t0, cfg = time.perf_counter(), run.cfg
    plans = [[s for s in mb if s.in_loss] for mb in minibatches[1:]]   # update_policy's lists
    plans.append([s for mb in minibatches for s in mb if not s.in_loss] if cfg.full_batch_metrics else [])
    for seqs in plans:
        for mb, _, logp, ent in lockstep_forwards(run.model, seqs, cfg=cfg, device=run.device,
                                                  with_entropy=True):
            for b, s in enumerate(mb):
                s.old_logp, s.old_entropy = logp[b, :len(s.resp)], ent[b, :len(s.resp)]
    if run.ref_model is not None:
        in_loss = [s for mb in minibatches for s in mb if s.in_loss]
        for mb, _, logp, _ in lockstep_forwards(run.ref_model, in_loss, cfg=cfg, device=run.device,
                                                with_entropy=False):
            for b, s in enumerate(mb):
                s.ref_logp = logp[b, :len(s.resp)]
    return {"timing/old_logprobs": time.perf_counter() - t0}


def keep_as_old(mb, batch, logp, entropy):
    """Take the first mini-batch's own forward as its old pass.

    Before the step's first optimizer step theta = theta_old, so the log-probs this forward
    computes (detached) are exactly pi_old's: old_logprobs leaves these sequences out, one forward
    pass saved. logp, entropy: (b, R)."""
    logp, entropy = logp.detach(), entropy.detach()  # (entropy carries a grad for a bonus)
    batch["old_logp"], batch["old_entropy"] = logp, entropy
    for b, s in enumerate(mb):
        s.old_logp, s.old_entropy = logp[b, :len(s.resp)], entropy[b, :len(s.resp)]


# ----------------------------------------------------------------------------- 4. the update


def update_policy(run, *, minibatches, step):
    """4. One optimizer step per mini-batch: gradients accumulated over its micro-batches, each
    micro-batch's loss normalised by the mini-batch's counts over all ranks (so they add up to the
    mini-batch's loss), then clip_and_step. A collective. -> Update
    """
    t0, cfg = time.perf_counter(), run.cfg
    for group in run.optimizer.param_groups:
        group["lr"] = lr_at(cfg, step)
    counts = global_counts(minibatches)
    n_trained = int(sum(n.trained for n in counts))  # over all mini-batches and ranks
    sums, steps, mask_steps = {}, [], 0
    top = torch.zeros(0, device=run.device)  # this rank's largest |log r| so far (log_ratio_tail)
    for k, (seqs, n) in enumerate(zip(minibatches, counts)):
        if n.trained == 0:
            continue  # no sequence of this mini-batch carries a gradient: no optimizer step
        # until a step is taken pi = pi_old, so the mask (target old) weighs 0: read where it can act
        reads_mask = any(st.taken for st in steps) or cfg.loss_cfg.kl_mask_target != "old"
        mask_steps += reads_mask
        run.optimizer.zero_grad(set_to_none=True)
        loss_sum = 0.0
        in_loss = [s for s in seqs if s.in_loss]
        keys = torch.Generator().manual_seed(rollout.derive_seed(cfg.seed, step, k, run.rank))
        if cfg.loss_cfg.selects_over_minibatch:
            select_tokens(run, in_loss, counts=n, keys=keys)
        for mb, batch, logp, ent in lockstep_forwards(run.model, in_loss, cfg=cfg, device=run.device,
                                                      with_entropy=True, grad=True):
            if k == 0:
                keep_as_old(mb, batch, logp, ent)
            loss, metrics = micro_batch_loss(cfg, batch, logp, ent, counts=n, keys=keys)
            if not reads_mask:
                metrics = {key: v for key, v in metrics.items() if not key.startswith("actor/grad_w_")}
            loss.backward()
            loss_sum += loss.item()
            add_metrics(sums, metrics)
            top = keep_largest(top, (logp.detach() - batch["old_logp"]).abs()[batch["mask"] > 0],
                               tail_size(n_trained, TAIL_Q))
        steps.append(clip_and_step(run, loss_sum))
    run.optimizer.zero_grad(set_to_none=True)
    metrics = update_metrics(run, sums=sums, steps=steps, step=step, mask_steps=mask_steps)
    metrics["actor/trained_tokens"] = n_trained  # the tokens in the loss, over the mini-batches
    if n_trained:  # the same on every rank
        metrics.update(log_ratio_tail(top, n_trained))
    metrics["timing/update"] = time.perf_counter() - t0
    return Update(steps, metrics)


def micro_batch_loss(cfg, batch, logp, entropy, *, counts, keys):
    """tepo.policy_loss of one micro-batch (a collated batch, logp and entropy (b, R)), normalised
    by its mini-batch's Counts; Clip-Cov / KL-Cov with cov_batch "microbatch" choose their tokens
    here, within it, as verl does (`keys`: the mini-batch's random keys). -> (loss, metrics)"""
    lcfg = cfg.loss_cfg
    if lcfg.cov != "none" and lcfg.cov_batch == "microbatch":
        batch["cov_sel"] = tepo.cov_select(logp, batch["old_logp"], batch["adv"], batch["mask"],
                                           lcfg, tepo.cov_keys(batch["mask"].shape, keys))
    return tepo.policy_loss(logp, batch["old_logp"], batch["adv"], batch["mask"], lcfg, entropy=entropy,
                            num_tokens=counts.tokens, num_seqs=counts.seqs, metric_tokens=counts.trained,
                            old_entropy=batch["old_entropy"], ref_logp=batch.get("ref_logp"),
                            rollout_logp=batch["rollout_logp"], cov_sel=batch.get("cov_sel"),
                            entropy_sel=batch.get("entropy_sel"))


def clip_and_step(run, loss_sum):
    """Clip the gradient's global norm at grad_clip and take the optimizer step; unless the loss
    (`loss_sum`, this rank's) or the gradient is not finite on some rank: then the step is skipped
    and the weights stay as they are (counted in state.skipped and state.bad_in_a_row;
    save_or_stop ends a run of too many). A collective. -> OptimizerStep"""
    grad_norm = torch.nn.utils.clip_grad_norm_(run.model.parameters(), run.cfg.grad_clip)
    grad_norm = float(full_tensor(grad_norm))
    loss_finite = all_ranks({"finite": math.isfinite(loss_sum)}, "min")["finite"]
    taken = math.isfinite(grad_norm) and bool(loss_finite)
    if taken:
        run.optimizer.step()
        run.state.bad_in_a_row = 0
    else:
        run.state.skipped += 1
        run.state.bad_in_a_row += 1
    return OptimizerStep(grad_norm, taken)


def add_metrics(sums, metrics):
    """Fold one micro-batch's metrics (tepo.policy_loss's, 0-d tensors) into `sums`: by min or
    max where tepo.METRIC_REDUCE says so, else added up."""
    for key, v in metrics.items():
        op = tepo.METRIC_REDUCE.get(key, "sum")
        sums[key] = sums.get(key, 0.0) + v if op == "sum" else (min if op == "min" else max)(sums.get(key, v), v)


def update_metrics(run, *, sums, steps, step, mask_steps):
    """The update's metrics over all ranks: tepo.policy_loss's, each combined by its rule
    (tepo.METRIC_REDUCE, else a sum), then tepo.step_metrics; and the steps' own (count, mean
    gradient norm, lr, skipped in all). A collective."""
    key_sets = [None] * run.world  # a rank that trained on nothing has no keys: gather them
    dist.all_gather_object(key_sets, sorted(sums))
    keys = sorted(set().union(*key_sets))
    fill = {k: math.inf if op == "min" else -math.inf for k, op in tepo.METRIC_REDUCE.items()}
    local = {k: sums.get(k, fill.get(k, 0.0)) for k in keys}  # what a rank without the key adds
    over_ranks = {"sum": all_ranks(local), "min": all_ranks(local, "min"), "max": all_ranks(local, "max")}
    metrics = tepo.step_metrics({k: over_ranks[tepo.METRIC_REDUCE.get(k, "sum")][k] for k in keys},
                                optimizer_steps=len(steps), mask_steps=mask_steps)
    metrics.update({"actor/optimizer_steps": len(steps),
                    "actor/grad_norm": sum(s.grad_norm for s in steps) / max(len(steps), 1),
                    "actor/lr": lr_at(run.cfg, step), "actor/skipped_updates": run.state.skipped})
    return metrics


# The tail of the per-token |log pi/pi_old| over a step's trained tokens (every mini-batch's
# forward): its max and 99.9th percentile show an abrupt update that a mean hides. Exact without
# gathering every token: the q-quantile lies among the tail_size largest values overall, and these
# are among the union of every rank's tail_size largest.
TAIL_Q = 0.999


def log_ratio_tail(top, n):
    """actor/log_ratio_max and actor/log_ratio_p999 of the step's n trained tokens. A collective."""
    largest, p999 = global_tail(top, n, TAIL_Q)
    return {"actor/log_ratio_max": largest, "actor/log_ratio_p999": p999}


@torch.no_grad()
def select_tokens(run, seqs, *, counts, keys):
    """The tokens of one mini-batch chosen on all ranks, so that the choice does not depend on how the
    batch is cut: Clip-Cov / KL-Cov's over its trained tokens (s.cov_sel: tepo.choose_cov; `keys`, this
    rank's generator) and the 80/20 rule's over those with A != 0, whatever other terms put in the
    loss (s.entropy_sel: tepo.top_entropy_select; counts.scored), from the current policy's
    log-probs and entropy in a forward without grad (their cost: one more forward pass per
    mini-batch). A collective."""
    lcfg, current = run.cfg.loss_cfg, {}
    for mb, _, logp, ent in lockstep_forwards(run.model, seqs, cfg=run.cfg, device=run.device,
                                              with_entropy=lcfg.top_entropy_frac > 0):
        for b, s in enumerate(mb):  # (logp (R,), entropy (R,) or None)
            current[id(s)] = [x if x is None else x[b, :len(s.resp)].cpu() for x in (logp, ent)]
    if lcfg.cov != "none" and lcfg.cov_batch == "minibatch":
        # The first mini-batch has no old log-probs yet (keep_as_old): there theta = theta_old, r = 1.
        items = [(current[id(s)][0], current[id(s)][0] if s.old_logp is None else s.old_logp.cpu(), s.adv)
                 for s in seqs]
        for s, sel in zip(seqs, tepo.choose_cov(items, lcfg, counts.trained, keys, sums=all_ranks, nth=global_nth)):
            s.cov_sel = sel
    if lcfg.top_entropy_frac > 0:
        scored = [s for s in seqs if s.adv != 0]  # (A = 0: no policy term to keep)
        H = torch.cat([current[id(s)][1] for s in scored] or [torch.zeros(0)])[:, None]      # (N, 1)
        sel = tepo.top_entropy_select(H, torch.ones_like(H), lcfg.top_entropy_frac, num_tokens=counts.scored,
                                      nth=global_nth)
        for s in seqs:
            s.entropy_sel = torch.zeros(len(s.resp), dtype=torch.bool)
        for s, x in zip(scored, sel[:, 0].split([len(s.resp) for s in scored])):
            s.entropy_sel = x


# ----------------------------------------------------------------------------- 5. sync and log


def sync_weights(run, *, changed):
    """5. Wake the engine and, if an optimizer step was taken (`changed`), send it the new weights,
    gathered whole from FSDP2's shards. A collective. -> {"timing/sync": seconds}"""
    t0 = time.perf_counter()
    if run.device.type == "cuda":  # vLLM's wake-up allocates outside PyTorch's caching allocator:
        torch.cuda.empty_cache()   # hand it the update's cached blocks
    run.engine.wake()
    if changed:  # a load that fails on one rank stops all (their gathers would wait for it forever)
        on_every_rank(run.engine.update_weights, full_weights(run.model), "the weight sync into the engine")
    return {"timing/sync": time.perf_counter() - t0}


def old_policy_metrics(minibatches):
    """The batch at theta_old, over every response token (or those in the loss: full_batch_metrics):
    entropy, Cov(log pi, A), and the sampler/trainer mismatch: mean |log pi_rollout - log pi_old|,
    KL(pi_rollout || pi_old) by k3 (the tokens are the sampler's), the largest per-token
    pi_old / pi_rollout (what an importance weight would be); null when there are none. Read after
    the update, whose first forward gives the first mini-batch its old values (keep_as_old).
    A collective.

    Cov(log pi, A) drives the entropy's change under policy gradient (dH ~ -lr Cov(log pi, A)):
    a positive covariance is a policy sharpening."""
    seqs = [s for mb in minibatches for s in mb if s.old_logp is not None]
    local = dict.fromkeys(["entropy", "logp_adv", "logp", "adv", "mismatch", "mismatch_kl", "n"], 0.0)
    log_w_max = -math.inf
    if seqs:
        cat = lambda key: torch.cat([getattr(s, key).detach().cpu().double() for s in seqs])  # noqa: E731
        lp, adv = cat("old_logp"), torch.cat([torch.full((len(s.resp),), s.adv) for s in seqs])
        rollout_lp = cat("rollout_logp")
        local = {"entropy": cat("old_entropy").sum(), "logp_adv": (lp * adv).sum(), "logp": lp.sum(),
                 "adv": adv.sum(), "mismatch": (rollout_lp - lp).abs().sum(),
                 "mismatch_kl": tepo.kl_estimate(rollout_lp, lp, "k3").sum(), "n": len(lp)}
        log_w_max = (lp - rollout_lp).max().item()
    tok = all_ranks(local)
    log_w_max = all_ranks({"w": log_w_max}, "max")["w"]
    n_tok = tok["n"] or math.nan
    metrics = {
        "actor/entropy": tok["entropy"] / n_tok, "mismatch/abs_mean": tok["mismatch"] / n_tok,
        "mismatch/kl": tok["mismatch_kl"] / n_tok,
        "mismatch/ratio_max": math.exp(min(log_w_max, 700)) if tok["n"] else math.nan,
        "actor/cov_logp_adv": tok["logp_adv"] / n_tok - (tok["logp"] / n_tok) * (tok["adv"] / n_tok)}
    return {k: None if math.isnan(v) else v for k, v in metrics.items()}


def evaluate(run):
    """Held-out accuracy over all ranks, by eval.py's path (eval.sample_benchmark: problem i sampled
    from its own stream, seeded from (seed, the file's name, i), on rank i mod world; graded by
    eval.make_judge), so the numbers do not depend on the number of ranks and equal `eval.py --ckpt
    <the step's checkpoint> --data <eval_data> -n eval_n --temperature T --top-p P --max-new-tokens M
    --seed <seed>`. A collective.
    -> {"eval/accuracy": the mean correctness of the eval_n samples per problem (= pass@1),
    "eval/pass@k": unbiased pass@k averaged over problems, k = 1, 2, 4, ... <= eval_n}. pass@k
    falling while pass@1 rises is a policy collapsing onto fewer answers. A grading call that
    raises or runs over reward_timeout counts as wrong, is printed, and is on record as
    "eval/grader_failures" (only then): an evaluation never stops a run."""
    cfg, rows = run.cfg, run.eval_rows
    ks = [2 ** i for i in range(cfg.eval_n.bit_length()) if 2 ** i <= cfg.eval_n]
    records = ev.sample_benchmark(
        run.engine, ev.benchmark_name(cfg.eval_data), rows, [r["prompt_ids"] for r in rows], n=cfg.eval_n,
        max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p,
        seed=cfg.seed, chunk_size=math.ceil(ev.SEQS_PER_CALL / cfg.eval_n), ks=ks, judge=run.judge,
        reward_timeout=cfg.reward_timeout, rank=run.rank, world=run.world,
        thinking_opened=bool(rows) and reward.thinking_opened(rows[0]["prompt"]))
    # Every problem's numbers on every rank, summed in problem order: the same float sums
    # whichever rank sampled which problem.
    mine = [(r["index"], sum(s["correct"] for s in r["samples"]),
             sum(s.get("grader_failed", False) for s in r["samples"]),
             [r["metrics"][f"pass@{k}"] for k in ks]) for r in records]
    parts = [None] * run.world
    dist.all_gather_object(parts, mine)
    problems = sorted(p for part in parts for p in part)
    n = max(len(problems), 1)
    out = {"eval/accuracy": sum(c for _, c, _, _ in problems) / (n * cfg.eval_n),
           **{f"eval/pass@{k}": sum(p[3][j] for p in problems) / n for j, k in enumerate(ks)}}
    failed = sum(f for _, _, f, _ in problems)
    if failed:  # on record only where it happened, as a fault
        out["eval/grader_failures"] = failed
    accuracies = [c / cfg.eval_n for _, c, _, _ in problems]
    half = ev.held_out_interval(accuracies)[1]
    if half is not None:  # plot.py draws it around the accuracy
        out["eval/accuracy_ci95"] = half
    if run.rank == 0:  # above the progress bar, which shows the training accuracy
        tqdm.write(ev.held_out_line(run.state.step, accuracies, cfg.eval_n))
    return out


def log(run, record):
    """Append one record to out_dir/metrics.jsonl, and send it to the trackers (rank 0)."""
    if run.rank == 0:
        with open(os.path.join(run.cfg.out_dir, "metrics.jsonl"), "a") as f:
            f.write(json.dumps(record) + "\n")
        for tracker in run.trackers:
            tracker.log(record)


def write_samples(run, *, step, groups):
    """Two responses of each of the first two groups to out_dir/samples.jsonl and the trackers: a
    look at what the policy writes (rank 0)."""
    if run.rank != 0:
        return
    rows = [{"step": step + 1, "prompt": g.row["prompt"], "answer": g.row["answer"],
             "response": s.text, "reward": r}
            for g in groups[:2] for s, r in zip(g.samples[:2], g.rewards)]
    with open(os.path.join(run.cfg.out_dir, "samples.jsonl"), "a") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
    for tracker in run.trackers:
        tracker.samples(step + 1, rows)


def save_or_stop(run, *, step):
    """Save a checkpoint when due (every save_every steps, and after the last). After more than
    max_bad_steps non-finite updates in a row, save this step's state as it is (the bad updates
    were skipped, so the weights are finite) without pruning older checkpoints, and stop. A
    collective when it saves."""
    cfg, state = run.cfg, run.state
    last = step + 1 == cfg.steps
    stop = state.bad_in_a_row > cfg.max_bad_steps
    if stop or due(cfg.save_every, step) or last:
        path = save_checkpoint(cfg, run.model, run.optimizer, run.tokenizer, state, run.rank,
                               last=last and not stop, prune=not stop)
    if stop:
        raise RuntimeError(f"{state.bad_in_a_row} optimizer steps in a row had a non-finite "
                           f"loss or gradient (max_bad_steps={cfg.max_bad_steps}); stopped after "
                           f"step {step + 1}, saved in {path} (older checkpoints kept)")


# ----------------------------------------------------------------------------- counts over the ranks


def global_counts(minibatches):
    """Per mini-batch, its Counts summed over all ranks: the loss's denominators, so that it does
    not depend on how the batch is split. A collective."""
    local = {}
    for k, mb in enumerate(minibatches):
        local.update({f"{k}/tokens": sum(len(s.resp) for s in mb), f"{k}/seqs": len(mb),
                      f"{k}/trained": sum(len(s.resp) for s in mb if s.in_loss),
                      f"{k}/scored": sum(len(s.resp) for s in mb if s.adv != 0)})
    total = all_ranks(local)
    return [Counts(*(total[f"{k}/{x}"] for x in ("tokens", "seqs", "trained", "scored"))) for k in range(len(minibatches))]


# ----------------------------------------------------------------------------- schedules


def lr_at(cfg, step):
    """Learning rate for RL step `step`: linear warm-up, then constant or cosine decay."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if cfg.lr_schedule == "constant":
        return cfg.lr
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def due(every, step):
    """Whether a periodic job (evaluation, samples, checkpoint) runs after RL step index `step`:
    on steps every, 2 every, ... counted from 1, as the records are numbered (0: never)."""
    return bool(every) and (step + 1) % every == 0


if __name__ == "__main__":
    run_main(main)
