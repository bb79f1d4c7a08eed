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
