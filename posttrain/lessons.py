"""`posttrain lessons`: open the interactive lessons (marimo notebooks in lessons/).

    posttrain lessons              every lesson in a browser, starting at the index (marimo run)
    posttrain lessons 02           one lesson (also "2", "02_rollout_and_pi_old", or its file name)
    posttrain lessons --edit       the lessons folder in marimo's editor: change the code, re-run
    posttrain lessons 02 --edit    one lesson in the editor
    posttrain lessons --list       the lessons, one line each

Everything runs locally: marimo serves on 127.0.0.1, its update check is switched off, and
it is never allowed to build a sandbox (which would download packages). The lessons live in
the repository's lessons/ folder, beside this package, not inside it.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import socket
import subprocess
import sys
import threading
import webbrowser
from pathlib import Path

LESSONS_DIR = Path(__file__).resolve().parent.parent / "lessons"
INDEX = "index.py"
LESSON_FILE = re.compile(r"^(\d\d[a-z]?)_\w+\.py$")  # "02_rollout_and_pi_old.py" -> "02"


def lesson_files(directory: Path = LESSONS_DIR) -> dict[str, Path]:
    """{"00": path, "01": path, ...}: every lesson notebook in `directory`, in order."""
    found = {}
    for path in sorted(directory.glob("*.py")):
        match = LESSON_FILE.match(path.name)
        if match:
            found[match.group(1)] = path
    return found


def lesson_title(path: Path) -> str:
    """The first line of the notebook's module docstring ("Lesson 02 · Rollout: ...")."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or path.stem
    return doc.strip().splitlines()[0]


def resolve_lesson(name: str, directory: Path = LESSONS_DIR) -> Path:
    """The notebook a user means by `name`: "02", "2", "02_rollout_and_pi_old(.py)" or
    "index". Raises ValueError listing the valid lessons when there is no such lesson."""
    lessons = lesson_files(directory)
    key = name.strip().removesuffix(".py")
    if key == "index":
        return directory / INDEX
    if key.isdigit():
        key = f"{int(key):02d}"
    for number, path in lessons.items():
        if key in (number, path.stem):
            return path
    valid = "\n".join(f"  {number}  {lesson_title(path)}" for number, path in lessons.items())
    raise ValueError(f"no lesson {name!r} in {directory}; valid lessons:\n{valid}\n  index  the table of lessons")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_command(lesson: str | None, edit: bool, port: int, headless: bool,
                  directory: Path = LESSONS_DIR) -> tuple[list[str], str | None]:
    """(the marimo command line, the URL to open in a browser ourselves or None).

    Without a lesson, `run` serves the whole folder, so the index's links to the other
    lessons work, and we open the browser on the index itself (marimo would open its file
    gallery); `edit` opens the folder in marimo's file browser."""
    target = directory if lesson is None else resolve_lesson(lesson, directory)
    mode = "edit" if edit else "run"
    cmd = [sys.executable, "-m", "marimo", mode, str(target), "--host", "127.0.0.1", "--port", str(port)]
    cmd.append("--no-sandbox")  # a sandbox would install packages: never
    open_url = None
    if mode == "run" and lesson is None:
        cmd.append("--headless")  # we open the browser on the index instead of the gallery
        open_url = None if headless else f"http://127.0.0.1:{port}/?file={INDEX}"
    elif headless:
        cmd.append("--headless")
    return cmd, open_url


# --------------------------------------------------------------------------------------
# Pieces several notebooks share, so that each lesson shows the library call rather than
# ten lines of set-up. Imports are local: `posttrain lessons --list` stays instant.
# --------------------------------------------------------------------------------------


