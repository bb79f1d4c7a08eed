"""Users' datasets in the ecosystem's formats (envs/dataset_files.py, envs/problem_rows.py,
data/preference.py): every format loads to the same problems, TRL's conventions map onto
Example and the preference records, errors name the file, line or row and the missing
column, column mapping and the user's own held-out split are honoured, a conversation
reaches an instruct model through its chat template, and a run trains end to end on a
Parquet file of conversations with a held-out file of its own."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

from posttrain.data.preference import load_preference_data
from posttrain.data.preference_rows import pairs_from_verifier, preference_episodes
from posttrain.envs import make_env
from posttrain.envs.arithmetic import split_of
from posttrain.envs.dataset_files import parse_columns, read_rows
from posttrain.models import CharTokenizer
from posttrain.types import PROMPT_MESSAGES, Episode, Example, PreferencePair, UnpairedExample

datasets = pytest.importorskip("datasets")

# 60 sums: enough that the hash gives every split some (train 45, dev 9, heldout 6)
ROWS = [{"question": f"Q: {a}+{b}\n", "answer": a + b, "difficulty": a % 3} for a in range(10) for b in range(6)]


def prompt_id(prompt: str) -> str:
    """The id a row without one gets (envs/problem_rows.py): its prompt's, as its split is."""
    return "prompt-" + hashlib.sha256(prompt.encode("utf-8")).hexdigest()[:16]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def problems(env) -> dict[str, list[Example]]:
    return {split: list(examples) for split, examples in env.by_split.items()}


def every_format(tmp_path: Path, rows: list[dict]) -> dict[str, Path]:
    """The same rows as a .jsonl, a .json list, a .json {"data": ...}, a .parquet file, a
    save_to_disk directory and a directory holding a data file."""
    directory = tmp_path / "files"
    directory.mkdir()
    datasets.Dataset.from_list(rows).to_parquet(str(directory / "problems.parquet"))
    (tmp_path / "list.json").write_text(json.dumps(rows))
    (tmp_path / "data.json").write_text(json.dumps({"data": rows}))
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "saved"))
    return {"jsonl": write_jsonl(tmp_path / "p.jsonl", rows), "json list": tmp_path / "list.json",
            "json data": tmp_path / "data.json", "parquet": directory / "problems.parquet",
            "saved": tmp_path / "saved", "directory": directory}


def test_every_format_loads_to_identical_problems_with_extra_columns_kept(tmp_path):
    loaded = {name: problems(make_env("jsonl", path=str(path), cot=False, columns="prompt=question"))
              for name, path in every_format(tmp_path, ROWS).items()}
    first = loaded["jsonl"]
    assert {split: len(rows) for split, rows in first.items()} == {"train": 45, "dev": 9, "heldout": 6}
    assert all(other == first for other in loaded.values()), {k: len(v["train"]) for k, v in loaded.items()}
    q = next(e for e in first["train"] if e.prompt == "Q: 7+5\n")
    assert q == Example("Q: 7+5\n", "12", prompt_id("Q: 7+5\n"), {"answer": 12, "difficulty": 1})  # columns survive for reward functions


