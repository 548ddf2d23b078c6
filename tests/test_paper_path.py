"""From a clone to the paper's table, on CPU, as README's "Reproduce the paper" runs it on GPUs:
`data.py fetch` over HTTP (the upstream files served locally stand in for GitHub), two RL steps of
configs/math1.5b-tepo.yaml on the fetched MATH train set (the model replaced by a random 2-layer
Qwen2 with the real tokenizer, the sizes made small), `eval.py --preset paper` on the first problems
of each of the seven benchmarks, and `eval.py --table` over the two checkpoints' results.

The training is the GPU config's with vLLM on 2 ranks, as on the GPUs (bf16 sampling, the real
tokenizer's chat template), with tests/test_gpu_configs.py's checks per step; the other configs
train there in one process. eval.py judges the checkpoints in this process with transformers'
generate (the protocol does not record the engine; eval.py's own command line and vLLM path are
tests/test_eval.py's).
"""
import json
import os

import pytest

import eval as ev
from data import load_problems
from qwen_math import DATA_DIR, ROOT, TOKENIZER_DIR, UPSTREAM, make_qwen_math_model, need_shared
from test_data_fetch import serve  # noqa: F401  (a fixture)
from test_gpu_configs import SIZES, check_run, torchrun


@pytest.mark.slow
def test_fetch_train_evaluate_tabulate(tmp_path, serve, capsys):  # noqa: F811
    need_shared(UPSTREAM, TOKENIZER_DIR, DATA_DIR)
    data = tmp_path / "data"
    import data as data_py
    data_py.main(["fetch", "--out", str(data), "--mirror", serve(UPSTREAM)])
    fetched = capsys.readouterr().out  # its report: a line per file
    assert fetched.count(" rows -> ") == 8 and "math_train: 7470 rows" in fetched, fetched
    assert sorted(os.listdir(data)) == sorted([*ev.BENCHMARKS.values(), "math_train.jsonl", "upstream"])
    assert len(load_problems(str(data / "math_train.jsonl"))) == 7470

    model = make_qwen_math_model(str(tmp_path / "model"))
    out_dir = tmp_path / "runs" / "math1.5b-tepo"
    sets = [f"model={model}", f"train_data={data / 'math_train.jsonl'}", f"eval_data={data / 'math500.jsonl'}",
            f"out_dir={out_dir}", "save_every=1", *SIZES]
    # the parity reward gives a random model's groups reward spread (the real grader gives all 0)
    torchrun(os.path.join(ROOT, "tests", "train_patched.py"), "--parity-reward", "--", "--config",
             os.path.join(ROOT, "configs", "math1.5b-tepo.yaml"), *[a for s in sets for a in ("--set", s)])
    check_run(str(out_dir), "tepo", 2)

    # the paper's protocol on the first problem of each benchmark, responses cut to 4 tokens
    results = []
    for step in ("step_000001", "step_000002"):
        path = tmp_path / "eval" / step / "results.json"
        args = ["--ckpt", str(out_dir / step), "--preset", "paper", "--data-dir", str(data),
                "--max-problems", "1", "--max-new-tokens", "4", "--out", str(path)]
        ev.main(args + ["--backend", "hf"])
        results.append(str(path))
    got = json.load(open(results[1]))
    p = got["protocol"]
    assert list(p["benchmarks"]) == list(ev.BENCHMARKS) and got["method"] == "tepo"
    assert {b: v["n"] for b, v in p["benchmarks"].items()} == {
        "math500": 4, "aime24": 32, "aime25": 32, "amc23": 32, "minerva": 4, "olympiadbench": 4, "gsm8k": 4}
    assert all(v["problems"] == 1 for v in p["benchmarks"].values())
    assert (p["preset"], p["temperature"], p["top_p"], p["max_new_tokens"], p["max_problems"]) == \
        ("paper", 0.6, 0.95, 4, 1)
    assert got["benchmarks"]["aime24"]["n"] == 32 and got["benchmarks"]["gsm8k"]["k"] == [1, 4]
    # the digest is of the rows read: data.py fetch's files and ../shared/data's, serialised
    # otherwise with other extra keys, are one protocol
    for b, f in ev.BENCHMARKS.items():
        digest = ev.rows_digest(load_problems(str(data / f)))
        assert p["benchmarks"][b]["rows_sha256"] == digest == ev.rows_digest(load_problems(os.path.join(DATA_DIR, f)))
    assert any((data / f).read_bytes() != open(os.path.join(DATA_DIR, f), "rb").read() for f in ev.BENCHMARKS.values())
    assert len(p["prompt_sha256"]) == 64

    table = tmp_path / "table.md"
    ev.main(["--table", *results, "--out", str(table)])
    text = table.read_text()
    assert "| run | math500 | aime24 | aime25 | amc23 | minerva | olympiadbench | gsm8k | avg |" in text
    for step in ("step_000001", "step_000002"):
        assert f"| tepo (seed 0, math1.5b-tepo/{step}) |" in text
    # 4-token responses on 1 problem: the paper's reported numbers are no comparison
    assert p["overrides"] == ["--max-new-tokens 4", "--max-problems 1"]  # the fetched rows are the pinned
    assert "Protocol: paper, modified by --max-new-tokens 4, --max-problems 1; n = " in text
    assert "as reported by the TEPO paper" not in text and (tmp_path / "table.csv").exists()
