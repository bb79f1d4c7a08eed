"""`posttrain compare`: every algorithm starts from the same SFT checkpoint and lands in one table."""

import json
import math

import pytest
import torch

from posttrain.cli import main
from tests.test_online_dpo import TINY_PREF, sft  # noqa: F401  (sft: a module-scoped SFT checkpoint fixture)
from tests.test_pipeline import TINY


def test_compare_shares_the_sft_start_and_writes_table_and_plot(tmp_path, capsys):
    algos = ["grpo", "ppo", "dapo"]  # plain, with a critic, with dynamic sampling
    assert main(["compare", "--algos", ",".join(algos), *TINY, "--rl.steps", "3", "--out_dir", str(tmp_path)]) == 0
    (root,) = tmp_path.iterdir()
    rows = json.loads((root / "compare.json").read_text())
    assert [r["algo"] for r in rows] == algos
    assert len({json.dumps(r["sft"]) for r in rows}) == 1  # one starting checkpoint, one number
    for r in rows:
        assert 0 <= r["rl"]["ci_low"] <= r["rl"]["mean"] <= r["rl"]["ci_high"] <= 1 and r["rl"]["n"] == 16
        assert r["wall_seconds"] > 0 and r["response_length"] > 0
        config = json.loads((root / r["run"] / "config.json").read_text())
        assert config["rl"]["algo"] == r["algo"] and config["init"].endswith("step_000005")
    dapo_rows = [json.loads(line) for line in (root / rows[2]["run"] / "metrics.jsonl").read_text().splitlines()]
    assert all("reward_sampled_mean" in r for r in dapo_rows if r["stage"] == "rl")
    table = (root / "compare.md").read_text()
    assert all(f"| {a} |" in table for a in algos)
    assert (root / "compare.png").stat().st_size > 10_000


def test_compare_rejects_unknown_algorithms(tmp_path, capsys):
    assert main(["compare", "--algos", "grpo,magic", "--out_dir", str(tmp_path)]) == 2
    assert "magic" in capsys.readouterr().err


def test_compare_preference_losses_reports_pairs_and_held_out_preference_accuracy(tmp_path):
    algos = ["kto", "simpo"]  # with a reference (and unpaired), reference-free
    assert main(["compare", "--algos", ",".join(algos), *TINY_PREF, "--rl.steps", "3", "--rl.preference.pair_prompts", "32",
                 "--out_dir", str(tmp_path)]) == 0
    (root,) = tmp_path.iterdir()
    rows = json.loads((root / "compare.json").read_text())
    assert [r["algo"] for r in rows] == algos and len({json.dumps(r["sft"]) for r in rows}) == 1
    pairs = {len((root / r["run"] / "pairs.jsonl").read_text().splitlines()) for r in rows}
    assert pairs == {rows[0]["pairs"]} and rows[0]["pairs"] > 0  # the same verifier-built pairs for every loss
    for r in rows:
        assert r["rl"]["n"] == 16 and r["kl_ref"] >= 0 and r["response_length"] > 0
        assert 0 <= r["train_accuracy"] <= 1 and 0 <= r["dev_pref_accuracy"] <= 1
    table = (root / "compare.md").read_text()
    assert "3 steps × 4 pairs" in table and "held-out pref acc" in table
    assert all(f"| {a} |" in table for a in algos)


def test_compare_online_rounds_runs_each_loss_offline_and_online_with_a_paired_difference(sft, tmp_path):
    assert main(["compare", "--algos", "dpo", "--online_rounds", "1,3", *TINY_PREF, "--init", sft, "--rl.steps", "3",
                 "--rl.preference.pair_prompts", "48", "--rl.preference.refresh_reference", "true",
                 "--dpo.beta", "0.2", "--dpo.nll_coef", "1.0", "--out_dir", str(tmp_path)]) == 0
    (root,) = tmp_path.iterdir()
    rows = json.loads((root / "compare.json").read_text())
    assert [r["algo"] for r in rows] == ["dpo offline", "dpo online ×3"]
    configs = [json.loads((root / r["run"] / "config.json").read_text())["rl"] for r in rows]
    assert [c["preference"]["online_rounds"] for c in configs] == [1, 3]
    assert [c["preference"]["refresh_reference"] for c in configs] == [False, True]  # offline has no next round to refresh
    assert all(c["algo_params"] == {"beta": 0.2, "nll_coef": 1.0} for c in configs)  # kept, not reset
    rounds = [json.loads((root / r["run"] / "pref_rounds.json").read_text()) for r in rows]
    assert [len(r) for r in rounds] == [1, 3]
    assert rows[1]["pairs"] == sum(r["pairs"] for r in rounds[1].values())
    # the paired difference is over the same 16 held-out problems, so its mean is the difference of the means
    diff = rows[1]["vs_first"]
    assert "vs_first" not in rows[0] and diff["n"] == 16
    assert math.isclose(diff["mean_diff"], rows[1]["rl"]["mean"] - rows[0]["rl"]["mean"], abs_tol=1e-9)
    assert diff["ci_low"] <= diff["mean_diff"] <= diff["ci_high"]
    table = (root / "compare.md").read_text()
    assert "| dpo offline |" in table and "| dpo online ×3 |" in table and "vs dpo offline (paired" in table
    assert "refreshed" in table and "nll_coef" in table


