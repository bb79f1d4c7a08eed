"""Scorer latency: p50 / p99 of `score()` for every spec on inputs from 10 bytes to 1 MB,
including adversarial ones (whitespace runs, giant integers, many Final lines).

Target (issue #4): p99 under 50 ms on inputs up to 1 MB.

    python benchmarks/scorer_latency.py
"""

from __future__ import annotations

import random
import statistics
import time

from posttrain.verifiers.final_int import SPECS, score
from posttrain.types import Example

TARGET_P99_MS = 50.0


def inputs(rng: random.Random) -> list[str]:
    texts = []
    for size in (10, 1_000, 100_000, 1_000_000):
        texts += [
            "Final: " + "1" * size,
            "Final:" + " " * size + "25",
            ("Final: 25\n" * (size // 10 + 1))[:size],
            "\n" * size,
            "1 " * (size // 2 + 1),
            "".join(rng.choice("0123456789+-=,:Final \n") for _ in range(min(size, 200_000))),
        ]
    return texts


def main() -> dict:
    example = Example("Q: 1+2\n", "25")
    texts = inputs(random.Random(0))
    results = {}
    for version in SPECS:
        times = []
        for text in texts:
            for _ in range(3):
                start = time.perf_counter()
                score(example, text, version)
                times.append((time.perf_counter() - start) * 1000)
        times.sort()
        p99 = times[min(len(times) - 1, int(0.99 * len(times)))]
        results[version] = {"p50_ms": statistics.median(times), "p99_ms": p99, "max_ms": times[-1]}
        verdict = "meets" if p99 < TARGET_P99_MS else "MISSES"
        print(f"{version:36s} p50 {results[version]['p50_ms']:7.2f} ms  p99 {p99:7.2f} ms  "
              f"({verdict} the {TARGET_P99_MS:.0f} ms target)")
    return results


if __name__ == "__main__":
    main()
