"""Curves of a training run: `python plot.py RUN_DIR [RUN_DIR ...] [--out curves.png]`.

Reads each run's metrics.jsonl (written by train.py) and draws reward and accuracy, held-out
accuracy (pass@1 with its 95% interval over the problems, and pass@4 and pass@32 where the run
sampled that many: entropy collapse shows as pass@32 falling while pass@1 rises), policy entropy,
response length and KL diagnostics against the RL step, one line per run. matplotlib is an optional dependency: `pip install matplotlib`.
"""
import argparse
import json
import os
import sys

PANELS = [  # (title, [(metric, label suffix)])
    ("reward / train accuracy", [("reward/mean", "reward"), ("reward/accuracy", "accuracy")]),
    ("held-out accuracy and pass@k", [("eval/accuracy", "pass@1"), ("eval/pass@4", "pass@4"),
                                      ("eval/pass@32", "pass@32")]),
    ("policy entropy (nats/token)", [("actor/entropy", "")]),
    ("response length (tokens)", [("response/length_mean", "")]),
    ("KL", [("actor/kl_old", "to pi_old"), ("actor/kl_ref", "to pi_ref"),
            ("loss/kl_mask", "mask loss")]),
    ("Cov(logp, A)", [("actor/cov_logp_adv", "")]),
]
# Reward and accuracy are equal where the reward is 1 right, 0 wrong (the demo): the reward is drawn
# wide and pale, the accuracy dashed over it, so that both lines show.
STYLES = {"reward/mean": dict(lw=4, alpha=0.45), "reward/accuracy": dict(ls="--", lw=1.5)}


LINE_STYLES = ("-", "--", ":", "-.")


def run_names(dirs):
    """Each run's label: its directory's name, or as much of its path as tells it from the others
    (runs/a/final and runs/b/final are "a/final" and "b/final")."""
    parts = [os.path.normpath(os.path.abspath(d)).split(os.sep) for d in dirs]
    for depth in range(1, max(len(p) for p in parts) + 1):
        names = [os.sep.join(p[-depth:]) for p in parts]
        if len(set(names)) == len(names):
            return names
    return [f"{n} ({i})" for i, n in enumerate(names)]  # the same directory given twice


def read_metrics(run_dir):
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no metrics.jsonl in {run_dir}: give train.py's out_dir (it writes "
                                f"metrics.jsonl from the first step or the step-0 evaluation on)")
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def series(rows, key):
    pts = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def interval(rows, key):
    """(steps, low, high) of `key`'s 95% interval where train.py logged one (`<key>_ci95`, the
    half-width: eval/accuracy's over the held-out problems), else None."""
    pts = [(r["step"], r[key] - r[key + "_ci95"], r[key] + r[key + "_ci95"]) for r in rows
           if r.get(key) is not None and r.get(key + "_ci95") is not None]
    return tuple(zip(*pts)) if pts else None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("runs", nargs="+", help="run directories (train.py's out_dir)")
    ap.add_argument("--out", help="PNG path (default: RUN_DIR/curves.png of the first run)")
    args = ap.parse_args(argv)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("plot.py needs matplotlib: pip install matplotlib") from None
    try:
        runs = {name: read_metrics(d) for name, d in zip(run_names(args.runs), args.runs)}
    except FileNotFoundError as e:  # bad input: one line and exit code 2, as train.py's errors
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    for ax, (title, keys) in zip(axes.flat, PANELS):
        for i, (name, rows) in enumerate(runs.items()):
            for j, (key, suffix) in enumerate(keys):
                x, y = series(rows, key)
                if x:
                    label = " ".join(p for p in (name if len(runs) > 1 else "", suffix) if p)
                    # one run: a colour per metric; several: a colour per run, in every panel,
                    # and a line style per metric
                    style = {"color": colours[(j if len(runs) == 1 else i) % len(colours)]}
                    if len(runs) > 1:
                        style["ls"] = LINE_STYLES[j % len(LINE_STYLES)]
                    style.update(STYLES.get(key, {}))
                    ax.plot(x, y, marker="o" if len(x) < 30 else None, ms=3, label=label or None,
                            **style)
                    band = interval(rows, key)
                    if band:  # the held-out accuracy's 95% interval over the problems
                        ax.fill_between(band[0], band[1], band[2], color=style["color"], alpha=0.2, lw=0)
        ax.set_title(title)
        ax.set_xlabel("RL step")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    out = args.out or os.path.join(args.runs[0], "curves.png")
    fig.savefig(out, dpi=100)
    print(f"wrote {out}")
    return out


if __name__ == "__main__":
    main()
