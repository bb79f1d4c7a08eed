"""`posttrain check NN`: every exercise stub fails its check untouched, passes with the
library's own function in its place, passes with an independent solution written here
from the exercise's text, and fails on the classic mistakes with the case named."""

from __future__ import annotations

import ast
import dataclasses

import pytest
import torch

from posttrain.teach import check
from posttrain.cli import main as cli_main

NUMBERS = list(check.EXERCISES)


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
}

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
    assert check.EXERCISES[number].function in names


@pytest.mark.parametrize("number", NUMBERS)
def test_untouched_stub_fails_with_a_hint(number):
    lines = []
    assert check.run_check(number, out=quiet(lines)) is False
    text = "\n".join(lines)
    assert "FAIL" in text and "still the stub" in text and "hint:" in text


@pytest.mark.parametrize("number", NUMBERS)
def test_the_library_function_passes(number):
    lines = []
    assert check.run_check(number, solution=check.EXERCISES[number].reference, out=quiet(lines)), "\n".join(lines)
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
