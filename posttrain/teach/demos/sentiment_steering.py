"""Steer a small language model toward positive text with PPO, and pay the alignment tax.

The classic RLHF sentiment experiment (Ziegler et al. 2019, arXiv:1909.08593, Sec. 4.1),
small enough for a laptop CPU:

    1. pretrain  gpt_mini (character level) learns to write short reviews from a bundled,
                 mood-balanced corpus (posttrain/teach/demos/reviews.py): it starts near-neutral.
    2. reward    VADER (Hutto & Gilbert 2014), a rule-based sentiment analyser, scores
                 each completion: its compound score, −1 (negative) .. +1 (positive).
                 It stands in for a learned reward model: fixed, imperfect, exploitable.
    3. PPO       for each β, from the same pretrained model: rollout engine, a value head
                 as critic, the frozen reference, the library's PPO (GAE, clipped
                 surrogate, per-token KL penalty in the reward),

                     r_t = −β (log π(y_t) − log π_ref(y_t)) + [t is last] · VADER(y)

The KL anchor is the only thing that stops the policy from trading everything for reward.
With a large β it barely moves; as β shrinks the reward climbs and the text narrows: the
same few most-positive words, "!" (VADER reads it as emphasis), and shorter completions (a
review that stops after "great!" cannot say anything negative). With β = 0 the default run
ends writing "The pizza was great!", "The staff was great!", ... for nearly every opening.
That loss of variety bought with reward is the alignment tax; the demo measures it after
training, on the same prompts and random draws for every β, as distinct-1/2 (unique word
uni-/bigrams over all completions), mean token entropy, and the share of real words.

    posttrain demo sentiment_steering                 # 3 β values: ~45 s of CPU (one thread)
    posttrain demo sentiment_steering --full          # 5 β values, 150 steps each: ~6 min of CPU
    posttrain demo sentiment_steering --betas 0.1,0   # any β list
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from importlib.metadata import version

import torch
from rich.markup import escape
from rich.table import Table

from posttrain.algorithms.core import kl_k1, masked_mean, masked_sum
from posttrain.algorithms.ppo import PPO
from posttrain.config import SamplingParams
from posttrain.models.gpt_mini import GPTMini, GPTMiniConfig
from posttrain.models.logprobs import token_entropy
from posttrain.models.tokenizer import CharTokenizer
from posttrain.models.value_head import ValueHead
from posttrain.roles.environment import score_episodes
from posttrain.roles.reference import Reference
from posttrain.roles.engines import make_engine
from posttrain.roles.engines.contract import encode_prompt
from posttrain.roles.trainer import Trainer, sft_loss
from posttrain.roles.weight_sync import InProcessWeightSync
from posttrain.teach.demos import reviews
from posttrain.teach.demos.common import demo_parser, finish_run, one_torch_thread, pyplot, save_figure, start_run
from posttrain.teach.demos.sentiment_measures import (
    CORPUS_SIZE,
    distinct_n,
    real_word_fraction,
    score,
)
from posttrain.types import Episode, Example, RolloutBatch, Tokenizer

# --------------------------------------------------------------------------------------
# Settings: the defaults run in about a minute; --full fills the None fields from FULL
# --------------------------------------------------------------------------------------


def arg(default, help: str):
    """A config field whose help text becomes its `--help` line."""
    return dataclasses.field(default=default, metadata={"help": help})


@dataclasses.dataclass
class Config:
    seed: int = arg(0, "seeds the model's initialisation, every prompt draw and every sample")
    out_dir: str = arg("runs", "parent folder of the run directory")
    full: bool = arg(False, "the longer run: five β values, more and larger PPO steps, a longer pretraining (~6 min)")
    betas: str | None = arg(None, "comma-separated KL coefficients β, each trained from the same start "
                                  "(default 1,0.1,0: stay put, trade, collapse; --full 1,0.3,0.1,0.03,0)")
    steps: int | None = arg(None, "PPO steps per β (default 40, --full 150)")
    prompts_per_step: int | None = arg(None, "review openings per PPO step, drawn from the corpus's 40 "
                                             "(default 8, --full 16)")
    samples_per_prompt: int = arg(4, "completions per opening (B = 32 rows per step by default); PPO's baseline "
                                     "is the value head, not the group, so a few per opening suffice")
    pretrain_steps: int | None = arg(None, "steps of next-token training on the review corpus "
                                           "(default 200, --full 800)")
    # Measured at 40 steps: 1e-3 made β = 1 blow up (KL 5.8 nats after one step, 200 after 20, letter soup)
    # and collapsed β = 0.1 as far as β = 0; 3e-4 keeps the β values apart. Cosine decay to 10% over the run.
    lr: float = arg(3e-4, "PPO's AdamW step (1e-3 makes even β = 1 diverge)")
    epochs: int = arg(2, "passes over each rollout batch: PPO's sample reuse, which the clip makes safe")
    minibatches: int = arg(1, "optimizer steps per pass: 1, since 32 rows are already a small batch")
    eval_samples: int = arg(4, "completions per opening for the before/after measurements: 160 texts, so the "
                               "difference between two β values is not sampling noise")
    max_new_tokens: int = arg(64, "cap on a completion: room for 99.9% of the corpus's continuations "
                                  "(mean 28 characters, longest 66)")


DEFAULT = {"betas": "1,0.1,0", "steps": 40, "prompts_per_step": 8, "pretrain_steps": 200}
FULL = {"betas": "1,0.3,0.1,0.03,0", "steps": 150, "prompts_per_step": 16, "pretrain_steps": 800}

# The model: 65k parameters, 2 layers. A character model this small learns to spell the corpus's
# 60 words in seconds (200 steps: ~90% of sampled words are corpus words) and
# samples a step's 32 completions in a fraction of a second.
MODEL = dict(dim=48, n_layer=2, n_head=4, hidden_dim=128, max_seq_len=96)
PRETRAIN_BATCH = 32  # corpus reviews per pretraining step
PRETRAIN_LR = 6e-3  # a tiny model from scratch takes large steps; warmup keeps the first ones sane


# --------------------------------------------------------------------------------------
# Step 1: pretrain gpt_mini on the review corpus (the SFT model every β starts from)
# --------------------------------------------------------------------------------------


def pretrain(cfg: Config, tokenizer: CharTokenizer, log=print) -> GPTMini:
    """Next-token training on the continuations of corpus reviews, through the library's
    Trainer and `sft_loss` (the prompt is context, the continuation is learned)."""
    torch.manual_seed(cfg.seed)  # the model's initialisation
    model = GPTMini(GPTMiniConfig(vocab_size=tokenizer.vocab_size, **MODEL))
    corpus = [
        Episode(example=Example(prompt, ""), group_id=i, prompt_ids=encode_prompt(tokenizer, prompt),
                response_ids=(ids := tokenizer.encode(response) + [tokenizer.eos_id]), response_logp=[0.0] * len(ids))
        for i, (prompt, response) in enumerate(reviews.reviews(CORPUS_SIZE))
    ]
    trainer = Trainer(model, lr=PRETRAIN_LR, total_steps=cfg.pretrain_steps, warmup_steps=cfg.pretrain_steps // 10)
    gen = torch.Generator().manual_seed(cfg.seed)
    for step in range(cfg.pretrain_steps):
        rows = torch.randint(len(corpus), (PRETRAIN_BATCH,), generator=gen).tolist()
        metrics = trainer.update(RolloutBatch.collate([corpus[i] for i in rows], tokenizer.pad_id), sft_loss)
        if (step + 1) % max(1, cfg.pretrain_steps // 5) == 0:
            log(f"pretrain step {step + 1:4d}/{cfg.pretrain_steps}  loss {metrics['loss']:.3f} nats/char")
    return model.eval()


# --------------------------------------------------------------------------------------
# Measurement: the same prompts and random draws before training and after each β
# --------------------------------------------------------------------------------------


@torch.no_grad()
def evaluate(policy: GPTMini, reference: Reference, tokenizer: Tokenizer, cfg: Config) -> dict:
    """Sample eval_samples completions of every corpus opening, with a generator seeded
    the same way every time, and measure reward, KL to the reference, diversity, entropy."""
    engine = make_engine(copy.deepcopy(policy), tokenizer, SamplingParams(max_new_tokens=cfg.max_new_tokens))
    examples = [Example(p, "", id=str(i)) for i, p in enumerate(reviews.prompts())]
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    episodes = score_episodes(score, engine.generate(examples, cfg.eval_samples, gen))
    batch = RolloutBatch.collate(episodes, tokenizer.pad_id)
    batch.ref_logp = reference.logp(batch)
    mask = batch.response_mask
    texts = [e.completion for e in episodes]
    return {
        "reward": float(batch.rewards.mean()),
        "kl": sequence_kl(batch),
        "distinct_1": distinct_n(texts, 1),
        "distinct_2": distinct_n(texts, 2),
        "entropy": masked_mean(token_entropy(policy(batch.tokens)), mask).item(),
        "real_words": real_word_fraction(texts),
        "length": float(mask.sum(1).mean()),
        "samples": [(e.example.prompt, e.completion, e.reward) for e in episodes],
    }


def sequence_kl(batch: RolloutBatch) -> float:
    """KL(π ‖ π_ref) of whole completions in nats, estimated on the batch: the mean over rows
    of log π(y) − log π_ref(y) = Σ_t k1_t, exactly what the penalty charges a completion
    (÷ β). Unbiased on samples from π. Not k3: its exp(log π_ref − log π) term explodes on
    the rare sampled token that π has all but ruled out (measured: one batch read 137 nats
    with k3, the steps around it 7)."""
    return masked_sum(kl_k1(batch.old_logp, batch.ref_logp), batch.response_mask, dim=1).mean().item()


# --------------------------------------------------------------------------------------
# Step 2: PPO toward VADER's reward, one run per β
# --------------------------------------------------------------------------------------


def ppo_run(start: GPTMini, beta: float, tokenizer: Tokenizer, cfg: Config, log=print) -> tuple[list[dict], GPTMini]:
    """cfg.steps PPO steps from `start` with KL coefficient β. The loop is the controller's
    rl_step, spelled out: sample → score → reference and critic → advantage → update → sync.
    Returns (one metrics row per step, the trained policy)."""
    policy = copy.deepcopy(start).train()
    reference = Reference(start)  # the frozen anchor: the pretrained model itself
    engine = make_engine(copy.deepcopy(policy), tokenizer, SamplingParams(max_new_tokens=cfg.max_new_tokens))
    sync = InProcessWeightSync(policy, engine)
    critic = ValueHead(policy.config.dim)  # V(prefix) on the policy's hidden states
    trainer = Trainer(policy, lr=cfg.lr, total_steps=cfg.steps, critic=critic)
    # kl_coef = β puts −β·k1 on every response token's reward; β = 0 ignores the reference.
    algo = PPO(kl_coef=beta)
    prompts = [Example(p, "", id=str(i)) for i, p in enumerate(reviews.prompts())]
    gen = torch.Generator().manual_seed(cfg.seed)  # the same prompt draws and samples for every β until they diverge
    rows = []
    for step in range(cfg.steps):
        picks = torch.randint(len(prompts), (cfg.prompts_per_step,), generator=gen).tolist()
        episodes = engine.generate([prompts[i] for i in picks], cfg.samples_per_prompt, gen)  # 1. sample
        score_episodes(score, episodes)  # 2. score
        batch = RolloutBatch.collate(episodes, tokenizer.pad_id)
        batch.ref_logp = reference.logp(batch)  # 3. reference (always: the KL is reported for β = 0 too)
        batch.values = trainer.values(batch)  # V at sampling time
        batch = dataclasses.replace(batch, **algo.compute_advantages(batch))  # 4. advantage
        metrics = trainer.update(batch, algo, cfg.epochs, cfg.minibatches, gen)  # 5. update
        sync.push()  # 6. sync
        texts = [e.completion for e in episodes]
        row = {"beta": beta, "step": step + 1, "reward": float(batch.rewards.mean()), "kl": sequence_kl(batch),
               "entropy": metrics["entropy"], "distinct_1": distinct_n(texts, 1), "distinct_2": distinct_n(texts, 2),
               "length": float(batch.response_mask.sum(1).mean()), "clipfrac": metrics["clipfrac"],
               "approx_kl": metrics["approx_kl"], "value_loss": metrics["value_loss"],
               "explained_variance": metrics["explained_variance"]}
        rows.append(row)
        if (step + 1) % max(1, cfg.steps // 6) == 0 or step == 0:
            log(f"  β={beta:<5g} step {step + 1:3d}/{cfg.steps}  reward {row['reward']:+.3f}  "
                f"KL {row['kl']:6.2f} nats  entropy {row['entropy']:.2f}  distinct-2 {row['distinct_2']:.2f}  "
                f"len {row['length']:4.1f}  e.g. {escape(repr(texts[0]))}")
    return rows, policy.eval()


# --------------------------------------------------------------------------------------
# Plumbing: arguments, table, CSV, plot, run directory
# --------------------------------------------------------------------------------------

CSV_COLUMNS = ("beta", "step", "reward", "kl", "entropy", "distinct_1", "distinct_2", "length", "clipfrac",
               "approx_kl", "value_loss", "explained_variance")


def parse_args(argv: list[str]) -> Config:
    fields = {f.name: f for f in dataclasses.fields(Config)}
    helps = {name: f.metadata["help"].replace("%", "%%") for name, f in fields.items()}  # argparse %-formats help
    p = demo_parser("sentiment_steering", __doc__, seed_help=helps["seed"])
    p.add_argument("--full", action="store_true", help=helps["full"])
    p.add_argument("--betas", help=helps["betas"])
    for name, f in fields.items():
        if name in ("seed", "out_dir", "full", "betas"):
            continue
        # the annotation is a string under `from __future__ import annotations`: "int", "int | None", "float"
        kind = {"int": int, "float": float}[f.type.removesuffix(" | None")]
        p.add_argument("--" + name.replace("_", "-"), type=kind, default=f.default, help=helps[name])
    args = p.parse_args(argv)
    for key, value in (FULL if args.full else DEFAULT).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    try:
        betas = [float(b) for b in args.betas.split(",")]
    except ValueError:
        p.error(f"--betas must be comma-separated numbers, got {args.betas!r}")
    if not betas or not all(math.isfinite(b) and b >= 0 for b in betas):
        p.error(f"every β must be a finite number >= 0 (0 = no KL anchor), got {args.betas!r}")
    if len(set(betas)) < len(betas):
        p.error(f"--betas lists a value twice ({args.betas!r}); each β is one run, list it once")
    positive = ("steps", "prompts_per_step", "samples_per_prompt", "epochs", "minibatches", "eval_samples",
                "max_new_tokens")
    for name in positive + ("pretrain_steps",):
        if getattr(args, name) < (1 if name in positive else 0):
            p.error(f"--{name.replace('_', '-')} must be >= {1 if name in positive else 0}, got {getattr(args, name)}")
    if not (math.isfinite(args.lr) and args.lr > 0):
        p.error(f"--lr must be a positive number, got {args.lr}")
    if args.minibatches > args.prompts_per_step * args.samples_per_prompt:
        p.error(f"--minibatches {args.minibatches} exceeds the {args.prompts_per_step * args.samples_per_prompt} "
                "rows of a step (prompts-per-step x samples-per-prompt)")
    prompt_len = max(len(p) for p in reviews.prompts()) + 1  # + <bos>
    if prompt_len + args.max_new_tokens > MODEL["max_seq_len"]:
        p.error(f"--max-new-tokens {args.max_new_tokens} + the longest prompt ({prompt_len} tokens) exceeds the "
                f"model's {MODEL['max_seq_len']} positions; use at most {MODEL['max_seq_len'] - prompt_len}")
    return Config(**{**vars(args), "betas": ",".join(f"{b:g}" for b in betas)})


def _smooth(values: list[float], window: int = 5) -> list[float]:
    """Trailing running mean: one 32-row batch's reward is noisy (±0.15), its trend is not."""
    return [sum(values[max(0, i - window + 1) : i + 1]) / (i + 1 - max(0, i - window + 1)) for i in range(len(values))]


