"""DPO: Direct Preference Optimization (Rafailov et al. 2023, arXiv:2305.18290).

Background. RLHF maximises a learned reward under a KL leash to a reference policy,

    max_π  E_{y~π}[ r(x, y) ] − β · KL(π(·|x) ‖ π_ref(·|x)).

That objective has a closed-form optimum, a reweighted reference (Sec. 4, Eq. 4),

    π*(y|x) = π_ref(y|x) · exp(r(x, y) / β) / Z(x),

which, solved for the reward, says every policy *implies* a reward (Eq. 5):

    r(x, y) = β · log π(y|x)/π_ref(y|x) + β · log Z(x).

Put that reward into the Bradley–Terry model of preferences, P(y_c ≻ y_r) =
σ(r(x, y_c) − r(x, y_r)): the partition function Z(x) appears on both sides and cancels,
leaving a likelihood written only in log-probs. Its negative log is the DPO loss (Eq. 7):

    L = −log σ( β · [ (log π_θ(y_c) − log π_ref(y_c)) − (log π_θ(y_r) − log π_ref(y_r)) ] ).

So DPO is the RLHF objective with the reward model integrated out: a logistic regression
on static pairs, no sampling, no critic. Its gradient (Sec. 4, "What does the DPO update
do?") raises log π_θ(y_c) and lowers log π_θ(y_r), each weighted by σ(−β·Δ), i.e. by how
wrong the implicit reward currently ranks the pair.

β is the strength of the KL leash, not a learning rate: a larger β means a stronger pull
toward π_ref, so a smaller KL at the optimum (and the logistic saturates after a smaller
log-ratio move). The implicit reward of a response is β · (log π_θ − log π_ref).

Variants kept here as options, each one line of the math:
    label_smoothing ε   conservative DPO (Mitchell 2023, "A note on DPO with noisy
                        preferences"): assume each label is flipped with probability ε, so
                        L = (1 − ε) · −log σ(βΔ) + ε · −log σ(−βΔ).
    length_normalize    length-normalised DPO: each log-ratio is divided by its response
                        length before the margin (keeps π_ref, unlike SimPO).
    nll_coef α          DPO + NLL (Pang et al. 2024, "Iterative Reasoning Preference
                        Optimization", arXiv:2404.19733, Eq. 1; also called RPO): add the
                        chosen response's length-normalised negative log-likelihood,
                        L = L_DPO + α · (−log π_θ(y_c) / |y_c|).
                        (The paper writes L_NLL + α·L_DPO with α = 1 and divides by prompt +
                        response length; at α = 1 that is this loss up to the normaliser.)
                        DPO only needs the chosen response to beat the rejected one, and
                        lowering both satisfies it; on chains of thought, where a rejected
                        chain shares most of its tokens (the copying steps) with correct ones,
                        that drags the chosen log-prob down too, which the paper measures.
                        The NLL term holds the chosen response's likelihood up, as ORPO's
                        SFT term does.
    gap_weighting       weight each pair's DPO term by a function of its score gap
                        Δs = score_chosen − score_rejected (core.gap_weights: "linear" w ∝ Δs,
                        "sqrt" w ∝ √Δs), scaled to mean 1 over the step's pairs:
                        L = mean_i w_i · L_DPO,i + (the NLL and KL terms, unweighted).
                        A pair a reward model ranks 0.9 against 0.1 says more than one it
                        ranks 0.51 against 0.49; the Bradley–Terry model behind DPO reads the
                        gap as how sure the preference is, and DPO itself throws it away.
                        A verifier's all-against-all pairs have gap 1 each: weighting changes
                        nothing there. Pairs without scores cannot be weighted (refused).
    kl_coef λ           a KL term on top of β's implicit leash: the squared sequence
                        log-ratio of both responses of each pair,
                        L = L_DPO + λ · ½ · mean over the 2B responses of (log π_θ(y) − log π_ref(y))².
                        Why this one: it is Schulman's k2 estimator ("Approximating KL
                        Divergence", 2020) taken on the whole response, and its gradient,
                        log(π_θ/π_ref)(y) · ∇ log π_θ(y), is in expectation over y ~ π_θ the
                        exact gradient of KL(π_θ ‖ π_ref) at the sequence level (Tang & Munos
                        2025, "On a few pitfalls in KL divergence gradient estimation for RL",
                        arXiv:2506.09477, Sec. 3–4): per-token k3 as a loss (GRPO's, DeepSeekMath
                        Eq. 4) differentiates to a different divergence and drops the earlier
                        tokens' effect on the later ones. Both responses, because each is one
                        sample for the estimate (in online DPO both are the policy's own
                        samples, where the estimate is on-policy; on a fixed file it is a soft
                        penalty toward π_ref, not an estimate). Zero at π_ref, it pulls each
                        response's log-likelihood back toward the reference's from either side.
                        β alone bounds nothing once a pair's margin is large: the logistic loss
                        keeps rewarding a wider margin, so both log-probs may drift far.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from posttrain.algorithms.contract import check_field
from posttrain.algorithms.preference.core import (
    GAP_WEIGHTINGS,
    PreferenceLogps,
    PreferenceLoss,
    pair_metrics,
    require_paired,
    require_reference,
)


@dataclass
class DPO(PreferenceLoss):
    """Direct Preference Optimization. Fields are the hyperparameters."""

    name: ClassVar[str] = "dpo"

    beta: float = 0.1  # the paper's β for dialogue and sentiment (Sec. 6); larger = closer to π_ref
    label_smoothing: float = 0.0  # ε of conservative DPO; 0 trusts every label (the paper's loss)
    length_normalize: bool = False  # the paper sums log-probs over the response
    # α of DPO + NLL; 0 is plain DPO. Pang et al. use α = 1. On the arithmetic task (β 0.1,
    # SFT start 69%): at lr 1e-4 on 447 pairs sampled at T = 1.5, α = 1 ended at 44% held-out
    # pass@1 and α = 10 at 65–69%; at lr 3e-5 on 924 pairs sampled at T = 1, α = 1 reached
    # 81% and plain DPO 74% (docs/algorithms/dpo.md)
    nll_coef: float = 0.0
    # how a pair's score gap (score_chosen − score_rejected: a reward model's or the self-judge's
    # scores, a file's score_chosen / score_rejected columns) weighs its DPO term, scaled to mean 1
    # over the step's pairs: none | linear | sqrt. none, the paper's loss: every pair counts the same
    gap_weighting: str = "none"
    # λ of ½·(log π_θ(y) − log π_ref(y))², the sequence k2 estimate of KL(π_θ ‖ π_ref) on both
    # responses (module docstring: why k2, not k3); 0 = plain DPO, whose only leash is β
    kl_coef: float = 0.0

    def __post_init__(self) -> None:
        check_field(self, "beta", self.beta > 0, "a number > 0")
        check_field(self, "label_smoothing", 0.0 <= self.label_smoothing < 0.5, "0 <= value < 0.5")
        check_field(self, "length_normalize", isinstance(self.length_normalize, bool), "True or False")
        check_field(self, "nll_coef", self.nll_coef >= 0, "a number >= 0 (0 = plain DPO)")
        check_field(self, "gap_weighting", self.gap_weighting in GAP_WEIGHTINGS, f"one of {list(GAP_WEIGHTINGS)}")
        check_field(self, "kl_coef", self.kl_coef >= 0, "a number >= 0 (0 = plain DPO)")

    def loss(self, logps: PreferenceLogps) -> tuple[torch.Tensor, dict[str, float]]:
        """Mean over the B pairs of the (smoothed) DPO loss; every input (B,)."""
        ref_chosen, ref_rejected = require_reference("DPO", logps)  # (B,) each
        require_paired("DPO", logps)
        chosen_logratio = logps.chosen - ref_chosen  # (B,) log π_θ/π_ref (y_c)
        rejected_logratio = logps.rejected - ref_rejected  # (B,)
        if self.length_normalize:
            chosen_logratio = chosen_logratio / logps.chosen_lengths.clamp(min=1)
            rejected_logratio = rejected_logratio / logps.rejected_lengths.clamp(min=1)
        logits = self.beta * (chosen_logratio - rejected_logratio)  # (B,) β·Δ
        # logsigmoid, not log(sigmoid(.)): sigmoid underflows to 0 for logits below about −88.
        losses = -(1 - self.label_smoothing) * F.logsigmoid(logits) - self.label_smoothing * F.logsigmoid(-logits)
        if logps.weights is not None:  # gap weighting: the weights came with the batch, mean 1 over the step
            losses = losses * logps.weights  # (B,)
        metrics = pair_metrics(self.beta * chosen_logratio, self.beta * rejected_logratio)
        if self.nll_coef > 0:  # DPO + NLL: the SFT loss on the chosen response, per token
            nll = -logps.chosen / logps.chosen_lengths.clamp(min=1)  # (B,)
            losses = losses + self.nll_coef * nll
            metrics["nll_chosen"] = nll.mean().item()
        if self.kl_coef > 0:  # ½ (sequence log-ratio)² of both responses, never length-normalised
            seq_logratio = torch.stack([logps.chosen - ref_chosen, logps.rejected - ref_rejected])  # (2, B)
            kl = 0.5 * seq_logratio.pow(2).mean(dim=0)  # (B,) the pair's mean over its two responses
            losses = losses + self.kl_coef * kl
            metrics["kl_seq"] = kl.mean().item()
        return losses.mean(), {"loss": losses.mean().item(), **metrics}
