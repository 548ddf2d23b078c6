"""trackers.py with the real tensorboard and wandb packages (wandb offline: no network, no
account): what each tracker holds is read back from its files (TensorBoard's event files, wandb's
offline .wandb transaction log) and compared with metrics.jsonl, value by value and step by step,
for a direct use and for a 2-rank train.py run resumed from an earlier checkpoint."""
import glob
import json
import os
import shutil
import struct
import subprocess
import sys
import time

import psutil
import pytest

import trackers
from config import Config, UserError
from test_train_e2e import run, setup_run

pytest.importorskip("tensorboard")
pytest.importorskip("wandb")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def offline_wandb(tmp_path, monkeypatch):
    """wandb offline with every file of its own under tmp_path; its service process shut down
    after the test (wandb.teardown), so no process outlives it."""
    for var, sub in (("WANDB_CONFIG_DIR", "config"), ("WANDB_CACHE_DIR", "cache"),
                     ("WANDB_DATA_DIR", "data"), ("WANDB_ARTIFACT_DIR", "artifacts")):
        monkeypatch.setenv(var, str(tmp_path / "wandb_home" / sub))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONSOLE", "off")  # in this process: leave pytest's stdout alone
    monkeypatch.delenv("WANDB_DIR", raising=False)
    yield
    import wandb
    wandb.teardown()


# ----------------------------------------------------------------------------- reading them back


def tensorboard_data(log_dir):
    """({tag: [(step, value)]} of the scalars, {tag: {step: text}} of the texts) of every event in
    TensorBoard's event files, in file order, read raw: with no reader's own dropping of older
    events, a step logged twice is there twice, and fails the assertion here."""
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto.event_pb2 import Event
    scalars, texts = {}, {}
    for path in sorted(glob.glob(os.path.join(log_dir, "*tfevents*"))):
        for raw in RawEventFileLoader(path).Load():
            event = Event.FromString(raw)
            for v in event.summary.value:
                if v.HasField("tensor"):  # add_text's
                    text = texts.setdefault(v.tag.removesuffix("/text_summary"), {})
                    assert event.step not in text, (v.tag, event.step)
                    text[event.step] = v.tensor.string_val[0].decode()
                else:
                    scalars.setdefault(v.tag, []).append((event.step, v.simple_value))
    for tag, points in scalars.items():
        assert len({step for step, _ in points}) == len(points), (tag, points)
    return scalars, texts


def wandb_records(path):
    """The protobuf records of a .wandb transaction log (wandb-core writes LevelDB's log format:
    a 7-byte ':W&B' header, then 32 KiB blocks of chunks with a 7-byte header each: CRC, length,
    type full/first/middle/last)."""
    from wandb.proto import wandb_internal_pb2
    data = open(path, "rb").read()
    assert data[:4] == b":W&B", path
    pos, chunks, out = 7, b"", []
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is zero padding
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunks, pos = chunks + data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind in (1, 4):  # a full record, or a record's last chunk
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunks)
            out.append(record)
            chunks = b""
    return out


def wandb_runs(wandb_dir):
    """Each offline run directory under wandb_dir/wandb, in start order, as
    {"dir", "id", "config", "history": {step: {key: value}}}."""
    runs = []
    for run_dir in sorted(glob.glob(os.path.join(wandb_dir, "wandb", "offline-run-*"))):
        (log,) = glob.glob(os.path.join(run_dir, "run-*.wandb"))
        got = {"dir": run_dir, "history": {}, "config": {}}
        for r in wandb_records(log):
            kind = r.WhichOneof("record_type")
            if kind == "run":
                got["id"] = r.run.run_id
                got["config"].update({i.key: json.loads(i.value_json) for i in r.run.config.update})
            elif kind == "history":
                row = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
                assert r.history.step.num not in got["history"], f"step {r.history.step.num} twice"
                got["history"][r.history.step.num] = row
        runs.append(got)
    return runs


def metric_values(row):
    """A wandb history row without wandb's own keys (_step, _runtime, ...) and the sample table's."""
    return {k: v for k, v in row.items() if not k.startswith(("_", "samples"))}


# ----------------------------------------------------------------------------- direct use


def records(steps, shift=0.0):
    """metrics.jsonl-like records: step 0 an evaluation only; a None value, as train.py logs one."""
    out = [{"step": 0, "eval/accuracy": 0.25}]
    for s in steps:
        out.append({"step": s, "reward/mean": 0.1 * s + shift, "actor/kl_old": None if s == 1 else 1e-3 * s,
                    "actor/optimizer_steps": 4, "timing/step": 1.5 + s + shift})
    return out