def test_trl_prompt_completion_and_messages_rows_map_onto_examples(tmp_path):
    rows = [
        {"prompt": "Q: 1+2\n", "completion": "Final: 3", "answer": 3, "source": "a"},
        {"prompt": [{"role": "user", "content": "Q: 2+2\n"}], "ground_truth": "4",
         "completion": [{"role": "assistant", "content": "Final: 4"}]},
        {"messages": [{"role": "system", "content": "Add."}, {"role": "user", "content": "Q: 3+3\n"},
                      {"role": "assistant", "content": "Final: 6"}], "solution": "6", "id": 7},
    ]
    env = make_env("jsonl", path=str(write_jsonl(tmp_path / "trl.jsonl", rows)), cot=False)
    by_prompt = {e.prompt: e for split in env.by_split.values() for e in split}
    assert by_prompt["Q: 1+2\n"] == Example("Q: 1+2\n", "3", prompt_id("Q: 1+2\n"), {"answer": 3, "source": "a", "solution": "Final: 3"})
    assert by_prompt["Q: 2+2\n"] == Example("Q: 2+2\n", "4", prompt_id("Q: 2+2\n"), {
        "ground_truth": "4", "solution": "Final: 4", PROMPT_MESSAGES: [{"role": "user", "content": "Q: 2+2\n"}]})
    # a system turn makes the plain text a transcript; the last assistant turn is the demonstration
    transcript = "system: Add.\nuser: Q: 3+3\n\nassistant: "
    assert by_prompt[transcript] == Example(transcript, "6", "7", {
        "solution": "Final: 6", PROMPT_MESSAGES: [{"role": "system", "content": "Add."},
                                                 {"role": "user", "content": "Q: 3+3\n"}]})
    assert env.solution(by_prompt["Q: 2+2\n"]) == "Final: 4"


def test_a_parquet_rows_columns_reach_a_trl_reward_function(tmp_path):
    from posttrain.rewards.user_function import UserFunction

    def close_enough(prompts, completions, ground_truth, difficulty, **columns):
        return [float(completions[0].endswith(ground_truth[0])) + difficulty[0] / 10]

    rows = [{"prompt": "Q: 7+5\n", "ground_truth": "12", "difficulty": 3}]
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "p.parquet"))
    env = make_env("jsonl", path=str(tmp_path / "p.parquet"), cot=False)
    (example,) = [e for split in env.by_split.values() for e in split]
    reward = UserFunction("close_enough", close_enough, "trl", timeout=0)
    assert reward(example, "Final: 12", env.score(example, "Final: 12")) == pytest.approx(1.3)
    assert reward(example, "Final: 13", env.score(example, "Final: 13")) == pytest.approx(0.3)


@pytest.mark.parametrize("row, said", [
    ({"prompt": "Q: 1+1\n", "answer": 2, "solution": "2"},
     r"columns \['answer', 'solution'\] could each be the expected answer; say which with --env.columns "
     r"'expected_answer=answer'"),
    ({"prompt": "Q: 1+1\n", "result": 2},
     r"no column 'expected_answer'; the row has columns \['prompt', 'result'\].*--env.columns 'expected_answer=COLUMN'"),
    ({"question": "Q: 1+1\n", "answer": 2},
     r"no column 'prompt'; the row has columns \['answer', 'question'\].*--env.columns 'prompt=COLUMN'"),
    ({"prompt": "Q: 1+1\n", "messages": [{"role": "user", "content": "x"}], "answer": 2}, "both 'prompt' and 'messages'"),
    ({"prompt": [{"role": "user"}], "answer": 2}, r"column 'prompt', turn 0: a turn is \{'role': str, 'content': str\}"),
    ({"prompt": "Q: 1+1\n", "completion": [{"role": "user", "content": "2"}], "answer": 2},
     r"'completion' as a conversation must be one assistant turn.*\['user'\]"),
    ({"prompt": "Q: 1+1\n", "answer": 2, "split": "later"}, "unknown split 'later'"),
    ({"messages": [{"role": "user", "content": "Q: 1+1\n"}, {"role": "assistant", "content": "Final: 2"}],
      "completion": "Final: 2", "answer": 2}, "both 'messages' .* and 'completion' give the completion"),
    ({"prompt": "Q: 1+1\n", "answer": "Paris"}, "not a canonical integer"),  # under final_int, at load time
])
def test_a_bad_row_is_named_with_what_is_wrong(tmp_path, row, said):
    path = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "Q: 0+0\n", "answer": 0}, row])
    with pytest.raises(ValueError, match=said) as error:
        make_env("jsonl", path=str(path), cot=False)
    assert str(error.value).startswith(f"{path}, line 2: ")


