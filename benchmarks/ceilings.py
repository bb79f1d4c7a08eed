"""The machine's two ceilings, measured in the same process as the workload they bound.

    matmul_flops()      float32 FLOP/s of a large square GEMM (compute ceiling)
    copy_bandwidth()    bytes/s moved by a large tensor copy, read + write (memory ceiling)

A workload's roofline bound is the time it would take if it ran at whichever ceiling
binds: max(FLOPs / matmul_flops, bytes / copy_bandwidth). Decoding a few rows is
bandwidth-bound (every weight is read once per token, whatever the batch); a large batch
or a training step is compute-bound.
"""

from __future__ import annotations

import platform
import time

import torch


def best_time(fn, repeats: int) -> float:
    fn()  # warm-up: allocations, thread pool, caches
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)  # noise on a shared machine only ever adds time


def matmul_flops(n: int = 2048, repeats: int = 10) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    return 2 * n**3 / best_time(lambda: a @ b, repeats)


def copy_bandwidth(megabytes: int = 512, repeats: int = 5) -> float:
    src = torch.empty(megabytes * 2**20 // 4).normal_()
    dst = torch.empty_like(src)
    return 2 * src.numel() * 4 / best_time(lambda: dst.copy_(src), repeats)


def matmul_params(model: torch.nn.Module) -> int:
    """Weights that take part in a matmul per token (every Linear, the LM head included;
    an embedding lookup is a gather, not a matmul)."""
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def machine(earlier: dict | None = None) -> dict:
    """The ceilings now; with `earlier` (a reading from the start of the run), the higher of
    the two for each, since a ceiling measured low only means something else was running."""
    now = {"cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
           "torch": torch.__version__, "matmul_gflops": matmul_flops() / 1e9, "copy_gbps": copy_bandwidth() / 1e9}
    if earlier:
        for key in ("matmul_gflops", "copy_gbps"):
            now[key] = max(now[key], earlier[key])
    return now


def describe(m: dict) -> str:
    return (f"{m['threads']} threads, torch {m['torch']}: matmul {m['matmul_gflops']:.0f} GFLOP/s (float32, "
            f"2048² GEMM), copy bandwidth {m['copy_gbps']:.1f} GB/s (read + write)")


if __name__ == "__main__":
    print(describe(machine()))
