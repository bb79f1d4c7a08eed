"""The recipe catalogue (recipes/*.toml): each file loads, passes every pre-run check of the
command its header names (`posttrain run`, or `posttrain rlhf` for InstructGPT's), states its
(data, algorithm, reward, system, scale) and its source, is in docs/guides/recipes.md, and
R1's, Qwen3's four stages and the reasoning-specialist capstone's run end to end at a tiny
size from the command line. The two start presets (start_from_base, start_from_aligned) differ exactly where
docs/guides/base-vs-aligned.md's table says, with the values it states."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from posttrain.config import EnvConfig, TrainConfig, parse_stages, rlhf_config
from posttrain.config.files import from_dict, load_file
from posttrain.pipelines.checks import check_config
from posttrain.pipelines.stage_plan import stage_plan
from posttrain.runs.lineage import differing_keys, flatten
from tests.test_pipeline import TINY, only_run_dir

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted((ROOT / "recipes").glob("*.toml"))
# the settings each command starts from before a file's: `posttrain rlhf` starts from PPO with a KL penalty
COMMAND_DEFAULTS = {"run": TrainConfig, "rlhf": rlhf_config}


def declared_command(path: Path) -> str:
    """The command a recipe's header says runs it: its line `# posttrain COMMAND --config recipes/FILE`."""
    found = set(re.findall(rf"^#\s+posttrain (\w+) --config recipes/{re.escape(path.name)}\b", path.read_text(), re.M))
    assert len(found) == 1, f"{path.name}'s header names one command that runs it, as `# posttrain run --config " \
                            f"recipes/{path.name}` (found {sorted(found)})"
    command = found.pop()
    assert command in COMMAND_DEFAULTS, f"{path.name}: `posttrain {command}` takes no recipe; one of {list(COMMAND_DEFAULTS)}"
    return command


def recipe_config(path: Path) -> TrainConfig:
    """The recipe's file over the defaults of the command that runs it."""
    return from_dict(TrainConfig, load_file(str(path)), base=COMMAND_DEFAULTS[declared_command(path)]())


def test_the_catalogue_holds_the_seven_named_recipes_the_two_capstones_and_the_two_starts():
    assert [p.stem for p in RECIPES] == ["capstone_aligned_assistant", "capstone_reasoning_specialist", "instructgpt",
                                         "kimi_k15", "qwen25", "qwen3", "r1", "r1_zero", "start_from_aligned",
                                         "start_from_base", "tulu3_rlvr"]
    assert {p.stem: declared_command(p) for p in RECIPES if declared_command(p) != "run"} == {"instructgpt": "rlhf"}


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_a_recipe_loads_passes_its_checks_and_says_what_it_is(path):
    cfg = recipe_config(path)
    cfg.validate()
    check_config(cfg)  # every stage's own settings too
    header = path.read_text(encoding="utf-8")
    for axis in ("data", "algorithm", "reward", "system", "scale"):
        assert re.search(rf"^#\s+{axis}\s", header, re.M), f"{path.name} does not state its {axis}"
    assert re.search(r"arXiv:\d{4}\.\d{5}", header), f"{path.name} cites no source"
    assert f"recipes/{path.name}" in (ROOT / "docs" / "guides" / "recipes.md").read_text(encoding="utf-8")
    assert f"posttrain {declared_command(path)} --config recipes/{path.name}" in header


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_a_recipe_passes_the_dry_run_of_the_command_its_header_names(path, capsys):
    from posttrain.cli import main

    command = declared_command(path)
    assert main([command, "--config", str(path), "--dry_run", "true"]) == 0, capsys.readouterr().err
    assert f"posttrain {command}: every check passed" in capsys.readouterr().out


def test_the_staged_recipes_name_their_stages():
    stages = {p.stem: [name for name, _, _ in parse_stages(recipe_config(p).stages)] for p in RECIPES}
    assert stages == {"capstone_aligned_assistant": ["sft", "dpo"], "capstone_reasoning_specialist": ["sft", "dpo", "grpo"],
                      "instructgpt": [], "kimi_k15": [], "qwen25": ["sft", "dpo", "grpo"],
                      "qwen3": ["sft", "grpo", "sft_2", "grpo_2"], "r1": ["sft", "grpo", "sft_2", "grpo_2"], "r1_zero": [],
                      "start_from_aligned": [], "start_from_base": [], "tulu3_rlvr": ["sft", "dpo", "ppo"]}