def _plot(path, curves: dict[float, list[dict]], before: dict, after: dict[float, dict]) -> None:
    plt = pyplot()
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 4.3))
    for i, (beta, rows) in enumerate(curves.items()):
        steps, color = [r["step"] for r in rows], f"C{i}"
        for ax, key in ((ax1, "reward"), (ax2, "kl")):
            ax.plot(steps, [r[key] for r in rows], color=color, alpha=0.25, lw=1)
            ax.plot(steps, _smooth([r[key] for r in rows]), color=color, lw=2, label=f"β = {beta:g}")
    ax1.axhline(before["reward"], color="gray", ls="--", lw=1, label="pretrained model")
    ax1.set(xlabel="PPO step", ylabel="mean VADER compound of the batch", title="reward rises as β shrinks")
    ax1.legend(fontsize=8)
    ax2.set(xlabel="PPO step", ylabel="KL(π ‖ π_ref) per completion [nats]", title="how far each policy drifted")
    ax2.legend(fontsize=8)
    # the alignment tax: reward bought with variety, one point per β in its curve's colour (+ the start, gray)
    points = [("start", before)] + [(f"β={b:g}", m) for b, m in after.items()]
    colors = ["gray"] + [f"C{i}" for i in range(len(after))]
    for key, marker, style, label in (("entropy", "s", "--", "token entropy [nats]"),
                                      ("distinct_2", "o", "-", "distinct-2"), ("distinct_1", "^", ":", "distinct-1")):
        xs, ys = [m["reward"] for _, m in points], [m[key] for _, m in points]
        ax3.plot(xs, ys, style, color="black", lw=1, marker=marker, mfc="white", mec="black", label=label)
        ax3.scatter(xs, ys, c=colors, marker=marker, s=40, zorder=3)
    for (name, m), color in zip(points, colors):
        ax3.annotate(name, (m["reward"], m["entropy"]), textcoords="offset points", xytext=(4, 6), fontsize=8,
                     color=color)
    top = max(m[key] for _, m in points for key in ("entropy", "distinct_1", "distinct_2"))
    ax3.set(xlabel="mean VADER reward after training (same prompts and draws)", ylim=(0, 1.12 * top),
            title="the alignment tax: reward bought with variety")
    ax3.legend(fontsize=8)
    save_figure(fig, path)


