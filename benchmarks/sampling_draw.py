"""Drawing the next token: `torch.multinomial` against inverse-CDF sampling (issue #18).

    cd benchmarks && ../.venv/bin/python sampling_draw.py [--threads 2] [--repeats 30]

`sample_next_token` (posttrain/roles/rollout.py) used to draw with `torch.multinomial`,
which on CPU draws an exponential for every vocabulary entry of every row; it now draws
one uniform per row and searches the cumulative sum of the probabilities. The first table
times both versions of the whole function (temperature, top-p, draw, log-prob) on random
logits over SmolLM2's vocabulary, V = 49,152, with the calls interleaved so that anything
else running on the machine slows both alike. The second table is why the cumulative sum
is float64: how far a float32 one strays from the probabilities it samples, and what
float64 costs.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from posttrain.config import SamplingParams
from posttrain.roles.engines.torch_engine import sample_next_token

VOCAB = 49_152  # SmolLM2's
LOGIT_SCALE = 4.0  # logits ~ N(0, 4²): an entropy of ~4.4 nats, a few hundred likely tokens


def multinomial_sample_next_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None):
    """`sample_next_token` as it was before issue #18, kept here as the baseline."""
    logp = F.log_softmax(logits.float() / params.temperature, dim=-1)  # (N, V)
    probs = logp.exp()
    if params.top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        sorted_probs = sorted_probs.masked_fill(mass_before >= params.top_p, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    token = torch.multinomial(probs, 1, generator=generator).squeeze(-1)  # (N,)
    return token, logp.gather(-1, token[:, None]).squeeze(-1)


def interleaved_medians(fns: dict, repeats: int) -> dict[str, float]:
    """Median seconds per call of each function, calling them in turn `repeats` times."""
    for fn in fns.values():
        fn()  # warm-up: allocations, thread pool
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def random_logits(rows: int) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(rows)) * LOGIT_SCALE  # (N, V)


def drawn_distribution(cdf: torch.Tensor, u_bits: int) -> torch.Tensor:
    """The probability with which inverse-CDF sampling picks each token, given the
    CDF it searches and a u on a grid of 2^-u_bits (torch.rand's resolution: 24 bits in
    float32, 53 in float64): token i owns the grid points u with cdf[i-1] ≤ u·total < cdf[i]
    (the rounding of u·total itself left out)."""
    grid = 2.0**u_bits
    points_below = torch.ceil(cdf.double() / cdf[:, -1:].double() * grid)  # (N, V): grid points under each entry
    return torch.diff(points_below, dim=-1, prepend=torch.zeros_like(points_below[:, :1])) / grid  # (N, V)


def draw(probs: torch.Tensor, dtype: torch.dtype, generator: torch.Generator) -> torch.Tensor:
    """The draw alone, in float32 or float64 (the guards of sample_next_token left out)."""
    u = torch.rand(probs.shape[0], dtype=dtype, generator=generator)  # (N,)
    # float32: a plain cumsum; float64: a copy summed in place, as sample_next_token does
    cdf = probs.cumsum(dim=-1) if dtype == torch.float32 else probs.double().cumsum_(dim=-1)  # (N, V)
    return torch.searchsorted(cdf, u[:, None] * cdf[:, -1:], right=True)  # (N, 1)


def cpu_name() -> str:
    """The model name `lscpu` shows (from /proc/cpuinfo on Linux), else what platform knows."""
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    return names[0] if names else platform.processor() or platform.machine()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=30, help="timed calls of each version per case")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"cd benchmarks && ../.venv/bin/python sampling_draw.py --threads {args.threads} --repeats {args.repeats}")
    print(f"{cpu_name()}, {torch.get_num_threads()} threads, torch {torch.__version__}, V = {VOCAB:,}")

    print("\nsample_next_token, median ms per call (temperature 1):")
    print("| rows | top_p | torch.multinomial | inverse CDF | ratio |")
    print("|---|---|---|---|---|")
    generator = torch.Generator().manual_seed(0)
    for top_p in (1.0, 0.9):
        for rows in (8, 64):
            logits, params = random_logits(rows), SamplingParams(temperature=1.0, top_p=top_p)
            t = interleaved_medians({"old": partial(multinomial_sample_next_token, logits, params, generator),
                                     "new": partial(sample_next_token, logits, params, generator)}, args.repeats)
            print(f"| {rows} | {top_p} | {t['old'] * 1e3:.2f} | {t['new'] * 1e3:.2f} | {t['old'] / t['new']:.1f}× faster |")

    rows = 64
    probs = torch.softmax(random_logits(rows), dim=-1)  # (N, V): the float32 probabilities to sample
    target = probs.double() / probs.double().sum(-1, keepdim=True)  # (N, V)
    entropy = -(target * target.clamp_min(1e-300).log()).sum(-1).mean()
    cdf32, cdf64 = probs.cumsum(-1), probs.cumsum(-1, dtype=torch.float64)
    # torch's CPU cumsum adds in float64 and stores float32; a running sum kept in float32
    # (numpy's float32 cumsum) shows what a float32 accumulator adds on top of that
    cdf32_running = torch.from_numpy(np.cumsum(probs.numpy(), axis=-1, dtype=np.float32))
    t = interleaved_medians({"float32": lambda: draw(probs, torch.float32, generator),
                             "float64": lambda: draw(probs, torch.float64, generator)}, args.repeats)
    print(f"\nThe draw alone at {rows} rows (entropy {entropy:.1f} nats): how far the distribution it samples is "
          f"from the probabilities (worst row), and its median time:")
    print("| u and cumulative sum | total variation | largest error in one token's probability | ms |")
    print("|---|---|---|---|")
    for label, cdf, u_bits, seconds in (("float32 (cumsum adds in float64, stores float32)", cdf32, 24, t["float32"]),
                                        ("float32, running sum kept in float32", cdf32_running, 24, None),
                                        ("float64 (what sample_next_token does)", cdf64, 53, t["float64"])):
        error = (drawn_distribution(cdf, u_bits) - target).abs()  # (N, V)
        tv = 0.5 * error.sum(-1).max()
        ms = "–" if seconds is None else f"{seconds * 1e3:.2f}"
        print(f"| {label} | {tv:.1e} | {error.max():.1e} | {ms} |")
    print("(float64 arithmetic in this check itself is good to about 1e-12.)")


if __name__ == "__main__":
    main()
