"""Devices and clusters: the four numbers of a device that the formulas read, and a few
published ones.

A device is its memory, its two ceilings (dense matmul FLOP/s in the compute dtype, and
memory bandwidth in bytes/s: the roofline's two lines, Williams et al. 2009) and its link to
its neighbours. A cluster is N of one device. The numbers below are the vendors' published
dense (no sparsity) bf16 peaks and HBM bandwidths; real runs reach a fraction of them
(training 40-60% of the FLOP/s, decoding 60-80% of the bandwidth), which `derated` applies.

This machine's CPU has no published numbers worth trusting: `measure_cpu` measures them
in the process whose work they bound, the way every benchmark in benchmarks/ does (they
import these functions):

    matmul_flops()      float32 FLOP/s of a large square GEMM (the compute ceiling)
    copy_bandwidth()    bytes/s moved by a large tensor copy, read + write (the memory ceiling)

A shared machine's ceilings move with its load: take the best of several readings (noise
only ever adds time), and measure at the thread count of the work.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import time
from dataclasses import dataclass

GB = 1e9  # decimal gigabyte: vendors quote memory and bandwidth in these
GIB = 2**30


@dataclass(frozen=True)
class Device:
    """One accelerator (or one CPU): memory, the two roofline ceilings, and its link."""

    name: str
    memory_bytes: float
    flops_per_second: float  # dense matmul ceiling in the compute dtype (bf16 on GPUs, float32 here)
    bytes_per_second: float  # memory bandwidth: HBM on a GPU, a large copy's read + write on a CPU
    link_bytes_per_second: float  # to another device, one direction (NVLink, PCIe); weight sync rides it

    def __post_init__(self) -> None:
        for name in ("memory_bytes", "flops_per_second", "bytes_per_second", "link_bytes_per_second"):
            if not getattr(self, name) > 0:
                raise ValueError(f"device {self.name!r}: {name}={getattr(self, name)!r} must be > 0")

    @property
    def balance_flops_per_byte(self) -> float:
        """The ridge point: a kernel doing fewer FLOPs per byte moved than this is bandwidth-bound."""
        return self.flops_per_second / self.bytes_per_second

    def derated(self, compute: float, memory: float) -> Device:
        """The ceilings a real kernel reaches: `compute` of the FLOP/s, `memory` of the bandwidth."""
        if not (0 < compute <= 1 and 0 < memory <= 1):
            raise ValueError(f"derated(compute={compute}, memory={memory}): both are fractions in (0, 1]")
        return dataclasses.replace(self, name=f"{self.name} ×({compute:g} compute, {memory:g} memory)",
                                   flops_per_second=self.flops_per_second * compute,
                                   bytes_per_second=self.bytes_per_second * memory)


@dataclass(frozen=True)
class Cluster:
    """`gpus` identical devices. Memory adds up only for what is sharded across them."""

    device: Device
    gpus: int

    def __post_init__(self) -> None:
        if not isinstance(self.gpus, int) or self.gpus < 1:
            raise ValueError(f"cluster of {self.gpus!r} devices: give a positive integer")

    @property
    def memory_bytes(self) -> float:
        return self.device.memory_bytes * self.gpus

    def describe(self) -> str:
        return f"{self.gpus} × {self.device.name} ({self.device.memory_bytes / GB:.0f} GB each)"


# Vendors' datasheets: dense bf16 tensor-core FLOP/s, memory bandwidth, and the link per
# direction (NVLink 4 = 900 GB/s both ways on H100/H200, NVLink 3 = 600 GB/s on A100; an
# L4 has PCIe 4.0 x16 only).
DEVICES: dict[str, Device] = {d.name: d for d in [
    Device("h100-80gb", 80 * GB, 989e12, 3.35e12, 450 * GB),
    Device("h200-141gb", 141 * GB, 989e12, 4.8e12, 450 * GB),
    Device("a100-80gb", 80 * GB, 312e12, 2.039e12, 300 * GB),
    Device("a100-40gb", 40 * GB, 312e12, 1.555e12, 300 * GB),
    Device("l4-24gb", 24 * GB, 121e12, 300 * GB, 32 * GB),
]}


def device_named(name: str, memory_gb: float = 0.0) -> Device:
    """A published device by name, optionally with another memory size (e.g. a 94 GB H100 NVL)."""
    if name not in DEVICES:
        raise ValueError(f"device {name!r} is not known: expected one of {sorted(DEVICES)} or 'cpu' (measured)")
    device = DEVICES[name]
    return dataclasses.replace(device, memory_bytes=memory_gb * GB) if memory_gb else device


# ---- this machine, measured -------------------------------------------------------------


def best_time(fn, repeats: int) -> float:
    fn()  # warm-up: allocations, thread pool, caches
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)  # noise on a shared machine only ever adds time


def matmul_flops(n: int = 2048, repeats: int = 10) -> float:
    import torch  # here, not at the top: the published devices and every formula need no torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    return 2 * n**3 / best_time(lambda: a @ b, repeats)


def copy_bandwidth(megabytes: int = 512, repeats: int = 5) -> float:
    import torch

    src = torch.empty(megabytes * 2**20 // 4).normal_()
    dst = torch.empty_like(src)
    return 2 * src.numel() * 4 / best_time(lambda: dst.copy_(src), repeats)


def matmul_params(model) -> int:
    """Weights of a torch module that take part in a matmul per token (every Linear, the LM
    head included; an embedding lookup is a gather, not a matmul)."""
    import torch

    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def machine(earlier: dict | None = None) -> dict:
    """The ceilings now; with `earlier` (a reading from the start of the run), the higher of
    the two for each, since a ceiling measured low only means something else was running."""
    import torch

    now = {"cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
           "torch": torch.__version__, "matmul_gflops": matmul_flops() / 1e9, "copy_gbps": copy_bandwidth() / 1e9}
    if earlier:
        for key in ("matmul_gflops", "copy_gbps"):
            now[key] = max(now[key], earlier[key])
    return now


def describe(m: dict) -> str:
    return (f"{m['threads']} threads, torch {m['torch']}: matmul {m['matmul_gflops']:.0f} GFLOP/s (float32, "
            f"2048² GEMM), copy bandwidth {m['copy_gbps']:.1f} GB/s (read + write)")


def memory_total_bytes() -> float:
    """The machine's RAM (what a CPU 'device' holds)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def measure_cpu(threads: int = 0) -> Device:
    """This CPU as a Device: float32 GEMM FLOP/s and copy bandwidth measured now (a few
    seconds), its RAM as memory, and the copy bandwidth as its 'link' (processes on one
    machine exchange weights through memory). threads = 0: torch's current setting."""
    if threads:
        import torch

        torch.set_num_threads(threads)
    m = machine()
    return Device(f"cpu ({m['cpu']}, {m['threads']} threads, measured)", memory_total_bytes(),
                  m["matmul_gflops"] * GB, m["copy_gbps"] * GB, m["copy_gbps"] * GB)
