"""The results table: several evaluations of eval.py side by side, with 95% intervals.

    python eval.py --table runs/*/step_000500/eval/results.json --out table.md   # and table.csv

It reads results.json files (eval.py writes one per evaluation, with the protocol it used) and
never a model: a row per run, a row of the mean over the seeds of each training configuration,
the paper's reported numbers as a reference row under the paper protocol unmodified; Markdown, and
CSV beside it. It refuses to put two protocols side by side, or two results of one run.
  run_cells, seed_cells  a run's cells, and a configuration's over its seeds (Student's t: t975)
  configuration, config_names  which runs are seeds of one configuration, and its name
  flags_to_match         when protocols differ: the flags to evaluate again with (shell_arg quotes)
  write_table            the check of the protocols, the rows, the Markdown and the CSV
Not here: how a protocol is recorded (eval.protocol), nor any sampling or grading (eval.py).
"""
import json
import math
import os
import re

from config import UserError, defining_values, free_keys, run_values
from runs import config_changes_before

# The TEPO paper's reported accuracies (%, Qwen2.5-Math-1.5B, its own protocol), as its abstract and
# summaries give them: TEPO's average over the seven benchmarks and its MATH-500, and GRPO's average
# (1.74 points below TEPO's). The other cells are not stated there. --table shows them as a
# reference row, never as a run.
PAPER_REPORTED = {"tepo": {"math500": 77.20, "avg": 32.04}, "grpo": {"avg": 30.30}}


# Student's t 0.975 quantile by degrees of freedom (the usual table); beyond 30, the first two
# terms of its expansion in 1/df around the normal z (Abramowitz & Stegun 26.7.5), within 5e-4 of
# it there. numpy has no t distribution.
T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042]
Z975 = 1.959964


def t975(df):
    z = Z975
    if df <= len(T975):
        return T975[df - 1]
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)


def run_cells(result):
    """{benchmark or "avg": (accuracy %, 95% half-width % or None)} of one results.json.

    A benchmark: its avg@n and Student's t interval over its P problems (accuracy_se, P - 1
    degrees of freedom: 2.045 for AIME's 30, 1.965 for MATH-500's 500). The average: the unweighted
    mean over benchmarks, as the papers report it; its error combines the benchmarks' as
    independent (sqrt of the summed variances over their count), with the normal quantile."""
    cells, ses = {}, []
    for name, m in result["benchmarks"].items():
        se = m.get("accuracy_se")
        q = t975(m["problems"] - 1) if m.get("problems", 0) > 1 else Z975
        cells[name] = (100 * m["accuracy"], None if se is None else 100 * q * se)
        ses.append(se)
    mean = sum(v for v, _ in cells.values()) / len(cells)
    half = None if None in ses else 100 * Z975 * math.sqrt(sum(se ** 2 for se in ses)) / len(ses)
    cells["avg"] = (mean, half)
    return cells


def seed_cells(runs):
    """{column: (mean %, Student's t 95% half-width over the runs)} of several seeds of one
    configuration."""
    out = {}
    for col in runs[0]:
        vals = [r[col][0] for r in runs]
        mean = sum(vals) / len(vals)
        sd = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1))
        out[col] = (mean, t975(len(vals) - 1) * sd / math.sqrt(len(vals)))
    return out


def configuration(cfg, ckpt, changes=()):
    """What makes the runs of one configuration seeds of it, from a training config
    (train_config.yaml, as results.json records it) and its checkpoint `ckpt`: what defines the run
    (config.defining_values, the definition a resume checks too) but its seed; and `steps` too for
    a checkpoint not named by its step (`final`), whose place in the run it gives. So the seeds of
    one configuration may differ in where they are written and what cannot change them (eval_every,
    loggers, micro_batch_tokens unless Clip-Cov or KL-Cov select per micro-batch), and only those
    are averaged: a method's name alone would merge grpo with grpo and an entropy bonus, or the runs
    of a learning-rate sweep.

    `changes`: what resumes with --allow-config-change changed on the way (results.json's
    config_changes, in order): train_config.yaml holds the last values only, so a defining key that
    changed takes the value "old→new at step K" (`lr=1e-06→2e-06 at step 250`), and the run is a
    configuration of its own, never a seed of the runs trained at either value throughout."""
    out = defining_values(cfg)
    del out["seed"]
    out.update(changed_on_the_way(cfg, changes or []))
    if not re.fullmatch(r"step_\d+", os.path.basename(ckpt)):
        out["steps"] = run_values(cfg)["steps"]
    return out


