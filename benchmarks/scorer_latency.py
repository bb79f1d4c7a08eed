"""Scorer latency: p50 / p99 of `score()` for every spec on inputs from 10 bytes to 1 MB,
including adversarial ones (whitespace runs, giant integers, many Final lines).

Target (issue #4): p99 under 50 ms on inputs up to 1 MB.

The code verifier is measured apart, per example: each score is a sandboxed run (issue #17:
one probe run for the tests the trainer judges, a second only for tests that must run
whole in the sandbox). No target; ~35 ms per example in namespace mode on 2 busy cores.

    python benchmarks/scorer_latency.py
"""

from __future__ import annotations

import random
import statistics
import time

from posttrain.types import Example
from posttrain.verifiers import code
from posttrain.verifiers.final_int import SPECS, score

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
    results.update(code_latency())
    return results


def code_latency(repeats: int = 20) -> dict:
    """p50 / p90 of code/tests-v1 on a 3-test `add` problem: right, wrong, and with one test
    the trainer cannot judge (a loop), which costs a second sandbox run."""
    tests = ["assert add(2, 3) == 5", "assert add(-1, 1) == 0", "assert add(0, 0) == 0"]
    cases = {"right": (tests, "def add(a, b): return a + b"), "wrong": (tests, "def add(a, b): return a - b"),
             "one test in the sandbox": (tests[:2] + ["for a in range(3):\n    assert add(a, 0) == a"],
                                         "def add(a, b): return a + b")}  # fmt: skip
    results = {}
    for name, (case_tests, completion) in cases.items():
        example = Example("Write add(a, b).", "", meta={"tests": case_tests})
        code.score(example, completion)  # the first run also probes for namespaces
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            code.score(example, completion)
            times.append((time.perf_counter() - start) * 1000)
        times.sort()
        results[f"code/tests-v1 ({name})"] = {"p50_ms": statistics.median(times), "p90_ms": times[int(0.9 * repeats)]}
        print(f"code/tests-v1, {name:24s} p50 {statistics.median(times):7.2f} ms  p90 {times[int(0.9 * repeats)]:7.2f} ms")
    return results


if __name__ == "__main__":
    main()
