"""data.py fetch over real HTTP: the upstream files (../shared/upstream, or $TEPO_DATA_DIR/upstream:
tests/qwen_math.py) served by http.server stand in for GitHub's raw host; the converted files must
equal ../shared/data (converted independently from the same bytes) row for row, and every bad input
is an error that names it and leaves nothing behind."""
import functools
import hashlib
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading

import pytest

import data
from config import UserError
from qwen_math import DATA_DIR, ROOT, TOKENIZER_DIR, UPSTREAM, need_shared


class Quiet(http.server.SimpleHTTPRequestHandler):
    """http.server's static handler, counting the requests it answers and keeping quiet."""
    hits = []

    def log_message(self, *args):
        Quiet.hits.append(self.path)


@pytest.fixture
def serve():
    """serve(directory, handler=Quiet) -> base URL of a static HTTP server over it (stopped after)."""
    servers = []

    def start(directory, handler=Quiet):
        httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                                functools.partial(handler, directory=directory))
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        servers.append(httpd)
        return f"http://127.0.0.1:{httpd.server_address[1]}"
    yield start
    for httpd in servers:
        httpd.shutdown()
        httpd.server_close()


def copy_of(tmp_path, name):
    """A copy of dataset `name`'s upstream tree under tmp_path/mirror; -> (mirror dir, raw file path)."""
    _, repo, commit, path = data.SOURCES[name][:4]
    dst = tmp_path / "mirror" / repo / commit / path
    dst.parent.mkdir(parents=True)
    shutil.copy(os.path.join(UPSTREAM, repo, commit, path), dst)
    return str(tmp_path / "mirror"), dst


def files_under(out):
    """Every file under `out`: after an error, none (no converted file, no temporary one)."""
    return [os.path.join(d, f) for d, _, fs in os.walk(out) for f in fs]


NEEDS_DATA = ["tests/test_data_fetch.py::test_a_converted_file_in_place_is_up_to_date_without_its_raw_file",
              "tests/test_gpu_path.py::test_the_chat_templates_end_of_turn_stops_sampling",
              "tests/test_reward.py::test_gold_answers_with_a_number_changed_do_not_verify"]


def pytest_run(env, *tests):
    """pytest on `tests` in a process of its own with `env` added -> its output, skip reasons shown."""
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *tests],
                         cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=300)
    return out.stdout + out.stderr


@pytest.mark.slow
def test_the_data_and_tokenizer_come_from_the_environment_or_a_skip_says_how(tmp_path, monkeypatch):
    """Where ../shared is not beside the checkout: a test that needs the data sets or the tokenizer
    skips saying what it needs and how to provide it (data.py fetch into $TEPO_DATA_DIR, the
    tokenizer's files into $TEPO_QWEN_TOKENIZER), and runs once they are there (the paths are read
    from the environment: tests/test_reward.py's looked only in ../shared). (It said only that
    ../shared was absent, and nothing else was looked at.)"""
    need_shared(UPSTREAM, DATA_DIR, TOKENIZER_DIR)
    absent = {"TEPO_DATA_DIR": str(tmp_path / "none"), "TEPO_QWEN_TOKENIZER": str(tmp_path / "none_tok")}
    report = pytest_run(absent, *NEEDS_DATA)
    assert "3 skipped" in report, report
    assert f"benchmark files not found at {tmp_path}/none: `python data.py fetch --out DIR`, then " \
           f"TEPO_DATA_DIR=DIR" in report, report
    assert (f"{tmp_path}/none/upstream is absent: this test needs the data sets' raw upstream files, which "
            f"`python data.py fetch --out DIR` keeps in DIR/upstream: TEPO_DATA_DIR=DIR") in report, report
    assert (f"{tmp_path}/none_tok is absent: this test needs Qwen2.5-Math-1.5B's tokenizer and config files: "
            f"`hf download Qwen/Qwen2.5-Math-1.5B config.json generation_config.json vocab.json merges.txt "
            f"tokenizer_config.json --local-dir DIR`, then TEPO_QWEN_TOKENIZER=DIR") in report, report
    data_dir, tok = tmp_path / "data", tmp_path / "tok"  # as data.py fetch and hf download leave them
    data_dir.mkdir()
    for f in os.listdir(DATA_DIR):
        os.symlink(os.path.join(DATA_DIR, f), data_dir / f)
    os.symlink(UPSTREAM, data_dir / "upstream")
    os.symlink(TOKENIZER_DIR, tok)
    # ... and, given, they are where the tests look (read at import: a module of its own here)
    import importlib.util
    monkeypatch.setenv("TEPO_DATA_DIR", str(data_dir))
    monkeypatch.setenv("TEPO_QWEN_TOKENIZER", str(tok))
    spec = importlib.util.spec_from_file_location("qwen_math_given", os.path.join(ROOT, "tests", "qwen_math.py"))
    given = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(given)
    assert (given.DATA_DIR, given.UPSTREAM, given.TOKENIZER_DIR) == (str(data_dir), str(data_dir / "upstream"), str(tok))
    given.need_shared(given.DATA_DIR, given.UPSTREAM, given.TOKENIZER_DIR)  # no skip