def changed_on_the_way(cfg, changes):
    """{key: "old→new at step K[→newer at step L ...]"} of the keys that resumes changed while they
    defined the run: each record (config_changes, in order) judged on the values just before and
    after it (the same rule as the resume's, config.config_changes), which are the saved config's
    with the later records undone. A key that defined the run when it changed is named even if the
    last values no longer read it; one changed while nothing read it is not."""
    stages = [run_values(cfg)]  # stages[i]: the values before record i; the last: after them all
    for record in reversed(changes):
        stages.insert(0, {**stages[0], **{k: old for k, (old, _) in record["changed"].items()}})
    history = {}
    for record, before, after in zip(changes, stages, stages[1:]):
        free = free_keys(before) & free_keys(after)
        for key, (old, new) in record["changed"].items():
            if key not in free:
                history[key] = f"{history.get(key, old)}→{new} at step {record['step']}"
    return history


def config_names(configs):
    """A name per configuration (configuration() dicts; None for a model without a training config):
    its method and the settings in which the configurations of that method in the table differ
    ("grpo, loss.entropy_coef=0.001" beside "grpo, loss.entropy_coef=0.0"; a key that only some of
    them have, such as micro_batch_tokens where Clip-Cov selects per micro-batch, named where it
    is)."""
    names = []
    for c in configs:
        if c is None:
            names.append(None)
            continue
        same = [o for o in configs if o is not None and o.get("method") == c.get("method")]
        keys = sorted(k for k in set().union(*same)
                      if len({json.dumps([k in o, o.get(k)], sort_keys=True) for o in same}) > 1)
        names.append(", ".join([str(c.get("method") or "?")] + [f"{k}={c[k]}" for k in keys if k in c]))
    return names


def shell_arg(text):
    """`text` as one shell word on one line: as it is when it is safe, else in bash's $'...' quotes,
    so a template's newlines and backslashes can be pasted back."""
    if text and all(c.isalnum() or c in "_-.,/:=+@%" for c in text):
        return text
    for c, escaped in (("\\", "\\\\"), ("'", "\\'"), ("\n", "\\n"), ("\t", "\\t")):
        text = text.replace(c, escaped)
    return "$'" + text + "'"


def flags_to_match(want, have):
    """The eval.py flags that turn protocol `have` into `want` (where they differ), for the message
    that refuses to put them side by side: what to evaluate again with, not only what differs."""
    out = []
    if want["preset"] != have["preset"]:
        out.append(f"--preset {want['preset']}" if want["preset"] else "no --preset")
    wb, hb = want["benchmarks"], have["benchmarks"]
    if list(wb) != list(hb):
        out.append("--benchmarks " + ",".join(wb) + " (or --data files of these names)")
    else:
        if any(wb[b]["n"] != hb[b]["n"] for b in wb):
            ns = {v["n"] for v in wb.values()}
            out.append(f"-n {ns.pop()}" if len(ns) == 1 else
                       "the samples per problem of " + ", ".join(f"{b} {v['n']}" for b, v in wb.items()))
        other = [b for b in wb if wb[b].get("rows_sha256") != hb[b].get("rows_sha256")]
        if other:
            out.append(f"the same data for {', '.join(other)} (their problems or answers differ)")
    if want["temperature"] == 0 and have["temperature"] != 0:
        out.append("--greedy")
    else:
        for key, flag in (("temperature", "--temperature"), ("top_p", "--top-p")):
            if want[key] != have[key]:
                out.append(f"{flag} {want[key]}")
    for key, flag in (("max_new_tokens", "--max-new-tokens"), ("max_problems", "--max-problems"),
                      ("grader", "--grader")):
        if want.get(key) != have.get(key):
            out.append(f"{flag} {want[key]}" if want.get(key) is not None else f"no {flag}")
    if want["prompt_template"] != have["prompt_template"]:
        out.append("--prompt-template " + ("default" if want["prompt_template"] is None
                                           else shell_arg(want["prompt_template"])))
    elif want.get("prompt_sha256") != have.get("prompt_sha256"):
        out.append("one --prompt-template for both (their checkpoints' chat templates differ)")
    return " ".join(out)