def test_expected_answer_wins_and_a_solution_beside_it_is_the_demonstration(tmp_path):
    rows = [{"prompt": "Q: 1+1\n", "expected_answer": 2, "answer": "two", "solution": "Final: 2"}]
    (example,) = [e for split in make_env("jsonl", path=str(write_jsonl(tmp_path / "p.jsonl", rows)),
                                          cot=False).by_split.values() for e in split]
    assert example == Example("Q: 1+1\n", "2", prompt_id("Q: 1+1\n"), {"answer": "two", "solution": "Final: 2"})


def test_malformed_rows_are_named_by_file_and_line_or_row_in_every_format(tmp_path):
    (tmp_path / "broken.jsonl").write_text('{"prompt": "Q: 1+1\\n", "answer": 2}\n\n{"prompt": \n')
    with pytest.raises(ValueError, match=r"broken.jsonl, line 3: not valid JSON"):
        read_rows(tmp_path / "broken.jsonl")
    (tmp_path / "list.json").write_text(json.dumps([{"prompt": "a", "answer": 1}, ["a", 1]]))
    with pytest.raises(ValueError, match=r"list.json, row 1: expected a JSON object, got list"):
        read_rows(tmp_path / "list.json")
    datasets.Dataset.from_list([{"prompt": "Q: 1+1\n", "answer": 2}, {"prompt": None, "answer": 3}]).to_parquet(
        str(tmp_path / "p.parquet"))
    with pytest.raises(ValueError, match=r"p.parquet, row 1: column 'prompt' must be a str or a conversation .*got None"):
        make_env("jsonl", path=str(tmp_path / "p.parquet"))
    splits = datasets.DatasetDict({"train": datasets.Dataset.from_list([{"prompt": "Q: 1+1\n", "answer": "2"}]),
                                   "test": datasets.Dataset.from_list([{"prompt": "Q: 2+2\n", "answer": "4.5"}])})
    splits.save_to_disk(str(tmp_path / "saved"))
    with pytest.raises(ValueError, match=r"saved, 'test' row 0: expected_answer '4.5' is not a canonical integer"):
        make_env("jsonl", path=str(tmp_path / "saved"), cot=False)
    (tmp_path / "p.csv").write_text("prompt,answer\n")
    with pytest.raises(ValueError, match=r"p.csv: unknown data format '.csv'"):
        read_rows(tmp_path / "p.csv")


def test_json_needs_no_optional_package_and_parquet_says_how_to_install_it(tmp_path, monkeypatch):
    formats = every_format(tmp_path, ROWS[:3])
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)  # as if `datasets` (and pyarrow) were not installed
    monkeypatch.setitem(sys.modules, "datasets", None)
    for name in ("jsonl", "json list", "json data"):
        assert [row.record for row in read_rows(formats[name])] == ROWS[:3]
    for name, module in (("parquet", "pyarrow"), ("saved", "datasets")):
        with pytest.raises(ValueError, match=rf"reading it needs the optional package '{module}': pip install "
                                             r"'posttrain\[data\]'"):
            read_rows(formats[name])


def test_column_mapping(tmp_path):
    assert parse_columns(" prompt=question, expected_answer=answer ,", "env.columns") == {
        "prompt": "question", "expected_answer": "answer"}
    for bad, said in [("prompt", "is not OURS=THEIRS"), ("prompt=a,prompt=b", "'prompt' is mapped twice")]:
        with pytest.raises(ValueError, match=said):
            parse_columns(bad, "env.columns")
    path = write_jsonl(tmp_path / "p.jsonl", [{"q": "Q: 1+1\n", "a": 2, "answer": "ignored"}])
    env = make_env("jsonl", path=str(path), cot=False, columns="prompt=q,expected_answer=a")
    (example,) = [e for split in env.by_split.values() for e in split]
    assert example == Example("Q: 1+1\n", "2", prompt_id("Q: 1+1\n"), {"answer": "ignored"})
    with pytest.raises(ValueError, match=r"p.jsonl, line 1: no column 'question' \(mapped to 'prompt'\); the row has "
                                         r"columns \['a', 'answer', 'q'\]"):
        make_env("jsonl", path=str(path), columns="prompt=question")