def _table(before: dict, after: dict[float, dict], steps: int) -> Table:
    table = Table(title=f"before and after {steps} PPO steps, on the same {len(before['samples'])} prompts and draws")
    for col in ("β", "reward", "Δ reward", "KL(π‖π_ref) [nats]", "distinct-1", "distinct-2", "token entropy",
                "real words", "length"):
        table.add_column(escape(col), justify="right", no_wrap=True)
    for name, m in [("start", before), *((f"{b:g}", m) for b, m in after.items())]:
        kl = round(m["kl"], 2) + 0.0  # + 0.0 turns the start's rounded -0.0 into 0.0
        table.add_row(name, f"{m['reward']:+.3f}", f"{m['reward'] - before['reward']:+.3f}", f"{kl:.2f}",
                      f"{m['distinct_1']:.3f}", f"{m['distinct_2']:.3f}", f"{m['entropy']:.3f}",
                      f"{m['real_words']:.0%}", f"{m['length']:.1f}")
    return table


@one_torch_thread()  # a 65k-parameter model: a second thread only adds wake-up latency
def main(argv: list[str]) -> int:
    cfg = parse_args(argv)
    reward = f"vaderSentiment {version('vaderSentiment')} compound score of the completion"
    console, run = start_run("sentiment_steering", cfg, fit_tables=True, seed=cfg.seed,
                             corpus=reviews.CORPUS_VERSION, reward=reward, model=MODEL)
    start = time.perf_counter()
    betas = [float(b) for b in cfg.betas.split(",")]
    tokenizer = CharTokenizer()
    console.print(f"[bold]Sentiment steering[/bold]: gpt_mini pretrained on {CORPUS_SIZE:,} bundled reviews, then "
                  f"PPO toward VADER's compound score for β in {betas}, {cfg.steps} steps of "
                  f"{cfg.prompts_per_step}x{cfg.samples_per_prompt} completions each")
    model = pretrain(cfg, tokenizer, log=console.print)
    reference = Reference(model)
    before = evaluate(model, reference, tokenizer, cfg)
    console.print(f"pretrained model: reward {before['reward']:+.3f}  distinct-2 {before['distinct_2']:.2f}  "
                  f"entropy {before['entropy']:.2f}  ({time.perf_counter() - start:.0f} s)")

    curves, after = {}, {}
    for beta in betas:
        curves[beta], policy = ppo_run(model, beta, tokenizer, cfg, log=console.print)
        after[beta] = evaluate(policy, reference, tokenizer, cfg)
    seconds = time.perf_counter() - start

    console.print(_table(before, after, cfg.steps))
    # the same draw of three different openings from every model
    picks = [i * cfg.eval_samples for i in (0, 13, 27)]
    console.print("samples (the same prompts and random draws for every model):")
    for name, m in [("start", before), *((f"β={b:g}", m) for b, m in after.items())]:
        texts = "   ".join(f"{escape(repr(m['samples'][i][0] + m['samples'][i][1]))} {m['samples'][i][2]:+.2f}"
                           for i in picks)
        console.print(f"  {name:<7} {texts}")

    rows = [r for beta in betas for r in curves[beta]]
    lines = [",".join(CSV_COLUMNS)] + [",".join(f"{r[c]:.6g}" for c in CSV_COLUMNS) for r in rows]
    (run.path / "sentiment_steering.csv").write_text("\n".join(lines) + "\n")
    run.write_jsonl("metrics.jsonl", rows)
    run.write_jsonl("samples.jsonl", [{"beta": name, "prompt": p, "completion": c, "reward": r}
                                      for name, m in [("start", before), *after.items()] for p, c, r in m["samples"]])
    _plot(run.path / "sentiment_steering.png", curves, before, after)
    strip = lambda m: {k: v for k, v in m.items() if k != "samples"}  # noqa: E731
    run.write_json("summary.json", {"before": strip(before), "after": {f"{b:g}": strip(m) for b, m in after.items()},
                                    "seconds": seconds})

    hi, lo = after[max(betas)], after[min(betas)]

    def change(key: str, digits: int) -> str:  # "rises 0.12 -> 0.65": the words follow the numbers
        return f"{'rises' if lo[key] > hi[key] else 'falls'} {hi[key]:.{digits}f} -> {lo[key]:.{digits}f}"

    finish_run(console, run, "sentiment_steering",
               f"from β={max(betas):g} to β={min(betas):g} the reward after training {change('reward', 3)} "
               f"(start {before['reward']:+.3f}), the KL {change('kl', 2)} nats, distinct-2 {change('distinct_2', 2)} "
               f"and token entropy {change('entropy', 2)}: less anchor, more reward, less variety. "
               f"{seconds:.0f} s wall time.")
    return 0
