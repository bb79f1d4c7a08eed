"""`posttrain train --dist.trainer_ranks 2`: the RL stage's trainer data-parallel over two
processes (posttrain/distributed/data_parallel.py), end to end through the CLI.

    2 ranks = 1 rank     the same samples and rewards; loss, KL, grad norm and final
                         weights equal to float rounding (the all-reduce adds the two
                         halves' gradients in a different order than one backward does)
    kill -9, resume      a 2-rank run killed after a checkpoint resumes to the metrics of
                         the uninterrupted 2-rank run exactly, and leaves no follower behind
    a dead follower      rank 0 fails at once, naming the rank, instead of hanging
    bad values           refused before anything runs, with what to do

The library class on its own (2 ranks on halves of a batch): test_distributed_dp.py.
"""

import dataclasses
import json
import math
import os
import signal
import time
from pathlib import Path

import pytest
import torch
from tests.test_pipeline import posttrain
from safetensors.torch import load_file

STEPS = 8
TINY = [
    "--model.dim", "32", "--model.n_layer", "2", "--model.n_head", "2", "--model.hidden_dim", "64",
    "--sft.num_examples", "16", "--sft.steps", "6", "--sft.batch_size", "8", "--sft.warmup_steps", "2",
    "--rl.prompts_per_step", "4", "--rl.samples_per_prompt", "4", "--rl.eval_every", "4", "--rl.dev_size", "4",
    "--rl.sampling.max_new_tokens", "16", "--heldout_size", "4",
    # the length penalty makes rewards differ within a group: non-zero advantages, weights that move
    "--rl.reward.length_penalty", "0.01", "--rl.reward.length_free", "5", "--rl.optim.lr", "1e-3", "--rl.optim.warmup_steps", "1",
    # adaptive KL changes the loss's kl_coef every step on rank 0: the followers must use it too
    "--rl.kl.target", "0.001", "--grpo.kl_coef", "0.04",
    "--rl.steps", str(STEPS), "--checkpoint_every", "2", "--threads", "1",
]
# Measured on this run (GRPO, 16 rows split 8 + 8, 8 steps): grad_norm (0.4 to 1.1) differs by
# at most 6e-8 (1.3e-7 on an AMD EPYC with AVX-512), kl_ref and kl_coef by under 1e-6 of their
# value (1.2e-6 there), a weight after 8 AdamW steps by 1.2e-7, one float32 ulp at 1.0 (3.0e-6
# on the AVX-512 EPYC: Adam divides by √v, so a rounding difference in a small gradient grows),
# while the weights move by 5e-3. These are float32 rounding: the all-reduce adds the two
# halves' gradients in another order than one backward does. The bounds leave ~3-10x headroom
# over the larger of the two; a real fault (a wrong row share, a rank on stale weights or a
# stale kl_coef, a skipped step) moves them by 1e-4 or more.
GRAD_NORM_RTOL = 1e-6
KL_RTOL = 1e-5
WEIGHT_ATOL = 1e-5


def train(out: Path, *args) -> Path:
    """`posttrain train` in this process (the kill test needs its own): imports paid once."""
    from posttrain.cli import main

    assert main(["train", *TINY, *args, "--out_dir", str(out)]) == 0
    (run,) = [p for p in out.iterdir() if p.is_dir()]
    return run


def rl_rows(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows if r["stage"] == "rl"]


def final_weights(run: Path) -> dict[str, torch.Tensor]:
    rl = run / "checkpoints" / "rl"
    return load_file(rl / (rl / "latest").read_text().strip() / "model.safetensors")


