"""Data parallelism over gloo: 2 ranks on halves of a batch make the update one process
makes on the whole batch (GRPO's per-sequence loss averaging makes it exact up to float
summation order)."""

import torch

from posttrain.algorithms import make_algorithm
from posttrain.distributed.data_parallel import DataParallelTrainer, rank_rows, spawn
from posttrain.models import CharTokenizer, build_model
from posttrain.config import ModelConfig
from posttrain.roles.trainer import Trainer
from posttrain.types import Episode, Example, RolloutBatch

MODEL = ModelConfig(dim=32, n_layer=2, n_head=2, hidden_dim=64)


def setup():
    """The same model, optimizer state and batch in every process (everything is seeded)."""
    torch.manual_seed(0)
    tokenizer = CharTokenizer()
    model = build_model(MODEL, tokenizer)
    g = torch.Generator().manual_seed(1)
    episodes = []
    for i in range(10):  # 5 groups of 2, ragged lengths
        n = 3 + i % 4
        episodes.append(Episode(Example(f"Q{i}", "1"), i // 2, [tokenizer.bos_id, 5, 6],
                                torch.randint(4, tokenizer.vocab_size, (n,), generator=g).tolist(), [0.0] * n,
                                reward=float(torch.rand(1, generator=g))))
    batch = RolloutBatch.collate(episodes, tokenizer.pad_id)
    algo = make_algorithm("grpo")
    trainer_args = dict(lr=1e-2, total_steps=10, grad_clip=1.0)
    return model, batch, algo, trainer_args


def prepare(trainer, batch, algo):
    with torch.no_grad():  # old_logp = the current policy's, as right after sampling
        batch.old_logp = trainer.forward(batch).logp * batch.response_mask
    import dataclasses
    return dataclasses.replace(batch, **algo.compute_advantages(batch))


def dp_rank(rank, world_size, out_dir):
    model, batch, algo, trainer_args = setup()
    trainer = DataParallelTrainer(model, **trainer_args)
    batch = prepare(trainer, batch, algo)
    first = trainer.update(batch, algo)
    grads = [p.grad.clone() for p in model.parameters()]  # the all-reduced gradient of step 1
    second = trainer.update(batch, algo)
    torch.save({"state": model.state_dict(), "grads": grads, "metrics": [first, second]}, f"{out_dir}/rank{rank}.pt")


def test_rank_rows_cover_every_row_once():
    for B in (1, 5, 10):
        for world in (1, 2, 3):
            rows = torch.cat([rank_rows(B, r, world) for r in range(world)])
            assert rows.tolist() == list(range(B))


def test_two_ranks_on_halves_equal_one_process_on_the_whole(tmp_path):
    model, batch, algo, trainer_args = setup()
    trainer = Trainer(model, **trainer_args)
    batch = prepare(trainer, batch, algo)
    first = trainer.update(batch, algo)
    grads = [p.grad.clone() for p in model.parameters()]
    second = trainer.update(batch, algo)
    spawn(dp_rank, 2, str(tmp_path))
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    # the summed half-batch gradients are the whole-batch gradient, to float summation order
    for g, d in zip(grads, ranks[0]["grads"]):
        assert torch.allclose(g, d, atol=1e-7, rtol=1e-4)
    for name, value in model.state_dict().items():
        assert torch.equal(ranks[0]["state"][name], ranks[1]["state"][name]), name  # replicas never drift
        # two AdamW steps of lr 1e-2 move a weight by up to 2e-2; the replicas agree to 1e-4
        # (Adam divides by √v, which magnifies float noise on near-zero gradient entries)
        assert torch.allclose(ranks[0]["state"][name], value, atol=1e-4), name
    assert first["grad_norm"] > 0.1 and second["grad_norm"] > 0.01
    # the additive metrics agree; per-row statistics (adv_mean, ratio_max) are averaged per rank
    for s, d in zip((first, second), ranks[0]["metrics"]):
        for key in ("pg_loss", "grad_norm", "lr"):
            assert abs(s[key] - d[key]) < 1e-5 * max(1.0, abs(s[key])), key