def test_every_data_set_fetched_over_http_equals_the_reference_row_for_row(tmp_path, serve):
    need_shared(UPSTREAM, DATA_DIR)
    url, out = serve(UPSTREAM), tmp_path / "data"
    Quiet.hits.clear()
    got = data.fetch(list(data.SOURCES), str(out), mirror=url)
    assert len(Quiet.hits) == len(data.SOURCES)
    for name, (file, repo, commit, path) in ((n, s[:4]) for n, s in data.SOURCES.items()):
        want = [json.loads(ln) for ln in open(os.path.join(DATA_DIR, file))]
        rows = data.load_problems(str(out / file))  # the loaders read what fetch writes
        assert [(r["problem"], r["answer"]) for r in rows] == [(r["problem"], r["answer"]) for r in want], name
        assert rows == got[name] and {r["source"] for r in rows} == {f"{repo}:{path}@{commit}"}
    assert len(got["math_train"]) == 7470 and len(got["olympiadbench"]) == 675  # 4 null answers dropped
    # a second fetch downloads nothing (the raw files are kept, checked by digest) and rewrites nothing
    stamps = {f: os.stat(out / f).st_mtime_ns for f in os.listdir(out) if f.endswith(".jsonl")}
    Quiet.hits.clear()
    data.fetch(list(data.SOURCES), str(out), mirror=url)
    assert Quiet.hits == []
    assert stamps == {f: os.stat(out / f).st_mtime_ns for f in stamps}


def test_a_converted_file_in_place_is_up_to_date_without_its_raw_file(tmp_path, serve):
    """The converted files alone (copied from elsewhere, no upstream/ beside them): nothing is
    downloaded, the server may be down. A file that differs by one byte is fetched again. And the
    pinned digests of the converted files are what converting the pinned raw files gives."""
    need_shared(UPSTREAM, DATA_DIR)
    for name, (file, repo, commit, path) in ((n, s[:4]) for n, s in data.SOURCES.items()):
        raw = open(os.path.join(UPSTREAM, repo, commit, path), "rb").read()
        body = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in data.convert(name, raw))
        assert hashlib.sha256(body.encode("utf-8")).hexdigest() == data.CONVERTED_SHA256[name], name
    first = tmp_path / "first"
    data.fetch(["aime24", "amc23"], str(first), mirror=serve(UPSTREAM))
    out = tmp_path / "data"
    out.mkdir()
    for f in ("aime24.jsonl", "amc23.jsonl"):
        shutil.copy(first / f, out / f)
    got = data.fetch(["aime24", "amc23"], str(out), mirror="http://127.0.0.1:9")  # nothing listens
    assert len(got["aime24"]) == 30 and len(got["amc23"]) == 40 and not (out / "upstream").exists()
    (out / "amc23.jsonl").write_text((out / "amc23.jsonl").read_text().replace('"27"', '"28"', 1))
    Quiet.hits.clear()
    data.fetch(["aime24", "amc23"], str(out), mirror=serve(UPSTREAM))
    assert len(Quiet.hits) == 1 and open(out / "amc23.jsonl", "rb").read() == open(first / "amc23.jsonl", "rb").read()


