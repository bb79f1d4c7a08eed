"""What the RL stage is rewarded by: `rl.reward`, the training reward's terms and the length
shaping paid on top, and `rl.rm`, the learned reward model that can stand in for the
verifier (posttrain/rewards/)."""

from __future__ import annotations

from dataclasses import dataclass

from posttrain.config.checks import check, check_non_negative, check_positive


@dataclass
class RewardConfig:
    """The training reward (posttrain/rewards/): a sum of terms, then the length shaping.
    Held-out pass@1 is always the verifier's alone, whatever is trained on."""

    # a sum of [WEIGHT*]TERM joined by "+": TERM is "accuracy" (the verifier's 1/0), "r1"
    # (accuracy + 0.2 × format, DeepSeek-R1-Zero-style), "rubric" (rule-based criteria in [0, 1]:
    # a Final: line, no loops, <= 512 chars), "self_critique" (Accuracy, Relevance, Completeness,
    # Clarity and Helpfulness in [0, 1], each a soft label of the rl.reward.judge model: Kimi K2's
    # self-critique, rewards/self_critique.py), "meta_verified" (arithmetic: 1 when a lenient step
    # verifier passes the chain and the step checker confirms it, rewards/meta_verifier.py), "language"
    # (R1's language consistency, rewards/language.py), or
    # your function, MODULE:FUNCTION or PATH.py:FUNCTION, with a TRL (prompts, completions,
    # **columns), verl (data_source, solution_str, ground_truth, extra_info) or posttrain (example,
    # completion) signature, called once per completion; e.g. "accuracy + 0.1*my_rewards:brevity"
    terms: str = "accuracy"
    # who scores the self_critique term: "policy" (the weights being trained judge their own samples,
    # as in Kimi K2), or a frozen judge: a gpt_mini checkpoint, a transformers directory or
    # "smollm2-135m". policy by default: self-critique is the policy's; a frozen judge costs a second model
    judge: str = "policy"
    # seconds a user's reward function may take on one completion before the run stops with
    # its name and the sample (a hung function must not hang training); rule-based rewards
    # take milliseconds. 0 = no limit, called in the training thread (signal-based timeouts
    # such as math_verify's default work only there)
    timeout: float = 5.0
    length_penalty: float = 0.0  # c of −c·max(0, L − length_free), L in characters; 0 = off
    length_free: int = 0  # characters a completion may use before the length penalty starts
    # weight of Kimi k1.5's length reward (arXiv:2501.12599, Sec. 2.3.3), relative to the
    # prompt's other samples: from +0.5 for the group's shortest right answer to −0.5 for its
    # longest, wrong answers only charged (rewards/length.py::kimi_length_reward). 0 = off: on
    # this task the chain of thought has one right length, and the reward can only shorten it
    length_reward: float = 0.0
    # the RL step from which the length reward is paid (Kimi k1.5 trained without it first:
    # from the start it slowed early learning). 0 = from the first step
    length_reward_start: int = 0
    # how a reward of several terms becomes advantages: "sum" normalises the weighted sum within its
    # group (GRPO); "per_term" normalises each term within its group, then sums with the weights and
    # whitens over the batch (GDPO, arXiv:2601.05242), so a dense term (format) cannot drown a
    # sparse one (accuracy). sum by default: every run measured so far was trained on the sum
    normalize: str = "sum"

    def validate(self, prefix: str = "rl.reward") -> None:
        check(bool(self.judge.strip()), f"{prefix}.judge", self.judge,
              "'policy' or a judge model (a checkpoint or transformers directory, or 'smollm2-135m')")
        check_non_negative(self, prefix, "timeout", "length_penalty", "length_free", "length_reward",
                           "length_reward_start")
        check(self.normalize in ("sum", "per_term"), f"{prefix}.normalize", self.normalize,
              "'sum' (normalise the weighted sum: GRPO) or 'per_term' (each term within its group first: GDPO)")


