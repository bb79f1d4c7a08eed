"""The machine's two ceilings (posttrain/systems/hardware.py), under the name the
benchmark scripts import: `from ceilings import describe, machine`.

    python benchmarks/ceilings.py      prints them for this machine
"""

from __future__ import annotations

from posttrain.systems.hardware import best_time, copy_bandwidth, describe, machine, matmul_flops, matmul_params

__all__ = ["best_time", "copy_bandwidth", "describe", "machine", "matmul_flops", "matmul_params"]

if __name__ == "__main__":
    print(describe(machine()))
