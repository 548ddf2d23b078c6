"""Every command that README.md, the docs it moved its reference parts to (DOCS) and the configs'
comments show is parsed by the script's own argument parser (parsed, not run), and its config and
`--set` keys are loaded as train.py loads them: a documented command that no longer parses fails
here, not in a reader's terminal. And every config key has its row in docs/CONFIG.md.

What counts as a command: each line of a fenced code block, and each inline code span, that starts
with `python`, `torchrun` or `for` (a shell loop: its body, once per value), split at `&&`, `||`
and `;`; in configs/*.yaml, the part of a comment line from `torchrun` or `python` on. A span with
`[` is a synopsis (optional parts), not a command, and is left out. Commands of other programs
(pip, hf, tensorboard, echo) are not ours to check."""
import argparse
import glob
import os
import re
import runpy
import shlex
import sys

import pytest

import config
import tepo

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STARTS = ("python ", "python3 ", "python3.11 ", "torchrun ")
# The README and the docs that hold what it moved out (the configuration reference, the metrics,
# what has run on a GPU): their commands are checked alike.
DOCS = ("README.md", "docs/CONFIG.md", "docs/METRICS.md", "docs/GPU.md")


def pieces(text):
    """The commands of one shell line: `for V in A B; do BODY; done` as BODY per value, then the
    parts between `&&`, `||` and `;` (`CMD || { echo failed; break; }`: CMD)."""
    loop = re.match(r"\s*for (\w+) in ([^;]+); do (.+?); done\s*$", text)
    if loop:
        var, values, body = loop.groups()
        return [p for v in values.split() for p in pieces(body.replace(f"${var}", v))]
    return [p.strip() for p in re.split(r"&&|\|\||;", text) if p.strip().startswith(STARTS)]


def shown_commands():
    """[(where, command)] of the commands of README.md and DOCS, and the configs' comments'."""
    found = []
    for doc in DOCS:
        text = open(os.path.join(ROOT, doc), encoding="utf-8").read()
        blocks = re.findall(r"^```[a-z]*\n(.*?)^```", text, re.S | re.M)
        for block in blocks:
            for line in block.replace("\\\n", " ").splitlines():
                if re.sub(r"#.*", "", line).strip().startswith(STARTS + ("for ",)):
                    found += [(doc, p) for p in pieces(line)]
        prose = re.sub(r"^```[a-z]*\n.*?^```", "", text, flags=re.S | re.M)
        for span in re.findall(r"`([^`\n]+)`", prose):
            if span.startswith(STARTS + ("for ",)) and "[" not in span:
                found += [(doc, p) for p in pieces(span)]
    for path in sorted(glob.glob(os.path.join(ROOT, "configs", "*.yaml"))):
        for line in open(path, encoding="utf-8"):
            m = re.search(r"#.*?\b((?:torchrun|python) .*)$", line)
            command = m.group(1).split("`")[0] if m else ""  # `python demo.py prepare` makes
            if command and "[" not in command:
                found += [(f"configs/{os.path.basename(path)}", p) for p in pieces(command)]
    return found


COMMANDS = shown_commands()


class Parsed(Exception):
    """Raised by the patched parse_args with the namespace it parsed: the script stops there."""


def parse_as_launched(script, args, monkeypatch):
    """The namespace `python SCRIPT ARGS` parses, by the script's own parser: the script runs as
    __main__ up to its parse_args, which parses and then stops it."""
    original = argparse.ArgumentParser.parse_args

    def parse_and_stop(self, argv=None, namespace=None):
        raise Parsed(original(self, argv, namespace))
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_and_stop)
    monkeypatch.setattr(sys, "argv", [os.path.join(ROOT, script), *args])
    try:
        runpy.run_path(os.path.join(ROOT, script), run_name="__main__")
    except Parsed as done:
        return done.args[0]
    except SystemExit as e:
        raise AssertionError(f"{script} {shlex.join(args)}: does not parse (exit {e.code})") from None
    raise AssertionError(f"{script} ran without parsing its command line")


