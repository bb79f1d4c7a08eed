"""The code exercises of the systems lessons (22b and after) for `posttrain check`:
each one's reference, computed by posttrain/systems, its cases and its hint; check.py
registers them beside lessons 00-14's. The library's answers are plain Python numbers, so
each reference returns them as a float64 tensor, the shape the stub returns.
"""

from __future__ import annotations

import torch

from posttrain.systems import stragglers


def _ref_decode_by_patch(lengths, a, b, cap):
    L = lengths.tolist()
    return torch.tensor([stragglers.static_batch_seconds(L, a, b), stragglers.decode_seconds(L, a, b),
                         stragglers.decode_seconds([min(x, cap) for x in L], a, b)], dtype=torch.float64)


def _decode_cases():
    typical = torch.tensor(stragglers.expected_lengths(256, 20.0, 1.0), dtype=torch.float64)
    return [
        ("one straggler among short rows", (torch.tensor([3.0, 1.0, 2.0, 7.0]), 1.0, 0.1, 5.0)),
        ("every row the same length: packing changes nothing", (torch.tensor([4.0, 4.0, 4.0]), 0.5, 0.2, 10.0)),
        ("a cap above every row changes nothing", (torch.tensor([5.0, 9.0, 2.0]), 0.3, 0.05, 100.0)),
        ("256 log-normal rows (mean 20, cv 1), our sampler's a and b, cap 80", (typical, 6.5e-3, 2e-4, 80.0)),
    ]


# lesson: (the stub's function, the library's answer, the cases, the hint said on any failure)
SYSTEMS_EXERCISES = {
    "22b": ("decode_seconds_by_patch", _ref_decode_by_patch, _decode_cases,
        "static = (a + b·n)·max(L); packed = a·max(L) + b·ΣL; capped = packed on min(L, cap). "
        "Use lengths.max(), lengths.sum() and lengths.clamp(max=cap); return torch.stack or torch.tensor "
        "of the three. See straggler_patches in posttrain/systems/stragglers.py."),
}
