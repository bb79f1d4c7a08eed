"""The open spec items of issue #42 (item 6), each checked by the number or state its lesson
shows, run headless the way tests/test_lessons.py runs them (marimo's app.run(), a widget's
default text replaced in a copy of the notebook):

    00  a map of the five parts drawn from the lesson files themselves; the three forces, one
        line each, pointing to lesson 26
    07  the six-role ring with the role that runs at the chosen step lit up, beside its numbers
    20  the bandwidth half of the sizer: bytes a decode step reads and the time they bound
    22  16 and 18 bytes a parameter side by side, the difference computed by systems/memory.py
    23  InstructGPT, Qwen2.5 and the o-series on the five axes, known apart from speculated
    11  the critic's memory saving computed: PPO's four copies against GRPO's, and the value head
"""

from __future__ import annotations

import importlib.util
import re
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from posttrain.systems.hardware import device_named
from posttrain.systems.kv_cache import kv_bytes_per_token
from posttrain.systems.memory import MIXED_ADAMW, MIXED_ADAMW_FP32_GRADS
from posttrain.systems.shapes import PRESETS, matmul_parameter_count
from posttrain.teach.charts import points
from posttrain.teach.diagrams import LOOP_STEPS, PARTS, ROLES, course_map_svg, part_of, six_roles_svg
from posttrain.teach.lessons import lesson_files, lesson_title
from tests.test_lesson_charts_b import drawn_data
from tests.test_lessons import LESSONS, restore_threads, run_in_process, run_with_setting  # noqa: F401  (fixture)

ROOT = Path(__file__).resolve().parent.parent
SVG = "{http://www.w3.org/2000/svg}"