def test_qwen3_runs_the_papers_four_stages_in_order_each_in_its_mode():
    """Think-only cold start → reasoning RL on /think problems in a pass-rate band → fusion SFT
    on both modes from the RL model → RL on both modes with no band (arXiv:2505.09388, Sec. 4)."""
    plan = stage_plan(recipe_config(ROOT / "recipes" / "qwen3.toml"))
    assert [(s.kind, s.cfg.env.arithmetic_think.think_mode) for s in plan] == [
        ("sft", "think"), ("grpo", "think"), ("sft", "fused"), ("grpo", "fused")]
    bands = [(s.cfg.rl.curation.pool_size, s.cfg.rl.curation.min_pass_rate, s.cfg.rl.curation.max_pass_rate)
             for s in plan if s.kind == "grpo"]
    assert bands == [(512, 0.125, 0.875), (0, 0.0, 1.0)]
    assert (plan[0].steps, plan[2].steps, plan[2].cfg.sft.lr) == (600, 200, 3e-4)


def test_qwen25_and_instructgpt_set_what_their_headers_say():
    qwen25 = {s.kind: s for s in stage_plan(recipe_config(ROOT / "recipes" / "qwen25.toml"))}
    dpo = qwen25["dpo"].cfg.rl
    assert (dpo.preference.pair_prompts, dpo.steps, dpo.optim.lr, dpo.algo_params) == (800, 60, 3e-5, {"nll_coef": 1.0})
    assert qwen25["grpo"].cfg.rl.rm.path == ""  # the verifier stands in for the paper's reward model (the header says why)
    instructgpt = recipe_config(ROOT / "recipes" / "instructgpt.toml")
    assert (instructgpt.rl.algo, instructgpt.rl.algo_params, instructgpt.rl.steps) == ("ppo", {"kl_coef": 0.02}, 120)
    assert instructgpt.sft.steps == 600 and instructgpt.rl.rm.steps == 300  # docs/guides/preference.md's measured run