def children(pid: int) -> list[int]:
    """Processes whose parent is pid (from /proc: no psutil needed)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                # the field after the parenthesised command name is the state, then the ppid
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                pass  # exited while we looked
    return out


def spawned(pid: int) -> bool:
    """A process multiprocessing started with the spawn method (a follower rank)."""
    try:
        return b"spawn_main" in (Path("/proc") / str(pid) / "cmdline").read_bytes()
    except OSError:
        return False


def alive(pid: int) -> bool:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory):
    return train(tmp_path_factory.mktemp("one"))


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    return train(tmp_path_factory.mktemp("two"), "--dist.trainer_ranks", "2")


def test_two_ranks_equal_one_rank(one_rank, two_ranks):
    single, parallel = rl_rows(one_rank), rl_rows(two_ranks)
    assert [r["step"] for r in parallel] == list(range(STEPS))
    for a, b in zip(single, parallel):
        # sampling and scoring happen on rank 0 as before: the same completions, the same rewards
        assert a["reward_mean"] == b["reward_mean"] and a["response_length"] == b["response_length"], a["step"]
        assert a["lr"] == b["lr"]
        assert math.isclose(a["grad_norm"], b["grad_norm"], rel_tol=GRAD_NORM_RTOL), a["step"]
        for key in ("kl_ref", "kl_coef"):  # kl_coef: the adaptive controller's, steered by kl_ref
            assert math.isclose(a[key], b[key], rel_tol=KL_RTOL, abs_tol=1e-12), (a["step"], key)
        # GRPO's on-policy surrogate is zero by construction (a group's advantages sum to 0),
        # so pg_loss is rounding noise of size 1e-7 in both; the gradient is what grad_norm checks
        assert abs(a["pg_loss"] - b["pg_loss"]) < 2e-7
        # not compared: entropy, kl, adv_mean, adv_std, ratio_max are per-token or per-row
        # statistics each rank takes over its own half, then averaged by row share (as
        # Trainer._step does over micro-batches); they differ at 1e-5 (entropy, kl) and more
    assert single[-1]["kl_ref"] > 1e-4 and min(r["grad_norm"] for r in single) > 0.1  # the weights really moved
    assert single[-1]["kl_coef"] != single[0]["kl_coef"]  # and β was steered
    one, two = final_weights(one_rank), final_weights(two_ranks)
    start = load_file(one_rank / "checkpoints" / "sft" / "step_000005" / "model.safetensors")
    moved = max((one[name] - start[name]).abs().max().item() for name in one)
    assert moved > 100 * WEIGHT_ATOL  # so that equal-within-WEIGHT_ATOL says something
    for name in one:
        assert torch.allclose(one[name], two[name], rtol=0, atol=WEIGHT_ATOL), name
    timings = [json.loads(line) for line in (two_ranks / "metrics.jsonl").read_text().splitlines()]
    assert all(r["time/allreduce"] > 0 for r in timings if r["stage"] == "rl")  # the cost is logged


# slow: two ranks killed and resumed; two ranks = one rank and the async run's exact resume are in make test
@pytest.mark.slow
def test_killed_two_rank_run_resumes_exactly(two_ranks, tmp_path):
    proc = posttrain("train", *TINY, "--dist.trainer_ranks", "2", "--out_dir", str(tmp_path))
    deadline, followers = time.time() + 120, []
    while time.time() < deadline:
        followers = followers or [pid for pid in children(proc.pid) if spawned(pid)]
        runs = [p for p in tmp_path.iterdir() if p.is_dir()]
        pointer = runs[0] / "checkpoints" / "rl" / "latest" if runs else None
        if pointer and pointer.exists() and pointer.read_text().strip() >= "step_000001":
            break
        assert proc.poll() is None, "the run finished before it could be killed; " + proc.stdout.read()
        time.sleep(0.005)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert followers, "no follower process was seen"
    deadline = time.time() + 15  # a follower sees its pipe to rank 0 close and exits
    while any(alive(pid) for pid in followers) and time.time() < deadline:
        time.sleep(0.05)
    assert not any(alive(pid) for pid in followers), "a follower outlived rank 0"

    (run,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert len(rl_rows(run)) < STEPS
    resumed = posttrain("train", "--resume", str(run))
    output, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, output
    assert "resuming rl" in output
    # the followers load the checkpoint's weights and optimizer state from rank 0: exact
    assert rl_rows(run) == rl_rows(two_ranks)
    for name, value in final_weights(two_ranks).items():
        assert torch.equal(final_weights(run)[name], value), name


def test_a_dead_follower_fails_rank_0_with_its_name():
    from posttrain.algorithms import make_algorithm
    from posttrain.config import ModelConfig
    from posttrain.distributed.data_parallel import make_trainer
    from posttrain.models import CharTokenizer, build_model
    from posttrain.types import Episode, Example, RolloutBatch

    torch.set_num_threads(1)
    tokenizer = CharTokenizer()
    model = build_model(ModelConfig(dim=16, n_layer=1, n_head=2, hidden_dim=32), tokenizer)
    episodes = [Episode(Example("Q", "1"), i // 2, [tokenizer.bos_id, 5], [6, 7, 8], [0.0] * 3, reward=float(i % 2))
                for i in range(4)]
    algo = make_algorithm("grpo")
    batch = RolloutBatch.collate(episodes, tokenizer.pad_id)
    trainer = make_trainer(2, model, lr=1e-3, total_steps=2)
    try:
        batch = dataclasses.replace(batch, **algo.compute_advantages(batch))
        assert trainer.update(batch, algo)["grad_norm"] > 0
        (follower,) = trainer._followers
        start = time.time()
        os.kill(follower.pid, signal.SIGKILL)  # not joined: the update may meet it dying mid-broadcast
        with pytest.raises(RuntimeError, match=r"rank 1 \(pid \d+\) exited with code -9"):
            trainer.update(batch, algo)
        assert time.time() - start < 5  # no waiting for a timeout
    finally:
        trainer.close()
    assert not trainer._followers


@pytest.mark.parametrize("value, message", [
    ("0", "dist.trainer_ranks=0 is not allowed: expected an integer >= 1"),
    ("17", "dist.trainer_ranks=17 is not allowed: expected at most the 16 rows of a minibatch"),
])
def test_bad_trainer_ranks_are_refused(value, message, tmp_path, capsys):
    from posttrain.cli import main

    assert main(["train", *TINY, "--dist.trainer_ranks", value, "--out_dir", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # refused before a run directory exists