def sample_rows(step):
    return [{"step": step, "prompt": "What is 1 + 1?\n| x |", "answer": "2", "response": f"\\boxed{{{step}}}",
             "reward": 1.0}]


def test_tensorboard_holds_the_records_and_a_resume_cuts_the_later_steps(tmp_path):
    """Launch 1 logs steps 0-3 (an evaluation at 3), launch 2 resumes from step 2's checkpoint and
    logs 3-4 with other values and no evaluation: the event files hold every step once, step 3
    with launch 2's values only. A launch from step 0 starts the files afresh."""
    cfg = Config(model="m", train_data="d", out_dir=str(tmp_path), loggers=["jsonl", "tensorboard"])
    first, second = records([1, 2, 3]), records([3, 4], shift=100.0)[1:]
    first[-1]["eval/accuracy"] = 0.5  # a tag launch 2 does not log at step 3
    (tb,) = trackers.open_trackers(cfg, 0, resumed=False)
    for r in first:
        tb.log(r)
    tb.samples(1, sample_rows(1))
    tb.close()
    (tb,) = trackers.open_trackers(cfg, 2, resumed=True)
    for r in second:
        tb.log(r)
    tb.samples(3, sample_rows(3))
    tb.close()

    want = {}
    for r in first[:3] + second:  # steps 0-2 of launch 1, then launch 2's
        for k, v in r.items():
            if k != "step" and v is not None:
                want.setdefault(k, []).append((r["step"], pytest.approx(v, rel=1e-6)))  # float32
    got, texts = tensorboard_data(str(tmp_path / "tensorboard"))
    assert got == want
    samples = texts["samples"]
    assert sorted(samples) == [1, 3]
    assert samples[3].splitlines() == ["| step | prompt | answer | response | reward |",
                                       "|---|---|---|---|---|",
                                       "| 3 | What is 1 + 1?<br>\\| x \\| | 2 | \\boxed{3} | 1.0 |"]
    config = texts["config"]
    assert sorted(config) == [0, 2] and "    loggers:\n    - jsonl\n    - tensorboard\n" in config[0]

    (tb,) = trackers.open_trackers(cfg, 0, resumed=False)
    tb.log(first[1])
    tb.close()
    assert tensorboard_data(str(tmp_path / "tensorboard"))[0] == {
        k: [(1, pytest.approx(v, rel=1e-6))] for k, v in first[1].items() if k != "step" and v is not None}


def test_wandb_offline_holds_the_records_and_a_resume_keeps_the_run_id(tmp_path, monkeypatch,
                                                                       offline_wandb):
    """History rows at the RL step with metrics.jsonl's values (None left out), the sample table in
    the row of its step, the config; a resumed launch under the same id, in WANDB_DIR."""
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb_dir"))
    out = tmp_path / "my_run"
    out.mkdir()
    cfg = Config(model="m", train_data="d", out_dir=str(out), loggers=["wandb"], wandb_project="p")
    first, second = records([1, 2, 3]), records([3, 4], shift=100.0)[1:]
    (wb,) = trackers.open_trackers(cfg, 0, resumed=False)
    for r in first:
        wb.log(r)
        if r["step"] == 2:
            wb.samples(2, sample_rows(2))
    wb.close()
    run_id = (out / "wandb_run_id").read_text()
    (wb,) = trackers.open_trackers(cfg, 2, resumed=True)
    for r in second:
        wb.log(r)
    wb.close()
    wb.wandb.teardown()  # wandb's service finishes writing the .wandb files when it stops

    assert not (out / "wandb").exists()  # WANDB_DIR wins over out_dir
    one, two = wandb_runs(str(tmp_path / "wandb_dir"))
    assert one["id"] == two["id"] == run_id and len(run_id) >= 8
    assert one["config"]["wandb_project"] == "p" and one["config"]["loggers"] == ["wandb"]
    for got, sent in ((one, first), (two, second)):
        assert sorted(got["history"]) == [r["step"] for r in sent]
        for r in sent:
            want = {k: v for k, v in r.items() if k != "step" and v is not None}
            assert metric_values(got["history"][r["step"]]) == want, r["step"]
    table = one["history"][2]
    assert table["samples/_type"] == "table-file" and table["samples/nrows"] == 1
    saved = json.load(open(os.path.join(one["dir"], "files", table["samples/path"])))
    assert saved["columns"] == list(sample_rows(2)[0]) and saved["data"] == [list(sample_rows(2)[0].values())]


