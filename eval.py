"""eval.py: judge a checkpoint on math benchmarks (accuracy, pass@k, maj@k) with one command.

    python eval.py --ckpt runs/tepo/step_000200 --data-dir data \\
        [--benchmarks math500,aime24,...] [--data FILE ...] [--n 16] [--temperature 0.6]
        [--top-p 0.95] [--max-new-tokens N] [--k 1,8,16] [--greedy] [--seed 0] [--out results.json]
    torchrun --nproc_per_node 8 eval.py --ckpt ... -n 16  # problems sharded over ranks; write
                                                          # -n (torchrun takes --n for its own)
    python eval.py --ckpt CKPT --preset paper   # the protocol of the papers' tables (see PRESETS)
    python eval.py --table runs/*/step_000500/eval/results.json --out table.md

A protocol (--preset paper or quick) fixes the benchmarks, the samples per problem, temperature,
top_p, the response cap and the prompt; any of them can still be overridden by its flag. results.json
records the protocol used (and the preset's overrides), and --table puts several results side by side
(a row per run, the mean over the seeds of each training configuration, 95% intervals, the paper's
reported numbers as a reference row beside the paper protocol unmodified) only when they share it:
table.py, which this command runs.

Benchmarks are JSONL files with `problem` and `answer`, found in --data-dir (default: $TEPO_DATA_DIR,
else `data/`) by name: math500, aime24, aime25, amc23, minerva, olympiadbench, gsm8k (see
BENCHMARKS), or any other `<name>.jsonl` there by its stem. The prompt is data.encode_prompt with
the checkpoint's own `prompt_template` (from train_config.yaml, which train.py writes into every
checkpoint), so a checkpoint is evaluated the way it was trained; --max-new-tokens defaults to its
`max_new_tokens` (else 4096). A model without train_config.yaml gets the chat template (else a plain
one) and 4096 tokens: eval.py says at start which prompt and cap it uses and where each comes from,
with the benchmarks and samples it will draw. Prompt plus response never exceed the model's context
(`max_position_embeddings`): a response that hits it counts as truncated, and a problem whose prompt
alone fills it gets n empty, wrong samples (counted as `prompt_too_long`), so the denominator stays
the benchmark's.

Metrics per benchmark (each a mean over problems, as fractions in results.json):
  accuracy  avg@n: the mean correctness of all n samples (equals pass@1);
  pass@k    the unbiased estimator of Chen et al. (2021), 1 - C(n-c, k) / C(n, k), c correct of n;
  maj@k     majority vote over the extracted answers of the FIRST k samples (see majority_vote);
plus the mean response length in tokens and the truncation rate (responses cut by the token limit).
Outputs: a table on the console, results.json (--out, default CKPT/eval/results.json; results of
another protocol there are not replaced: eval.py stops at start) and, beside it,
<out>_samples.jsonl with one graded line per sample that anyone can re-grade.

Reproducibility and ranks: problem i of a benchmark is sampled from its own random stream, seeded by
(seed, benchmark, i), whichever rank and generate call sample it. Problems are dealt to the ranks
round-robin (problem i to rank i mod world), so every rank samples every benchmark, within one
problem of the others, and each rank samples its share in calls of --chunk-size problems (default:
ceil(1024 / n)). The same seed gives the same numbers on 1 or 8 ranks (bit for bit on CPU, where
it is tested; on GPU up to the engine's batch invariance: its logits may differ in the last bits
with the batch a sequence is decoded in).
"""
import argparse
import hashlib
import json
import math
import os
import time
from fractions import Fraction

import torch.distributed as dist
import yaml
from tqdm import tqdm

import data
import ranks
from config import UserError
import reward
import rollout
import runs
import second_opinion
import table

# Benchmark name -> file name in --data-dir (the schema and names of ../shared/data).
BENCHMARKS = {"math500": "math500.jsonl", "aime24": "aime24.jsonl", "aime25": "aime25.jsonl",
              "amc23": "amc23.jsonl", "minerva": "minerva_math.jsonl",
              "olympiadbench": "olympiadbench.jsonl", "gsm8k": "gsm8k_test.jsonl"}
# The rows_digest of each benchmark as `data.py fetch` writes it (and ../shared/data holds it):
# under a preset, other rows in --data-dir modify the protocol, so the paper's numbers are not shown
# beside them.
BENCHMARK_ROWS = {
    "math500": "cc976e62f0457b6e026bf188f8a6f3d8c00675baaf63cf54c8a2c311b096118b",
    "aime24": "c3ce2fba1d9e4beaa9a13f9ec0048023a9aee3ffe7cde219fc447f61b6fa4679",
    "aime25": "aea363f59973845287a6116c2a5ab8e8e4715d44e29f623bc4f01ea51138aeb2",
    "amc23": "112be57859252dfaf4dda719ef70410dfef150871d1e6b3b27faa3dbe4cefde5",
    "minerva": "a1e9ef81802872c113ecd534d3f334474f4aa3433bd40fb73fedee0f5ec9b25e",
    "olympiadbench": "375706f56830f60224886d39faf8fb1073a411989c67d67259991922d93fc41f",
    "gsm8k": "bb3478cc4e1038476525262658917d04d96e1ad4c9d88de7c93690219a9ce7a9"}