def test_the_docs_show_the_commands_this_test_reads():
    """The extraction finds the commands it should (a change of the README's layout that hid them
    from this test would make it pass vacuously)."""
    shown = [c for _, c in COMMANDS]
    for start in ("torchrun --nproc_per_node 2 train.py --config configs/demo.yaml",
                  "python demo.py prepare", "python eval.py --table", "python data.py fetch",
                  "torchrun --nproc_per_node 8 eval.py", "python bench/gpu_check.py",
                  "torchrun --nproc_per_node 8 train.py --config configs/math1.5b-tepo.yaml --set steps=10",
                  "python -m pytest -q tests/"):
        assert any(c.startswith(start) for c in shown), start
    # the paper's sweep: every method launched with --resume (a rerun after a failure goes on), as
    # its own command, not swallowed with the `|| { echo ...; break; }` that follows it
    for m in ("tepo", "grpo", "drgrpo", "dapo", "gspo"):
        assert (f"torchrun --nproc_per_node 8 train.py --config configs/math1.5b-{m}.yaml --resume"
                in shown), m
    assert any(w.startswith("configs/") for w, _ in COMMANDS)


@pytest.mark.parametrize("where,command", COMMANDS, ids=[f"{w}: {c[:70]}" for w, c in COMMANDS])
def test_a_documented_command_parses(where, command, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    words = shlex.split(command.replace("$'", "'"), comments=True)
    if words[0] == "torchrun":  # torchrun's own options, by its parser; then the script's
        from torch.distributed.run import get_args_parser
        launch = get_args_parser().parse_args(words[1:])
        words = ["python", launch.training_script, *launch.training_script_args]
    if words[1] == "-m":  # python -m pytest FILES: the files are there (-m venv: not ours)
        if words[2] != "pytest":
            return
        paths = [w.split("::")[0] for w in words[3:] if w.startswith("tests")]
        assert all(os.path.exists(p) for p in paths), command
        return
    script, args = words[1], words[2:]
    assert os.path.isfile(os.path.join(ROOT, script)), f"{where}: {script} is not in the repository"
    ns = parse_as_launched(script, args, monkeypatch)
    if getattr(ns, "config", None):  # train.py's, gpu_plan's, the study's: keys known and typed
        config.load_config(ns.config, getattr(ns, "set", None) or [])
    capsys.readouterr()


@pytest.mark.parametrize("script,args", [("train.py", []), ("bench/gpu_plan.py", []),
                                         ("bench/study.py", ["run"]),
                                         ("bench/bench_offpolicy.py", ["--demo", "d"]),
                                         ("bench/same_trajectory.py", ["--against", "HEAD"])])
def test_set_takes_several_pairs_and_can_be_repeated(script, args, monkeypatch):
    """`--set seed=1 out_dir=runs/x` (the README's form for seeds: one pair only, before) and
    `--set a=1 --set b=2` give the same overrides, in order."""
    monkeypatch.chdir(ROOT)
    ns = parse_as_launched(script, [*args, "--set", "seed=1", "out_dir=runs/x", "--set", "lr=2e-6"],
                           monkeypatch)
    assert ns.set == ["seed=1", "out_dir=runs/x", "lr=2e-6"]


def reference_rows(heading):
    """The keys of the table under `## heading` in docs/CONFIG.md: each row's first cell, its
    backquoted names (`cov_lb`, `cov_ub` is two)."""
    text = open(os.path.join(ROOT, "docs", "CONFIG.md"), encoding="utf-8").read()
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return {k for cell in re.findall(r"^\| ([^|]+) \|", section, re.M) for k in re.findall(r"`(\w+)`", cell)}


def test_every_config_key_has_its_row_in_the_reference():
    """docs/CONFIG.md (the README's configuration reference, moved there) documents every field of
    config.Config and of tepo.LossConfig (but LossConfig.method: the top-level `method`), and no
    key that is gone."""
    import dataclasses
    assert reference_rows("Keys") == {f.name for f in dataclasses.fields(config.Config)}
    assert reference_rows("`loss:` keys") == {f.name for f in dataclasses.fields(tepo.LossConfig)} - {"method"}
