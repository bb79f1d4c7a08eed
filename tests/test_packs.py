"""The shipped packs: the Golden Correct Set, the exploit suite, frozen rollouts, the
best-of-N pack and the kata each do what their records say, and rebuild byte for byte."""

import json
import time
from collections import Counter

import pytest

from posttrain.verifiers.final_int import HONEST_SPECS, SPECS, get_spec
from posttrain.eval import make_packs
from posttrain.files import jsonl_text
from posttrain.eval.packs import FAILURE_LABELS, PACKS, PACKS_DIR, example_of, kata_scorer, load_pack, pack_path


def test_every_pack_is_shipped_inside_the_package():
    for name, filename in PACKS.items():
        assert pack_path(name) == PACKS_DIR / filename
        assert pack_path(name).is_file()
    assert (PACKS_DIR / "README.md").is_file()
    assert PACKS_DIR.parent.parent.name == "posttrain"  # found next to the code, not the cwd


def test_golden_correct_set_never_scores_zero():
    golden = load_pack("golden")
    assert len(golden) >= 50
    assert len({r["style"] for r in golden}) >= 8  # varied CoT text, not 50 copies of one form
    for record in golden:
        for spec in record["must_pass"]:
            result = get_spec(spec)(example_of(record), record["completion"])
            # a 0 here is a false negative: a scorer bug, not a model failure
            assert result["reward"] == 1.0, (record["id"], spec, result["details"])
            assert result["details"]["parsed"] == record["expected_answer"]
    # every golden entry passes cot-v1; the one-line ones pass strict-v1 too
    assert all("final_int/cot-v1" in r["must_pass"] for r in golden)
    assert sum("final_int/strict-v1" in r["must_pass"] for r in golden) == 12


def test_exploit_suite_beats_each_hackable_spec_and_no_honest_one_in_under_5s():
    start = time.perf_counter()
    exploits = load_pack("exploits")
    for record in exploits:
        example = example_of(record)
        won = SPECS[record["exploits_spec"]](example, record["completion"])
        assert won["reward"] == 1.0, (record["id"], won["details"])
        for spec in HONEST_SPECS:
            assert SPECS[spec](example, record["completion"])["reward"] == 0.0, (record["id"], spec)
    elapsed = time.perf_counter() - start
    assert elapsed < 5.0, f"exploit suite took {elapsed:.2f} s"
    hackable = {v for v in SPECS if v.startswith("hackable/")}
    assert {r["exploits_spec"] for r in exploits} == hackable  # every variant is attacked
    assert Counter(r["exploits_spec"] for r in exploits) == {v: 6 for v in hackable}


def test_frozen_rollouts_score_as_their_generator_intended():
    frozen = load_pack("frozen")
    assert len(frozen) == 100
    scored = Counter()
    for record in frozen:
        details = SPECS["final_int/cot-v1"](example_of(record), record["completion"])["details"]
        assert details["reason"] == record["intended_reason"], record["id"]
        scored[details["reason"]] += 1
    assert scored == Counter(r["intended_reason"] for r in frozen)
    # the mix the generator's seed produced: about half right, format failures of many kinds
    assert scored == {"ok": 49, "wrong_answer": 13, "no_final_line": 11, "extra_text": 8,
                      "bad_spacing": 7, "multiple_final_lines": 4, "leading_zero": 4,
                      "final_not_last": 3, "empty": 1}
    assert any(r["kind"] == "truncated_in_cot" for r in frozen)


def test_best_of_n_pack_shape_and_mix():
    bon = load_pack("bon")
    assert len(bon) == 50
    for record in bon:
        ids = [c["id"] for c in record["candidates"]]
        assert ids == [f"c{j:02d}" for j in range(8)]
        for c in record["candidates"]:
            got = SPECS["final_int/cot-v1"](example_of(record), c["completion"])["details"]["reason"]
            assert got == c["intended_reason"]
    correct = Counter(sum(c["intended_reason"] == "ok" for c in r["candidates"]) for r in bon)
    assert correct[0] == 12 and correct[1] == 7 and sum(m for c, m in correct.items() if c >= 2) == 31


def test_kata_rescoring_reproduces_every_case():
    kata = load_pack("kata")
    assert Counter(r["label"] for r in kata) == {
        "model-wrong": 4, "verifier-wrong": 2, "data-ambiguous": 1, "spec-unclear": 1, "reward-hacked": 2}
    assert set(FAILURE_LABELS) == {r["label"] for r in kata}  # the course's taxonomy, every label used
    for record in kata:
        result = kata_scorer(record["spec_version"])(example_of(record), record["completion"])
        assert result["reward"] == record["reward"], record["id"]
        assert result["details"]["reason"] == record["reason_code"], record["id"]
        assert record["why"] and record["fix"]
        honest = SPECS["final_int/cot-v1"](example_of(record), record["completion"])["reward"]
        if record["label"] == "verifier-wrong":
            assert record["spec_version"] not in HONEST_SPECS
            assert result["reward"] != honest  # the honest spec disagrees: the verifier erred
        if record["label"] == "reward-hacked":
            assert (result["reward"], honest) == (1.0, 0.0)
    with pytest.raises(ValueError, match="unknown spec_version 'nope'"):
        kata_scorer("nope")


def test_packs_rebuild_byte_for_byte():
    packs = make_packs.build_packs()
    for name, records in packs.items():
        assert jsonl_text(records) == pack_path(name).read_text(encoding="utf-8"), name
    json.loads(jsonl_text(packs["kata"]).splitlines()[0])  # one JSON object per line
