"""`posttrain check NN`: every exercise stub fails its check untouched, passes with the
library's own function in its place, passes with an independent solution written here
from the exercise's text, and fails on the classic mistakes with the case named."""

from __future__ import annotations

import ast
import dataclasses
import math
import re
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from posttrain.teach import check
from posttrain.teach.exercises import EXERCISES
from posttrain.cli import main as cli_main

NUMBERS = list(EXERCISES)


def quiet(lines: list[str]):
    return lines.append


# Solutions written from the exercises' docstrings alone, not from the library: the check
# must accept any correct implementation, not only the library's own code path.
def _where(x, mask):
    return torch.where(mask != 0, x, torch.zeros_like(x))


def _group_stats(r, ids):
    mean, std, count = torch.empty_like(r), torch.empty_like(r), torch.empty_like(r)
    for g in ids.unique():
        rows = ids == g
        mean[rows] = r[rows].mean()
        std[rows] = r[rows].std() if rows.sum() > 1 else 0.0
        count[rows] = rows.sum()
    return mean, std, count


INDEPENDENT = {
    "03": lambda logp, ref: torch.exp(ref - logp) - (ref - logp) - 1,
    "04": lambda batch: (batch.rewards - _group_stats(batch.rewards, batch.group_ids)[0])[:, None] * batch.response_mask,
    "05": lambda logp, mask: -_where(logp, mask).sum() / mask.sum(),
    "08": lambda x, mask: _where(x, mask).sum() / mask.sum().clamp(min=1),
    "09": lambda logp, adv, mask: -(_where(adv, mask) * _where(logp, mask)).sum(dim=1).mean(),
    "10": lambda logp, old, adv, mask, eps=0.2: (lambda ratio: _where(torch.maximum(
        -_where(adv, mask) * ratio, -_where(adv, mask) * ratio.clamp(1 - eps, 1 + eps)), mask).sum() / mask.sum())(
        torch.exp(_where(logp - old, mask))),
    "11": lambda r, ids: (r - _group_stats(r, ids)[0]) / (_group_stats(r, ids)[1] + 1e-6),
    "12": lambda r, ids: (lambda m, s, n: torch.where(n > 1, (m * n - r) / (n - 1).clamp(min=1), r))(
        *_group_stats(r, ids)),
    "13": lambda lengths, max_len, cache: torch.zeros(len(lengths)) if cache == 0 else (
        ((max_len - cache) - lengths.float()) / cache).clamp(-1.0, 0.0),
    "14": lambda loss_mat, mask, max_len: (_where(loss_mat, mask).sum(dim=1) / max_len).mean(),
    "pick_best": lambda samples: sorted(samples, key=lambda s: (-s["reward"], s["id"]))[0],
    "15": lambda rc, rr, margin: -F.logsigmoid(rc - rr - margin).mean(),
    "16": lambda pc, pr, rc, rr, beta: -F.logsigmoid(beta * ((pc - rc) - (pr - rr))).mean(),
    "17": lambda n, correct, k: torch.tensor([1.0 if n - int(c) < k else 1 - math.comb(n - int(c), k) / math.comb(n, k)
                                              for c in correct]),
    "18": lambda expected, completions: torch.tensor([_cot_v1(e, c) for e, c in zip(expected, completions)]),
    "26": lambda losses, weights: torch.tensor([sum(w * l for w, l in zip((weights / weights.sum()).tolist(), row))
                                                + 0.001 * sum(row) for row in losses.tolist()]),
    "27": lambda old, behaviour, mask, cap: torch.where(mask != 0, torch.minimum(
        (old - behaviour).exp(), torch.tensor(cap)), torch.zeros_like(old)),
}

# ---- lesson 18a: written from the stub's docstring ----


def _draw_probabilities(passes, tries, low, high, weights, inclusive=True):
    p = [int(n) / tries for n in passes]
    inside = [(low <= x <= high) if inclusive else (low < x < high) for x in p]
    candidates = [i for i in range(len(p)) if inside[i]] or list(range(len(p)))
    weight = {"uniform": lambda x: 1.0, "failure": lambda x: 1 - x, "signal": lambda x: x * (1 - x)}[weights]
    w = {i: weight(p[i]) for i in candidates}
    if sum(w.values()) == 0:
        w = {i: 1.0 for i in candidates}
    return torch.tensor([w.get(i, 0.0) / sum(w.values()) for i in range(len(p))], dtype=torch.float64)


