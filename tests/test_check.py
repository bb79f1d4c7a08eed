"""`posttrain check NN`: every exercise stub fails its check untouched, passes with the
library's own function in its place, passes with an independent solution written here
from the exercise's text, and fails on the classic mistakes with the case named."""

from __future__ import annotations

import ast

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