@dataclass
class RewardModelConfig:
    """The learned reward of `posttrain rlhf`: a Bradley–Terry model trained on pairs of the
    SFT policy's samples that the verifier ranked (posttrain/pipelines/rlhf.py)."""

    # a trained reward-model directory, or several joined by "," (an ensemble, combined by
    # rl.rm.ensemble); "" = the verifier is the training reward. With a preference loss, the
    # reward model ranks the policy's samples into pairs instead of the verifier: one pair per
    # prompt, its best-scored sample against its worst. With an "rm" term in rl.reward.terms it is
    # that term's scorer, on top of the verifier, instead of replacing it
    path: str = ""
    # how an ensemble's scores combine (rewards/ensemble.py): "mean", "min" (worst case) or
    # "mean-minus-std" (disagreement charged); mean, the plain average, changes least
    ensemble: str = "mean"
    disagreement_coef: float = 1.0  # λ of mean-minus-std: one standard deviation of the members' scores
    # reward models `posttrain rlhf` trains, each from its own seed (reward_model_0, _1, ...),
    # then combined by rl.rm.ensemble; 1 trains the single model docs/guides/preference.md's runs used
    ensemble_size: int = 1
    prompts: int = 1024  # training prompts whose samples make the pairs (held-out pairs: rl.dev_size dev prompts)
    temperature: float = 1.5  # the SFT policy is near-deterministic at T = 1: hotter samples give more distinct pairs
    # ~6 epochs of the ~1,700 pairs 1,024 prompts give; measured with pooling "loglik":
    # pairwise accuracy 0.91 train, 0.77 held out (283 pairs; "last" at 150 steps: 0.68, 0.64)
    steps: int = 300
    lr: float = 1e-4  # the body starts from the SFT policy, so smaller than from-scratch training's 1e-3
    batch_size: int = 32  # pairs per step
    # pairs per forward and backward pass (gradient accumulation: the step's gradient is the whole
    # batch's, to float rounding); 0 = all batch_size pairs at once, as the runs above trained. A
    # transformers body wants a few: measured on SmolLM2-135M ("loglik", 32 pairs of ~60-token
    # arithmetic texts), one step peaked at 7.4 GB of memory with 0 and 3.75 GB with 4
    micro_batch_size: int = 0
    # what the scalar head reads (rewards/reward_model.py): "last" real token's hidden
    # state, "mean" hidden state, or "loglik", the body's own mean token log-likelihood.
    # Measured on the arithmetic task's 1,694 pairs (283 held out): "last" memorises (300
    # steps: 0.79 train, 0.59 held out); "mean" 0.62–0.70 held out, also with 4× the pairs;
    # and "loglik" 0.77 held out at 300 steps, because the SFT body already finds a wrong
    # step unlikely (its likelihood ranks 0.79 of the held-out pairs right before any training)
    pooling: str = "loglik"

    def paths(self) -> list[str]:
        """The reward-model directories `path` names (several joined by ","; [] for "")."""
        return [part.strip() for part in self.path.split(",")] if self.path else []

    def validate(self, prefix: str = "rl.rm") -> None:
        check_positive(self, prefix, "prompts", "steps", "batch_size", "ensemble_size")
        check_non_negative(self, prefix, "micro_batch_size")
        check(self.ensemble in ("mean", "min", "mean-minus-std"), f"{prefix}.ensemble", self.ensemble,
              "'mean', 'min' or 'mean-minus-std'")
        check(self.disagreement_coef >= 0, f"{prefix}.disagreement_coef", self.disagreement_coef, "a number >= 0")
        check(self.pooling in ("last", "mean", "loglik"), f"{prefix}.pooling", self.pooling,
              "'last', 'mean' or 'loglik'")
        check(self.lr > 0, f"{prefix}.lr", self.lr, "a positive number")
        check(self.temperature > 0, f"{prefix}.temperature", self.temperature, "a number > 0")