@pytest.mark.parametrize("argv, message", [
    (["--algos", "grpo", "--online_rounds", "1,4"], "preference"),
    (["--algos", "dpo", "--online_rounds", "1,four"], "round counts"),
    (["--algos", "dpo", "--online_rounds", "0,4"], "positive round counts"),
    (["--algos", "dpo", "--online_rounds", "1,4", "--rl.preference.online_rounds", "4"], "not both"),
    (["--algos", "dpo,simpo", "--dpo.nll_coef", "1.0"], "nll_coef"),  # every row gets it: simpo has none
])
def test_compare_refuses_rows_it_cannot_run_before_training_anything(argv, message, tmp_path, capsys):
    assert main(["compare", *argv, "--out_dir", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # refused before SFT, not after


# --- rows of any settings: --row NAME:KEY=VALUE,... ----------------------------------------------


def flat(config: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in config.items():
        if isinstance(value, dict) and key != "algo_params":
            out |= flat(value, f"{prefix}{key}.")
        else:
            out[prefix + key] = value
    return out


def test_a_row_changes_its_settings_and_only_those():
    from posttrain.config import TrainConfig
    from posttrain.config.files import to_dict
    from posttrain.pipelines.compare_rows import parse_row, row_config

    base = TrainConfig(seed=3)
    cases = {
        "same": ({}, {}),
        "lr:rl.optim.lr=2e-4,rl.sampling.max_new_tokens=40,seed=1": (
            {"rl.optim.lr": 2e-4, "rl.sampling.max_new_tokens": 40, "seed": 1}, {}),
        "clip:grpo.clip_eps_high=0.28,grpo.overlong_filter=true": ({}, {"clip_eps_high": 0.28, "overlong_filter": True}),
        "kimi:rl.algo=kimi,kimi.tau=0.1,rl.reward.length_reward=0.5": ({"rl.algo": "kimi", "rl.reward.length_reward": 0.5}, {"tau": 0.1}),
        # a teacher is opd's own setting, so distillation is a row beside the algorithms it is compared with
        "opd:rl.algo=opd,opd.teacher=runs/t": ({"rl.algo": "opd"}, {"teacher": "runs/t"}),
        "start:init=runs/x/checkpoints/sft/step_000099,model.lora_r=4": (
            {"init": "runs/x/checkpoints/sft/step_000099", "model.lora_r": 4}, {}),
    }
    before = flat(to_dict(base))
    for text, (settings, params) in cases.items():
        row = parse_row(text if ":" in text else text)
        after = flat(to_dict(row_config(base, row)))
        changed = {k: after[k] for k in after if after[k] != before[k]}
        expected = dict(settings) | ({"rl.algo_params": params} if params else {})
        assert changed == expected, text
        assert all(isinstance(after[k], type(v)) for k, v in settings.items())  # read as the setting's type


@pytest.mark.parametrize("row, message", [
    ("x:rl.lrr=1", "valid ones: ['rl.alerts.action', 'rl.alerts.monitors', 'rl.algo'"),  # the section's keys, listed
    ("x:learning_rate=1", "'heldout_size', 'init'"),  # the top-level keys and the algorithms
    ("x:grpo.clip=0.3", "grpo's hyperparameters are ['adv_eps', 'adv_norm', 'clip_eps_high'"),
    ("x:dapo.clip_eps_high=0.3", "the row trains rl.algo='grpo', so its hyperparameters are grpo.FIELD"),
    ("x:model.dim=64", "would change the shared SFT start"),
    ("x:out_dir=/tmp", "cannot be set per row"),
    ("x:rl.optim.lr=fast", "rl.optim.lr='fast' is not allowed"),
    ("x:rl.sampling=3", "must be a section"),
    ("x:rl.optim.lr", "is not KEY=VALUE"),
    ("../x:rl.optim.lr=1", "the row's name"),
    ("x:rl.optim.lr=1,rl.optim.lr=2", "given twice"),
])
def test_a_row_it_cannot_apply_is_refused_naming_what_is_valid(row, message):
    from posttrain.config import ConfigError, TrainConfig
    from posttrain.pipelines.compare_rows import parse_row, row_config

    with pytest.raises(ConfigError) as err:
        row_config(TrainConfig(), parse_row(row))
    assert message in str(err.value) and (row.startswith("..") or f"--row {row!r}" in str(err.value))


def test_compare_rows_run_each_setting_from_one_start_in_one_table(tmp_path):
    rows = ["grpo", "clip_higher:grpo.clip_eps_high=0.28", "lite:rl.algo=lite_ppo,rl.optim.lr=2e-4",
            "short:rl.sampling.max_new_tokens=30,grpo.overlong_filter=true"]
    argv = ["compare", *TINY, "--rl.steps", "2", "--out_dir", str(tmp_path)]
    for row in rows:
        argv += ["--row", row]
    assert main(argv) == 0
    (root,) = tmp_path.iterdir()
    results = json.loads((root / "compare.json").read_text())
    assert [r["algo"] for r in results] == ["grpo", "clip_higher", "lite", "short"]
    assert len({json.dumps(r["sft"]) for r in results}) == 1  # one start
    configs = [json.loads((root / r["run"] / "config.json").read_text()) for r in results]
    assert [c["rl"]["algo"] for c in configs] == ["grpo", "grpo", "lite_ppo", "grpo"]
    assert [c["rl"]["algo_params"] for c in configs] == [{}, {"clip_eps_high": 0.28}, {},
                                                         {"overlong_filter": True}]
    assert [c["rl"]["optim"]["lr"] for c in configs] == [1e-4, 1e-4, 2e-4, 1e-4]
    assert [c["rl"]["sampling"]["max_new_tokens"] for c in configs] == [48, 48, 48, 30]
    assert all(c["init"].endswith("step_000005") for c in configs)
    for r in results[1:]:
        assert r["vs_first"]["n"] == 16 and r["length_vs_first"]["n"] == 16
        assert math.isclose(r["length_vs_first"]["mean_diff"],
                            r["heldout_length"]["mean"] - results[0]["heldout_length"]["mean"], abs_tol=1e-9)
    assert results[3]["heldout_length"]["mean"] <= 30  # the 30-token budget holds (EOS is not in the text)
    table = (root / "compare.md").read_text()
    assert "| row |" in table and "| clip_higher |" in table and "held-out length, chars" in table
    assert "`clip_higher`: grpo.clip_eps_high=0.28" in table and "`grpo`: as shared" in table
    saved = json.loads((root / "config.json").read_text())
    assert saved["rows"] == rows
    assert (root / "compare.png").stat().st_size > 10_000


@pytest.mark.parametrize("argv, message", [
    (["--algos", "grpo", "--row", "a"], "not both"),
    (["--row", "a", "--row", "a:rl.optim.lr=1e-3"], "must differ"),
    (["--row", "a", "--row", "b:rl.nope=1"], "unknown setting"),
    (["--row", "a", "--row", "b:rl.algo=kimi,kimi.tau=0"], "Kimi.tau=0.0"),  # checked as its run would be
    (["--grpo.clip_eps_high", "0.3", "--row", "a", "--row", "k:rl.algo=kimi"], "clip_eps_high"),  # shared params
    ([], "give --algos"),
])
def test_compare_refuses_rows_before_training_anything(argv, message, tmp_path, capsys):
    assert main(["compare", *argv, "--out_dir", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_the_progressive_build_changes_one_setting_per_row():
    from posttrain.algorithms.grpo import GRPO, group_advantages
    from posttrain.config import TrainConfig
    from posttrain.config.files import to_dict
    from posttrain.pipelines.compare_rows import parse_rows, row_config

    rows = parse_rows([], "progressive")
    assert [r.label for r in rows] == ["vanilla", "baseline", "group_norm", "hybrid_norm", "ppo_clip"]
    configs = [flat(to_dict(row_config(TrainConfig(), row))) for row in rows]
    params = [c.pop("rl.algo_params") for c in configs]
    for before, after, p_before, p_after in zip(configs, configs[1:], params, params[1:]):
        changed = {k for k in after if after[k] != before[k]} | {k for k in p_after if p_after[k] != p_before.get(k)}
        assert len(changed) == 1, changed  # one setting: adv_norm three times, then rl.update.minibatches
    assert [p["adv_norm"] for p in params] == ["no-baseline", "none", "group", "group-mean-batch-std",
                                               "group-mean-batch-std"]
    assert configs[-1]["rl.update.minibatches"] == 4 and configs[-2]["rl.update.minibatches"] == 1
    # the first row's advantage is the reward itself, and needs no groups
    rewards, groups = torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.tensor([0, 0, 1, 1])
    assert torch.equal(group_advantages(rewards, groups, "no-baseline", 1e-6), rewards)
    assert GRPO(adv_norm="no-baseline").needs_groups is False


def test_an_unknown_row_set_is_refused_with_the_sets(capsys):
    assert main(["compare", "--rows", "regressive"]) == 2
    assert "--rows 'regressive' is not a set of rows; the sets: progressive" in capsys.readouterr().err


def test_rows_that_change_the_measurement_are_refused_before_anything_trains(tmp_path, capsys):
    from posttrain.pipelines.compare_rows import check_rows_measure_alike, parse_rows

    argv = ["compare", "--row", "a", "--row", "harder:env.arithmetic.level=4,rl.optim.lr=2e-4", "--row", "big:heldout_size=900",
            "--out_dir", str(tmp_path)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "harder: env.arithmetic.level=4" in err and "big: heldout_size=900" in err and "rl.optim.lr" not in err
    assert "--allow-different" in err and not any(tmp_path.iterdir())  # nothing was trained
    rows = parse_rows(["a", "harder:env.arithmetic.level=4,rl.optim.lr=2e-4"])
    assert check_rows_measure_alike(rows, allow_different=True) == ["harder: env.arithmetic.level=4"]
    assert check_rows_measure_alike(parse_rows(["a", "b:rl.optim.lr=2e-4"])) == []
