"""bench/gpu_plan.py's parameter counts against the published model sizes, and its verdicts on
cases whose answer is plain (a 7B engine cannot hold its weights in 0.4 x 24 GB)."""
import glob
import os
import re
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import gpu_plan  # noqa: E402
import train  # noqa: E402


@pytest.mark.parametrize("key,published", [("1.5b", 1_543_714_304),   # Qwen2.5-Math-1.5B
                                            ("7b", 7_615_616_512),     # Qwen2.5-Math-7B
                                            ("qwen3-0.6b", 596_049_920),   # Qwen3-0.6B
                                            ("qwen3-4b", 4_022_468_096)])  # Qwen3-4B-Base
def test_parameter_counts_match_the_published_models(key, published):
    assert gpu_plan.params(gpu_plan.MODELS[key])[2] == published


@pytest.fixture(scope="module")
def paper_plan_on_h100():
    """The plan of the paper's 1.5B config on 8 H100s, as printed (made once: a few seconds)."""
    import contextlib
    import io
    cfg = train.load_config(os.path.join(ROOT, "configs", "math1.5b-tepo.yaml"))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        figures = gpu_plan.plan(cfg, gpu_plan.model_shapes("1.5b"), "h100", 8, gpu_plan.measured_mfu(), 0.6,
                                1536, 150)
    return out.getvalue(), figures


def test_verdicts(capsys, paper_plan_on_h100):
    cfg = train.load_config(os.path.join(ROOT, "configs", "math1.5b-tepo.yaml"))
    gpu_plan.plan(cfg, gpu_plan.model_shapes("7b"), "4090", 8, 0.4, 0.6, 1536, 150)
    out = capsys.readouterr().out
    assert "ENGINE DOES NOT FIT" in out and "rollout: master + Adam + vLLM + ctx" in out
    assert "DOES NOT FIT (engine, above)" in out
    out, _ = paper_plan_on_h100
    assert "ENGINE DOES NOT FIT" not in out and "DOES NOT FIT" not in out


def test_the_plan_counts_the_straggler_and_the_evaluation_by_todays_rules():
    """The update's time is the busiest rank's (packing.deal simulated), and evaluation's the busiest
    rank's decode waves: MATH-500 at n = 1 on 8 ranks is one wave now, two on rank 0 alone before;
    the paper protocol 10 against 28."""
    cfg = train.load_config(os.path.join(ROOT, "configs", "math1.5b-tepo.yaml"))
    pos = gpu_plan.step_positions(cfg, 8, 150, 700, 500, equal=0.6, steps=10)
    assert pos["update"] / pos["update_mean"] <= 1.10 < pos["before"] / pos["update_mean"]
    assert (gpu_plan.eval_waves(500, 1, 8, "now"), gpu_plan.eval_waves(500, 1, 8, "before")) == (1, 2)
    paper = [(p, 32 if p < 100 else 4) for p in gpu_plan.PAPER_SIZES.values()]
    assert sum(gpu_plan.eval_waves(p, n, 8, "now") for p, n in paper) == 10
    assert sum(gpu_plan.eval_waves(p, n, 8, "before") for p, n in paper) == 28