DEFAULT_K = (1, 8, 16)
# Named protocols (--preset). "paper": the one of this line of work's tables for Qwen2.5-Math
# (SimpleRL-Zoo, Dr.GRPO, the TEPO paper's seven benchmarks): avg@32 on the benchmarks of under 100
# problems (AIME 24/25, AMC 23, where one sample per problem is mostly noise), avg@4 on the others;
# T 0.6 and top_p 0.95; the chat template with the boxed-answer instruction ("default"); responses up
# to 3,072 tokens, so that prompt and response fit Qwen2.5-Math's 4,096-token context (as in training,
# configs/math1.5b.yaml). Which parts the TEPO paper states, and which are ours, README says.
# "quick": one greedy sample per problem, for a first look.
PRESETS = {
    "paper": {"benchmarks": list(BENCHMARKS), "n": {"below_100": 32, "else": 4}, "temperature": 0.6,
              "top_p": 0.95, "max_new_tokens": 3072, "prompt_template": "default"},
    "quick": {"benchmarks": list(BENCHMARKS), "greedy": True, "n": 1, "max_new_tokens": 3072,
              "prompt_template": "default"},
}
# Default chunk: about this many sequences (problems x n) per generate call of a rank. Larger calls
# batch better (a call's last, longest responses decode in a thin batch: MATH-500 at n=4 on CPU took
# ~1.5x longer in chunks of 128 problems than in one call); smaller ones report progress more often.
SEQS_PER_CALL = 1024


# ----------------------------------------------------------------------------- metrics

def pass_at_k(n, c, k):
    """Unbiased pass@k of one problem with c correct among n samples: 1 - C(n-c, k) / C(n, k).

    The probability that a random k-subset of the n samples holds a correct one (Chen et al.
    2021); computed with exact integers, so it is exact for any n.
    """
    if not (isinstance(n, int) and isinstance(c, int) and isinstance(k, int)):
        raise TypeError(f"pass_at_k takes ints, got n={n!r}, c={c!r}, k={k!r}")
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    return float(1 - Fraction(math.comb(n - c, k), math.comb(n, k)))


def majority_vote(answers, same=reward.verify):
    """Index of the sample whose answer wins the vote among `answers` (str or None), or None.

    Answers are grouped into clusters in order: an answer joins the first cluster whose first
    answer (its representative) it equals as a string or by `same(representative, answer)`;
    None (no answer extracted) casts no vote. The largest cluster wins; among tied clusters the
    one whose first answer comes first wins. Returns the index of the winner's representative.
    """
    reps, votes = [], []  # representative sample index and vote count per cluster
    for i, a in enumerate(answers):
        if a is None:
            continue
        for j, r in enumerate(reps):
            if a == answers[r] or same(answers[r], a):
                votes[j] += 1
                break
        else:
            reps.append(i)
            votes.append(1)
    if not reps:
        return None
    best = max(range(len(reps)), key=lambda j: (votes[j], -j))  # ties: the earliest cluster
    return reps[best]


def maj_at_k(answers, correct, k, same=reward.verify):
    """maj@k of one problem: whether the majority answer of the first k samples is correct.

    `answers` (str or None) and `correct` (bool) are per sample, in sample order; the winner is
    majority_vote's, and its correctness is that of its representative sample. No answer at all
    is wrong. With n > k samples this is one draw of k, as papers report maj@k (the mean over all
    k-subsets would cost C(n, k) votes); it is unbiased, only noisier than avg@n.
    """
    if len(answers) != len(correct):
        raise ValueError(f"maj_at_k: {len(answers)} answers but {len(correct)} correctness flags")
    if not 1 <= k <= len(answers):
        raise ValueError(f"maj_at_k needs 1 <= k <= {len(answers)} samples, got k={k}")
    winner = majority_vote(answers[:k], same)
    return winner is not None and bool(correct[winner])


def problem_metrics(samples, ks, same=reward.verify):
    """Per-problem numbers from its graded samples (dicts with answer, correct, tokens, finish);
    `same` groups the answers for maj@k (majority_vote)."""
    n, c = len(samples), sum(s["correct"] for s in samples)
    answers, correct = [s["answer"] for s in samples], [s["correct"] for s in samples]
    out = {"accuracy": c / n}
    out.update({f"pass@{k}": pass_at_k(n, c, k) for k in ks})
    out.update({f"maj@{k}": float(maj_at_k(answers, correct, k, same)) for k in ks})
    return out


def summarize(problems, ks):
    """Benchmark metrics: the mean of each per-problem metric, response length and truncation."""
    keys = ["accuracy"] + [f"pass@{k}" for k in ks] + [f"maj@{k}" for k in ks]
    out = {"problems": len(problems), "n": len(problems[0]["samples"]), "k": list(ks)}
    out.update({key: sum(p["metrics"][key] for p in problems) / len(problems) for key in keys})
    # The standard error of the accuracy over problems: each problem's avg@n carries its sampling
    # noise, so this one number covers both (the interval of --table); None below 2 problems.
    acc = [p["metrics"]["accuracy"] for p in problems]
    out["accuracy_se"] = (math.sqrt(sum((a - out["accuracy"]) ** 2 for a in acc) / (len(acc) - 1)
                                    / len(acc)) if len(acc) > 1 else None)
    gen = [s for p in problems for s in p["samples"] if s["finish_reason"] != "prompt_too_long"]
    out["mean_response_tokens"] = sum(s["tokens"] for s in gen) / max(len(gen), 1)
    out["truncation_rate"] = sum(s["finish_reason"] == "length" for s in gen) / max(len(gen), 1)
    out["prompt_too_long"] = sum(p["samples"][0]["finish_reason"] == "prompt_too_long"
                                 for p in problems)
    out["generated_tokens"] = sum(s["tokens"] for s in gen)
    out["grader_failures"] = sum(s.get("grader_failed", False) for p in problems for s in p["samples"])
    return out


