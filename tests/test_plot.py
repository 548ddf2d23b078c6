"""plot.py turns metrics.jsonl into a PNG (matplotlib is optional: skipped without it)."""
import json
import os
import subprocess
import sys

import pytest

import plot

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    run = tmp_path / "run"
    run.mkdir()
    rows = [{"step": 0, "eval/accuracy": 0.2}] + [
        {"step": s, "reward/mean": 0.1 * s, "reward/accuracy": 0.1 * s, "actor/entropy": 1 / s,
         "response/length_mean": 40 + s, "actor/kl_old": 0.01, "loss/kl_mask": 0.001,
         "actor/cov_logp_adv": 0.02} for s in range(1, 6)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = plot.main([str(run)])
    with open(out, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert plot.series(rows, "eval/accuracy") == ([0], [0.2])
    assert plot.interval(rows, "eval/accuracy") is None  # no interval logged: none drawn
    rows[0]["eval/accuracy_ci95"] = 0.05
    rows.append({"step": 5, "eval/accuracy": 0.4, "eval/accuracy_ci95": 0.1})
    steps, low, high = plot.interval(rows, "eval/accuracy")
    assert steps == (0, 5) and low == pytest.approx((0.15, 0.3)) and high == pytest.approx((0.25, 0.5))
    plot.main([str(run)])  # drawn with the band


def test_plot_names_a_missing_metrics_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="no metrics.jsonl"):
        plot.read_metrics(str(tmp_path))
    # as a user runs it: one line naming the fix and exit code 2, no traceback
    res = subprocess.run([sys.executable, os.path.join(ROOT, "plot.py"), str(tmp_path)],
                         capture_output=True, text=True)
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [
        f"error: no metrics.jsonl in {tmp_path}: give train.py's out_dir (it writes metrics.jsonl "
        f"from the first step or the step-0 evaluation on)"], res.stderr


def test_reward_and_accuracy_both_show_when_equal(tmp_path):
    """On a 1-right/0-wrong reward (the demo) the two curves are equal: drawn alike, the accuracy
    line hid the reward line. They differ in style, so both show."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt
    run = tmp_path / "run"
    run.mkdir()
    rows = [{"step": s, "reward/mean": 0.1 * s, "reward/accuracy": 0.1 * s} for s in range(1, 6)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    plot.main([str(run), "--out", str(tmp_path / "c.png")])
    reward, accuracy = plt.gcf().axes[0].get_lines()
    assert list(reward.get_ydata()) == list(accuracy.get_ydata())
    assert (reward.get_linestyle(), reward.get_linewidth()) != (accuracy.get_linestyle(),
                                                                accuracy.get_linewidth())
    plt.close("all")


def test_held_out_pass_at_k_is_drawn_beside_pass_at_1(tmp_path):
    """Entropy collapse shows as held-out pass@32 falling while pass@1 rises: both are drawn, and
    a run that sampled one answer a problem (no pass@k) draws pass@1 alone."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt
    run, one = tmp_path / "run", tmp_path / "one"
    run.mkdir(), one.mkdir()
    rows = [{"step": s, "eval/accuracy": 0.6 + 0.05 * s, "eval/pass@4": 0.9 - 0.01 * s,
             "eval/pass@32": 0.99 - 0.03 * s} for s in (0, 1, 2)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (one / "metrics.jsonl").write_text(json.dumps({"step": 0, "eval/accuracy": 0.5}) + "\n")
    plot.main([str(run), "--out", str(tmp_path / "c.png")])
    lines = {l.get_label(): list(l.get_ydata()) for l in plt.gcf().axes[1].get_lines()}
    want = {"pass@1": [0.6, 0.65, 0.7], "pass@4": [0.9, 0.89, 0.88], "pass@32": [0.99, 0.96, 0.93]}
    assert lines.keys() == want.keys()
    assert all(lines[k] == pytest.approx(want[k]) for k in want)
    plt.close("all")
    plot.main([str(one), "--out", str(tmp_path / "d.png")])
    assert [l.get_label() for l in plt.gcf().axes[1].get_lines()] == ["pass@1"]
    plt.close("all")


def test_several_runs_keep_one_colour_each_and_their_own_names(tmp_path):
    """With several runs a run has one colour in every panel (the metrics of a panel differ by line
    style), and runs whose directories share a name (a/final, b/final) are told apart."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt
    dirs = []
    for parent in ("a", "b"):
        run = tmp_path / parent / "final"
        run.mkdir(parents=True)
        rows = [{"step": s, "eval/accuracy": 0.5, "eval/pass@32": 0.9, "actor/entropy": 0.1,
                 "response/length_mean": 30} for s in (0, 1, 2)]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        dirs.append(str(run))
    plot.main([*dirs, "--out", str(tmp_path / "c.png")])
    axes = plt.gcf().axes
    colour = {}
    for ax in (axes[1], axes[2], axes[3]):  # held-out, entropy, length
        for line in ax.get_lines():
            run = line.get_label().split(" ")[0]
            assert colour.setdefault(run, line.get_color()) == line.get_color(), (ax.get_title(), run)
    assert set(colour) == {"a/final", "b/final"} and colour["a/final"] != colour["b/final"]
    styles = {line.get_label(): line.get_linestyle() for line in axes[1].get_lines()}
    assert styles["a/final pass@1"] != styles["a/final pass@32"]
    plt.close("all")