def tiny_policy(sft_steps: int = 100, seed: int = 0):
    """A tiny gpt_mini (dim 32, two layers, ~33k parameters) taught the `Final: <int>`
    format of level-1 arithmetic by `sft_steps` steps of the real SFT path (Trainer +
    sft_loss on demonstration_episodes), about 3 s on one thread.

    Returns (model, tokenizer, env, sft_losses). The model is in eval mode."""
    import torch

    from posttrain.envs.arithmetic import ArithmeticEnv
    from posttrain.models.gpt_mini import GPTMini, GPTMiniConfig
    from posttrain.models.tokenizer import CharTokenizer
    from posttrain.roles.controller import demonstration_episodes
    from posttrain.roles.trainer import Trainer, sft_loss
    from posttrain.types import RolloutBatch

    torch.manual_seed(seed)
    tok = CharTokenizer()
    env = ArithmeticEnv(level=1, cot=False)  # "Q: 3+4\n" -> "Final: 7"
    model = GPTMini(GPTMiniConfig(vocab_size=tok.vocab_size, dim=32, n_layer=2, n_head=2, hidden_dim=96,
                                  max_seq_len=48))
    demos = demonstration_episodes(env, tok, env.fixed_set("train", 90))
    # lr 1e-2: a tiny model and a format to learn fast; warmup keeps Adam's first steps sane
    trainer = Trainer(model, lr=1e-2, total_steps=sft_steps, warmup_steps=5)
    gen = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(sft_steps):
        rows = torch.randint(len(demos), (16,), generator=gen)
        losses.append(trainer.update(RolloutBatch.collate([demos[i] for i in rows.tolist()], tok.pad_id),
                                     sft_loss)["loss"])
    return model.eval(), tok, env, losses


def algorithm_pushes(batch, name: str, **params):
    """Run one registered algorithm on `batch` exactly as the controller and trainer do, at
    θ = θ_old (ratio 1). Returns (advantage of each row's first response token (B,),
    push on each row (B,), loss metrics); push = −Σ_t ∂loss/∂log π over the row's response:
    > 0 means the step makes that completion more likely. Rows the algorithm drops before
    training (DAPO's dynamic sampling) get NaN in both."""
    import dataclasses

    import torch

    from posttrain.algorithms import make_algorithm
    from posttrain.types import PolicyOutputs

    algo = make_algorithm(name, **params)
    rows = torch.arange(batch.batch_size)  # (B,) the rows the algorithm trains on
    if getattr(algo, "filter_batch", None) is not None:  # DAPO's dynamic sampling drops whole groups
        kept = {id(e) for e in algo.filter_batch(batch).episodes}
        rows = torch.tensor([b for b, e in enumerate(batch.episodes) if id(e) in kept], dtype=torch.long)
    # rows the algorithm dropped (dynamic sampling) are NaN: "not in the batch", unlike a 0
    adv = torch.full((batch.batch_size,), float("nan"))
    push = torch.full((batch.batch_size,), float("nan"))
    if rows.numel() == 0:  # nothing informative: nothing to train on
        return adv, push, {"kept_rows": 0.0}
    sub = batch.select(rows)
    scored = dataclasses.replace(sub, **algo.compute_advantages(sub))
    logp = sub.old_logp.clone().requires_grad_(True)  # (b, T) θ = θ_old
    values = torch.zeros_like(logp) if algo.uses_critic else None
    outputs = PolicyOutputs(logp=logp, entropy=torch.zeros_like(logp), values=values)
    loss, metrics = algo.compute_loss(outputs, scored)
    loss.backward()
    first = sub.response_mask.argmax(dim=1)  # (b,) first response column of each row
    adv[rows] = scored.advantages.gather(1, first[:, None])[:, 0]
    push[rows] = -(logp.grad * sub.response_mask).sum(dim=1)
    metrics["kept_rows"] = float(rows.numel())
    return adv, push, metrics


FAMILY = ("grpo", "rloo", "dr_grpo", "dapo")  # lessons 11–14: the same batch through each


def synthetic_batch(groups: list[list[tuple[float, int]]], prompt_len: int = 4):
    """A RolloutBatch with known rewards and response lengths and nothing else random:
    `groups[g]` lists (reward, response length) of the samples of prompt g. Every token
    has old_logp −1 (any constant would do: at θ = θ_old only the ratio, 1, matters)."""
    from posttrain.types import Episode, Example, RolloutBatch

    episodes = []
    for g, samples in enumerate(groups):
        example = Example(prompt=f"prompt {g}", expected_answer="")
        for reward, length in samples:
            if length < 1:
                raise ValueError(f"a response needs at least 1 token (its EOS), got length {length}")
            episodes.append(Episode(example=example, group_id=g, prompt_ids=[1] * prompt_len,
                                    response_ids=[5] * (length - 1) + [2], response_logp=[-1.0] * length,
                                    reward=float(reward)))
    return RolloutBatch.collate(episodes, pad_id=0)