def test_the_users_own_heldout_split_is_honoured(tmp_path):
    main = write_jsonl(tmp_path / "train.jsonl", [{"prompt": r["question"], "answer": r["answer"]} for r in ROWS])
    mine = [{"prompt": f"Q: {a}+9\n", "answer": a + 9} for a in range(4)] + [{"prompt": "Q: 7+5\n", "answer": 12}]
    with pytest.warns(UserWarning, match="1 row.s. repeat an earlier problem exactly"):
        env = make_env("jsonl", path=str(main), cot=False, heldout_path=str(write_jsonl(tmp_path / "mine.jsonl", mine)))
    assert sorted(e.prompt for e in env.by_split["heldout"]) == sorted(row["prompt"] for row in mine)
    # the hash's held-out rows train instead; its dev rows stay dev; "Q: 7+5" is held out only
    assert len(env.by_split["dev"]) == 9 and all(split_of(e.prompt) == "dev" for e in env.by_split["dev"])
    assert len(env.by_split["train"]) == 60 - 9 - 1
    assert "Q: 7+5\n" not in {e.prompt for e in env.by_split["train"]}
    assert "user's own" not in env.split_rule and "['heldout'] rows are that split" in env.split_rule
    # the same through a DatasetDict's "test" split and through a `split` column
    rows = [{"prompt": r["question"], "answer": r["answer"]} for r in ROWS]
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows),
                          "test": datasets.Dataset.from_list(mine)}).save_to_disk(str(tmp_path / "saved"))
    column = write_jsonl(tmp_path / "column.jsonl", rows + [{**row, "split": "test"} for row in mine])
    for source in (tmp_path / "saved", column):
        with pytest.warns(UserWarning, match="1 row.s. repeat"):
            other = make_env("jsonl", path=str(source), cot=False)
        assert problems(other) == problems(env), source


def test_preference_rows_in_trl_conventions(tmp_path):
    turn = lambda role, text: {"role": role, "content": text}  # noqa: E731
    rows = [
        {"prompt": "Review:\n", "chosen": "Lovely.", "rejected": "Awful.", "score": 1.5},
        {"chosen": [turn("user", "Review:"), turn("assistant", "Lovely.")],
         "rejected": [turn("user", "Review:"), turn("assistant", "Awful.")]},
        {"chosen": "The hotel was lovely.", "rejected": "The hotel was awful."},
        {"prompt": [turn("user", "Review:")], "chosen": [turn("assistant", "Good.")],
         "rejected": [turn("assistant", "Bad.")]},
    ]
    datasets.Dataset.from_list([{"question": r["prompt"], "good": r["chosen"], "bad": r["rejected"]}
                                for r in rows[:1]]).to_parquet(str(tmp_path / "pairs.parquet"))
    pairs = load_preference_data(write_jsonl(tmp_path / "pairs.jsonl", rows))
    messages = {PROMPT_MESSAGES: [turn("user", "Review:")]}
    assert pairs == [PreferencePair("Review:\n", "Lovely.", "Awful.", {"score": 1.5}),
                     PreferencePair("Review:", "Lovely.", "Awful.", messages),
                     PreferencePair("The hotel was ", "lovely.", "awful."),
                     PreferencePair("Review:", "Good.", "Bad.", messages)]
    mapped = load_preference_data(tmp_path / "pairs.parquet", "prompt=question,chosen=good,rejected=bad")
    assert mapped == [PreferencePair("Review:\n", "Lovely.", "Awful.")]  # the parquet row had no score column
    unpaired = [{"prompt": "Review:\n", "completion": "Lovely.", "label": True},
                {"prompt": [turn("user", "Review:")], "completion": [turn("assistant", "Awful.")], "label": False}]
    assert load_preference_data(write_jsonl(tmp_path / "kto.jsonl", unpaired)) == [
        UnpairedExample("Review:\n", "Lovely.", True), UnpairedExample("Review:", "Awful.", False, messages)]
    # KTO's rows from Parquet: one trainable row each, rewarded by its label, after <bos> + the plain prompt
    conversational = [{**unpaired[1], "label": True, "completion": [turn("assistant", "Lovely.")]}, unpaired[1]]
    datasets.Dataset.from_list(conversational).to_parquet(str(tmp_path / "kto.parquet"))  # a column has one type
    rows = preference_episodes(load_preference_data(tmp_path / "kto.parquet"), CharTokenizer())
    assert [(len(group), group[0].reward) for group in rows] == [(1, 1.0), (1, 0.0)]
    assert rows[1][0].prompt_ids == [CharTokenizer().bos_id] + CharTokenizer().encode("Review:")
    # pairs the verifier builds from a conversation's samples keep its turns (and so its chat template)
    sampled = [Episode(Example("Review:", "", meta=messages), 0, [], [], [], completion=text, reward=reward)
               for text, reward in (("Good.", 1.0), ("Bad.", 0.0))]
    (built,) = pairs_from_verifier([sampled])
    assert (built.chosen, built.meta[PROMPT_MESSAGES]) == ("Good.", messages[PROMPT_MESSAGES])
    for bad, said in [({"prompt": "p", "completion": "c", "label": 1}, "'label' must be a boolean"),
                      ({"chosen": "Yes.", "rejected": "No."}, "share no leading text"),
                      ({"prompt": "p", "completion": "c"}, r"no column 'label'; the row has columns "
                                                           r"\['completion', 'prompt'\]")]:
        with pytest.raises(ValueError, match=said) as error:
            load_preference_data(write_jsonl(tmp_path / "bad.jsonl", [bad]))
        assert "bad.jsonl, line 1: " in str(error.value)


