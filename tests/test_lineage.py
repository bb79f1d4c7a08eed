"""One change at a time (runs/lineage.py): a run started with --parent RUN_DIR records the
parent and the config keys that differ from the parent's config.json, and warns by name
when more than one setting changed."""

import dataclasses
import json

import pytest

import posttrain.pipelines.run as pipeline_run
from posttrain.cli import main
from posttrain.config import TrainConfig
from posttrain.config.files import to_dict
from posttrain.pipelines.run import start_run
from posttrain.runs.lineage import MISSING, describe_changes, differing_keys, flatten, parent_record, read_parent
from posttrain.runs.rundir import RunDir, RunDirError


def test_flatten_names_every_leaf_by_its_dotted_key():
    assert flatten({"rl": {"optim": {"lr": 1e-4}, "sampling": {"top_p": 1.0}, "algo_params": {}}, "seed": 0,
                    "ks": [1, 5]}) == {
        "rl.optim.lr": 1e-4, "rl.sampling.top_p": 1.0, "seed": 0, "ks": [1, 5]}  # an empty section has no leaves


def test_differing_keys_worked_by_hand():
    parent = {"name": "a", "seed": 0, "rl": {"optim": {"lr": 1e-4}, "algo_params": {}, "steps": 10}}
    child = {"name": "b", "seed": 0, "rl": {"optim": {"lr": 3e-4}, "algo_params": {"kl_coef": 0.04}, "steps": 10},
             "new": 1}
    assert differing_keys(parent, child, ignore={"name"}) == {
        "new": (MISSING, 1), "rl.algo_params.kl_coef": (MISSING, 0.04), "rl.optim.lr": (1e-4, 3e-4)}
    assert differing_keys(parent, parent) == {}


def test_where_a_run_is_written_is_not_a_change():
    parent = to_dict(TrainConfig())
    child = to_dict(dataclasses.replace(TrainConfig(), name="x", out_dir="elsewhere", report_to="tensorboard",
                                        checkpoint_every=5))
    assert parent_record("runs/p", parent, child)["changed"] == []


@pytest.mark.parametrize("changes, line", [
    ({}, "note: this run changes no setting from its parent runs/p: it is a repeat"),
    ({"seed": 1}, "one change from the parent runs/p: seed 0 -> 1"),
    ({"seed": 1, "heldout_size": 64},
     "warning: this run changes 2 settings from its parent runs/p (heldout_size, seed): if its numbers move, you "
     "cannot tell which change moved them. Change one thing at a time"),
])
def test_the_line_a_run_prints_about_its_parent(changes, line):
    record = parent_record("runs/p", to_dict(TrainConfig()), to_dict(dataclasses.replace(TrainConfig(), **changes)))
    assert describe_changes(record).startswith(line)


def test_start_run_records_the_parent_and_the_changed_keys(tmp_path, capsys):
    parent_cfg = TrainConfig(out_dir=str(tmp_path), name="parent")
    parent = start_run(parent_cfg, "train")
    parent.close()
    child_cfg = dataclasses.replace(parent_cfg, name="child", rl=dataclasses.replace(parent_cfg.rl, optim=dataclasses.replace(parent_cfg.rl.optim, lr=3e-4)))
    child = start_run(child_cfg, "train", parent=str(parent.path))
    child.close()
    meta = child.read_json("meta.json")
    assert meta["parent"] == {"run": str(parent.path), "changed": ["rl.optim.lr"], "values": {"rl.optim.lr": [1e-4, 3e-4]}}
    assert meta["loop"] == "C (train)" and meta["spec_version"]  # the rest of meta.json is still there
    assert "one change from the parent" in capsys.readouterr().out
    assert "parent" not in parent.read_json("meta.json")  # a run without --parent records none


def test_train_with_parent_warns_when_two_settings_changed(tmp_path, capsys, monkeypatch):
    # the pipeline itself is stubbed: what is tested is the command line's parent, not training
    def no_training(cfg, run, env=None):
        (run.path / "summary.md").write_text("# stub\n")
        return {"stub": True}

    monkeypatch.setattr(pipeline_run, "run_pipeline", no_training)
    out = tmp_path / "runs"
    assert main(["train", "--out_dir", str(out), "--name", "parent", "--threads", "1"]) == 0
    (parent,) = out.iterdir()
    capsys.readouterr()
    assert main(["train", "--out_dir", str(out), "--name", "child", "--threads", "1", "--parent", str(parent),
                 "--rl.optim.lr", "3e-4", "--grpo.kl_coef", "0.04"]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert (f"warning: this run changes 2 settings from its parent {parent} (rl.algo_params.kl_coef, rl.optim.lr)"
            in printed)
    (child,) = [p for p in out.iterdir() if p != parent]
    record = json.loads((child / "meta.json").read_text())["parent"]
    assert record["changed"] == ["rl.algo_params.kl_coef", "rl.optim.lr"]
    assert record["values"]["rl.optim.lr"] == [1e-4, 3e-4]


def test_a_parent_that_is_not_a_run_is_refused_before_anything_is_created(tmp_path, capsys):
    out = tmp_path / "runs"
    assert main(["train", "--out_dir", str(out), "--parent", str(tmp_path / "nowhere")]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"--parent '{tmp_path / 'nowhere'}' is not a run directory (no config.json in it)" in err
    assert not out.exists()
    (tmp_path / "list").mkdir()
    (tmp_path / "list" / "config.json").write_text("[1, 2]")
    with pytest.raises(RunDirError, match="holds a JSON list, not the settings of a run"):
        read_parent(tmp_path / "list")


def test_eval_of_another_models_completions_names_the_file_as_the_one_change(tmp_path, capsys):
    first = tmp_path / "a.jsonl"
    first.write_text('{"id": "1", "prompt": "Q: 3+4\\n", "expected_answer": "7", "completion": "Final: 7"}\n')
    second = tmp_path / "b.jsonl"
    second.write_text('{"id": "1", "prompt": "Q: 3+4\\n", "expected_answer": "7", "completion": "Final: 8"}\n')
    out = tmp_path / "runs"
    assert main(["eval", "--completions", str(first), "--out_dir", str(out), "--name", "a"]) == 0
    (parent,) = out.iterdir()
    assert main(["eval", "--completions", str(second), "--out_dir", str(out), "--name", "b",
                 "--parent", str(parent)]) == 0
    assert "one change from the parent" in capsys.readouterr().out
    (child,) = [p for p in out.iterdir() if p != parent]
    record = RunDir.open(str(child)).read_json("meta.json")["parent"]
    assert record["changed"] == ["path"] and record["values"]["path"] == [str(first), str(second)]
