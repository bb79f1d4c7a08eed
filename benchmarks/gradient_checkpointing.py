"""What model.gradient_checkpointing trades: one training step of gpt_mini (forward to the
next-token loss, backward, AdamW) with and without it, step time and memory side by side.

    cd benchmarks && ../.venv/bin/python gradient_checkpointing.py [--dim 256 --layers 8 --batch 16 --tokens 256]

Memory: each setting runs in a fresh process of its own (`--one plain|checkpointed`), so its
peak resident memory (ru_maxrss, which the kernel never lowers) is its own. Two readings:

    saved for backward  the bytes of the distinct tensors autograd keeps between forward and
                        backward (torch.autograd.graph.saved_tensors_hooks): the activations
                        that checkpointing drops, counted exactly, whatever the allocator does
    peak above start    the step's high-water mark of resident memory minus the process's
                        resident memory before it: the whole step, weights' gradients, AdamW's
                        state and the allocator's slack included

Time: both settings in this process, alternating step by step so that other jobs' load
falls on both alike; the median of --repeats steps after a warm-up one. Random tokens: the
time and memory of a step do not depend on what the tokens are.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

from posttrain.config import ModelConfig
from posttrain.models import make_policy

MB = 2**20
SETTINGS = ("plain", "checkpointed")


def resident_bytes() -> int:
    """This process's resident memory now (Linux /proc)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def saved_bytes(model: torch.nn.Module, ids: torch.Tensor) -> int:
    """Bytes of the distinct tensors one forward pass to the loss keeps for backward."""
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()  # a view shares its base's storage: counted once
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        step_loss(model, ids)
    return sum(storages.values())


def step_loss(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    logits = model(ids[:, :-1])  # (B, T-1, V)
    return F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())


def build(setting: str, args: argparse.Namespace) -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.Tensor]:
    """A fresh gpt_mini of the asked size (seed 0), its optimizer and a batch of random tokens."""
    torch.manual_seed(0)
    cfg = ModelConfig(dim=args.dim, n_layer=args.layers, n_head=args.dim // 64, hidden_dim=args.dim * 11 // 4,
                      max_seq_len=args.tokens, gradient_checkpointing=setting == "checkpointed")
    model, tokenizer = make_policy(cfg)
    ids = torch.randint(0, tokenizer.vocab_size, (args.batch, args.tokens))  # (B, T)
    return model.train(), torch.optim.AdamW(model.parameters(), lr=1e-4), ids


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, ids: torch.Tensor) -> float:
    began = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    step_loss(model, ids).backward()
    optimizer.step()
    return time.perf_counter() - began


def memory(setting: str, args: argparse.Namespace) -> dict:
    """One setting's memory, measured in a process of its own: two steps (the second with
    AdamW's state already there), the high-water mark of the whole process above its start."""
    model, optimizer, ids = build(setting, args)
    saved = saved_bytes(model, ids)
    start = resident_bytes()
    for _ in range(2):
        train_step(model, optimizer, ids)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    return {"saved_mb": saved / MB, "peak_above_start_mb": (peak - start) / MB,
            "params_m": sum(p.numel() for p in model.parameters()) / 1e6}


def step_times(args: argparse.Namespace) -> dict[str, float]:
    """Median seconds per step of each setting, the two alternating step by step in this
    process so that other jobs' load falls on both alike; one warm-up step each."""
    runs = {setting: build(setting, args) for setting in SETTINGS}
    times: dict[str, list[float]] = {setting: [] for setting in SETTINGS}
    for repeat in range(args.repeats + 1):
        for setting, run in runs.items():
            seconds = train_step(*run)
            if repeat:
                times[setting].append(seconds)
    return {setting: statistics.median(t) for setting, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=256, help="tokens per row")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--one", choices=SETTINGS, help=argparse.SUPPRESS)  # the memory of one, alone
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.one:
        print(json.dumps(memory(args.one, args)))
        return
    rows = {}
    for setting in SETTINGS:
        out = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--one", setting],
                             check=True, capture_output=True, text=True).stdout
        rows[setting] = json.loads(out.splitlines()[-1])
    for setting, seconds in step_times(args).items():
        rows[setting]["step_s"] = seconds
    plain, checkpointed = rows["plain"], rows["checkpointed"]
    print(f"gpt_mini {plain['params_m']:.1f}M parameters, dim {args.dim}, {args.layers} layers, "
          f"{args.batch} rows × {args.tokens} tokens, {args.threads} threads, torch {torch.__version__}")
    print("command: " + " ".join(["python", "benchmarks/gradient_checkpointing.py", *sys.argv[1:]]))
    print(f"{'':26}{'plain':>10}{'checkpointed':>14}{'ratio':>8}")
    for key, label in (("step_s", f"step time (s, median of {args.repeats})"), ("saved_mb", "saved for backward (MB)"),
                       ("peak_above_start_mb", "peak above start (MB)")):
        print(f"{label:26}{plain[key]:10.2f}{checkpointed[key]:14.2f}{checkpointed[key] / plain[key]:8.2f}")


if __name__ == "__main__":
    main()