# ----------------------------------------------------------------------------- inputs

def available_benchmarks(data_dir):
    """{name: path} of every benchmark in `data_dir`: the BENCHMARKS names and all file stems."""
    found = {}
    if os.path.isdir(data_dir):
        for f in sorted(os.listdir(data_dir)):
            if f.endswith(".jsonl"):
                found[f[:-len(".jsonl")]] = os.path.join(data_dir, f)
    for name, f in BENCHMARKS.items():
        if os.path.isfile(os.path.join(data_dir, f)):
            found[name] = os.path.join(data_dir, f)
    return found


def train_config(ckpt):
    """The run config train.py saved into the checkpoint (train_config.yaml), or {}."""
    path = os.path.join(ckpt, "train_config.yaml")
    if not os.path.isfile(path):
        return {}
    with open(path) as f:
        return yaml.safe_load(f) or {}


def context_length(ckpt):
    """The model's context (max_position_embeddings of config.json), or None if it has none."""
    with open(os.path.join(ckpt, "config.json")) as f:
        cfg = json.load(f)
    cfg = cfg.get("text_config", cfg)  # multimodal configs nest the language model's
    return cfg.get("max_position_embeddings")


class OneLineErrors(argparse.ArgumentParser):
    """argparse with errors of one line, `eval.py: error: ...` (exit code 2): argparse printed the
    9-line usage before each, which `eval.py -h` shows. Under torchrun the line is printed once and
    ends torchrun's report (ranks.report_error), as train.py's errors are."""

    def error(self, message):
        if "TORCHELASTIC_RUN_ID" not in os.environ:
            self.exit(2, f"{self.prog}: error: {message}\n")
        ranks.report_error(f"{self.prog}: error: {message}")
        os._exit(2)  # as ranks.run_main: peers may be gone, and shutdown hooks would wait on them