INDEPENDENT["18a"] = _draw_probabilities


def test_an_exclusive_band_fails_on_its_ends():
    lines = []
    exclusive = lambda *args: _draw_probabilities(*args, inclusive=False)  # noqa: E731
    assert check.run_check("18a", solution=exclusive, out=quiet(lines)) is False
    assert any("FAIL" in line and "ends of the band" in line for line in lines), "\n".join(lines)


# ---- lessons 19, 20, 21, 22, 22a (systems, part 1): written from the stubs' docstrings ----


def _sync_parts(P, n, link, memory, master=4, engine=2, colocated=False, tp=1):
    gather = (n - 1) / n * P * master / link
    cast = 0.0 if master == engine else P * (master + engine) / memory
    broadcast = 0.0 if colocated else P * engine / link
    return torch.tensor([gather, cast, broadcast, 2 * P * engine / tp / memory], dtype=torch.float64)


def _cache_bytes(lengths, reserved, block, per_token):
    blocks = sum(-(-int(n) // block) for n in lengths)
    return torch.tensor([float(lengths.sum()) * per_token, len(lengths) * reserved * per_token,
                         blocks * block * per_token], dtype=torch.float64)


def _decode_times(shape, device, rows, ctx, wb, kvb):
    n = shape.hidden * shape.vocab  # the output head, then every layer's projections
    n += shape.n_layers * (shape.hidden * (shape.n_heads + 2 * shape.n_kv_heads) * shape.head_dim
                           + shape.n_heads * shape.head_dim * shape.hidden + shape.mlp_matrices * shape.hidden * shape.intermediate)
    flops = rows * (2 * n + 4 * shape.n_layers * shape.n_heads * shape.head_dim * (ctx + 1))
    moved = n * wb + rows * (ctx + 1) * 2 * shape.n_layers * shape.n_kv_heads * shape.head_dim * kvb
    return torch.tensor([flops / device.flops_per_second, moved / device.bytes_per_second], dtype=torch.float64)


INDEPENDENT.update({
    "19": _sync_parts,
    "20": _cache_bytes,
    "21": lambda a, g, c: torch.tensor([sum(a ** i for i in range(g + 1)), (1 + g * c) / sum(a ** i for i in range(g + 1))],
                                       dtype=torch.float64),
    "22": _decode_times,
    "22a": lambda t, topology: torch.tensor(
        [max(t["rollout"], sum(t.values()) - t["rollout"]) if topology == "async" else sum(t.values()),
         ["rollout", "verifier", "reference", "train", "sync"].index(
             "rollout" if topology == "async" and 2 * t["rollout"] >= sum(t.values())
             else max(t if topology != "async" else [r for r in t if r != "rollout"], key=t.get))],
        dtype=torch.float64),
})


def _cot_v1(expected: str, completion: str) -> float:
    """final_int/cot-v1 from the exercise's text, by regular expression."""
    lines = completion.strip(" \t\n\r\f\v").split("\n")
    answer = re.fullmatch(r"Final: (-?(?:0|[1-9][0-9]*))", lines[-1])
    one_final = sum(line.startswith("Final:") for line in lines) == 1
    return float(one_final and answer is not None and answer.group(1) != "-0" and answer.group(1) == expected)
# ---- lessons 22b, 22c, 24, 25, 28 (systems, part 2): written from the stubs' docstrings ----


def _step_ends(rollout, train, sync, k):
    published, ends, rollout_free, trainer_free = [0.0], [], 0.0, 0.0
    for s, (r, t) in enumerate(zip(rollout, train)):
        rollout_free = max(rollout_free, published[max(0, s - k)] if k else published[s]) + r
        end = max(rollout_free, trainer_free) + t + sync
        trainer_free = end
        published.append(end)
        ends.append(end)
    return torch.tensor(ends, dtype=torch.float64)


def _grpo_bytes(parameters, gpus, stage):
    share = lambda k: gpus if stage >= k else 1  # noqa: E731
    return torch.tensor([parameters * (2 / share(3) + 2 / share(2) + 12 / share(1)), parameters * 2 / share(3),
                         parameters * 2.0], dtype=torch.float64)


def _mismatch(sampler, trainer, cap):
    d = (trainer - sampler).double()
    w = d.exp()
    return torch.stack([d.abs().mean(), (w - 1 - d).mean(), (w > cap).double().mean(),
                        w.sum() ** 2 / (len(w) * (w * w).sum())])


def _saved(times, topology, levers):
    def step(t):
        rest = t["verifier"] + t["reference"] + t["train"] + t["sync"]
        return max(t["rollout"], rest) if topology == "async" else t["rollout"] + rest

    return torch.tensor([step(times) - step({r: v * f.get(r, 1.0) for r, v in times.items()}) for f in levers])


INDEPENDENT.update({
    "22b": lambda L, a, b, cap: torch.stack([(a + b * len(L)) * L.max(), a * L.max() + b * L.sum(),
                                             a * L.clamp(max=cap).max() + b * L.clamp(max=cap).sum()]),
    "22c": _step_ends,
    "24": _grpo_bytes,
    "25": _mismatch,
    "28": _saved,
})

# ---- end of lessons 22b-28 ----


# ---- lesson 23 ----


def _kl_alert_steps(rows, kl_max):
    steps, above_before = [], False
    for index, row in enumerate(rows):
        kl = row.get("kl_ref")
        if kl is None:
            continue
        above = not kl <= kl_max  # NaN is above
        if above and not above_before:
            steps.append(row.get("step", index))
        above_before = above
    return steps


INDEPENDENT["23"] = _kl_alert_steps


def test_every_exercise_has_a_stub_file_and_an_independent_solution_here():
    files = check.exercise_files()
    assert sorted(files) == sorted(NUMBERS)
    assert sorted(INDEPENDENT) == sorted(NUMBERS)


@pytest.mark.parametrize("number", NUMBERS)
def test_stub_is_marked_and_defines_the_function(number):
    path = check.exercise_files()[number]
    text = path.read_text(encoding="utf-8")
    assert "YOUR CODE HERE" in text and "END OF YOUR CODE" in text
    assert f"posttrain check {number}" in text
    names = {n.name for n in ast.walk(ast.parse(text)) if isinstance(n, ast.FunctionDef)}
    assert EXERCISES[number].function in names


@pytest.mark.parametrize("number", NUMBERS)
def test_untouched_stub_fails_with_a_hint(number):
    lines = []
    assert check.run_check(number, out=quiet(lines)) is False
    text = "\n".join(lines)
    assert "FAIL" in text and "still the stub" in text and "hint:" in text


@pytest.mark.parametrize("number", NUMBERS)
def test_the_library_function_passes(number):
    lines = []
    assert check.run_check(number, solution=EXERCISES[number].reference, out=quiet(lines)), "\n".join(lines)
    assert lines[-1].startswith("PASS")


@pytest.mark.parametrize("number", NUMBERS)
def test_an_independent_solution_passes(number):
    lines = []
    assert check.run_check(number, solution=INDEPENDENT[number], out=quiet(lines)), "\n".join(lines)


def test_multiplying_by_the_mask_fails_on_nan_padding_and_says_so():
    lines = []
    naive = lambda logp, adv, mask: -(adv * logp * mask).sum(dim=1).mean()  # NaN · 0 = NaN
    assert check.run_check("09", solution=naive, out=quiet(lines)) is False
    text = "\n".join(lines)
    assert "ok    case 'rows of different lengths" in text  # right on clean inputs
    assert "FAIL  case 'padding and prompt positions hold NaN'" in text and "NaN" in text


def test_a_detached_loss_fails_on_its_gradient():
    lines = []
    detached = lambda logp, mask: (-_where(logp, mask).sum() / mask.sum()).detach()
    assert check.run_check("05", solution=detached, out=quiet(lines)) is False
    assert "no gradient" in "\n".join(lines)


def test_clip_without_the_max_fails_on_the_gradient_or_value():
    lines = []
    unclipped = lambda logp, old, adv, mask, eps=0.2: (-_where(adv, mask) * torch.exp(_where(logp - old, mask))).sum() / mask.sum()
    assert check.run_check("10", solution=unclipped, out=quiet(lines)) is False


def test_dividing_by_the_length_instead_of_the_budget_fails():
    lines = []
    grpo_style = lambda loss_mat, mask, max_len: (_where(loss_mat, mask).sum(dim=1) / mask.sum(dim=1)).mean()
    assert check.run_check("14", solution=grpo_style, out=quiet(lines)) is False


def test_a_crashing_solution_is_reported_not_raised():
    lines = []

    def broken(rewards, group_ids):
        raise RuntimeError("boom")

    assert check.run_check("11", solution=broken, out=quiet(lines)) is False
    assert "RuntimeError: boom" in "\n".join(lines)


def test_pick_best_that_depends_on_the_input_order_fails_on_the_reversed_tie():
    lines = []
    first_maximum = lambda samples: max(samples, key=lambda s: s["reward"])  # keeps the first maximum it meets
    assert check.run_check("pick_best", solution=first_maximum, out=quiet(lines)) is False
    text = "\n".join(lines)
    assert "ok    case 'a tie at the top, the smallest id listed first'" in text  # right by luck of order
    assert "FAIL  case 'the same tie listed in reverse order" in text
    assert "picked 'c03' (reward 1.0), expected 'c00'" in text
    assert "hint:" in text and "smallest id" in text


def test_pick_best_by_the_smallest_completion_is_deterministic_but_not_the_rule():
    lines = []
    by_text = lambda samples: min(samples, key=lambda s: (-s["reward"], s["completion"]))
    assert check.run_check("pick_best", solution=by_text, out=quiet(lines)) is False
    assert "FAIL  case 'a tie whose smallest id has the larger completion" in "\n".join(lines)


def test_pick_best_must_return_the_sample_unchanged_and_may_sort_its_own_copy():
    lines = []
    just_the_id = lambda samples: sorted(samples, key=lambda s: (-s["reward"], s["id"]))[0]["id"]
    assert check.run_check("pick_best", solution=just_the_id, out=quiet(lines)) is False
    assert "expected one of the samples" in "\n".join(lines)

    def sorts_in_place(samples):
        samples.sort(key=lambda s: (-s["reward"], s["id"]))
        return samples[0]

    assert check.run_check("pick_best", solution=sorts_in_place, out=quiet([]))


def test_the_pick_best_stub_runs_on_the_pack_once_written(tmp_path):
    # the stub's own demo block, with the reference rule filled in: runs and prints the pass rates
    text = check.exercise_files()["pick_best"].read_text(encoding="utf-8")
    solved = text.replace('raise NotImplementedError("exercise pick_best: write pick_best")',
                          'return min(samples, key=lambda s: (-s["reward"], s["id"]))')
    (tmp_path / "pick_best.py").write_text(solved)
    run = subprocess.run([sys.executable, str(tmp_path / "pick_best.py")], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    # the pack's numbers, as `posttrain bon --n 8` reports them (docs/guides/measuring.md): 0.460 first, 0.760 best-of-8
    assert "pass rate of the first sample 0.460, of your choice of 8 0.760" in run.stdout


def test_cli_check_exit_codes(capsys):
    assert cli_main(["check", "09"]) == 1  # the untouched stub
    assert "FAIL" in capsys.readouterr().out
    assert cli_main(["check", "99"]) == 2
    assert "no exercise '99'" in capsys.readouterr().err
    assert cli_main(["check", "--list"]) == 0
    assert "exercises/09_reinforce.py" in capsys.readouterr().out


def test_check_reloads_the_file_so_edits_count(tmp_path, monkeypatch):
    (tmp_path / "13_dapo.py").write_text(
        "import torch\n\ndef overlong_penalty(lengths, max_len, cache_len):\n"
        "    if cache_len == 0:\n        return torch.zeros(len(lengths))\n"
        "    return (((max_len - cache_len) - lengths.float()) / cache_len).clamp(-1.0, 0.0)\n")
    monkeypatch.setattr(check, "EXERCISES_DIR", tmp_path)
    fn = check.load_solution("13", directory=tmp_path)
    lines = []
    assert check.run_check("13", solution=fn, out=quiet(lines)), "\n".join(lines)


def test_log_of_sigmoid_fails_where_it_underflows():
    lines = []
    naive = lambda rc, rr, margin: -torch.log(torch.sigmoid(rc - rr - margin)).mean()  # log(0) = −inf
    assert check.run_check("15", solution=naive, out=quiet(lines)) is False
    text = "\n".join(lines)
    assert "ok    case 'six pairs, no margin'" in text
    assert "FAIL  case 'rewards 400 apart" in text
    lines = []
    naive_dpo = lambda pc, pr, rc, rr, beta: -torch.log(torch.sigmoid(beta * ((pc - rc) - (pr - rr)))).mean()
    assert check.run_check("16", solution=naive_dpo, out=quiet(lines)) is False
    assert "FAIL  case 'log-ratios thousands of nats apart" in "\n".join(lines)


def test_a_dpo_without_the_reference_fails():
    lines = []
    no_ref = lambda pc, pr, rc, rr, beta: -F.logsigmoid(beta * (pc - pr)).mean()
    assert check.run_check("16", solution=no_ref, out=quiet(lines)) is False


@pytest.mark.parametrize("wrong", ["c / n", "with replacement"])
def test_biased_pass_at_k_estimators_fail_beyond_k_1(wrong):
    lines = []
    if wrong == "c / n":
        solution = lambda n, correct, k: correct.double() / n
    else:
        solution = lambda n, correct, k: 1 - (1 - correct.double() / n) ** k
    assert check.run_check("17", solution=solution, out=quiet(lines)) is False
    text = "\n".join(lines)
    assert "ok    case 'n = 8, k = 1" in text and "FAIL  case 'n = 8, k = 4'" in text


def test_a_lenient_verifier_fails_on_the_exploit_pack():
    """The last number anywhere equal to the answer (hackable/last-number) passes every
    right answer and is caught by the golden exploit pack."""
    def last_number(expected, completions):
        found = [re.findall(r"-?[0-9]+", c) for c in completions]
        return torch.tensor([float(bool(f) and f[-1] == e) for e, f in zip(expected, found)])

    lines = []
    assert check.run_check("18", solution=last_number, out=quiet(lines)) is False
    text = "\n".join(lines)
    assert "ok    case 'the golden correct set" in text
    assert "FAIL  case 'the golden exploit pack" in text


def test_unnormalised_weights_or_no_tie_break_fail_the_scoring_rule():
    lines = []
    raw = lambda losses, weights: losses @ weights + 0.001 * losses.sum(dim=1)  # weights not normalised
    assert check.run_check("26", solution=raw, out=quiet(lines)) is False
    text = "\n".join(lines)
    assert "ok    case 'eight designs, weights summing to 1'" in text
    assert "FAIL  case 'weights that do not sum to 1" in text
    lines = []
    no_tie = lambda losses, weights: losses @ (weights / weights.sum())
    assert check.run_check("26", solution=no_tie, out=quiet(lines)) is False


@pytest.mark.parametrize("wrong", ["clamped from below too", "no mask"])
def test_wrong_truncated_importance_weights_fail(wrong):
    lines = []
    if wrong == "clamped from below too":
        solution = lambda old, beh, mask, cap: (old - beh).exp().clamp(1 / cap, cap) * mask
    else:
        solution = lambda old, beh, mask, cap: (old - beh).exp().clamp(max=cap)
    assert check.run_check("27", solution=solution, out=quiet(lines)) is False
    assert "ok    case 'on-policy: every weight is 1'" in "\n".join(lines)
# ---- lessons 22b, 22c, 24, 25, 28: the classic mistakes fail, with the case named ----


def test_an_async_step_summed_instead_of_maxed_fails_on_the_async_cases():
    lines = []
    summed = lambda times, topology, levers: _saved(times, "colocated", levers)  # noqa: E731
    assert check.run_check("28", solution=summed, out=quiet(lines)) is False
    text = "\n".join(lines)
    assert "ok    case 'colocated" in text and "FAIL  case 'async, the rollout binds" in text


def test_sharding_the_engine_with_zero_fails():
    lines = []
    sharded = lambda p, gpus, stage: _grpo_bytes(p, gpus, stage) / torch.tensor([1.0, 1.0, gpus if stage == 3 else 1])
    assert check.run_check("24", solution=sharded, out=quiet(lines)) is False
    assert "FAIL  case '8 GPUs, ZeRO stage 3'" in "\n".join(lines)


def test_a_packed_batch_paying_for_every_row_to_the_end_fails():
    lines = []
    static_twice = lambda L, a, b, cap: torch.stack(  # noqa: E731
        [(a + b * len(L)) * L.max()] * 2 + [(a + b * len(L)) * L.clamp(max=cap).max()])
    assert check.run_check("22b", solution=static_twice, out=quiet(lines)) is False
    assert "ok    case 'every row the same length" in "\n".join(lines)  # equal rows: the two agree


def test_a_sync_that_broadcasts_to_colocated_engines_fails_that_case():
    lines = []
    always = lambda P, n, link, memory, master=4, engine=2, colocated=False, tp=1: _sync_parts(
        P, n, link, memory, master, engine, False, tp)
    assert check.run_check("19", solution=always, out=quiet(lines)) is False
    text = "\n".join(lines)
    assert "ok    case '8 trainers" in text and "FAIL  case 'colocated: no broadcast'" in text


def test_resolve_accepts_a_lesson_between_two_numbers():
    assert check.resolve("19") == check.resolve("19_weight_sync") == "19"


def test_paging_by_the_mean_length_instead_of_each_sequence_fails():
    lines = []
    by_mean = lambda lengths, reserved, block, per_token: torch.tensor(
        [float(lengths.sum()) * per_token, len(lengths) * reserved * per_token,
         len(lengths) * -(-int(lengths.float().mean()) // block) * block * per_token], dtype=torch.float64)
    assert check.run_check("20", solution=by_mean, out=quiet(lines)) is False
    assert "FAIL  case 'three sequences, blocks of 4, by hand'" in "\n".join(lines)


def test_a_cache_counted_with_the_query_heads_fails_on_gqa():
    lines = []
    mha_cache = lambda shape, device, rows, ctx, wb, kvb: _decode_times(
        dataclasses.replace(shape, n_kv_heads=shape.n_heads), device, rows, ctx, wb, kvb)
    assert check.run_check("22", solution=mha_cache, out=quiet(lines)) is False
    text = "\n".join(lines)
    assert "ok    case 'Llama-2-7B (MHA)" in text and "FAIL  case 'Qwen2.5-7B, one row" in text


def test_an_async_bottleneck_off_the_binding_side_fails():
    lines = []
    largest = lambda t, topology: torch.tensor(
        [max(t["rollout"], sum(t.values()) - t["rollout"]) if topology == "async" else sum(t.values()),
         ["rollout", "verifier", "reference", "train", "sync"].index(max(t, key=t.get))], dtype=torch.float64)
    assert check.run_check("22a", solution=largest, out=quiet(lines)) is False
    assert "FAIL  case 'async, the trainer side binds by its update'" in "\n".join(lines)


def test_forgetting_the_targets_own_token_fails():
    lines = []
    drafts_only = lambda a, g, c: torch.tensor([sum(a ** i for i in range(1, g + 1)),
                                                (1 + g * c) / max(sum(a ** i for i in range(1, g + 1)), 1e-9)],
                                               dtype=torch.float64)
    assert check.run_check("21", solution=drafts_only, out=quiet(lines)) is False
    assert "FAIL  case 'α = 0: every draft rejected" in "\n".join(lines)


# ---- lesson 23: the classic mistakes fail, with the case named ----


def test_alerting_on_every_step_above_the_line_or_missing_nan_fails():
    every = lambda rows, kl_max: [r.get("step", i) for i, r in enumerate(rows)
                                  if r.get("kl_ref") is not None and not r["kl_ref"] <= kl_max]
    lines = []
    assert check.run_check("23", solution=every, out=quiet(lines)) is False
    text = "\n".join(lines)
    assert "FAIL  case 'a KL that rises through the line and stays above" in text
    assert "ok    case 'a NaN KL counts as above the line'" in text
    lines = []
    nan_is_fine = lambda rows, kl_max: [s for s in _kl_alert_steps(rows, kl_max)
                                        if not math.isnan(next(r["kl_ref"] for i, r in enumerate(rows)
                                                               if r.get("step", i) == s))]
    assert check.run_check("23", solution=nan_is_fine, out=quiet(lines)) is False
    assert "FAIL  case 'a NaN KL counts as above the line'" in "\n".join(lines)
