"""Comparing two measurements (eval/comparison.py, `posttrain diff`): runs measured with
another scorer, dataset, prompt template or sampling are refused with a message naming the
difference, and compared with --allow-different while listing it; the paired difference
carries the noise rule's verdict."""

import json

import pytest

from posttrain.cli import main
from posttrain.eval.comparison import (IncomparableRunsError, check_comparable, diff_line, instrument,
                                       instrument_differences, paired_change, paired_scores, solved_by_id)
from posttrain.models import CharTokenizer, load_tokenizer
from posttrain.models.smollm2 import default_cache_dir
from posttrain.roles.engines.contract import prompt_template
from posttrain.runs.rundir import RunDir

GREEDY = {"temperature": 0.0, "decoding": "greedy", "max_new_tokens": 64}
META = {"loop": "A (eval)", "spec_version": "final_int/cot-v1", "dataset": {"version": "problems-abc", "size": 60},
        "prompt": {"template": "<bos>{prompt}"}, "sampling": GREEDY, "git_commit": "x", "created": "today"}


def meta(**changes):
    return {**META, **changes}


# --- the rule, on meta.json dicts ---------------------------------------------------------


def test_same_measurement_is_comparable_whatever_else_differs():
    other = meta(git_commit="y", created="tomorrow", checkpoint="runs/b", device={"device": "cpu"})
    assert check_comparable(META, other) == []


def test_other_sampling_is_refused_naming_the_setting_and_both_values():
    with pytest.raises(IncomparableRunsError) as refused:
        check_comparable(META, meta(sampling={**GREEDY, "temperature": 0.8}))
    message = str(refused.value)
    assert "sampling settings: sampling.temperature = 0.0 (A) vs 0.8 (B)" in message
    assert "--allow-different" in message
    assert "max_new_tokens" not in message  # only what differs is named


def test_other_spec_dataset_and_prompt_are_each_named():
    other = meta(spec_version="final_int/strict-v1", dataset={"version": "problems-def", "size": 60},
                 prompt={"template": "<|im_start|>user\n{prompt}<|im_end|>"})
    with pytest.raises(IncomparableRunsError) as refused:
        check_comparable(META, other, names=("base", "new"))
    lines = str(refused.value).splitlines()[1:4]
    assert lines == [
        "  scorer/spec version: spec_version = 'final_int/cot-v1' (base) vs 'final_int/strict-v1' (new)",
        "  dataset version: dataset.version = 'problems-abc' (base) vs 'problems-def' (new)",
        "  prompt template: prompt.template = '<bos>{prompt}' (base) vs '<|im_start|>user\\n{prompt}<|im_end|>' (new)"]


def test_allow_different_returns_the_differences_instead_of_raising():
    lines = check_comparable(META, meta(spec_version="final_int/strict-v1", sampling={**GREEDY, "top_p": 0.9}),
                             allow_different=True)
    assert lines == ["scorer/spec version: spec_version = 'final_int/cot-v1' (A) vs 'final_int/strict-v1' (B)",
                     "sampling settings: sampling.top_p = (not set) (A) vs 0.9 (B)"]


def test_a_field_one_run_lacks_is_a_difference_and_one_neither_records_is_not():
    no_prompt = {k: v for k, v in META.items() if k != "prompt"}
    assert [d["key"] for d in instrument_differences(META, no_prompt)] == ["prompt.template"]
    assert instrument_differences(no_prompt, no_prompt) == []


def test_dataset_is_its_version_when_recorded_else_everything_but_the_path():
    # two completions files of the same problems: other paths and file hashes, one version
    a = meta(dataset={"version": "problems-abc", "file": "a.jsonl", "sha256": "111", "n": 60})
    b = meta(dataset={"version": "problems-abc", "file": "b.jsonl", "sha256": "222", "n": 60})
    assert check_comparable(a, b) == []
    # an older run without a version: every recorded field but the path counts
    old_a = meta(dataset={"env": "arithmetic", "level": 3, "file": "x"})
    old_b = meta(dataset={"env": "arithmetic", "level": 2, "file": "y"})
    assert instrument(old_a)["dataset"] == {"env": "arithmetic", "level": 3}
    assert [d["key"] for d in instrument_differences(old_a, old_b)] == ["dataset.level"]


# --- the paired difference and the noise rule ----------------------------------------------


def test_paired_scores_worked_by_hand():
    a = {"p1": 1.0, "p2": 1.0, "p3": 0.0, "p4": 0.0, "only_a": 1.0}
    b = {"p4": 0.0, "p3": 0.0, "p2": 0.0, "p1": 1.0, "only_b": 0.0}
    diff = paired_scores(a, b)
    # shared p1..p4: a = 1,1,0,0 (0.5), b = 1,0,0,0 (0.25): one item moved, +25 points on 4 items
    assert diff["mean_diff"] == pytest.approx(0.25) and diff["mean_a"] == 0.5 and diff["mean_b"] == 0.25
    assert (diff["n_shared"], diff["only_in_a"], diff["only_in_b"]) == (4, 1, 1)
    assert diff["noise_rule"]["verdict"] == "over 5 points"
    assert "noise rule: over 5 points (N = 4 < 100 but |difference| = 25.0 > 5 points" in diff_line(diff)
    with pytest.raises(ValueError, match="share no item ids"):
        paired_scores({"x": 1.0}, {"y": 1.0})