def page_text(path: Path) -> tuple[str, dict]:
    """(every output the notebook shows, as one HTML string; its public definitions)."""
    spec = importlib.util.spec_from_file_location(f"gaps_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    outputs, defs = module.app.run()
    return "\n".join(str(getattr(o, "text", o)) for o in outputs if o is not None), defs


def lit_roles(svg: str) -> set[str]:
    """The labels of the boxes drawn lit in a six-roles picture."""
    tree = ET.fromstring(svg)
    return {g.find(f"{SVG}text").text for g in tree.iter(f"{SVG}g") if g.get("class") == "lit"}


# ---- the ring, lit (teach/diagrams.py) ----------------------------------------------------


def test_the_loop_steps_follow_controller_step():
    """LOOP_STEPS names the steps in the order Controller.step numbers them in its comments
    (its seventh, the metrics, is what the lesson calls the log)."""
    source = (ROOT / "posttrain" / "roles" / "controller.py").read_text(encoding="utf-8")
    numbered = dict(re.findall(r"# (\d)\. (\w+)", source))
    assert [numbered[str(i)] for i in range(1, 8)] == [name for name, _ in LOOP_STEPS[:6]] + ["metrics"]
    assert {role for _, roles in LOOP_STEPS for role in roles} == {role for role, *_ in ROLES}  # every role runs


def test_highlight_lights_the_named_roles_and_dims_the_rest():
    svg = six_roles_svg(highlight=("trainer", "rollout"), caption="6 · sync")
    assert lit_roles(svg) == {"trainer", "rollout"}
    assert svg.count('class="dim"') == 4 and "6 · sync" in svg
    assert 'class="lit"' not in six_roles_svg() and 'class="dim"' not in six_roles_svg()  # lesson 00's picture
    with pytest.raises(ValueError, match="'critic'.*the six are"):
        six_roles_svg(highlight=["critic"])


@pytest.mark.parametrize("stage", [1, 2, 6, 7])
def test_lesson_07_lights_the_role_that_runs_at_each_step(stage, restore_threads, tmp_path):  # noqa: F811
    path = LESSONS / "07_controller.py"
    defs = run_with_setting(path, 'value=7, label="run up to stage"', f'value={stage}, label="run up to stage"',
                            tmp_path) if stage != 7 else run_in_process(path)
    expected = {1: {"rollout"}, 2: {"environment"}, 6: {"trainer", "rollout"}, 7: {"controller"}}[stage]
    assert defs["stage"] == stage and set(defs["running"]) == expected
    assert lit_roles(defs["diagram"]) == expected
    # the numbers beside it are the real step's: on-policy, and the push reached the engine
    assert defs["metrics"]["ratio_max"] == pytest.approx(1.0, abs=1e-4)
    assert defs["out"]["sync_gap_after"] == 0.0 and defs["out"]["engine_version"] == 1


# ---- lesson 00: the map of the five parts --------------------------------------------------


def test_every_lesson_lands_in_its_part():
    assert [part_of(n) for n in ("00", "01", "08", "09", "14", "15", "18a", "22c", "23", "24", "25", "26", "28")] == [
        "", "I", "I", "II", "II", "III", "III", "III", "III", "IV", "IV", "V", "V"]


def test_lesson_00_draws_the_five_parts_from_the_lesson_files(restore_threads):  # noqa: F811
    defs = run_in_process(LESSONS / "00_orientation.py")
    files = lesson_files()
    assert set(defs["course"]) == set(files)
    tree = ET.fromstring(defs["course_map"])
    headers = [t.text for t in tree.iter(f"{SVG}text") if t.text and t.text.startswith("Part ")]
    assert headers == [f"Part {part} · {name}" for part, name, *_ in PARTS]
    drawn = {g.get("data-lesson"): g for g in tree.iter(f"{SVG}g") if g.get("class") == "lesson"}
    assert sorted(drawn) == sorted(n for n in files if n != "00")  # every lesson once; the orientation before them
    column = 176 + 8  # a part's width and the gap after it
    for number, g in drawn.items():
        x = float(g.find(f"{SVG}text").get("x"))
        assert [p for p, *_ in PARTS][int(x // column)] == part_of(number), number
        assert g.find(f"{SVG}title").text == lesson_title(files[number])
    links = {a.get("href") for a in tree.iter(f"{SVG}a")}
    assert links == {f"?file={files[n].name}" for n in drawn}
    # three forces, one line each, each pointing to lesson 26
    assert len(defs["force_lines"]) == 3
    for line, force in zip(defs["force_lines"], ("signal", "estimator", "cost")):
        assert line.startswith(f"* **{force}**") and "(?file=26_three_forces.py)" in line


def test_a_new_lesson_file_joins_the_map_by_itself():
    lessons = {n: (p.name, lesson_title(p)) for n, p in lesson_files().items()}
    svg = course_map_svg({**lessons, "29": ("29_new.py", "Lesson 29 · Something new: and why")})
    assert 'data-lesson="29"' in svg and ">lessons 26–29<" in svg and "Something new" in svg


# ---- lesson 20: the bandwidth half of the sizer --------------------------------------------


def test_lesson_20_decode_step_reads_weights_once_and_every_rows_cache(restore_threads, tmp_path):  # noqa: F811
    path = LESSONS / "20_kv_cache.py"
    defs = run_in_process(path)  # Llama-3-8B on an H100, 512 sequences averaging ~1.3k tokens
    shape, H100 = PRESETS["llama-3-8b"], device_named("h100-80gb")
    context, per_token = defs["context"], kv_bytes_per_token(shape, 2)
    assert per_token == 128 * 1024 and 1100 < context < 1500
    weights = matmul_parameter_count(shape) * 2
    assert defs["weight_read_bytes"] == weights
    for rows, step, rate in ((defs["in_flight_paged"], defs["decode_paged"], defs["paged_rate"]),
                             (defs["in_flight_contiguous"], defs["decode_contiguous"], defs["contiguous_rate"])):
        assert step.bytes == pytest.approx(weights + rows * (context + 1) * per_token)
        assert step.memory_seconds == pytest.approx(step.bytes / 3.35e12) and step.bound == "memory"
        assert rate == pytest.approx(rows / step.seconds)
    assert defs["rate_ceiling"] == pytest.approx(H100.bytes_per_second / ((context + 1) * per_token))
    # paging's rows share the weights' read: more than twice the tokens a second, below the ceiling
    assert defs["contiguous_rate"] * 2 < defs["paged_rate"] < defs["rate_ceiling"]
    chart = defs["bandwidth_chart"]
    assert points(chart) > 0 and chart.axes[0].get_ylabel() == "decode tokens per second"

    h200 = run_with_setting(path, 'value="h100-80gb", label', 'value="h200-141gb", label', tmp_path)
    assert h200["decode_paged"].memory_seconds == pytest.approx(h200["decode_paged"].bytes / 4.8e12)
    assert h200["in_flight_paged"] > 1.9 * defs["in_flight_paged"] and h200["paged_rate"] > 1.5 * defs["paged_rate"]
    assert drawn_data(h200["bandwidth_chart"]) != drawn_data(chart)
    mha = run_with_setting(path, 'value="llama-3-8b (GQA 4:1)"', 'value="llama-2-7b (MHA)"', tmp_path)
    assert mha["context"] == context and mha["rate_ceiling"] == pytest.approx(defs["rate_ceiling"] / 4)


# ---- lesson 22: 16 or 18 bytes a parameter -------------------------------------------------


def test_the_two_accountings_differ_by_the_gradients_alone():
    assert (MIXED_ADAMW.bytes_per_parameter, MIXED_ADAMW_FP32_GRADS.bytes_per_parameter) == (16, 18)
    assert MIXED_ADAMW_FP32_GRADS.grad_bytes - MIXED_ADAMW.grad_bytes == 2
    assert MIXED_ADAMW_FP32_GRADS.sharded_optimizer_bytes == MIXED_ADAMW.sharded_optimizer_bytes == 12


def test_lesson_22_shows_both_counts_and_shards_the_difference_from_stage_2(restore_threads, tmp_path):  # noqa: F811
    path = LESSONS / "22_memory_and_throughput.py"
    page, defs = page_text(path)  # Qwen2.5-7B, ZeRO-3 over 8 GPUs
    P = defs["P"]
    assert defs["extra_bytes_per_parameter"] == 2
    assert defs["state"].total == pytest.approx(16 * P / 8) and defs["state_fp32_grads"].total == pytest.approx(18 * P / 8)
    assert defs["state_fp32_grads"].grads - defs["state"].grads == pytest.approx(2 * P / 8)
    assert defs["fits"] and defs["fits_fp32_grads"]
    assert "16 B a parameter (bf16 gradients)" in page and "18 B (fp32 gradients)" in page
    assert "cost 2 more a parameter, all of it gradients" in page
    stage1 = run_with_setting(path, 'value=3, label="ZeRO', 'value=1, label="ZeRO', tmp_path)
    gap = stage1["state_fp32_grads"].total - stage1["state"].total
    assert gap == pytest.approx(2 * P)  # gradients are not sharded before stage 2: 15 GB on every GPU
    assert stage1["state_fp32_grads"].total / 1e9 == pytest.approx(57.1, abs=0.1)
    assert stage1["state"].total / 1e9 == pytest.approx(41.9, abs=0.1)


# ---- lesson 23: the published recipes ------------------------------------------------------


def test_the_published_catalogue_holds_the_seeds_six_on_five_axes():
    with open(LESSONS / "data" / "23_published_recipes.toml", "rb") as file:
        recipes = tomllib.load(file)["recipe"]
    assert [r["name"] for r in recipes] == ["InstructGPT", "DeepSeek-R1-Zero", "DeepSeek-R1", "Tülu 3", "Qwen2.5",
                                            "o-series (o1, o3)"]
    for r in recipes:
        for axis in ("data", "algorithm", "reward", "system", "scale"):
            assert r[axis]["known"].strip(), f"{r['name']} states nothing on {axis}"
        assert not r["toy"].startswith("recipes/") or (ROOT / r["toy"]).is_file(), r["toy"]
    papers = {r["name"]: r for r in recipes if r["name"] != "o-series (o1, o3)"}
    assert all(re.search(r"arXiv:\d{4}\.\d{5}", r["source"]) for r in papers.values())
    # only the o-series mixes in guesswork, and it marks it; the papers' rows are what the papers say
    assert not any("speculated" in r[a] for r in papers.values() for a in ("data", "algorithm", "reward", "system",
                                                                            "scale"))
    o_series = recipes[-1]
    assert {a for a in ("data", "algorithm", "reward", "system", "scale") if "speculated" in o_series[a]} == {
        "data", "algorithm", "reward"}
    assert "not disclosed" in o_series["data"]["known"] and "2412.16339" in o_series["source"]
    assert "13k" in papers["InstructGPT"]["data"]["known"] and "GRPO" in papers["Qwen2.5"]["algorithm"]["known"]
    # R1's distillation outcome (arXiv:2501.12948, Tables 5 and 6): distilled 32B against RL on the same base
    assert "72.6%" in papers["DeepSeek-R1"]["scale"]["known"] and "47.0%" in papers["DeepSeek-R1"]["scale"]["known"]


def test_lesson_23_shows_the_catalogue_and_marks_the_panels_recipe(restore_threads):  # noqa: F811
    page, defs = page_text(LESSONS / "23_recipes_and_failure_modes.py")
    assert [r["name"] for r in defs["published"]][0] == "InstructGPT" and len(defs["published"]) == 6
    for name in ("InstructGPT", "Qwen2.5", "o-series (o1, o3)", "Tülu 3"):
        assert f"<strong>{name}</strong>" in page
    assert "<strong>DeepSeek-R1</strong> ◀ the panel" in page  # the panel's recipe, r1, is the paper's toy
    assert page.count("<em>speculated:</em>") == 3


# ---- lesson 11: what dropping the critic saves -------------------------------------------


def test_lesson_11_computes_what_dropping_the_critic_saves(restore_threads):  # noqa: F811
    """PPO-based RLHF holds a trained policy and critic (16 B/param each in mixed precision),
    a frozen reference, reward model and rollout copy (2 each): 38 B/param; GRPO with a
    verifier 16 + 2 + 2 = 20, so 1 − 20/38 = 47% less, whatever the model; posttrain's own
    critic is one linear layer on the trunk (dim + 1 parameters)."""
    text, defs = page_text(LESSONS / "11_grpo.py")
    assert defs["critic_saving"] == pytest.approx(1 - 20 / 38, rel=1e-9)
    assert "<strong>47% less</strong>" in text and "llama-3-8b" in text
    roles = {copy.role for copy in defs["ppo_memory"].copies} - {copy.role for copy in defs["grpo_memory"].copies}
    assert roles == {"critic", "reward model"}
    assert defs["head_params"] == 128 + 1 and defs["policy_params"] > 800_000