def recorded_changes(path, result):
    """What resumes changed in the run of `result` (a results.json at `path`): its config_changes;
    for one written by an eval.py of before that record, read from its checkpoint when it is still
    there (runs.config_changes_before), else [] and a line saying the run is taken as unchanged."""
    if "config_changes" in result:
        return result["config_changes"]
    ckpt = result.get("ckpt")
    if ckpt and os.path.isdir(ckpt):
        return config_changes_before(ckpt)
    print(f"note: {path} does not record what resumes changed in its run (an eval.py of before), and its "
          f"checkpoint {ckpt} is not here to read it from: taken as a run that never changed config")
    return []


def write_table(paths, out=None):
    """The Markdown table of several results.json (one protocol), printed, and written at `out`
    with a CSV beside it (out None: printed only, so that nothing lands where the command runs).

    A row per run (its configuration's name, seed, checkpoint); for each configuration (runs alike
    in what defines them but for the seed: configuration) and checkpoint name (step_000500) with
    runs of two or more seeds, a row of their mean with its interval over seeds; then, under the
    paper preset unmodified, the paper's reported numbers, marked as a reference: they come from the
    paper's own protocol (beside other benchmarks, settings or data they would only mislead). The
    protocol line names the preset's overrides.
    -> the Markdown text."""
    results = []
    for path in paths:
        try:
            with open(path) as f:
                result = json.load(f)
        except FileNotFoundError:
            raise UserError(f"--table: results file not found: {path}") from None
        except json.JSONDecodeError as e:
            raise UserError(f"--table: {path} is not JSON ({e.msg}, line {e.lineno})") from None
        if not isinstance(result, dict) or "protocol" not in result or "benchmarks" not in result:
            raise UserError(f"--table: {path} records no protocol (not a results.json of this eval.py, "
                            f"or one written before protocols were recorded): evaluate it again")
        if any("sha256" in b for b in result["protocol"]["benchmarks"].values()):
            raise UserError(f"--table: {path} records its benchmarks by their files' bytes (an eval.py of "
                            f"before the digest of the problems and answers read): evaluate it again")
        results.append(result)
    first = results[0]["protocol"]
    for path, result in zip(paths[1:], results[1:]):
        if result["protocol"] != first:
            keys = sorted(k for k in set(first) | set(result["protocol"])
                          if first.get(k) != result["protocol"].get(k))
            ckpt, ckpt0 = result.get("ckpt", path), results[0].get("ckpt", paths[0])
            raise UserError(f"--table: {path} was evaluated under another protocol than {paths[0]} "
                            f"(they differ in {', '.join(keys)}: {[result['protocol'].get(k) for k in keys]} "
                            f"against {[first.get(k) for k in keys]}); to compare them, evaluate {ckpt} "
                            f"again with {flags_to_match(first, result['protocol'])} (or {ckpt0} with "
                            f"{flags_to_match(result['protocol'], first)})")
    cols = list(first["benchmarks"]) + ["avg"]
    rows = []  # (label, kind, {col: (value, half or None)})
    configs = []
    for path, r in zip(paths, results):
        try:
            configs.append(configuration(r["train_config"], r.get("ckpt") or path, recorded_changes(path, r))
                           if r.get("train_config") else None)
        except UserError as e:
            raise UserError(f"--table: {path}: its training {e}") from None
    groups = {}  # (configuration, checkpoint name) -> {seed: (path, cells)}; a model without one alone
    for path, result, config, name in zip(paths, results, configs, config_names(configs)):
        ckpt, seed = result.get("ckpt") or path, result.get("seed")
        where = os.path.join(os.path.basename(os.path.dirname(ckpt)), os.path.basename(ckpt))
        cells = run_cells(result)
        label = f"{name} (seed {seed}, {where})" if name else f"{where} (no training config)"
        rows.append((label, "run", cells))
        key = json.dumps(config, sort_keys=True) if config is not None else os.path.abspath(ckpt)
        runs = groups.setdefault((key, name, os.path.basename(ckpt)), {})
        if seed in runs:  # the mean over seeds would count it once, silently
            raise UserError(f"--table: {path} is a second result of {name or where}, seed {seed}, "
                            f"{os.path.basename(ckpt)} ({runs[seed][0]} is the first): give one results.json "
                            f"per run")
        runs[seed] = (path, cells)
    for (_, name, step), runs in groups.items():
        if len(runs) > 1:
            rows.append((f"{name}, {step}: mean of {len(runs)} seeds", "seeds",
                         seed_cells([cells for _, cells in runs.values()])))
    # An override (another data set, temperature, cap, problem count...) would make them a false
    # comparison; a results.json without the record of its overrides gets no reference row either.
    unmodified_paper = first["preset"] == "paper" and first.get("overrides") == []
    for method, numbers in PAPER_REPORTED.items() if unmodified_paper else ():
        rows.append((f"{method} as reported by the TEPO paper (its protocol)", "reference",
                     {c: (numbers[c], None) for c in cols if c in numbers}))

    def show(cell):
        if cell is None:
            return "n/r"
        value, half = cell
        return f"{value:.2f}" + ("" if half is None else f" ± {half:.2f}")
    p = first
    ns = [f"{b} {v['n']}" for b, v in p["benchmarks"].items()]
    ns = ", ".join(ns) if len({v["n"] for v in p["benchmarks"].values()}) > 1 else ns[0].split()[-1]
    lines = [f"Accuracy (avg@n, %) with 95% intervals: over problems and samples for a run, over seeds "
             f"for a configuration's mean (Student's t). Protocol: {p['preset'] or 'custom'}"
             + (f", modified by {', '.join(p['overrides'])}" if p.get("overrides") else "") + f"; n = {ns}; "
             f"T {p['temperature']}, top_p {p['top_p']}, up to {p['max_new_tokens']} response tokens"
             + (f"; the first {p['max_problems']} problems of each benchmark" if p["max_problems"] else "")
             + ". n/r: not reported.", "",
             "| run | " + " | ".join(cols) + " |", "|---|" + "---:|" * len(cols)]
    for label, kind, cells in rows:
        name = f"*{label}*" if kind == "reference" else f"**{label}**" if kind == "seeds" else label
        lines.append(f"| {name} | " + " | ".join(show(cells.get(c)) for c in cols) + " |")
    text = "\n".join(lines) + "\n"
    if out is None:
        print(text + "(not written: --out FILE.md writes it, and a .csv beside it)")
        return text
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        f.write(text)
    csv_path = os.path.splitext(out)[0] + ".csv"
    with open(csv_path, "w") as f:
        f.write("run,kind," + ",".join(f"{c},{c}_ci95_low,{c}_ci95_high" for c in cols) + "\n")
        for label, kind, cells in rows:
            fields = []
            for c in cols:
                value, half = cells.get(c, (None, None))
                fields += ["" if value is None else f"{value:.4f}"] + (
                    ["", ""] if half is None else [f"{value - half:.4f}", f"{value + half:.4f}"])
            f.write(f'"{label}",{kind},' + ",".join(fields) + "\n")
    print(text + f"wrote {out} and {csv_path}")
    return text