def test_a_conversation_reaches_an_instruct_model_through_its_chat_template(tmp_path):
    """The prompt tokens of a conversation are the model's own template of its turns (the
    data's system turn winning over the tokenizer's), in sampling and in pairs alike."""
    transformers = pytest.importorskip("transformers")
    from posttrain.models import smollm2
    from posttrain.models.hf import HFTokenizer
    from posttrain.roles.engines.contract import example_prompt_ids

    cache = smollm2.default_cache_dir()
    if not (cache / "tokenizer.json").is_file():
        pytest.skip("SmolLM2 is not converted on this machine (posttrain.models.smollm2.convert_smollm2)")
    hf = transformers.AutoTokenizer.from_pretrained(cache, local_files_only=True)
    tokenizer = HFTokenizer(hf, system_prompt="Be brief.")
    turns = [{"role": "system", "content": "Add."}, {"role": "user", "content": "Q: 3+3"},
             {"role": "assistant", "content": "6"}, {"role": "user", "content": "Q: 4+4"}]
    rows = [{"messages": turns, "answer": 8}, {"prompt": "Q: 5+5", "answer": 10}]
    env = make_env("jsonl", path=str(write_jsonl(tmp_path / "chat.jsonl", rows)), cot=False)
    by_answer = {e.expected_answer: e for split in env.by_split.values() for e in split}
    conversation = hf.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
    assert "Be brief." not in conversation and conversation.count("<|im_start|>") == 5
    assert example_prompt_ids(tokenizer, by_answer["8"]) == tokenizer.encode(conversation)
    plain = hf.apply_chat_template([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Q: 5+5"}],
                                   tokenize=False, add_generation_prompt=True)
    assert example_prompt_ids(tokenizer, by_answer["10"]) == tokenizer.encode(plain)
    pairs = load_preference_data(write_jsonl(tmp_path / "pairs.jsonl", [
        {"prompt": turns, "chosen": [{"role": "assistant", "content": "8"}], "rejected": "9"}]))
    (chosen, rejected), = preference_episodes(pairs, tokenizer)
    assert chosen.prompt_ids == rejected.prompt_ids == tokenizer.encode(conversation)
    assert tokenizer.decode(chosen.response_ids) == "8"


def test_train_end_to_end_on_parquet_conversations_with_a_heldout_file(tmp_path, monkeypatch):
    """gpt_mini (no chat template) trains on the plain text of TRL `messages` rows, and
    its held-out evaluation is exactly the user's held-out file."""
    from posttrain.cli import main as posttrain

    def row(a: int, b: int) -> dict:
        return {"messages": [{"role": "user", "content": f"Q: {a}+{b}\n"},
                             {"role": "assistant", "content": f"Final: {a + b}"}], "ground_truth": str(a + b)}
    datasets.Dataset.from_list([row(a, b) for a in range(10) for b in range(6)]).to_parquet(str(tmp_path / "t.parquet"))
    heldout = [row(a, 7) for a in range(5)]
    (tmp_path / "heldout.json").write_text(json.dumps(heldout))
    monkeypatch.chdir(tmp_path)
    tiny = ["--sft.steps", "3", "--sft.num_examples", "8", "--sft.batch_size", "4", "--sft.warmup_steps", "1",
            "--rl.steps", "1", "--rl.prompts_per_step", "2", "--rl.samples_per_prompt", "2", "--rl.dev_size", "2",
            "--heldout_size", "5", "--model.dim", "32", "--model.n_layer", "1", "--model.n_head", "2",
            "--model.hidden_dim", "64", "--threads", "1", "--env.cot", "false"]
    assert posttrain(["train", "--env.name", "jsonl", "--env.path", "t.parquet", "--env.heldout_path", "heldout.json",
                      *tiny, "--out_dir", "runs"]) == 0
    (run,) = (tmp_path / "runs").iterdir()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["sft"]["n"] == summary["rl"]["n"] == 5
    evaluated = [json.loads(line) for line in (run / "eval_rl.jsonl").read_text().splitlines()]
    assert sorted(r["prompt"] for r in evaluated) == [f"Q: {a}+7\n" for a in range(5)]
    assert sorted(int(r["details"]["expected"]) for r in evaluated) == [a + 7 for a in range(5)]
    # SFT learnt from the assistant turns: its loss falls at every one of its 3 steps
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    losses = [m["loss"] for m in metrics if m.get("stage") == "sft"]
    assert len(losses) == 3 and losses[0] > losses[1] > losses[2], losses


def test_the_sampler_starts_a_conversation_from_its_chat_template(tmp_path):
    """A tiny transformers model whose tokenizer has a chat template: the rollout samples
    a conversational problem from the template of its turns, not from its plain text."""
    import torch

    from posttrain.config import SamplingParams
    from posttrain.models import GPTMini, GPTMiniConfig
    from posttrain.models.hf import HFPolicy
    from posttrain.roles.engines import RolloutEngine

    torch.manual_seed(0)
    GPTMini(GPTMiniConfig(vocab_size=100, dim=32, n_layer=1, n_head=2, hidden_dim=64, max_seq_len=96)).save_pretrained(
        tmp_path / "tiny", CharTokenizer())
    policy, tokenizer = HFPolicy.load(tmp_path / "tiny")
    tokenizer.hf.chat_template = ("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
                                  "{% if add_generation_prompt %}[assistant] {% endif %}")
    tokenizer.chat = True
    turns = [{"role": "system", "content": "Add."}, {"role": "user", "content": "Q: 3+3"}]
    env = make_env("jsonl", path=str(write_jsonl(tmp_path / "chat.jsonl", [{"prompt": turns, "answer": 6}])))
    plain = "system: Add.\nuser: Q: 3+3\nassistant: "  # what gpt_mini would read
    (example,) = env.by_split[split_of(plain)]
    assert example.prompt == plain
    engine = RolloutEngine(policy, tokenizer, SamplingParams(max_new_tokens=4))
    (episode,) = engine.generate([example], 1, torch.Generator().manual_seed(0))
    assert tokenizer.decode(episode.prompt_ids) == "[system] Add.\n[user] Q: 3+3\n[assistant] "