def test_solved_counts_the_verifiers_word_not_the_reward():
    rows = [{"id": "a", "reward": 1.0, "details": {}}, {"id": "b", "reward": 0.5, "details": {"correct": False}},
            {"id": 3, "reward": 0.5, "details": {"correct": True}}, {"id": "d", "reward": 0.0, "details": {}}]
    assert solved_by_id(rows) == {"a": 1.0, "b": 0.0, "3": 1.0, "d": 0.0}


# --- `posttrain diff` on run directories --------------------------------------------------


def run_dir(root, name, meta_json, rewards):
    run = RunDir.create(str(root), name)
    run.write_json("config.json", {"name": name})
    run.write_json("meta.json", meta_json)
    run.write_jsonl("samples.jsonl", [{"id": f"q{i:02d}", "reward": r} for i, r in enumerate(rewards)])
    run.close()
    return str(run.path)


def test_diff_refuses_other_sampling_and_compares_with_allow_different(tmp_path, capsys):
    greedy = run_dir(tmp_path, "greedy", META, [1.0] * 30 + [0.0] * 30)
    sampled = run_dir(tmp_path, "sampled", meta(sampling={**GREEDY, "temperature": 1.0}), [1.0] * 32 + [0.0] * 28)
    assert main(["diff", sampled, greedy]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "posttrain diff: error: run A and run B were not measured the same way" in err
    assert "sampling settings: sampling.temperature = 1.0 (A) vs 0.0 (B)" in err

    assert main(["diff", sampled, greedy, "--allow-different"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "comparing runs measured differently (--allow-different)" in out
    assert "sampling settings: sampling.temperature = 1.0 (A) vs 0.0 (B)" in out
    # two items moved out of 60: 3.3 points, the rule's "likely noise", printed beside the CI
    assert "A 0.533 vs B 0.500 on 60 shared items: A - B = +0.033" in out
    assert "noise rule: likely noise (N = 60 < 100 and |difference| = 3.3 <= 5 points)" in out


def test_diff_of_runs_measured_alike_needs_no_flag(tmp_path, capsys):
    a = run_dir(tmp_path, "a", META, [1.0] * 50 + [0.0] * 10)
    b = run_dir(tmp_path, "b", meta(git_commit="other"), [1.0] * 30 + [0.0] * 30)
    assert main(["diff", a, b]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "real difference" in out and "noise rule: over 5 points" in out and "warning" not in out


def test_diff_force_names_its_replacement(tmp_path, capsys):
    a = run_dir(tmp_path, "a", META, [1.0])
    assert main(["diff", a, a, "--force"]) == 2
    assert "--force was renamed --allow-different" in capsys.readouterr().err


def test_diff_of_a_hand_edited_meta_without_fields_still_names_them(tmp_path, capsys):
    a = run_dir(tmp_path, "a", META, [1.0, 0.0])
    bare = run_dir(tmp_path, "bare", {"loop": "A (eval)"}, [1.0, 1.0])
    assert main(["diff", a, bare]) == 2
    err = capsys.readouterr().err
    for what in ("scorer/spec version", "dataset version", "prompt template", "sampling settings"):
        assert what in err
    assert json.loads((tmp_path / bare.split("/")[-1] / "meta.json").read_text()) == {"loop": "A (eval)"}


def test_paired_change_pairs_a_runs_before_and_after_or_declines():
    before = [{"id": f"h{i}", "reward": 1.0 if i < 8 else 0.0, "details": {}} for i in range(16)]
    after = [{"id": f"h{i}", "reward": 1.0 if i < 11 else 0.0, "details": {}} for i in reversed(range(16))]
    change = paired_change(after, before)
    assert change["mean_diff"] == pytest.approx(3 / 16) and change["n_shared"] == 16
    assert change["noise_rule"]["verdict"] == "over 5 points"  # 18.75 points on 16 problems
    assert paired_change(after, []) is None  # an older run directory without eval_sft.jsonl
    nameless = [{**row, "id": ""} for row in before]
    assert paired_change(nameless, nameless) is None  # pairing by id would pair the wrong items
    repeated = before + before[:1]
    assert paired_change(after, repeated) is None


def test_the_prompt_template_shows_where_the_problem_text_goes():
    assert prompt_template(CharTokenizer()) == "<bos>{prompt}"  # gpt_mini: the text after <bos>
    directory = default_cache_dir()
    if not (directory / "tokenizer.json").is_file():
        pytest.skip(f"SmolLM2 is not converted at {directory} (the first `--model smollm2-135m` run converts it)")
    template = prompt_template(load_tokenizer(directory))  # its chat template, with its default system turn
    assert template.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert template.endswith("<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n")
