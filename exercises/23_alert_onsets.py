"""Exercise 23 · Where a monitor fires (lesson 23).

A run's metrics are a list of rows, one dict per step, e.g.

    {"step": 40, "reward_mean": 0.81, "kl_ref": 0.07}

Return the steps at which the KL monitor raises an alert, with kl_max the line:

  * only rows with a number under "kl_ref" count; a row without it, or with None, is skipped
    (the KL is not logged on every row);
  * a row is above the line when kl_ref > kl_max; a NaN is above too (a metric that became
    NaN is broken), so write it as `not kl <= kl_max`;
  * an alert marks where the condition STARTS to hold: a KL above the line for 30 steps in
    a row gives one alert, at the first of them, and another only if it drops back to or
    below the line and crosses again;
  * a row's step is row["step"], or, if it has none, its position in the list.

Check:  posttrain check 23
"""


def kl_alert_steps(rows: list[dict], kl_max: float) -> list[int]:
    """The steps where kl_ref first rises above kl_max (each crossing once), in row order."""
    # ---- YOUR CODE HERE (replace the line below) ----
    raise NotImplementedError("exercise 23: write kl_alert_steps")
    # ---- END OF YOUR CODE ----
