"""Loop A on a completions file: the report's numbers, the run directory, and
compare_runs' refusal across spec versions and its noise verdicts."""

import json

import pytest

from posttrain.eval.comparison import IncomparableRunsError, compare_runs
from posttrain.eval.completions import run_eval_file, score_completions_file
from posttrain.eval.packs import load_pack
from posttrain.runs.rundir import RunDir


def write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def items(n_right, n_wrong):
    """n_right correct then n_wrong wrong completions of one prompt, ids i000, i001, ..."""
    records = []
    for i in range(n_right + n_wrong):
        answer = "7" if i < n_right else "8"
        records.append({"id": f"i{i:03d}", "prompt": "Q: 3+4\n", "expected_answer": "7",
                        "completion": f"3+4=7\nFinal: {answer}"})
    return records


def test_frozen_pack_report_matches_its_labels():
    result = score_completions_file("frozen", "final_int/cot-v1")
    assert result["n"] == 100
    assert result["pass_rate"] == result["mean_reward"] == pytest.approx(0.49)
    assert result["reward_distribution"] == {"0": 51, "1": 49}
    labelled = {}
    for record in load_pack("frozen"):
        labelled[record["intended_reason"]] = labelled.get(record["intended_reason"], 0) + 1
    assert result["reason_counts"] == labelled
    assert len(result["top"]) == 5 and all(r["reason"] == "ok" for r in result["top"])
    bottom = [r["reason"] for r in result["bottom"]]
    # one of each of the five commonest failure codes, commonest first
    assert bottom == ["wrong_answer", "no_final_line", "extra_text", "bad_spacing", "multiple_final_lines"]
    assert all(r["completion"].startswith("'") for r in result["bottom"])  # raw repr shown


def test_bottom_groups_by_reason_when_codes_are_few(tmp_path):
    records = items(2, 4) + [{"id": "x", "prompt": "Q: 3+4\n", "expected_answer": "7", "completion": ""}]
    result = score_completions_file(write(tmp_path / "c.jsonl", records), "final_int/cot-v1")
    assert [r["reason"] for r in result["bottom"]] == ["wrong_answer"] * 4 + ["empty"]


def test_run_eval_file_writes_a_run_directory(tmp_path, capsys):
    summary = run_eval_file("frozen", "final_int/strict-v1", str(tmp_path), "frozen")
    run = RunDir.open(summary["run_dir"])
    meta = run.read_json("meta.json")
    assert meta["loop"] == "A (eval)" and meta["spec_version"] == "final_int/strict-v1"
    samples = run.read_jsonl("samples.jsonl")
    assert len(samples) == 100 and {"completion", "reward", "details"} <= set(samples[0])
    assert run.read_json("summary.json")["pass_rate"] == summary["pass_rate"]
    # strict-v1 wants one line: only the answer-only completions could pass, and there are none
    assert summary["pass_rate"] == 0.0
    assert "reason codes" in capsys.readouterr().out


def test_missing_field_is_reported_with_the_line(tmp_path):
    path = write(tmp_path / "bad.jsonl", [{"prompt": "Q: 1+1\n", "expected_answer": "2"}])
    with pytest.raises(ValueError, match=r"bad.jsonl:1: missing field\(s\) \['completion'\]"):
        score_completions_file(path, "final_int/cot-v1")


def test_an_int_expected_answer_scores_like_its_string_and_a_hopeless_one_is_refused(tmp_path):
    as_int = [{**r, "expected_answer": 7} for r in items(3, 2)]
    result = score_completions_file(write(tmp_path / "int.jsonl", as_int), "final_int/cot-v1")
    assert result["pass_rate"] == pytest.approx(0.6)
    assert result["reason_counts"] == {"ok": 3, "wrong_answer": 2}
    assert result["samples"][0]["details"]["expected"] == "7"
    hopeless = items(1, 0) + [{**items(1, 0)[0], "id": "seven", "expected_answer": "seven"}]
    with pytest.raises(ValueError, match=r"h.jsonl: record 'seven': expected_answer 'seven' is not a canonical integer"):
        score_completions_file(write(tmp_path / "h.jsonl", hopeless), "final_int/cot-v1")
    with pytest.raises(ValueError, match=r"f.jsonl: record 1: 'expected_answer' must be a str or an int, got float"):
        score_completions_file(write(tmp_path / "f.jsonl", [{**items(1, 0)[0], "expected_answer": 7.0}]),
                               "final_int/cot-v1")