def family_comparison(batch, params: dict[str, dict] | None = None, names=FAMILY) -> dict:
    """{name: (adv (B,), push (B,), metrics)} for each algorithm on the same batch, via
    `algorithm_pushes`; `params[name]` overrides that algorithm's defaults."""
    params = params or {}
    return {name: algorithm_pushes(batch, name, **params.get(name, {})) for name in names}


def family_markdown(batch, results: dict, focus: str, base: str = "grpo") -> str:
    """Two markdown tables (advantage, push) of `family_comparison` results: one row per
    completion, one column per entry of `results`, `focus` marked ▶, and every cell that
    differs from column `base` in **bold** — the diff the lesson is about (with a base other
    than GRPO, only the focus column is compared). Dropped rows read "dropped"."""
    names = list(results)
    lengths = batch.response_lengths().int().tolist()
    # against GRPO every other column is a diff worth seeing; against another base (DAPO and
    # its ablation) GRPO is only a reference column, and only the focus is compared
    compared = {n for n in names if n != base and (base == "grpo" or n == focus)}

    def table(k: int, fmt: str) -> str:
        head = "| row | group | reward | tokens | " + " | ".join(
            f"▶ {n}" if n == focus else n for n in names) + " |\n" + "|---" * (4 + len(names)) + "|\n"
        rows = []
        for b in range(batch.batch_size):
            cells = []
            for n in names:
                value = results[n][k][b].item()
                reference = results[base][k][b].item() if base in results else value
                if value != value:  # NaN: dropped before training
                    cells.append("**dropped**" if n in compared and reference == reference else "dropped")
                    continue
                text = fmt.format(value if abs(value) > 5e-5 else 0.0)  # no "-0.0000"
                differs = n in compared and (reference != reference
                                             or abs(value - reference) > 1e-4 * max(1.0, abs(reference)))
                cells.append(f"**{text}**" if differs else text)
            rows.append(f"| {b} | {int(batch.group_ids[b])} | {batch.rewards[b]:g} | {lengths[b]} | "
                        + " | ".join(cells) + " |\n")
        return head + "".join(rows)

    return ("**Advantage** (first response token):\n\n" + table(0, "{:+.3f}")
            + "\n**Push** on the whole completion, −Σ_t ∂loss/∂log π (> 0: made more likely):\n\n"
            + table(1, "{:+.4f}"))


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="posttrain lessons", description=__doc__.split("\n\n")[0])
    p.add_argument("lesson", nargs="?", default=None, help='lesson number ("02"), file name, or "index"; default: all')
    p.add_argument("--edit", action="store_true", help="open in marimo's editor instead of read-only app mode")
    p.add_argument("--port", type=int, default=0, help="port to serve on (default: a free one)")
    p.add_argument("--headless", action="store_true", help="do not open a browser; print the URL")
    p.add_argument("--list", action="store_true", help="list the lessons and exit")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if not LESSONS_DIR.is_dir():
        print(f"posttrain lessons: error: no lessons folder at {LESSONS_DIR}; the lessons ship with the "
              "repository, not the wheel: run this from a clone (pip install -e .)", file=sys.stderr)
        return 2
    if args.list:
        for number, path in lesson_files().items():
            print(f"{number}  {lesson_title(path)}  ({path.relative_to(LESSONS_DIR.parent)})")
        return 0
    try:
        import marimo  # noqa: F401  (only to fail early with a clear message)
    except ImportError:
        print("posttrain lessons: error: marimo is not installed; run: pip install marimo", file=sys.stderr)
        return 2
    try:
        cmd, open_url = build_command(args.lesson, args.edit, args.port or _free_port(), args.headless)
    except ValueError as err:
        print(f"posttrain lessons: error: {err}", file=sys.stderr)
        return 2
    env = dict(os.environ, MARIMO_SKIP_UPDATE_CHECK="1")
    if open_url:
        # give the server a moment to bind before the browser asks for the page
        threading.Timer(2.0, webbrowser.open, args=(open_url,)).start()
    print(" ".join(cmd), flush=True)
    try:
        return subprocess.call(cmd, env=env, cwd=LESSONS_DIR.parent)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