def test_a_missing_package_names_its_pip_command(tmp_path, monkeypatch):
    for name in ("tensorboard", "wandb"):
        cfg = Config(model="m", train_data="d", out_dir=str(tmp_path), loggers=["jsonl", name])
        with monkeypatch.context() as m:
            m.setitem(sys.modules, name, None)  # `import name` fails, as when it is not installed
            with pytest.raises(UserError, match=f"loggers: {name} needs the {name} package: "
                                                f"pip install {name}$"):
                trackers.open_trackers(cfg, 0, resumed=False)
    assert not os.listdir(tmp_path)


def test_jsonl_alone_imports_no_tracker():
    """The default opens nothing and imports neither package (a fresh interpreter)."""
    code = ("import sys, config, trackers\n"
            "assert trackers.open_trackers(config.Config(model='m', train_data='d'), 0, False) == []\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('wandb', 'tensorboard')"
            " or m == 'torch.utils.tensorboard'))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr[-2000:]


# ----------------------------------------------------------------------------- train.py, resumed


@pytest.mark.slow
def test_a_resumed_training_run_continues_its_trackers(tmp_path, tiny_model_dir, offline_wandb,
                                                       monkeypatch):
    """train.py on 2 ranks, 3 steps (checkpoints at 2 and 3; step 3's is then deleted, as when a kill
    lands after a step is logged and before its checkpoint is written), then --resume from step 2 to 4:
    TensorBoard and wandb hold metrics.jsonl's values at its steps, each step once (the event
    files lose the first launch's step 3, whose timing/* and evaluation the resumed one does not
    repeat), one wandb run id for both launches, rank 0 alone logging, the sample tables of
    samples.jsonl."""
    monkeypatch.delenv("WANDB_CONSOLE")  # wandb captures the workers' output, as by default
    evals = tmp_path / "eval.jsonl"
    evals.write_text("".join(json.dumps({"problem": f"What is {i} + 1?", "answer": str(i + 1)}) + "\n"
                             for i in range(2)))
    cfg, out = setup_run(tmp_path, tiny_model_dir, "tracked", steps=3, save_every=2, backend="hf",
                         eval_data=str(evals), loggers=["jsonl", "tensorboard", "wandb"])
    run(cfg, nproc=2)
    first_launch = [json.loads(ln) for ln in open(os.path.join(out, "metrics.jsonl"))]
    shutil.rmtree(os.path.join(out, "step_000003"))  # a --resume behind a newer checkpoint is refused
    run(cfg, "--resume", os.path.join(out, "step_000002"), "--set", "steps=4", nproc=2)
    rows = [json.loads(ln) for ln in open(os.path.join(out, "metrics.jsonl"))]
    assert [r["step"] for r in first_launch] == [0, 1, 2, 3] and [r["step"] for r in rows] == [0, 1, 2, 3, 4]
    assert first_launch[3]["timing/step"] != rows[3]["timing/step"]  # step 3 ran twice

    want = {}
    for r in rows:
        for k, v in r.items():
            if k != "step" and v is not None:
                want.setdefault(k, []).append((r["step"], pytest.approx(v, rel=1e-6)))  # float32
    got, texts = tensorboard_data(os.path.join(out, "tensorboard"))
    assert got.keys() == want.keys()
    for k in want:
        assert got[k] == want[k], k
    samples = [json.loads(ln) for ln in open(os.path.join(out, "samples.jsonl"))]
    assert sorted(texts["samples"]) == [1, 2, 3, 4]  # log_samples_every 1
    for step in (1, 4):
        assert texts["samples"][step] == trackers.markdown_table([s for s in samples if s["step"] == step])
    assert sorted(texts["config"]) == [0, 2]

    one, two = wandb_runs(out)  # one directory per launch: rank 1 logged nothing
    assert one["id"] == two["id"] == open(os.path.join(out, "wandb_run_id")).read()
    assert sorted(one["history"]) == [0, 1, 2, 3] and sorted(two["history"]) == [3, 4]
    assert two["config"]["steps"] == 4 and one["config"]["method"] == "tepo"
    for got_run, launch in ((one, first_launch), (two, rows[3:])):
        for r in launch:
            row = metric_values(got_run["history"][r["step"]])
            assert row == {k: pytest.approx(v, rel=1e-12) for k, v in r.items()
                           if k != "step" and v is not None}, r["step"]
    last = two["history"][4]
    saved = json.load(open(os.path.join(two["dir"], "files", last["samples/path"])))
    assert saved["data"] == [list(s.values()) for s in samples if s["step"] == 4]
    # wandb's service processes (wandb-core) ended with the launches that started them.
    time.sleep(2)
    ours = [p.info for p in psutil.process_iter(["pid", "name", "cmdline"]) if "wandb" in p.info["name"]
            and str(tmp_path) in p.environ().get("WANDB_CACHE_DIR", "")]
    assert not ours, ours