def parse_args(argv=None):
    """Parse and check the command line; bad input exits with one line naming the problem."""
    ap = OneLineErrors(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--ckpt", help="transformers-format model directory")
    ap.add_argument("--preset", choices=sorted(PRESETS), help="a named protocol (see PRESETS); its "
                                                              "settings yield to the flags given")
    ap.add_argument("--max-problems", type=int, help="only the first N problems of each benchmark "
                                                     "(a smoke test; recorded in the protocol)")
    ap.add_argument("--table", nargs="+", metavar="RESULTS", help="print the table of these "
                    "results.json files (with --out FILE.md, also write it and a .csv beside it) and stop")
    ap.add_argument("--benchmarks", help="comma-separated names (default: all of BENCHMARKS, or "
                                         "none when --data is given)")
    ap.add_argument("--data-dir", default=os.environ.get("TEPO_DATA_DIR", "data"),
                    help="where benchmark files are found (default: $TEPO_DATA_DIR, else data/)")
    ap.add_argument("--data", nargs="+", default=[], metavar="FILE",
                    help="extra JSONL benchmark files, named by their stem; without --benchmarks "
                         "they are the only ones (a preset's seven included)")
    # -n / --num-samples: under torchrun, whose parser takes `--n` for an abbreviation of its own.
    ap.add_argument("-n", "--n", "--num-samples", dest="n", type=int,
                    help="samples per problem (default 16; 1 with --greedy)")
    ap.add_argument("--temperature", type=float, help="default 0.6")
    ap.add_argument("--top-p", type=float, help="default 0.95")
    ap.add_argument("--max-new-tokens", "--max-tokens", dest="max_new_tokens", type=int,
                    help="response budget (default: the checkpoint's max_new_tokens, else 4096)")
    ap.add_argument("--k", help="comma-separated k of pass@k and maj@k (default: 1,8,16 up to n, "
                                "and n)")
    ap.add_argument("--greedy", action="store_true", help="temperature 0, n = 1, k = 1")
    ap.add_argument("--seed", type=int, default=0, help="sampling seed: problem i of a benchmark is sampled "
                                                        "from (seed, benchmark, i); not part of the protocol")
    ap.add_argument("--prompt-template", help="'{problem}' template overriding the checkpoint's; "
                                              "'default' for the chat template (or plain)")
    ap.add_argument("--backend", default="vllm", choices=rollout.BACKENDS,
                    help="sampling engine: vllm, or hf (transformers' generate, slower)")
    ap.add_argument("--grader", default=reward.DEFAULT_GRADER,
                    help="rule+math_verify (the default: reward.py's rules, then math-verify where they "
                         "say no), rule or math_verify alone (to reproduce numbers made with one), or "
                         "package.module:function (a reward of one's own, math_reward's signature)")
    ap.add_argument("--reward-timeout", type=float, default=10.0,
                    help="seconds one grading call may take; over it, or raising, the sample is wrong "
                         "and counted (results: grader_failures)")
    ap.add_argument("--dtype", default="auto", help="the engine's dtype: float32, bfloat16 or float16; "
                                                     "auto: bfloat16 on GPU, float32 on CPU")
    ap.add_argument("--chunk-size", type=int, help="problems per generate call of a rank "
                                                   "(default: ceil(1024 / n)); not part of the seed")
    ap.add_argument("--out", help="results JSON (default: CKPT/eval/results.json; results of another "
                                  "protocol there are not replaced); with --table: the table's .md")
    args = ap.parse_args(argv)
    if args.table:
        return args
    if args.grader not in reward.GRADERS:
        try:
            reward.make_grader(args.grader)  # a function of one's own: imported, its signature checked
        except ValueError as e:
            ap.error(str(e))
    if not args.ckpt:
        ap.error("--ckpt is required (or --table RESULTS ...)")
    preset = PRESETS.get(args.preset, {})
    given = {k: v for k, v in vars(args).items() if v is not None}
    args.given = given  # the flags given, for preset_overrides
    for key in ("temperature", "top_p", "max_new_tokens", "prompt_template"):
        if key not in given and key in preset:
            setattr(args, key, preset[key])
    if preset and args.benchmarks is None and not args.data:
        args.benchmarks = ",".join(preset["benchmarks"])
    args.greedy = args.greedy or (preset.get("greedy", False) and args.n in (None, 1)
                                  and args.temperature in (None, 0.0))
    rule = preset.get("n") if args.n is None and not args.greedy else None
    args.n_rule = rule if isinstance(rule, dict) else None  # paper's n by size; quick's is one
    args.n = rule if isinstance(rule, int) else args.n
    args.temperature = 0.6 if args.temperature is None else args.temperature
    args.top_p = 0.95 if args.top_p is None else args.top_p
    if args.max_problems is not None and args.max_problems < 1:
        ap.error(f"--max-problems must be >= 1, got {args.max_problems}")

    if not os.path.isfile(os.path.join(args.ckpt, "config.json")):
        hint = ""
        if os.path.isdir(args.ckpt):
            steps = sorted(d for d in os.listdir(args.ckpt) if d.startswith("step_"))
            hint = f" (it holds checkpoints; the latest is {os.path.join(args.ckpt, steps[-1])})" \
                if steps else " (no config.json in it)"
        ap.error(f"checkpoint not found: {args.ckpt}{hint}")
    found = available_benchmarks(args.data_dir)
    names = args.benchmarks.split(",") if args.benchmarks else ([] if args.data else
                                                                list(BENCHMARKS))
    unknown = [b for b in names if b.strip() not in found]
    fetch = f"`python data.py fetch --out {args.data_dir}` fetches the benchmarks"
    if unknown and not found:
        what = "holds no .jsonl file" if os.path.isdir(args.data_dir) else "does not exist"
        ap.error(f"no benchmarks: --data-dir {args.data_dir} {what}; {fetch} there, or --data "
                 f"FILE.jsonl names a file of problems and answers")
    if unknown:
        ap.error(f"unknown benchmark(s) {unknown} in --data-dir {args.data_dir}; found: {sorted(found)}"
                 + (f" ({fetch})" if any(b.strip() in BENCHMARKS for b in unknown) else ""))
    args.files = {b.strip(): found[b.strip()] for b in names}
    for f in args.data:
        if not os.path.isfile(f):
            ap.error(f"--data file not found: {f}")
        args.files[benchmark_name(f)] = f

    cfg = train_config(args.ckpt)
    if args.greedy:
        if args.n not in (None, 1):
            ap.error(f"--greedy samples once per problem; got --n {args.n}")
        args.n, args.temperature, args.top_p = 1, 0.0, 1.0
    args.n = 16 if args.n is None else args.n
    if args.n < 1:
        ap.error(f"--n must be >= 1, got {args.n}")
    if args.temperature == 0 and args.n > 1:
        ap.error("temperature 0 gives n identical samples: use --greedy (n = 1)")
    try:
        args.k = [int(k) for k in args.k.split(",")] if args.k else None
    except ValueError:
        ap.error(f"--k must be comma-separated integers, got {args.k!r}")
    least = min(args.n_rule.values()) if args.n_rule else args.n
    bad = [k for k in args.k or [] if not 1 <= k <= least]
    if bad:
        ap.error(f"--k {bad}: every k must be between 1 and n = {least} (samples per problem)")
    args.ks = samples_and_ks(args, 0)[1]
    # Where the prompt template and the response cap come from, said at start (a model without a
    # training config gets eval.py's defaults, not the prompt it was taught: the demo's pre-trained
    # model scored 0.1% so, its responses running to the context).
    args.sources = {}
    for key in ("prompt_template", "max_new_tokens"):
        flag = f"--{key.replace('_', '-')}"
        args.sources[key] = (flag if key in given else f"--preset {args.preset}" if key in preset
                             else "the checkpoint's train_config.yaml" if key in cfg
                             else "eval.py's default: the checkpoint has "
                                  + ("none in its train_config.yaml" if cfg else "no train_config.yaml")
                                  + f"; {flag} sets it")
    if args.max_new_tokens is None:
        args.max_new_tokens = cfg.get("max_new_tokens") or 4096
    if args.max_new_tokens < 1:
        ap.error(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    template = args.prompt_template if args.prompt_template is not None else \
        cfg.get("prompt_template")
    if template is not None and template != "default" and "{problem}" not in template:
        ap.error(f"--prompt-template must contain '{{problem}}', got {template!r}")
    args.template = None if template == "default" else template
    if args.chunk_size is None and not args.n_rule:
        args.chunk_size = math.ceil(SEQS_PER_CALL / args.n)
    if args.chunk_size is not None and args.chunk_size < 1:
        ap.error(f"--chunk-size must be >= 1, got {args.chunk_size}")
    args.out = args.out or os.path.join(args.ckpt, "eval", "results.json")
    return args


# ----------------------------------------------------------------------------- sampling

def samples_and_ks(args, size):
    """(n, ks) for a benchmark of `size` problems: --n, or the preset's rule by size (avg@32 under
    100 problems, avg@4 else); --k, or 1, 8, 16 up to n, and n."""
    n = args.n if not args.n_rule else (args.n_rule["below_100"] if size < 100 else args.n_rule["else"])
    return n, sorted(set(args.k or ({k for k in DEFAULT_K if k <= n} | {n})))


def benchmark_name(path):
    """A benchmark's name, as --data names it: its file's stem (part of the seeds of its samples)."""
    return os.path.splitext(os.path.basename(path))[0]


def held_out_interval(accuracies):
    """(mean, half-width of its 95% interval, None for one problem) of the problems' accuracies,
    each a problem's share of its samples that were right: --table's interval (Student's t over
    the problems), which counts the problems, not the samples, as the draws."""
    p = len(accuracies)
    mean = sum(accuracies) / max(p, 1)
    half = (table.t975(p - 1) * math.sqrt(sum((a - mean) ** 2 for a in accuracies) / (p - 1) / p)
            if p > 1 else None)
    return mean, half


def held_out_line(step, accuracies, n):
    """'step 10: held-out accuracy 62.2% ± 4.3 (95%, 500 problems x 1 sample)': the line train.py's
    rank 0 prints at each held-out evaluation (held_out_interval's numbers)."""
    p = len(accuracies)
    mean, half = held_out_interval(accuracies)
    interval = f" ± {100 * half:.1f} (95%, " if half is not None else " ("
    return (f"step {step}: held-out accuracy {100 * mean:.1f}%{interval}{p} problem{'s' * (p != 1)} "
            f"x {n} sample{'s' * (n != 1)})")


def make_judge(name):
    """(text, gold) -> (extracted answer or None, correct) by the grader `name`: reward.grade (the
    default: the rules, then math-verify's second opinion; or, for "rule", the rules alone), or
    another grader's verdict (math-verify's, a function of one's own) beside reward.py's extracted
    answer (shown, and voted on by maj@k). Its `.same` is what maj@k groups answers by: the default's
    judgement, else the rules' (as before the second opinion, so that old numbers reproduce)."""
    if name in ("rule", reward.DEFAULT_GRADER):
        second = name != "rule"
        if second:
            second_opinion.start()

        def judge(text, gold):
            return reward.grade(text, gold, second_opinion=second)
    else:
        grader = reward.make_grader(name)

        def judge(text, gold):
            return reward.grade(text, gold, second_opinion=False)[0], grader(text, gold) >= 1.0
    judge.same = reward.verify if name == reward.DEFAULT_GRADER else reward.rule_verify
    return judge


def my_problems(n_problems, rank, world):
    """The problems this rank samples: every world-th one, so that every rank has a share of
    every benchmark, within one problem of the others'."""
    return list(range(rank, n_problems, world))


def sample_benchmark(engine, name, rows, prompt_ids, *, n, max_new_tokens, temperature, top_p, seed,
                     chunk_size, ks, judge, reward_timeout, rank=0, world=1, context=None, clock=None,
                     bar=None, thinking_opened=False):
    """Sample and grade this rank's problems of one benchmark; returns its problem records. The
    one evaluation path: eval.py's, and train.py's held-out evaluation (so its numbers do not depend
    on the number of ranks, and equal eval.py's on the checkpoint with the same settings).

    Problem i is sampled from the stream rollout.derive_seed(seed, name, i), on rank i mod world,
    in generate calls of up to `chunk_size` of this rank's problems. Each record: {"index",
    "problem", "gold", "samples": [...], "metrics": problem_metrics}. Problems whose prompt leaves
    no room to generate (`context`) get n empty, wrong samples (finish "prompt_too_long").
    judge(text, gold) -> (answer or None, correct) (make_judge); a call that raises or runs over
    reward_timeout seconds makes the sample wrong, marked grader_failed. `bar` (tqdm) advances by
    each problem's samples as the engine finishes them. `thinking_opened`: the prompts open a think block
    (reward.thinking_opened), so a response is judged as "<think>" + response.
    """
    records, failed = [], {"errors": 0, "timeouts": 0}
    mine = my_problems(len(rows), rank, world)
    for c in range(0, len(mine), chunk_size):
        idx = mine[c:c + chunk_size]
        fits = [i for i in idx if context is None or len(prompt_ids[i]) < context]
        t = time.time()
        kwargs = {"progress": bar.update} if bar is not None else {}  # per problem, as it finishes
        outs = dict(zip(fits, engine.generate(
            [prompt_ids[i] for i in fits], n=n, max_new_tokens=max_new_tokens,
            temperature=temperature, top_p=top_p,
            seeds=[rollout.derive_seed(seed, name, i) for i in fits], **kwargs))) if fits else {}
        if clock is not None:
            clock["generate_s"] += time.time() - t
        for i in idx:
            samples = []
            for s in outs.get(i, [None] * n):
                text = s.text if s else ""
                judged = reward.guarded(reward_timeout, lambda: judge(
                    ("<think>" if thinking_opened else "") + text, rows[i]["answer"]), text,
                    failed) if s else None  # None from guarded: the call failed
                answer, correct = judged or (None, False)
                samples.append({"response": text, "answer": answer, "correct": bool(correct),
                                "tokens": len(s.response_ids) if s else 0,
                                "finish_reason": s.finish_reason if s else "prompt_too_long",
                                **({"grader_failed": True} if s and judged is None else {})})
            records.append({"index": i, "problem": rows[i]["problem"], "gold": rows[i]["answer"],
                            "samples": samples,
                            "metrics": problem_metrics(samples, ks, getattr(judge, "same", reward.verify))})
        if bar is not None:  # the samples of prompts too long to sample
            bar.update((len(idx) - len(fits)) * n)
    if "first" in failed:
        print(f"warning: {name}: {failed['errors']} grading calls raised and {failed['timeouts']} ran over "
              f"the reward timeout ({reward_timeout}s) on rank {rank}, counted as wrong; first: "
              f"{failed['first']}", flush=True)
    return records


def gather(records, world):
    """Rank 0 gets every rank's records in problem order; other ranks get None."""
    if world == 1:
        return records
    parts = [None] * world if dist.get_rank() == 0 else None
    dist.gather_object(records, parts, dst=0)
    return sorted((r for p in parts for r in p), key=lambda r: r["index"]) if parts else None


# ----------------------------------------------------------------------------- protocol

def rows_digest(rows):
    """SHA-256 of what an evaluation reads of a benchmark: its problems and answers, in order (the
    prompt is built from the problem, the grader reads the answer; other keys reach neither). So
    one data set is one digest however its file is serialised, and any change of a problem, an
    answer or their order is another."""
    body = json.dumps([[r["problem"], r["answer"]] for r in rows], ensure_ascii=False)
    return hashlib.sha256(body.encode("utf-8")).hexdigest()


def preset_overrides(args, plan, problems):
    """The ways this evaluation departs from its preset, each as the flag that made it ("--data
    held_out (rows 3f2a...)", "--temperature 1.0", "--data-dir (other rows of math500: 9c1e...)"), in
    flag order; [] when it is the preset unmodified, or without a preset. The table shows the
    paper's reported numbers only beside an unmodified paper protocol, and names these in its
    protocol line. Data is named by content, the benchmark's name and the first 12 hex digits of its
    rows_digest (the whole is in the protocol's benchmarks), never by directory: the same rows in a
    file of the same name elsewhere are one protocol. The name is the benchmark's (its column, and
    part of each problem's sampling seed: sample_benchmark), so the same rows under another name
    are another benchmark. The paths are in results.json (config.files)."""
    preset = PRESETS.get(args.preset)
    if not preset:
        return []
    out = []
    given = [benchmark_name(f) for f in args.data]
    if args.data:
        out.append("--data " + " ".join(f"{b} (rows {rows_digest(problems[b])[:12]})" for b in given))
    elif list(plan) != preset["benchmarks"]:
        out.append(f"--benchmarks {','.join(plan)}")
    other = [b for b in plan if b in BENCHMARK_ROWS and rows_digest(problems[b]) != BENCHMARK_ROWS[b]
             and b not in given]
    if other:
        out.append("--data-dir (other rows of " + ", ".join(f"{b}: {rows_digest(problems[b])[:12]}"
                                                             for b in other) + ")")
    rule = preset["n"] if isinstance(preset["n"], dict) else {"below_100": preset["n"], "else": preset["n"]}
    if args.greedy and not preset.get("greedy", False):
        out.append("--greedy")
    elif any(n != rule["below_100" if len(problems[b]) < 100 else "else"] for b, (n, _) in plan.items()):
        out.append(f"-n {args.n}")
    for flag, key in (("--temperature", "temperature"), ("--top-p", "top_p"),
                      ("--max-new-tokens", "max_new_tokens"), ("--prompt-template", "prompt_template")):
        if key in args.given and args.given[key] != preset.get(key) and not (
                args.greedy and key in ("temperature", "top_p")):  # --greedy's, named above
            value = args.given[key]
            out.append(f"{flag} {value!r}" if key == "prompt_template" else f"{flag} {value}")
    if args.max_problems is not None:
        out.append(f"--max-problems {args.max_problems}")
    if args.grader != reward.DEFAULT_GRADER:
        out.append(f"--grader {args.grader}")
    return out


def protocol(args, plan, problems, prompt):
    """What must be equal for two results to share a table: the benchmarks with their samples per
    problem, problem counts and data (rows_digest of all its rows: another version of a benchmark
    is another benchmark), sampling, response cap, the prompt (`prompt`: a problem's prompt with
    the problem left as "{problem}", so the checkpoint's chat template counts too; its SHA-256) and
    grader (not the seed); and the preset's overrides (preset_overrides), which follow from the
    rest. `problems`: {benchmark: all its rows}, before --max-problems."""
    return {"preset": args.preset,
            "benchmarks": {b: {"n": n, "problems": len(problems[b][:args.max_problems]),
                               "rows_sha256": rows_digest(problems[b])}
                           for b, (n, _) in plan.items()},
            "temperature": args.temperature, "top_p": args.top_p, "max_new_tokens": args.max_new_tokens,
            "prompt_template": args.template,
            "prompt_sha256": hashlib.sha256(prompt.encode("utf-8")).hexdigest(),
            "max_problems": args.max_problems, "grader": args.grader,
            "overrides": preset_overrides(args, plan, problems)}


def start_lines(args, *, prompt, chat, plan, prompts, context, world):
    """What eval.py says before it samples, so that a long evaluation shows at once what it will do:
    the benchmarks (problems x samples, the total); the prompt (`prompt`: a problem's, the problem
    left as "{problem}"; `chat`: the tokenizer has a chat template) and the response cap, each with
    where it came from (a flag, the preset, the checkpoint's train_config.yaml or eval.py's default),
    and how the model's `context` clips the cap; the generate calls of rank 0 (of `world`), which
    the progress bar counts. `prompts`: {benchmark: token ids of each prompt}."""
    sizes = {b: len(p) for b, p in prompts.items()}
    total = sum(sizes[b] * n for b, (n, _) in plan.items())
    lines = [f"{args.ckpt}: {len(plan)} benchmark(s), {total:,} samples ("
             + ", ".join(f"{b} {sizes[b]} x {n}" for b, (n, _) in plan.items()) + ")"]
    kind = ("the tokenizer's chat template" if chat else "the plain template (the tokenizer has no chat "
            "template)") if args.template is None else "the template"
    lines.append(f"prompt: {kind} {prompt!r} (from {args.sources['prompt_template']})")
    cap = f"response cap: {args.max_new_tokens} tokens (from {args.sources['max_new_tokens']})"
    lengths = [len(p) for ps in prompts.values() for p in ps]
    room = [context - n for n in lengths if n < context] if context else []
    clipped = [r for r in room if r < args.max_new_tokens]
    if clipped:
        cap += (f"; the model's context of {context} tokens clips it to {min(clipped)}-{max(clipped)} "
                f"tokens for {len(clipped):,} of {len(lengths):,} prompts")
    lines.append(cap)
    if context and len(room) < len(lengths):
        lines.append(f"warning: {len(lengths) - len(room)} prompts do not fit the model's context of "
                     f"{context} tokens: their samples count as wrong")
    calls = sum(math.ceil(len(my_problems(sizes[b], 0, world))
                          / (args.chunk_size or math.ceil(SEQS_PER_CALL / n))) for b, (n, _) in plan.items())
    lines.append(f"sampling: T {args.temperature}, top_p {args.top_p}, seed {args.seed}, on {world} rank(s), "
                 f"in {calls} generate call(s) on rank 0, whose progress the bar shows as each problem's "
                 f"samples finish")
    return lines


def keep_other_protocol(out, proto):
    """Refuse, before any sampling, to replace the results at `out` (--out; by default one per
    checkpoint) when they were evaluated under another protocol than `proto`: an evaluation with
    other settings must not destroy the earlier one. The same protocol again replaces them."""
    if not os.path.exists(out):
        return
    try:
        with open(out) as f:
            earlier = json.load(f).get("protocol")
    except (OSError, ValueError, AttributeError):  # not JSON, or not an object
        earlier = None
    if earlier != proto:
        keys = sorted(k for k in set(earlier or {}) | set(proto) if (earlier or {}).get(k) != proto.get(k))
        what = f"an evaluation under another protocol (it differs in {', '.join(keys)})" if earlier \
            else "something that is not a results.json of this eval.py"
        raise UserError(f"{out} holds {what}, which this evaluation would replace: give --out another "
                        f"file (or remove it to replace it)")


# ----------------------------------------------------------------------------- main

def print_table(results):
    ks = sorted({k for m in results.values() for k in m["k"]})
    cols = ["accuracy"] + [f"pass@{k}" for k in ks] + [f"maj@{k}" for k in ks]
    head = f"{'benchmark':<16}{'problems':>9}{'n':>5}" + "".join(f"{c:>10}" for c in cols) + \
        f"{'tokens':>9}{'trunc':>8}"
    print(head + "\n" + "-" * len(head))
    for name, m in results.items():
        print(f"{name:<16}{m['problems']:>9}{m['n']:>5}" +
              "".join(f"{100 * m[c]:>10.1f}" if c in m else f"{'-':>10}" for c in cols) +
              f"{m['mean_response_tokens']:>9.0f}{100 * m['truncation_rate']:>7.1f}%")


def main(argv=None):
    """Run the evaluation; rank 0 writes the outputs and returns the results dict."""
    t_start = time.time()
    args = parse_args(argv)
    if args.table:
        return table.write_table(args.table, args.out)
    # Under torchrun: the trainer's group setup (gloo for CPU tensors, nccl for CUDA ones). Alone:
    # no group, and vLLM makes its own (so eval.main can run twice in one process).
    rank, world = (ranks.setup_distributed()[:2] if int(os.environ.get("WORLD_SIZE", 1)) > 1
                   else (0, 1))
    # into the checkpoint's eval/: marked while under way, so that the trainer's pruning leaves it be
    running = os.path.join(args.ckpt, "eval", ".running")
    running = running if os.path.dirname(os.path.abspath(args.out)) == os.path.dirname(os.path.abspath(running)) else None
    if rank == 0:  # an unwritable --out fails now, not after the evaluation
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        if running:
            with open(running, "w") as f:
                f.write(f"{os.getpid()} {time.time()}\n")
    tokenizer = data.load_tokenizer(args.ckpt)
    problems = {name: data.load_problems(path) for name, path in args.files.items()}
    # n per benchmark by its full size (AIME stays avg@32 when --max-problems cuts it)
    plan = {name: samples_and_ks(args, len(rows)) for name, rows in problems.items()}
    prompt = data.build_prompt(tokenizer, "{problem}", args.template)  # the template, for protocol
    proto = protocol(args, plan, problems, prompt)
    keep_other_protocol(args.out, proto)
    problems = {name: rows[:args.max_problems] for name, rows in problems.items()}
    # the token ids training samples from (data.encode_prompt)
    prompts = {name: [data.encode_prompt(tokenizer, r["problem"], args.template)[1] for r in rows]
               for name, rows in problems.items()}
    context = context_length(args.ckpt)
    longest = max(len(p) for ps in prompts.values() for p in ps)
    max_model_len = longest + args.max_new_tokens if context is None else \
        min(context, longest + args.max_new_tokens)
    if rank == 0:
        print("\n".join(start_lines(args, prompt=prompt, chat=bool(getattr(tokenizer, "chat_template", None)),
                                    plan=plan, prompts=prompts, context=context, world=world)), flush=True)
    engine = rollout.make_engine(args.ckpt, backend=args.backend, dtype=args.dtype,
                                 max_model_len=max_model_len, seed=args.seed)
    t_sample, results, all_records, clock = time.time(), {}, {}, {"generate_s": 0.0}
    chunks = {}
    # One bar over every sample of the evaluation, so that its rate and estimate are the whole run's
    mine = sum(len(my_problems(len(rows), rank, world)) * plan[name][0] for name, rows in problems.items())
    bar = tqdm(total=mine, unit="sample", disable=rank != 0,
               desc="sampling" if world == 1 else f"sampling (rank 0 of {world})")
    judge = make_judge(args.grader)
    thinking_opened = reward.thinking_opened(data.build_prompt(tokenizer, "", args.template))
    for name, rows in problems.items():
        n, ks = plan[name]
        chunk_size = chunks[name] = args.chunk_size or math.ceil(SEQS_PER_CALL / n)
        bar.set_postfix_str(name)
        records = gather(sample_benchmark(
            engine, name, rows, prompts[name], n=n, max_new_tokens=args.max_new_tokens,
            temperature=args.temperature, top_p=args.top_p, seed=args.seed, chunk_size=chunk_size,
            ks=ks, judge=judge, reward_timeout=args.reward_timeout, rank=rank, world=world,
            context=max_model_len, clock=clock, bar=bar, thinking_opened=thinking_opened), world)
        if rank == 0:
            results[name], all_records[name] = summarize(records, ks), records
            if results[name]["truncation_rate"] > 0.5:
                bar.write(f"warning: {name}: {results[name]['truncation_rate']:.0%} of the responses hit "
                          f"the length limit ({args.max_new_tokens} tokens, or the context of "
                          f"{max_model_len}): the model may not stop under this prompt, or the cap be too "
                          f"low (the prompt and cap, and where each comes from, are printed above)")
    bar.close()
    t_end = time.time()
    if world == 1 and hasattr(engine, "close"):
        # One process: free the engine now, and with it the process group vLLM made for itself (in
        # a process that evaluates again, or trains, a group left behind would be a second one).
        # Under torchrun the engine shares the run's group, which end_distributed leaves.
        engine.close()
    if rank != 0:
        ranks.end_distributed()  # waits for rank 0's, after the files are written
        return None
    tokens = sum(m["generated_tokens"] for m in results.values())
    problems = sum(m["problems"] for m in results.values())
    samples_path = os.path.splitext(args.out)[0] + "_samples.jsonl"
    cfg = train_config(args.ckpt)
    one = lambda values: values[0] if len(set(map(str, values))) == 1 else None  # noqa: E731
    out = {"ckpt": os.path.abspath(args.ckpt), "method": cfg.get("method"), "seed": cfg.get("seed"),
           "train_config": cfg,  # table.py averages seeds of one configuration only
           "config_changes": runs.config_changes_before(args.ckpt) if cfg else [],  # ... a changed run its own
           "protocol": proto,
           "benchmarks": results,
           "config": {"n": one([n for n, _ in plan.values()]) or {b: n for b, (n, _) in plan.items()},
                      "k": one([ks for _, ks in plan.values()]) or {b: ks for b, (_, ks) in plan.items()},
                      "temperature": args.temperature,
                      "top_p": args.top_p, "max_new_tokens": args.max_new_tokens,
                      "max_model_len": max_model_len, "greedy": args.greedy, "seed": args.seed,
                      "prompt_template": args.template, "backend": args.backend, "grader": args.grader,
                      "chunk_size": one(list(chunks.values())) or chunks, "world_size": world,
                      "max_problems": args.max_problems, "preset": args.preset,
                      "files": {k: os.path.abspath(v) for k, v in args.files.items()}},
           "timing": {"total_s": t_end - t_start, "eval_s": t_end - t_sample,
                      "rank0_generate_s": clock["generate_s"],
                      "problems_per_s": problems / (t_end - t_sample),
                      "generated_tokens_per_s": tokens / (t_end - t_sample)},
           "samples_file": os.path.abspath(samples_path)}
    with open(args.out, "w") as f:
        json.dump(out, f, indent=2)
    if running and os.path.exists(running):
        os.remove(running)  # results.json protects it from now on
    with open(samples_path, "w", encoding="utf-8") as f:
        for name, records in all_records.items():
            for r in records:
                for j, s in enumerate(r["samples"]):
                    f.write(json.dumps({"benchmark": name, "index": r["index"], "sample": j,
                                        "problem": r["problem"], "gold": r["gold"], **s}) + "\n")
    print_table(results)
    t = out["timing"]
    print(f"{problems} problems, {tokens} generated tokens in {t['eval_s']:.1f}s "
          f"({t['problems_per_s']:.2f} problems/s, {t['generated_tokens_per_s']:.0f} tokens/s; "
          f"{t['total_s']:.1f}s with start-up) on {world} rank(s)\nwrote {args.out} and "
          f"{samples_path}")
    if world > 1:
        ranks.end_distributed()
    return out


if __name__ == "__main__":
    ranks.run_main(main)