def test_the_normalisations_of_the_converter():
    """The answer rules on rows written here: AIME leading zeros, AMC floats, GSM8K commas, the last
    balanced \\boxed of a Minerva solution, OlympiadBench's $...$ lists."""
    def one(name, row):
        raw = json.dumps(row).encode() if name != "math_train" else json.dumps([row]).encode()
        return data.convert(name, raw)[0]
    assert one("aime24", {"problem": "p", "answer": "025"})["answer"] == "25"
    assert one("aime24", {"problem": "p", "answer": "025"})["answer_raw"] == "025"
    assert one("amc23", {"question": "p", "answer": 27.0})["answer"] == "27"
    assert one("amc23", {"question": "p", "answer": "2.5"})["answer"] == "2.5"
    assert one("gsm8k", {"question": "p", "answer": "so 3*4=12\n#### 1,234"})["answer"] == "1234"
    assert one("minerva", {"problem": "p", "solution": "\\boxed{1} then \\boxed{\\frac{1}{2} }."})[
        "answer"] == "\\frac{1}{2}"
    assert one("olympiadbench", {"question": "p", "final_answer": ["$x=1$", " $2$"]})["answer"] == "x=1,2"


@pytest.mark.parametrize("name,broken", [
    ("aime24", {"answer": None}), ("minerva", {"solution": "no box"}), ("gsm8k", {"answer": "12"}),
    ("olympiadbench", {"final_answer": []}), ("math500", {"problem": ""})])
def test_a_row_without_an_answer_names_the_file_and_row_and_writes_nothing(tmp_path, serve, monkeypatch,
                                                                           name, broken):
    """The upstream file changed (and its pin with it): row 3 lost its answer. A naive converter writes
    `"answer": null` (or an empty problem) that eval would grade against; this one stops."""
    need_shared(UPSTREAM)
    mirror, raw = copy_of(tmp_path, name)
    lines = raw.read_text().splitlines()
    row = json.loads(lines[2])
    row.update(broken)
    lines[2] = json.dumps(row)
    raw.write_text("\n".join(lines) + "\n")
    pinned = list(data.SOURCES[name])
    pinned[4] = hashlib.sha256(raw.read_bytes()).hexdigest()
    monkeypatch.setitem(data.SOURCES, name, tuple(pinned))
    out = tmp_path / "data"
    with pytest.raises(UserError, match=r"test\.jsonl: row 3 has no"):
        data.fetch([name], str(out), mirror=serve(mirror))
    assert files_under(out) == []


def test_a_corrupted_byte_is_refused_by_its_digest_and_writes_nothing(tmp_path, serve):
    need_shared(UPSTREAM)
    mirror, raw = copy_of(tmp_path, "amc23")
    body = bytearray(raw.read_bytes())
    body[1000] ^= 0x01  # one bit, in a problem's text: the rows still parse
    raw.write_bytes(bytes(body))
    out = tmp_path / "data"
    with pytest.raises(UserError, match=r"amc23/test\.jsonl: SHA-256 \w+ is not the pinned 43707e1c"):
        data.fetch(["amc23"], str(out), mirror=serve(mirror))
    assert files_under(out) == []


def test_an_html_page_in_place_of_the_file_is_named_as_such(tmp_path, serve):
    """A captive portal or a proxy's error page answers 200 with HTML."""
    need_shared(UPSTREAM)
    mirror, raw = copy_of(tmp_path, "aime25")
    raw.write_text("<!DOCTYPE html><html><body>Sign in to continue</body></html>")
    out = tmp_path / "data"
    with pytest.raises(UserError, match=r"an HTML page, not the data"):
        data.fetch(["aime25"], str(out), mirror=serve(mirror))
    assert files_under(out) == []


class Truncating(Quiet):
    """Announces the whole file's length, sends half of it and closes the connection."""

    def copyfile(self, source, outputfile):
        outputfile.write(source.read()[:500])


def test_a_truncated_body_is_retried_then_refused(tmp_path, serve, monkeypatch):
    """urllib hands over a short body without complaint when the server closes early; the digest
    would catch it too, but the message must say what happened."""
    need_shared(UPSTREAM)
    monkeypatch.setattr(data, "FETCH_TRIES", 2)
    monkeypatch.setattr("time.sleep", lambda s: None)
    mirror, _ = copy_of(tmp_path, "aime24")
    Quiet.hits.clear()
    out = tmp_path / "data"
    with pytest.raises(UserError, match=r"(?s)could not download 1 of the 1 data files from http://\S+: .*"
                                        r"aime24/test\.jsonl -> \S+ \(truncated: got 500 of \d+ bytes; 2 tries\)"):
        data.fetch(["aime24"], str(out), mirror=serve(mirror, Truncating))
    assert len(Quiet.hits) == 2
    assert files_under(out) == []


