"""cli/section_schema.json: what the command line knows of the algorithm sections, the
environments and the demos without importing them (torch). It must be what the classes say:
the same help, the same refusals, the same defaults; and where it is stale the classes answer."""

import dataclasses
import json
from typing import Literal

import pytest

from posttrain.cli import main
from posttrain.cli import section_schema, train_flags
from posttrain.cli import write_section_schema
from posttrain.cli.section_schema import (
    SCHEMA_PATH,
    WRITE_COMMAND,
    committed_schema,
    stale_sources,
    stand_in_class,
    stand_in_sections,
)
from posttrain.cli.write_section_schema import live_schema, schema_text, section_entry
from posttrain.cli.train_flags import section_defaults
from posttrain.config import RLConfig
from posttrain.config.rl import PREFERENCE_LOSS_NAMES, RL_ALGORITHM_NAMES
from posttrain.config.sections import SamplingParams


@pytest.fixture(autouse=True)
def fixed_width(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")  # help and errors are laid out for the terminal


@pytest.fixture
def classes_only(monkeypatch):
    """Call it to have the command line read the classes, as it does with no schema or a stale one."""
    def use() -> None:
        monkeypatch.setattr(section_schema, "schema_file", lambda: None)  # environments, demos
        monkeypatch.setattr(train_flags, "committed_schema", lambda: None)  # sections
    return use


def answer(capsys, argv: list[str]) -> tuple[int, str, str]:
    status = main(argv)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_the_committed_schema_is_what_the_classes_say():
    changed = stale_sources(json.loads(SCHEMA_PATH.read_text(encoding="utf-8")))
    why = f"{', '.join(changed)} changed since it was written" if changed else "it differs from the classes"
    assert SCHEMA_PATH.read_text(encoding="utf-8") == schema_text(live_schema()), (
        f"posttrain/cli/{SCHEMA_PATH.name} is stale ({why}): rewrite it with `{WRITE_COMMAND}` and commit it; "
        "after merging branches that touched algorithms/, envs/ or the demos, rerun it")
    assert committed_schema() is not None  # and the command line reads it


@pytest.mark.parametrize("argv", [
    ["train", "--help-all"],
    ["train", "--algo", "dpo", "--help"],
    ["train", "--env.name", "reasoning_gym:chain_sum", "--help"],
    ["rlhf", "--help"],
    ["compare", "--algos", "grpo,dapo", "--help"],
    ["train", "--grpo.kl_coeff", "0.1"],
    ["train", "--grpo.clip_eps", "abc"],
    ["train", "--grpo.kl_coef", "x"],
    ["train", "--grpo.overlong_filter", "maybe"],
    ["compare", "--algos", "grpo,dapo", "--dapo.clip_eps_hi", "0.3"],
    ["train", "--stages", "sft,dpo", "--dpo.bta", "0.3"],
])
def test_help_and_refusals_from_the_schema_are_those_of_the_classes(capsys, classes_only, argv):
    from_schema = answer(capsys, argv)
    classes_only()
    from_classes = answer(capsys, argv)
    assert from_schema == from_classes
    assert from_schema[0] == (0 if "--help" in argv[-1] else 2)


def test_the_stand_ins_are_the_classes_defaults():
    rl = RLConfig(algo="dr_grpo", algo_params={"kl_coef": 0.04, "max_len": 50},
                  sampling=SamplingParams(max_new_tokens=77))
    stand_ins = stand_in_sections(committed_schema(), rl)
    classes = section_defaults(rl)
    assert list(stand_ins) == list(classes)
    for name, real in classes.items():
        assert type(stand_ins[name]).__name__ == type(real).__name__
        assert dataclasses.asdict(stand_ins[name]) == dataclasses.asdict(real), name
    assert (stand_ins["grpo"].max_len, stand_ins["dpo"].beta) == (77, 0.1)  # the budget, as make_algorithm sets it
    assert (stand_ins["dr_grpo"].kl_coef, stand_ins["dr_grpo"].max_len) == (0.04, 50)  # rl.algo_params on top


@pytest.mark.parametrize("params", [{"kl_coeff": 0.1}, {"kl_coef": True}, {"kl_coef": "0.1"}, {"max_len": 2.5}])
def test_params_the_fields_do_not_take_are_left_to_the_classes_to_refuse(params):
    # the classes' message names the setting, the value and the fields (test_config_sections)
    assert stand_in_sections(committed_schema(), RLConfig(algo="grpo", algo_params=params)) is None
    assert stand_in_sections(committed_schema(), RLConfig(algo="grpo", algo_params={"max_len": None})) is not None


def test_a_stale_schema_is_not_read_and_the_classes_answer_the_same(capsys, monkeypatch, tmp_path):
    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    schema["sources"]["posttrain/algorithms/grpo.py"] = "0" * 64  # as if grpo.py changed after the writer ran
    stale = tmp_path / "section_schema.json"
    stale.write_text(json.dumps(schema))
    assert stale_sources(schema) == ["posttrain/algorithms/grpo.py"]
    monkeypatch.setattr(section_schema, "SCHEMA_PATH", stale)
    section_schema.schema_file.cache_clear()
    try:
        assert committed_schema() is None
        status, _, err = answer(capsys, ["train", "--grpo.kl_coeff", "0.1"])
        assert status == 2 and "--grpo.kl_coef FLOAT" in err
        monkeypatch.setattr(write_section_schema, "SCHEMA_PATH", stale)
        assert write_section_schema.main(["--check"]) == 1
        assert f"is stale: rewrite it with `{WRITE_COMMAND}`" in capsys.readouterr().err
    finally:
        section_schema.schema_file.cache_clear()


def test_a_literal_and_an_optional_field_keep_their_choices_and_none(capsys):
    @dataclasses.dataclass
    class Toy:
        """A toy section."""

        mode: Literal["mean", "sum"] = "mean"  # how the toy adds up
        cap: int | None = None  # at most this many; None = no cap

    entries = section_entry(Toy)["fields"]
    assert entries == [
        {"name": "mode", "type": "str", "optional": False, "choices": ["mean", "sum"], "default": "mean",
         "help": "how the toy adds up"},
        {"name": "cap", "type": "int", "optional": True, "choices": None, "default": None,
         "help": "at most this many; None = no cap"}]
    stand_in = stand_in_class(section_entry(Toy))
    assert stand_in.__name__ == "Toy" and stand_in().mode == "mean"
    assert train_flags.parse_flags(["--toy.mode", "sum", "--toy.cap", "3"], "toy", "toy",
                                   [("toy", stand_in, stand_in())]).toy == stand_in(mode="sum", cap=3)
    with pytest.raises(SystemExit):
        train_flags.parse_flags(["--toy.mode", "max"], "toy", "toy", [("toy", stand_in, stand_in())])
    assert "invalid choice 'max'" in capsys.readouterr().err


def test_a_field_the_schema_cannot_hold_is_refused_with_what_to_do():
    @dataclasses.dataclass
    class Odd:
        sizes: tuple[int, ...] = (1, 2)

    with pytest.raises(TypeError, match=r"Odd.sizes: the type .* has no flag in the schema; .*add it to TYPES"):
        section_entry(Odd)


def probe_values(field: dict) -> list:
    """Values around every bound the algorithms use, of the field's type: each check's edges."""
    if field["choices"]:
        return [*field["choices"], "no-such-choice"]
    numbers = [-1, 0, 1, 2, 3, 5, 8, 64, 10_000]
    kinds = {"int": numbers, "float": [*numbers, -1e-9, 1e-9, 0.25, 0.4999, 0.5, 0.9999, 1.0001, float("inf")],
             "bool": [True, False], "str": ["", "no-such-value", field["default"]] if field["default"] else ["", "x"]}
    values = kinds[field["type"]]
    if field["type"] == "str":  # every string constant a check compares against
        values = [*values, "token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm", "seq-mean-token-mean",
                  "k1", "k2", "k3", "low_var_kl", "none", "running_mean", "group_mean", "before", "after",
                  "loss_agg", "forward", "reverse"]
    return [*values, None] if field["optional"] else values


def class_refusal(cls: type, values: dict) -> str | None:
    try:
        cls(**values)
    except ValueError as error:
        return str(error)
    return None


@pytest.mark.parametrize("name", [*RL_ALGORITHM_NAMES, *PREFERENCE_LOSS_NAMES])
def test_a_stand_in_refuses_what_its_class_refuses_with_its_message(name):
    # every field of every section at values around its bounds, one at a time and (for the
    # checks that read two fields: DAPO's max_len > overlong_cache) in pairs with max_len
    from posttrain.algorithms import ALGORITHMS
    from posttrain.algorithms.preference import PREFERENCE_LOSSES

    cls = {**ALGORITHMS, **PREFERENCE_LOSSES}[name]
    section = committed_schema()["sections"][name]
    stand_in = stand_in_class(section)
    base = {"max_len": 64} if any(f["name"] == "max_len" for f in section["fields"]) else {}
    trials = [base | {f["name"]: value} for f in section["fields"] for value in probe_values(f)]
    trials += [{"max_len": length, "overlong_cache": cache} for length in (0, 3, 8, 64) for cache in (0, 5, 8)
               if {"max_len", "overlong_cache"} <= {f["name"] for f in section["fields"]}]
    refused = 0
    for values in trials:
        expected = class_refusal(cls, values)
        if expected is not None and any(field in expected.split("=")[0] for field in section["unchecked"]):
            continue  # a check the schema could not carry: the class refuses it, after torch
        assert class_refusal(stand_in, values) == expected, values
        refused += expected is not None
    assert refused >= 2, f"{name}: the probes found too few bounds to test ({refused})"


def test_the_checks_the_schema_cannot_carry_are_few_and_named():
    # only GRPO's family's adv_norm check, whose message is built from a local variable
    # (the renamed normalisation), is left to the class
    unchecked = {name: section["unchecked"] for name, section in committed_schema()["sections"].items()
                 if section["unchecked"]}
    assert set(map(tuple, unchecked.values())) == {("adv_norm",)}, (
        f"{unchecked}: these checks are not carried by section_schema.json, so a bad value of these fields is "
        "refused only after torch loads; write each as check_field(self, FIELD, CONDITION, ALLOWED) as "
        "cli/section_checks.py describes, or, if it cannot be, add it here")
    assert "grpo" in unchecked and "dpo" not in unchecked and "ppo" not in unchecked


@pytest.mark.parametrize("command", ["check", "demo bandit", "demo tokens"])
def test_the_recorded_help_is_what_the_parser_prints(capsys, command):
    # at the width the file was written for (the fixed_width fixture): the parser's own words, byte for byte
    from posttrain.teach.check import main as check_main
    from posttrain.teach.demos import DEMOS

    parser_main = check_main if command == "check" else DEMOS[command.split()[1]]
    with pytest.raises(SystemExit):
        parser_main(["--help"])
    printed = capsys.readouterr().out
    assert main([*command.split(), "--help"]) == 0
    assert capsys.readouterr().out == printed
    assert printed.startswith(f"usage: posttrain {command}")
