"""`posttrain compare`: every algorithm starts from the same SFT checkpoint and lands in one table."""

import json

from posttrain.cli import main
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
    from tests.test_online_dpo import TINY_PREF

    algos = ["kto", "simpo"]  # with a reference (and unpaired), reference-free
    assert main(["compare", "--algos", ",".join(algos), *TINY_PREF, "--rl.steps", "3", "--rl.pair_prompts", "32",
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