def test_the_r1_recipe_runs_from_the_command_line_at_a_tiny_size(tmp_path):
    path = ROOT / "recipes" / "r1.toml"
    # the recipe's four stages as written, with tiny counts where a stage sets its own (its
    # self-distillation sampled 400 answers and trained 40 steps, its second GRPO 40 steps: 37 s)
    tiny_stages = load_file(str(path))["stages"]
    for pattern, tiny in [(r"sft\.steps=\d+", "sft.steps=4"), (r"sft\.num_examples=\d+", "sft.num_examples=16"),
                          (r"rl\.steps=\d+", "rl.steps=2")]:
        tiny_stages, found = re.subn(pattern, tiny, tiny_stages)
        assert found == 1, (pattern, tiny_stages)
    done = subprocess.run([sys.executable, "-m", "posttrain", "run", "--config", str(path), *TINY, "--rl.steps", "2",
                           "--stages", tiny_stages, "--out_dir", str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    run = only_run_dir(tmp_path)
    assert run.name.endswith("-r1")
    config = json.loads((run / "config.json").read_text())
    assert config["stages"].startswith("sft,grpo,sft[sft.teacher=self") and config["rl"]["reward"]["terms"] == "r1 + language"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert {r["stage"] for r in rows} >= {"sft", "grpo", "grpo_2"}  # sft_2 trains only on what the policy solved
    steps = [r for r in rows if r["stage"] == "grpo" and "reward_mean" in r]
    assert steps and all("reward/language" in r for r in steps)  # the language term logged on its own
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert all({"format", "language"} <= set(s["details"]["components"]) for s in samples if s["stage"] == "grpo")
    assert all("rubric" in s["details"]["components"] for s in samples if s["stage"] == "grpo_2")


def test_the_capstone_recipe_passes_its_dry_run_and_trains_dpo_on_the_bundled_fixture(capsys):
    from posttrain.cli import main
    from posttrain.data.feedback_fixture import FEEDBACK_FIXTURE

    path = ROOT / "recipes" / "capstone_aligned_assistant.toml"
    assert main(["run", "--config", str(path), "--dry_run", "true"]) == 0
    printed = capsys.readouterr().out
    assert "every check passed" in printed and "checked stage dpo (dpo, 100 steps)" in printed
    dpo = {name: settings for name, _, settings in parse_stages(from_dict(TrainConfig, load_file(str(path))).stages)}["dpo"]
    assert ROOT / dpo["rl.preference.pairs"] == FEEDBACK_FIXTURE and dpo["dpo.nll_coef"] == "1"
    assert "posttrain winrate" in path.read_text(encoding="utf-8")


def test_the_reasoning_capstone_runs_from_the_command_line_at_a_tiny_size(tmp_path):
    """The recipe's task, model length and verifier through all three stages. A six-step SFT
    policy solves no puzzle, so its own samples would give DPO no right-vs-wrong pair: the
    pairs here are the task's demonstrations against the puzzle's classic wrong answer
    (her sisters, forgetting her), and --stages is the recipe's with tiny step counts."""
    pytest.importorskip("reasoning_gym", reason="reasoning-gym is not installed (pip install 'posttrain[tasks]')")
    from posttrain.data.preference import save_preference_jsonl
    from posttrain.envs import make_env
    from posttrain.types import PreferencePair

    path = ROOT / "recipes" / "capstone_reasoning_specialist.toml"
    env_settings = from_dict(EnvConfig, load_file(str(path))["env"], "env.")
    env = make_env(env_settings.name, **env_settings.kwargs())
    pairs = []
    for example in env.fixed_set("train", 12):
        chosen = env.solution(example)  # "5 sisters + Susan = 6\n<answer>6</answer>"
        sisters = chosen.split()[0]
        pairs.append(PreferencePair(example.prompt, chosen, f"{sisters} sisters\n<answer>{sisters}</answer>"))
    save_preference_jsonl(pairs, tmp_path / "pairs.jsonl")
    stages = f"sft,dpo[rl.preference.pairs={tmp_path / 'pairs.jsonl'},rl.steps=2,dpo.nll_coef=1],grpo"
    done = subprocess.run([sys.executable, "-m", "posttrain", "run", "--config", str(path), *TINY, "--rl.steps", "2",
                           "--stages", stages, "--env.reasoning_gym.pool_size", "2000", "--out_dir", str(tmp_path / "runs")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    run = only_run_dir(tmp_path / "runs")
    assert run.name.endswith("-capstone-reasoning")
    config = json.loads((run / "config.json").read_text())
    assert config["env"]["name"] == "reasoning_gym:aiw" and config["env"]["reasoning_gym"]["worked_steps"] is True
    assert config["model"]["max_seq_len"] == 192
    records = json.loads((run / "stages.json").read_text())
    assert [(r["name"], r["steps"]) for r in records] == [("sft", 6), ("dpo", 2), ("grpo", 2)]
    summary = (run / "summary.md").read_text()
    assert all(f"| {name} |" in summary for name in ("sft", "dpo", "grpo"))
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert {s["stage"] for s in samples} >= {"grpo"}
    assert all(s["details"]["reason"] for s in samples if s["stage"] == "grpo")  # graded by the task's verifier


START_PRESETS = {kind: ROOT / "recipes" / f"start_from_{kind}.toml" for kind in ("base", "aligned")}
START_PAGE = ROOT / "docs" / "guides" / "base-vs-aligned.md"


def table_row(page_text: str, setting: str) -> list[str]:
    """The cells of the page's table row whose setting cell starts with `setting`."""
    for line in page_text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) > 2 and cells[1].startswith(f"`{setting}`"):
            return cells
    raise AssertionError(f"{START_PAGE.name} has no table row for `{setting}`")


def as_written(value) -> str:
    """A setting's value as the page's table writes it: TOML's false, 0.05, token-mean."""
    return str(value).lower() if isinstance(value, bool) else f"{value:g}" if isinstance(value, float) else str(value)


def test_the_two_start_presets_differ_where_the_page_says_and_nowhere_else():
    """The base and aligned presets set the same keys; the settings whose values differ are the
    six the preset table names, each row stating both files' values."""
    settings = {kind: flatten(load_file(str(path))) for kind, path in START_PRESETS.items()}
    assert set(settings["base"]) == set(settings["aligned"]), "each preset sets what its twin sets"
    differ = differing_keys(settings["base"], settings["aligned"], ignore=frozenset({"name"}))
    assert sorted(differ) == ["rl.algo_params.clip_eps_high", "rl.algo_params.kl_coef", "rl.algo_params.loss_agg",
                              "rl.algo_params.overlong_filter", "rl.reward.terms", "sft.steps"]
    page = START_PAGE.read_text(encoding="utf-8")
    for key, (base, aligned) in differ.items():
        cells = table_row(page, key.replace("rl.algo_params.", "grpo."))  # the flag's name: --grpo.clip_eps_high
        assert (cells[2], cells[3]) == (as_written(base), as_written(aligned)), key
    # the two rows they share on purpose: the same values in both files and on the page
    shared = table_row(page, "rl.update.minibatches")
    assert shared[2] == shared[3] == str(settings["base"]["rl.update.minibatches"]) == "4"
    # the DAPO choices the base start keeps and the aligned one changes (the clip only binds with reuse)
    assert (settings["base"]["rl.algo_params.clip_eps_high"], settings["aligned"]["rl.algo_params.clip_eps_high"]) \
        == (0.2, 0.28)


@pytest.mark.parametrize("kind", list(START_PRESETS))
def test_a_start_preset_states_what_it_sets_and_why(kind):
    """Each file's header names, for SFT, KL, reward, sampling and loss, the settings it chooses,
    cites both papers, and points at its twin and the page."""
    header = "\n".join(line for line in START_PRESETS[kind].read_text(encoding="utf-8").splitlines()
                       if line.startswith("#"))
    for concern, setting in (("SFT", "sft.steps"), ("KL", "grpo.kl_coef"), ("reward", "rl.reward.terms"),
                             ("sampling", "temperature"), ("loss", "grpo.clip_eps_high"),
                             ("loss", "grpo.loss_agg"), ("loss", "grpo.overlong_filter")):
        assert re.search(rf"^#\s+{concern}\s", header, re.M), f"{kind}: no {concern} line"
        assert setting in header, f"{kind}: the header does not name {setting}"
    assert "arXiv:2503.14476" in header and "arXiv:2508.08221" in header
    twin = "aligned" if kind == "base" else "base"
    assert f"recipes/start_from_{twin}.toml" in header and "docs/guides/base-vs-aligned.md" in header


def test_qwen3s_four_stages_run_from_the_command_line_and_posttrain_think_reads_the_result(tmp_path):
    """The recipe's stages at a tiny size (its fusion SFT cut to 2 steps), less the RL stage's
    pass-rate band (a six-step SFT policy solves nothing, so no prompt is in it): the first RL stage samples /think prompts
    only, the last both modes, and `posttrain think` measures the final checkpoint."""
    path = ROOT / "recipes" / "qwen3.toml"
    stages = re.sub(r",rl\.curation\.\w+=[\d.]+", "", recipe_config(path).stages).replace("sft.steps=200", "sft.steps=2")
    assert "curation" not in stages and stages.count("think_mode=think") == 2 and "sft.steps=2," in stages
    done = subprocess.run([sys.executable, "-m", "posttrain", "run", "--config", str(path), *TINY, "--rl.steps", "2",
                           "--stages", stages, "--out_dir", str(tmp_path / "runs")], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    run = only_run_dir(tmp_path / "runs")
    records = json.loads((run / "stages.json").read_text())
    assert [(r["name"], r["kind"], r["steps"]) for r in records] == [("sft", "sft", 6), ("grpo", "grpo", 2),
                                                                     ("sft_2", "sft", 2), ("grpo_2", "grpo", 2)]
    assert all(later["start"]["sha256"] == earlier["end"]["sha256"] for earlier, later in zip(records, records[1:]))
    modes: dict[str, set[str]] = {}
    for line in (run / "samples.jsonl").read_text().splitlines():
        sample = json.loads(line)
        modes.setdefault(sample["stage"], set()).add(sample["prompt"].rsplit(" ", 1)[1].strip())
    assert modes == {"grpo": {"/think"}, "grpo_2": {"/think", "/no_think"}}
    # every stage scored on the run's fused held-out problems, half in each mode
    heldout = [json.loads(line)["id"] for line in (run / "eval_sft.jsonl").read_text().splitlines()]
    assert {i.rsplit("/", 1)[1] for i in heldout} == {"think", "no_think"}
    final = run / "checkpoints" / "grpo_2" / "step_000001"
    done = subprocess.run([sys.executable, "-m", "posttrain", "think", "--checkpoint", str(final), "--size", "8",
                           "--budgets", "0,8", "--threads", "1", "--out_dir", str(tmp_path / "think")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "/think, budget 8" in done.stdout


def test_kimis_partial_rollout_variant_is_a_command_in_its_header_that_passes_the_dry_run(capsys):
    """The default recipe runs in one process; the header's variant adds Ray workers in the
    async topology, which partial rollouts need, and passes every pre-run check."""
    from posttrain.cli import main

    path = ROOT / "recipes" / "kimi_k15.toml"
    assert recipe_config(path).dist.partial_rollout_tokens == 0  # the default: one process
    variant = re.search(r"^#\s+posttrain run --config recipes/kimi_k15\.toml (--workers .*partial_rollout_tokens \d+)$",
                        path.read_text(), re.M)
    assert variant, "kimi_k15.toml's header gives the partial-rollout variant's command"
    assert main(["run", "--config", str(path), *variant.group(1).split(), "--dry_run", "true"]) == 0, \
        capsys.readouterr().err
    assert "posttrain run: every check passed" in capsys.readouterr().out
    # the flag alone, in the one-process default: refused by name, with the fix
    assert main(["run", "--config", str(path), "--dist.partial_rollout_tokens", "16", "--dry_run", "true"]) == 2
    assert "add --dist.topology async" in capsys.readouterr().err
