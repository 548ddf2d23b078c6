"""Experiment trackers beside metrics.jsonl: TensorBoard and Weights & Biases (config `loggers`).

metrics.jsonl is the run's record of truth (--resume, plot.py and the benches read it) and is
always written; `loggers: [jsonl, tensorboard, wandb]` also sends each record to the trackers
named, under the same names with the RL step as x axis (numbers only: a null value is left out),
the config once per launch, and the responses written to samples.jsonl as a table. Rank 0 only.
A tracker's package is imported only when it is chosen, and is not a dependency of this project:
`pip install tensorboard`, `pip install wandb`.

  tensorboard   event files in out_dir/tensorboard (`tensorboard --logdir out_dir/tensorboard`)
  wandb         project `wandb_project`, run `wandb_run_name` (default: out_dir's last part), local
                files in out_dir/wandb (or $WANDB_DIR/wandb); WANDB_MODE=offline needs no account
                and no network, and `wandb sync out_dir/wandb` uploads the run later

A launch with --resume from the checkpoint of step K continues the same tracker run:
  - TensorBoard writes to the same directory, whose event files are first cut back to step K
    (those events of later steps that the interrupted launch wrote are dropped), as train.py cuts
    metrics.jsonl, so no step shows twice; a launch from step 0 removes the old event files.
    Not SummaryWriter's purge_step: TensorBoard's default (Rust) reader ignores it and keeps a
    stale point of any tag the resumed launch does not log again at that step (eval/accuracy of
    an evaluation step, say); only `tensorboard --load_fast=false` applies it (both measured).
  - wandb reuses the run id kept in out_dir/wandb_run_id: wandb.init(id=..., resume="allow").
    Online (not tried: no network here), the server continues the run after the last step it
    holds, and wandb ignores with a warning the steps K+1.. that the interrupted launch had
    logged: those keep that launch's values, which the resumed steps repeat exactly but for
    timing/*. Offline there is no server to ask: every launch writes its own
    out_dir/wandb/offline-run-<time>-<id> directory with the same id, the resumed one's history
    starting at step K + 1, and `wandb sync` uploads the directories of one id into that run in
    the order they started (what the server keeps of a step both hold was not tried).
"""
import glob
import importlib.util
import os

import yaml

from config import UserError, config_dict


def open_trackers(cfg, step, resumed):
    """The trackers cfg.loggers names besides jsonl (train.log writes that one), for a launch that
    starts at `step` (the checkpoint's, when `resumed`; else 0). Rank 0 only.
    -> list of TensorBoard / WandB, each with log(record), samples(step, rows), close()"""
    check_installed(cfg.loggers)
    kinds = {"tensorboard": TensorBoard, "wandb": WandB}
    return [kinds[name](cfg, step, resumed) for name in dict.fromkeys(cfg.loggers) if name in kinds]


def check_installed(loggers):
    """A UserError naming the pip command when a chosen tracker's package is missing. train.py
    calls it on every rank at start-up, so that a run stops before minutes of loading."""
    for name in ("tensorboard", "wandb"):
        if name in loggers and importlib.util.find_spec(name) is None:
            raise UserError(f"loggers: {name} needs the {name} package: pip install {name}")


def scalars(record):
    """What a tracker plots of a metrics.jsonl record: its numbers but the step (the x axis)."""
    return {k: v for k, v in record.items() if k != "step" and isinstance(v, (int, float))}


class TensorBoard:
    """Scalars, the config and sample tables as text, in out_dir/tensorboard (torch's writer)."""

    def __init__(self, cfg, step, resumed):
        from torch.utils.tensorboard import SummaryWriter
        log_dir = os.path.join(cfg.out_dir, "tensorboard")
        cut_events(log_dir, step if resumed else -1)
        self.writer = SummaryWriter(log_dir)
        config = yaml.safe_dump(config_dict(cfg))
        self.writer.add_text("config", "".join("    " + ln for ln in config.splitlines(True)), step)

    def log(self, record):
        for key, value in scalars(record).items():
            self.writer.add_scalar(key, value, record["step"])
        self.writer.flush()  # on disk as soon as metrics.jsonl's line: a kill loses no step

    def samples(self, step, rows):
        self.writer.add_text("samples", markdown_table(rows), step)

    def close(self):
        self.writer.close()


class WandB:
    """History rows at the RL step, the config, sample tables (wandb.Table): one wandb run per
    out_dir, its id in out_dir/wandb_run_id."""

    def __init__(self, cfg, step, resumed):
        import wandb
        self.wandb = wandb
        id_file = os.path.join(cfg.out_dir, "wandb_run_id")
        run_id = open(id_file).read().strip() if resumed and os.path.exists(id_file) else None
        try:
            self.run = wandb.init(
                project=cfg.wandb_project, id=run_id, resume="allow" if run_id else None,
                name=cfg.wandb_run_name or os.path.basename(os.path.normpath(cfg.out_dir)),
                config=config_dict(cfg), dir=os.environ.get("WANDB_DIR", cfg.out_dir))
        except wandb.errors.UsageError as e:  # no API key, say
            raise UserError(f"loggers: wandb: {e} (WANDB_MODE=offline needs no account)") from None
        with open(id_file, "w") as f:
            f.write(self.run.id)

    def log(self, record):
        self.run.log(scalars(record), step=record["step"])

    def samples(self, step, rows):
        # Logged at the step of the metrics just logged: wandb adds it to the same history row.
        table = self.wandb.Table(columns=list(rows[0]), data=[list(r.values()) for r in rows])
        self.run.log({"samples": table}, step=step)

    def close(self):
        self.run.finish()


def cut_events(log_dir, last_step):
    """Drop the events of steps after `last_step` from the TensorBoard event files in log_dir; a
    file left with none is removed. A file is rewritten to a name TensorBoard does not read, then
    renamed over the old one: a kill leaves the old file or the new one."""
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.summary.writer.record_writer import RecordWriter
    for path in glob.glob(os.path.join(log_dir, "*tfevents*")):
        records = list(RawEventFileLoader(path).Load())  # serialized Event protos
        keep = [r for r in records if Event.FromString(r).step <= last_step]
        if not keep:
            os.remove(path)
        elif len(keep) < len(records):
            tmp = os.path.join(log_dir, "cut.tmp")
            with open(tmp, "wb") as f:
                writer = RecordWriter(f)
                for r in keep:
                    writer.write(r)
            os.replace(tmp, path)


def markdown_table(rows):
    """Dicts with the same keys as a Markdown table (TensorBoard renders its text as Markdown)."""
    cell = lambda v: str(v).replace("|", "\\|").replace("\n", "<br>")  # noqa: E731
    lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    return "\n".join(lines + ["| " + " | ".join(cell(v) for v in r.values()) + " |" for r in rows])