def test_offline_every_missing_file_is_named_in_one_error_and_nothing_is_left(tmp_path):
    """No host answers: one `error:` line naming the host and --mirror, then each of the eight
    source URLs with the path where a copy downloaded by hand is taken from; no directory made.
    (Before: it stopped at the first file, said nothing of --mirror, and left an empty directory.)
    Then the file placed there is used."""
    need_shared(UPSTREAM)
    out = tmp_path / "data"
    code = ("import sys, data; data.FETCH_TRIES = 2; import time; time.sleep = lambda s: None; "
            "data.main(sys.argv[1:])")
    run = subprocess.run([sys.executable, "-c", code, "fetch", "--out", str(out), "--mirror",
                          "http://127.0.0.1:9"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    errors = [ln for ln in run.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: could not reach http://127.0.0.1:9 (") and \
        "8 data file(s) missing" in errors[0] and "--mirror URL" in errors[0], run.stderr
    for _, repo, commit, path in (s[:4] for s in data.SOURCES.values()):
        assert f"\n  {data.GITHUB_RAW}/{repo}/{commit}/{path} -> {out / 'upstream' / repo / commit / path}" \
            in run.stderr, run.stderr
    assert not out.exists()
    _, repo, commit, path = data.SOURCES["aime24"][:4]
    by_hand = out / "upstream" / repo / commit / path
    by_hand.parent.mkdir(parents=True)
    shutil.copy(os.path.join(UPSTREAM, repo, commit, path), by_hand)
    again = subprocess.run([sys.executable, "data.py", "fetch", "aime24", "--out", str(out), "--mirror",
                            "http://127.0.0.1:9"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert [json.loads(ln)["answer"] for ln in open(out / "aime24.jsonl")] == \
        [json.loads(ln)["answer"] for ln in open(os.path.join(DATA_DIR, "aime24.jsonl"))]


def test_a_mirror_without_some_files_names_each_and_writes_the_others(tmp_path, serve, monkeypatch):
    """A host that answers but lacks a file (HTTP 404): the others are still tried and written."""
    need_shared(UPSTREAM)
    monkeypatch.setattr("time.sleep", lambda s: None)
    mirror, _ = copy_of(tmp_path, "aime24")
    out = tmp_path / "data"
    with pytest.raises(UserError, match=r"could not download 2 of the 3 data files from http://\S+: 2 data "
                                        r"file\(s\) missing(.|\n)*amc23/test\.jsonl -> \S+ \(HTTP 404 File not "
                                        r"found; 1 tries\)\n.*gsm8k/test\.jsonl -> \S+ \(HTTP 404"):
        data.fetch(["amc23", "aime24", "gsm8k"], str(out), mirror=serve(mirror))
    assert sorted(os.listdir(out)) == ["aime24.jsonl", "upstream"]


def test_unknown_names_are_refused_with_fetchs_usage():
    """fetch's own usage line (it was the top-level one, which does not show NAME or --out)."""
    run = subprocess.run([sys.executable, "data.py", "fetch", "math", "--out", "/nonexistent"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and run.stderr.startswith("usage: data.py fetch [-h] [--out OUT]"), run.stderr
    assert "data.py fetch: error: unknown data set(s) ['math']; known: math_train math500 aime24 aime25 " \
           "amc23 minerva olympiadbench gsm8k (or the stems of their files: minerva_math gsm8k_test)" in run.stderr


def test_a_data_set_may_be_named_by_its_files_stem(tmp_path, serve):
    """minerva_math and gsm8k_test, as eval.py names the files, fetch minerva and gsm8k (they were
    refused as unknown); a set named twice is fetched once."""
    need_shared(UPSTREAM)
    Quiet.hits.clear()
    data.main(["fetch", "minerva_math", "gsm8k_test", "minerva", "--out", str(tmp_path), "--mirror", serve(UPSTREAM)])
    assert sorted(os.listdir(tmp_path)) == ["gsm8k_test.jsonl", "minerva_math.jsonl", "upstream"]
    assert len(Quiet.hits) == 2
