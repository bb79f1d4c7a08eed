"""KL coefficient controllers: β in `reward − β·KL` (or `loss + β·KL`) from step to step.

`FixedKLController` keeps it; `AdaptiveKLController` steers it toward a target KL
(Ziegler et al. 2019), so the policy drifts from the reference at a chosen pace.
"""

from __future__ import annotations

from typing import Any


class FixedKLController:
    """β stays `kl_coef` for the whole run. Same interface as AdaptiveKLController."""

    def __init__(self, kl_coef: float) -> None:
        if not kl_coef >= 0:
            raise ValueError(f"kl_coef must be >= 0, got {kl_coef!r}")
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> float:
        return self.value

    def state_dict(self) -> dict[str, Any]:
        return {"kind": "fixed", "value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = float(state["value"])


class AdaptiveKLController:
    """Proportional control of β toward a target KL (Ziegler et al. 2019, "Fine-Tuning
    Language Models from Human Preferences", arXiv:1909.08593, Sec. 2.2):

        e_t     = clip(KL_t / KL_target − 1, −0.2, 0.2)
        β_{t+1} = β_t · (1 + K_β · e_t),   K_β = n_steps / horizon

    KL above target raises β (pull harder toward the reference), below target lowers it.
    The clip bounds each update to ±20% of the error signal, so one noisy KL estimate
    cannot swing β far. `n_steps` is how many samples (or steps, your unit) the update
    covers and `horizon` is how many of those it takes to close most of the gap, so the
    speed of adaptation does not depend on the batch size. β is multiplied, never
    replaced, so it stays positive when it starts positive.

    Args:
        init_kl_coef: β_0.
        target_kl:    KL_target, in the units `update` receives (nats per sequence, or
                      per token: be consistent with what you log).
        horizon:      samples (or steps) over which the controller acts; larger = slower.
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: float) -> None:
        if not init_kl_coef > 0:
            raise ValueError(f"init_kl_coef must be > 0 (β is multiplied, so 0 stays 0), got {init_kl_coef!r}")
        if not target_kl > 0:
            raise ValueError(f"target_kl must be > 0, got {target_kl!r}")
        if not horizon > 0:
            raise ValueError(f"horizon must be > 0, got {horizon!r}")
        self.value = float(init_kl_coef)
        self.target_kl = float(target_kl)
        self.horizon = float(horizon)

    def update(self, current_kl: float, n_steps: int) -> float:
        """One control step from the KL measured over the last `n_steps`; returns the new β."""
        if not 0 <= n_steps < 5 * self.horizon:
            # at n_steps/horizon >= 5 the factor 1 − 0.2·n_steps/horizon reaches 0 or below
            raise ValueError(f"n_steps must be in [0, 5·horizon) = [0, {5 * self.horizon:g}), got {n_steps!r}")
        proportional_error = min(max(current_kl / self.target_kl - 1.0, -0.2), 0.2)
        self.value *= 1.0 + proportional_error * n_steps / self.horizon
        return self.value

    def state_dict(self) -> dict[str, Any]:
        return {"kind": "adaptive", "value": self.value, "target_kl": self.target_kl, "horizon": self.horizon}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = float(state["value"])
        self.target_kl = float(state["target_kl"])
        self.horizon = float(state["horizon"])