def plan_figures(config, model, gpu, equal=0.4):
    cfg = train.load_config(os.path.join(ROOT, config))
    return gpu_plan.plan(cfg, gpu_plan.model_shapes(model), gpu, 8, gpu_plan.measured_mfu(), 0.6,
                         cfg.max_new_tokens // 2, 150, None, equal)


@pytest.mark.slow
def test_the_readmes_plan_table_is_what_gpu_plan_computes(capsys):
    """README's memory and step-time table: each figure as bench/gpu_plan.py computes it for its
    row (estimates at the update's speed measured on one H200; 40% of groups with equal rewards), so that an edit of the formulas or configs
    shows here, not as a stale number."""
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    rows = [line for line in text.splitlines()
            if re.match(r"\| (1\.5B|7B|Qwen3-4B), (H100|H200|A100|RTX 4090)", line)]
    assert len(rows) == 8, rows
    models = {"1.5B": ("configs/math1.5b-tepo.yaml", "1.5b"), "7B": ("configs/math7b.yaml", "7b"),
              "Qwen3-4B": ("configs/qwen3-4b.yaml", "qwen3-4b")}
    gpus = {"H100": "h100", "H200": "h200", "A100": "a100", "RTX 4090": "4090"}
    for row in rows:
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        model, gpu = cells[0].split(", ")
        want = plan_figures(*models[model], gpus[gpu.rsplit(" ", 2)[0]])
        keys = ["rollout_gib", "update_gib", None, "rollout_s", "old_s", "update_s", "eval_s", "step_s"]
        for key, cell in zip(keys, cells[1:]):
            if key is None or cell == "–":
                continue
            value = float(cell.lstrip("~"))
            tol = 0.5 if cell.startswith("~") else 0.05   # "~13": whole seconds
            assert abs(value - want[key]) <= tol, (row, key, want[key])
    # "First hour on 8 GPUs" quotes the 1.5B H100 row for its ten-step run
    first = text.split("## First hour on 8 GPUs", 1)[1].split("\n## ", 1)[0]
    h100 = plan_figures("configs/math1.5b-tepo.yaml", "1.5b", "h100")
    quoted = (f"{h100['rollout_gib']:.1f} GiB per GPU while sampling, {h100['update_gib']:.1f} GiB in the "
              f"update, ~{h100['step_s']:.0f} s a step (rollout {h100['rollout_s']:.1f} s, old pass "
              f"{h100['old_s']:.1f} s, update {h100['update_s']:.1f} s)")
    assert quoted in " ".join(first.split()), quoted
    capsys.readouterr()


def test_the_configs_comments_quote_no_estimate():
    """Memory and step times are gpu_plan's to compute (the README's table, checked above): a
    config's comment that quoted them went stale (math7b.yaml said ~66 s a step on H100, ~166 s on
    A100, against gpu_plan's 54.5 and 128.2)."""
    for path in glob.glob(os.path.join(ROOT, "configs", "*.yaml")):
        comments = " ".join(line.split("#", 1)[1] for line in open(path) if "#" in line)
        assert not re.search(r"\d\s*(s|GiB|min|h)\b", comments), (path, re.findall(r"[^.]*\d\s*(?:s|GiB|min|h)\b", comments))


def test_the_step_counts_the_deal(paper_plan_on_h100):
    """The step's total includes the deal's seconds (balance_ranks), and a rank receives its share
    of the sequences, not all of them."""
    out, figures = paper_plan_on_h100
    parts = ("rollout_s", "old_s", "update_s", "eval_s", "deal_s")
    assert figures["step_s"] == pytest.approx(sum(figures[k] for k in parts))
    assert 0 < figures["deal_s"] < 0.01 * figures["step_s"]
    secs = {m[0]: float(m[1]) for m in re.findall(r"^  (rollout|old pass|update|eval|deal|total) +([\d.]+) s", out, re.M)}
    assert set(secs) == {"rollout", "old pass", "update", "eval", "deal", "total"}, out
    mine, everything = map(float, re.search(r"deal .*?([\d.]+) MiB received.*?rank, ([\d.]+) MiB", out).groups())
    assert 0 < mine < everything / 4


def test_the_plan_reads_the_configs_model_and_runs_at_the_measured_speed(capsys, monkeypatch):
    """`--config configs/math7b.yaml` plans the 7B (it planned the 1.5B unless --model 7b was given);
    a model directory's config.json gives its shapes; the default speed is the one measured on the
    H200: at its shape the plan's update takes the measured 24.9k tokens a second."""
    monkeypatch.setattr(sys, "argv", ["gpu_plan.py", "--config", os.path.join(ROOT, "configs", "math7b.yaml"),
                                      "--gpu", "h200", "--no-anchor"])
    gpu_plan.main()
    out = capsys.readouterr().out
    assert "=== Qwen2.5-Math-7B: N = 7.62 B params | 8 x H200 141GB" in out and "=== Qwen2.5-Math-1.5B" not in out
    assert "24.9k tokens/s measured on one NVIDIA H200" in out
    tok = os.path.join(ROOT, "..", "shared", "qwen2.5-math-tokenizer")
    if os.path.isdir(tok):
        key, shapes = gpu_plan.config_model(tok)
        assert key == tok and gpu_plan.params(shapes)[2] == 1_543_714_304
    m = gpu_plan.model_shapes("1.5b")
    seconds = 23000 * gpu_plan.flops_per_token(m, 850) / (989e12 * gpu_plan.measured_mfu())
    assert seconds == pytest.approx(23000 / 24.9e3)  # 0.923 s, as measured
    assert 0.23 < 6 * gpu_plan.params(m)[2] * 24.9e3 / 989e12 < 0.234  # 23.3% of the spec sheet at 6N
    with pytest.raises(SystemExit, match="give --model"):
        gpu_plan.config_model("someone/some-model")


@pytest.mark.slow  # five plans of 40 simulated steps each: ~10 s
def test_the_plans_update_memory_follows_the_lm_head_and_the_checkpointed_layers():
    """The update's memory at the LM head: lm_head chunked (auto, the default) holds one chunk of
    2^26 logits' buffers and the weight gradient's sums, not the bf16 logits and their gradient
    (2 x T x V x 2 B: 18.5 GiB at the 1.5B config's 32,768 positions), which halves the update's
    memory above the weights; checkpoint_layers k of L keeps the other layers' activations whole
    and recomputes a share k / L of the forward."""
    import contextlib
    import dataclasses
    import io
    cfg = train.load_config(os.path.join(ROOT, "configs", "math1.5b-tepo.yaml"))
    m = gpu_plan.model_shapes("1.5b")
    T, V, h, L = cfg.micro_batch_tokens, m["V"], m["h"], m["L"]

    def plan(**changes):
        with contextlib.redirect_stdout(io.StringIO()) as out:
            figures = gpu_plan.plan(dataclasses.replace(cfg, **changes), m, "h100", 8, 0.3, 0.6, 1536, 150)
        return figures, out.getvalue()
    (chunked, text), (logits, before) = plan(), plan(lm_head="logits")
    assert cfg.lm_head == "auto" and "LM head in chunks" in text and "logits bf16 T x V" in before
    saved = (2 * T * V * 2 + 2 * 2 ** 24 * 4) - (2 ** 26 * 16 + V * h * 6)
    assert (logits["update_gib"] - chunked["update_gib"]) * gpu_plan.GiB == pytest.approx(saved)
    weights = 16 * gpu_plan.params(m)[2] / 8 / gpu_plan.GiB       # master, grads, Adam: sharded over 8
    assert chunked["update_gib"] - weights < 0.5 * (logits["update_gib"] - weights)
    assert chunked["update_s"] == logits["update_s"]                 # the time rests on the measured speed
    some, _ = plan(checkpoint_layers=L // 2)
    none, _ = plan(activation_checkpointing=False)
    assert chunked["update_gib"] < some["update_gib"] < none["update_gib"]
    assert none["update_s"] < some["update_s"] < chunked["update_s"]
    assert some["update_s"] == pytest.approx((chunked["update_s"] + none["update_s"]) / 2)
    assert plan(checkpoint_layers=L)[0] == chunked