def test_compare_runs_refuses_other_spec_unless_allowed(tmp_path, capsys):
    path = write(tmp_path / "a.jsonl", items(30, 30))
    cot = run_eval_file(path, "final_int/cot-v1", str(tmp_path), "cot")["run_dir"]
    strict = run_eval_file(path, "final_int/strict-v1", str(tmp_path), "strict")["run_dir"]
    mismatch = "scorer/spec version: spec_version = 'final_int/cot-v1' (A) vs 'final_int/strict-v1' (B)"
    with pytest.raises(IncomparableRunsError, match=mismatch.replace("(", r"\(").replace(")", r"\)")):
        compare_runs(cot, strict)
    capsys.readouterr()
    diff = compare_runs(cot, strict, allow_different=True)
    assert diff["mean_diff"] == pytest.approx(0.5)  # 30/60 right under cot, 0 under strict
    assert diff["verdict"] == "real" and diff["differences"] == [mismatch]
    out = " ".join(capsys.readouterr().out.split())
    assert "comparing runs measured differently" in out and mismatch in out
    # N = 60 < 100 and 50 points: the rule does not call it noise
    assert diff["noise_rule"]["verdict"] == "over 5 points"


def test_compare_runs_real_and_within_noise(tmp_path, capsys):
    def run(records, name):
        return run_eval_file(write(tmp_path / f"{name}.jsonl", records), "final_int/cot-v1",
                             str(tmp_path), name)["run_dir"]

    base = run(items(30, 30), "base")  # 0.50
    much_better = run(items(55, 5), "better")  # 0.92: every changed item improved
    one_more = run(items(31, 29), "one_more")  # 0.517: a single item flipped
    capsys.readouterr()
    real = compare_runs(much_better, base)  # three files of the same problems: one dataset version
    assert real["verdict"] == "real" and real["mean_diff"] == pytest.approx(25 / 60)
    assert real["differences"] == [] and real["noise_rule"]["verdict"] == "over 5 points"
    assert "real difference" in capsys.readouterr().out
    noise = compare_runs(one_more, base)
    assert noise["verdict"] == "within noise" and noise["mean_diff"] == pytest.approx(1 / 60)
    out = " ".join(capsys.readouterr().out.split())
    assert "difference within noise" in out
    assert "noise rule: likely noise (N = 60 < 100 and |difference| = 1.7 <= 5 points)" in out
    assert noise["n_shared"] == 60


def test_compare_runs_reads_a_training_runs_final_held_out_evaluation(tmp_path):
    from posttrain.runs.rundir import RunDir

    def train_run(name, solved):
        run = RunDir.create(str(tmp_path), name)
        run.write_json("config.json", {})
        run.write_meta({"loop": "C (train)", "spec_version": "final_int/cot-v1"})
        run.write_json("summary.json", {"final_stage": "rl"})
        run.write_jsonl("samples.jsonl", [{"id": "p0", "reward": 1.0}] * 3)  # training samples: not compared
        run.write_jsonl("eval_sft.jsonl", [{"id": f"p{i}", "reward": 0.0} for i in range(10)])
        run.write_jsonl("eval_rl.jsonl", [{"id": f"p{i}", "reward": float(i < solved)} for i in range(10)])
        return run.path

    diff = compare_runs(train_run("a", 7), train_run("b", 4))
    assert diff["n_shared"] == 10 and diff["mean_diff"] == pytest.approx(0.3)
