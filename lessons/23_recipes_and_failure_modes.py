"""Lesson 23 · Famous recipes and failure modes: five axes, and what a sick run looks like."""

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium")


@app.cell
def _():
    import marimo as mo

    return (mo,)


@app.cell
def _(mo):
    mo.md(r"""
    # 23 · Famous recipes and failure modes

    ## A recipe is five choices

    Read a post-training paper for what it *chose*, not what it called itself. Five axes are
    enough to place every recipe this course has met:

    * **data**: which prompts, demonstrations or pairs, in what order and at what difficulty;
    * **algorithm**: the loss and what it needs resident (a critic, a reference, a group);
    * **reward**: a verifier, a learned model, shaping terms (format, length);
    * **system**: where sampling and training run, and how stale the samples may be;
    * **scale**: model size, steps, samples, sequence length.

    The recipe catalogue in `recipes/` writes seven famous ones (R1-Zero, R1, Kimi k1.5, Qwen3,
    Qwen-2.5, Tülu 3, and InstructGPT, which `posttrain rlhf` runs) as posttrain config files at
    a size this machine trains in minutes, each with its
    five choices in its header (`docs/guides/recipes.md` has the table and what the toy versions
    leave out), beside the course's two capstones; below the panel, six published recipes
    (InstructGPT, R1-Zero, R1, Tülu 3, Qwen2.5, the o-series) sit on the same axes at full
    scale. Line them up and the surprise is how little of the difference is the optimiser: R1
    and R1-Zero both run SFT then GRPO on the same reward, and differ in one data setting
    (whether the demonstrations show their working), the length of that SFT and the KL
    coefficient.

    The panel below loads two recipe files with the library's own loader
    (`load_file`, then `from_dict(TrainConfig, ...)`, exactly what `posttrain run --config`
    does), moves **one axis** from the second recipe into the first (every setting of the file
    that belongs to that axis), runs the library's pre-run checks on the hybrid, and shows
    which settings of the full config changed (`differing_keys`, what `--parent` records for a
    run's lineage). Which file setting belongs to which axis is this lesson's table
    (`AXIS_OF_SETTING` below): the config has no such field, because an axis is a way to read
    a recipe, not a part of the program.

    ## When a run goes wrong

    The second half of the panel is the other direction: a symptom you see in a run's metrics,
    the monitor in `posttrain/runs/monitors.py` that detects it, and the lesson that explains
    it. The run is synthetic (40 steps of metric rows, healthy until step 20, then the symptom
    you pick grows), and the detection is the library's `check_all`, the same call a training
    run makes every step (`rl.alerts.action` decides what happens then).
    """)
    return


@app.cell
def _(mo):
    SYMPTOMS = {
        "reward up while dev pass@1 falls": dict(key="gold", monitor="proxy_gold_divergence", field="min_gold_drop",
                                                 lessons="[15](?file=15_rlhf.py) the proxy rises and the gold peaks; "
                                                         "[18](?file=18_verifiers.py) the verifier's holes"),
        "KL to the reference explodes": dict(key="kl", monitor="kl_explosion", field="kl_max",
                                             lessons="[03](?file=03_reward_and_reference.py) the KL anchor; "
                                                     "[15](?file=15_rlhf.py) its two jobs"),
        "entropy collapses": dict(key="entropy", monitor="entropy_collapse", field="entropy_floor",
                                  lessons="[13](?file=13_dapo.py) clip-higher"),
        "every group scored alike": dict(key="flat", monitor="no_learning_signal", field="no_signal_steps",
                                         lessons="[11](?file=11_grpo.py) zero-variance groups; "
                                                 "[13](?file=13_dapo.py) dynamic sampling"),
        "responses double in length": dict(key="length", monitor="length_blowup", field="length_factor",
                                           lessons="[14](?file=14_dr_grpo.py) the length bias; "
                                                   "[13](?file=13_dapo.py) the overlong penalty"),
        "chosen likelihood falls (DPO)": dict(key="chosen", monitor="chosen_likelihood_collapse",
                                              field="chosen_drop_max",
                                              lessons="[16](?file=16_dpo.py) both sides made unlikely"),
        "sampler and trainer log-probs disagree": dict(key="mismatch", monitor="sampler_mismatch",
                                                       field="mismatch_max",
                                                       lessons="[25](?file=25_kernels_for_rl.py) the silent bug; "
                                                               "[27](?file=27_missing_concepts.py) truncated IS"),
    }
    # the files `posttrain run` reads; recipes/instructgpt.toml is read by `posttrain rlhf` over its own
    # defaults (a reward model, then PPO), so the panel, which loads a file as `run` does, leaves it out
    RECIPE_NAMES = ["kimi_k15", "qwen25", "qwen3", "r1", "r1_zero", "tulu3_rlvr"]
    AXES = ["data", "algorithm", "reward", "system", "scale"]
    controls = mo.ui.dictionary({
        "recipe": mo.ui.dropdown(options=RECIPE_NAMES, value="r1", label="recipe"),
        "donor": mo.ui.dropdown(options=RECIPE_NAMES, value="r1_zero", label="take one axis from"),
        "axis": mo.ui.dropdown(options=AXES, value="data", label="the axis to swap"),
        "symptom": mo.ui.dropdown(options=["a healthy run"] + list(SYMPTOMS), value="reward up while dev pass@1 falls",
                                  label="the symptom"),
        "loosen": mo.ui.slider(start=1.0, stop=10.0, step=0.5, value=1.0,
                               label="loosen its monitor's line (× its default)", show_value=True),
    })
    controls.vstack()
    return AXES, SYMPTOMS, controls


@app.cell
def _(AXES, mo):
    import re
    import tomllib

    with mo.status.spinner(title="Loading the config checker (posttrain.pipelines.checks) for the recipe catalogue…"):
        from posttrain.config import ConfigError, TrainConfig
        from posttrain.config.files import from_dict, load_file, to_dict
        from posttrain.pipelines.checks import check_config
        from posttrain.runs.lineage import NOT_A_CHANGE, differing_keys, flatten
        from posttrain.teach.lessons import LESSONS_DIR

    RECIPES_DIR = LESSONS_DIR.parent / "recipes"  # the repository's catalogue, next to lessons/

    # Which settings of a recipe file make up each axis (a prefix names a section: "env" is env.*).
    AXIS_OF_SETTING = {
        "data": ("env", "sft.num_examples", "rl.curation", "rl.preference.pair_prompts", "rl.preference.pairs", "rl.preference.pairs_columns"),
        # how often a batch is reused (PPO's epochs and minibatches) is the algorithm's: it decides whether the clip binds
        "algorithm": ("stages", "rl.algo", "rl.algo_params", "rl.kl.target", "rl.kl.horizon", "init",
                      "rl.update.epochs", "rl.update.minibatches"),
        "reward": ("rl.reward.terms", "rl.reward.length_reward", "rl.reward.length_reward_start", "rl.reward.length_penalty", "rl.rm"),
        "system": ("dist", "device", "dtype", "threads", "rl.sampling.weights", "rl.sampling.compile"),
        "scale": ("rl.steps", "sft.steps", "model", "rl.sampling.max_new_tokens", "rl.samples_per_prompt",
                  "rl.prompts_per_step"),
    }
    assert list(AXIS_OF_SETTING) == AXES
    # the run's name, and how often and on how many problems it is measured: no recipe's choice
    NOT_AN_AXIS = ("name", "rl.eval_every", "rl.dev_size", "heldout_size")

    def axis_of(key):
        """The axis a dotted setting belongs to, or None (NOT_AN_AXIS)."""
        if key in NOT_AN_AXIS:
            return None
        for axis, prefixes in AXIS_OF_SETTING.items():
            if any(key == p or key.startswith(p + ".") for p in prefixes):
                return axis
        return None

    def unflatten(flat):
        """{"rl.curation.order": x} -> {"rl": {"curation": {"order": x}}}: the shape from_dict reads."""
        nested = {}
        for key, value in flat.items():
            *sections, leaf = key.split(".")
            node = nested
            for section in sections:
                node = node.setdefault(section, {})
            node[leaf] = value
        return nested

    def header_axes(text):
        """The five choices a recipe file states in its header comment, as {axis: sentence}."""
        axes, current = {}, None
        for line in text.splitlines():
            if not line.startswith("#"):
                break
            start = re.match(r"#\s{3}(data|algorithm|reward|system|scale)\s+(.*)", line)
            if start:
                current = start.group(1)
                axes[current] = start.group(2)
            elif current and re.match(r"#\s{6,}\S", line):
                axes[current] += " " + line[1:].strip()
            else:
                current = None
        return axes

    RECIPES = {p.stem: flatten(load_file(str(p))) for p in sorted(RECIPES_DIR.glob("*.toml"))}
    STATED = {p.stem: header_axes(p.read_text(encoding="utf-8")) for p in sorted(RECIPES_DIR.glob("*.toml"))}
    # the papers behind the files, at full scale: what each source states, apart from what is only assumed
    with open(RECIPES_DIR.parent / "lessons" / "data" / "23_published_recipes.toml", "rb") as _file:
        published = tomllib.load(_file)["recipe"]
    return (ConfigError, NOT_AN_AXIS, NOT_A_CHANGE, RECIPES, STATED, TrainConfig, axis_of, check_config,
            differing_keys, from_dict, published, to_dict, unflatten)


@app.cell
def _(ConfigError, NOT_A_CHANGE, RECIPES, TrainConfig, axis_of, check_config, controls, differing_keys, from_dict,
      to_dict, unflatten):
    recipe, donor, axis = controls.value["recipe"], controls.value["donor"], controls.value["axis"]
    moved = {k: v for k, v in RECIPES[donor].items() if axis_of(k) == axis}
    hybrid = {**{k: v for k, v in RECIPES[recipe].items() if axis_of(k) != axis}, **moved}
    base_config = from_dict(TrainConfig, unflatten(RECIPES[recipe]))
    hybrid_config = from_dict(TrainConfig, unflatten(hybrid))
    changed = differing_keys(to_dict(base_config), to_dict(hybrid_config), ignore=NOT_A_CHANGE)
    try:
        check_config(hybrid_config)
        refused = None
    except ConfigError as error:  # the axes are not independent: some hybrids cannot run
        refused = str(error)
    return axis, changed, donor, moved, recipe, refused


@app.cell
def _(AXES, axis, changed, donor, mo, moved, published, recipe, refused, STATED):
    _stated = "".join(f"| {a} | {STATED[recipe].get(a, '')} | {STATED[donor].get(a, '')} |\n"
                      for a in ("data", "algorithm", "reward", "system", "scale"))
    _moved = ", ".join(f"`{k} = {v!r}`" for k, v in moved.items()) or "nothing (it leaves this axis at the defaults)"
    _rows = "".join(f"| `{k}` | `{a!r}` | `{b!r}` |\n" for k, (a, b) in changed.items())
    _diff = (f"""
    | setting | {recipe} | {recipe} with {donor}'s {axis} |
    |:---|:---|:---|
    {_rows}""" if changed else f"\n    **No setting changes**: {recipe} and {donor} make the same {axis} choice here.\n")
    _verdict = (f"**The pre-run checks refuse the hybrid:** {refused}" if refused
                else "**The pre-run checks pass the hybrid:** `posttrain run` would train it.")
    _cell = lambda axis: axis["known"] + (f"; *speculated:* {axis['speculated']}" if "speculated" in axis else "")  # noqa: E731
    _published = "\n".join(f"| **{r['name']}**{' ◀ the panel' if r['toy'] == f'recipes/{recipe}.toml' else ''}<br>"
                            f"{r['source']} | " + " | ".join(_cell(r[a]) for a in AXES) + f" | {r['toy'] or 'none'} |"
                            for r in published)
    mo.md(f"""
    ### {recipe} and {donor}, as their files state them

    | axis | {recipe} | {donor} |
    |:---|:---|:---|
    {_stated}
    ### {recipe} with {donor}'s {axis}

    {donor}'s file sets, on this axis: {_moved}. The full configs then differ in
    **{len(changed)}** setting(s):
    {_diff}
    {_verdict}

    ### The published recipes on the same five axes

    Six recipes as their papers state them, at full scale (the files above are toy versions);
    where a source is silent, the cell says so, and guesswork is marked *speculated*.

    | recipe | data | algorithm | reward | system | scale | runs here as |
    |:---|:---|:---|:---|:---|:---|:---|
    {_published}
    """)
    return


@app.cell
def _():
    import dataclasses

    from posttrain.runs.monitors import MonitorConfig, check_all

    STEPS, ONSET = 40, 20  # a synthetic run: healthy for 20 steps, then the symptom grows to step 39

    def synthetic_rows(symptom):
        """One metric row per step, with every key some monitor reads. Healthy: the reward and
        the dev pass@1 (scored every 5 steps) rise together, KL creeps, length and entropy drift."""
        rows = []
        for s in range(STEPS):
            u = max(0.0, (s - ONSET) / (STEPS - 1 - ONSET))  # 0 until the onset, 1 at the last step
            row = {"step": s, "reward_mean": 0.3 + 0.4 * s / (STEPS - 1), "kl_ref": 0.002 * s,
                   "response_length": 30.0 + 0.1 * s, "entropy": 0.6 - 0.005 * s,
                   "zero_variance_groups": 0.2, "grad_norm": 1.0, "int8/logp_mismatch": 0.001}
            if s % 5 == 0 or s == STEPS - 1:
                row["dev_pass@1"] = 0.25 + 0.3 * min(s, ONSET if symptom == "gold" else s) / (STEPS - 1)
                row["dev_pref_logps_chosen_per_token"] = -1.0
            if symptom == "gold" and "dev_pass@1" in row:
                row["dev_pass@1"] -= 0.3 * u  # the held-out task falls; the reward keeps rising
            if symptom == "kl":
                row["kl_ref"] += 1.0 * u * u
            if symptom == "entropy":
                row["entropy"] -= (row["entropy"] - 0.02) * u  # down to 0.02 nats/token
            if symptom == "flat" and s >= ONSET:
                row.update(zero_variance_groups=1.0, reward_mean=0.0)  # every sample of every group wrong
            if symptom == "length":
                row["response_length"] *= 1 + 1.5 * u  # 2.5x by the end
            if symptom == "chosen" and "dev_pref_logps_chosen_per_token" in row:
                row["dev_pref_logps_chosen_per_token"] -= 1.0 * u  # 1 nat/token less likely by the end
            if symptom == "mismatch" and s >= ONSET:
                row["int8/logp_mismatch"] = 0.1  # the sampler switched to weights 0.1 nats/token away
            rows.append(row)
        return rows

    def loosened(field, k):
        """MonitorConfig with one line moved k times further from healthy (entropy's floor is lowered)."""
        default = getattr(MonitorConfig(), field)
        value = default / k if field == "entropy_floor" else (round(default * k) if field == "no_signal_steps"
                                                               else default * k)
        return dataclasses.replace(MonitorConfig(), **{field: value})

    def fires(rows, monitor, config):
        return [a for a in check_all(rows, config) if a["monitor"] == monitor]

    FACTORS = [1.0 + 0.5 * i for i in range(19)]  # the slider's stops, 1 to 10
    return FACTORS, MonitorConfig, STEPS, check_all, fires, loosened, synthetic_rows


@app.cell
def _(FACTORS, MonitorConfig, SYMPTOMS, check_all, controls, fires, loosened, synthetic_rows):
    symptom, k = controls.value["symptom"], controls.value["loosen"]
    healthy_alerts = check_all(synthetic_rows("healthy"))
    # The map, every symptom at the default lines: the step its monitor first fires, and the
    # smallest loosening (on the slider's stops) that hides it completely.
    failure_map = {}
    for _name, _s in SYMPTOMS.items():
        _rows = synthetic_rows(_s["key"])
        _first = fires(_rows, _s["monitor"], MonitorConfig())
        _hidden = next((f for f in FACTORS if not fires(_rows, _s["monitor"], loosened(_s["field"], f))), None)
        failure_map[_name] = dict(step=_first[0]["step"] if _first else None, hidden_from=_hidden,
                                  others=sorted({a["monitor"] for a in check_all(_rows)} - {_s["monitor"]}))
    if symptom == "a healthy run":
        config, alerts = MonitorConfig(), healthy_alerts
    else:
        config = loosened(SYMPTOMS[symptom]["field"], k)
        alerts = check_all(synthetic_rows(SYMPTOMS[symptom]["key"]), config)
    return alerts, config, failure_map, healthy_alerts, k, symptom


@app.cell
def _(MonitorConfig, SYMPTOMS, STEPS, alerts, config, failure_map, k, mo, symptom):
    _hidden = lambda f: "never, up to ×10" if f is None else f"×{f:g}"
    _map = "".join(
        f"| {name} | `{s['monitor']}` (`{s['field']}` = {getattr(MonitorConfig(), s['field'])}) | "
        f"{failure_map[name]['step']} | {_hidden(failure_map[name]['hidden_from'])} | {s['lessons']} |\n"
        for name, s in SYMPTOMS.items())
    if symptom == "a healthy run":
        _line = "every monitor at its default line"
    else:
        _field = SYMPTOMS[symptom]["field"]
        _line = f"`{_field}` = {getattr(config, _field):.4g} (×{k:g} looser than its default)"
    _alerts = "".join(f"| {a['step']} | `{a['monitor']}` | {a['message']} |\n" for a in alerts)
    _result = (f"""
    | step | monitor | what it says |
    |---:|:---|:---|
    {_alerts}""" if alerts else f"\n    **No monitor fires** in {STEPS} steps.\n")
    mo.md(f"""
    ### The symptom → monitor → lesson map

    Each symptom on its own synthetic run, every monitor at its default line: the step its
    monitor first fires (the symptom starts at step 20), and the loosening from which it
    never fires at all.

    | symptom | the monitor (its line) | fires at step | hidden from | the lesson that explains it |
    |:---|:---|---:|:---|:---|
    {_map}
    ### Your run: {symptom}, {_line}
    {_result}""")
    return


@app.cell
def _(mo):
    mo.md(r"""
    ## What the numbers say

    * **R1 against R1-Zero** (the defaults): swapping R1-Zero's data into R1 changes three
      settings: `env.arithmetic.words` (R1's prompts in number words go back to digits),
      `env.cot` (the demonstrations stop showing their working) and `sft.num_examples`. Swap
      the algorithm instead and two settings change: R1-Zero's KL coefficient 0.001 arrives,
      and `stages` goes from R1's four stages to `""`, the default two-stage job (SFT, then
      `rl.algo`, GRPO): the rejection-sampling SFT and the last RL stage leave with it. One
      changed key can carry two stages; read each changed key before calling it a small
      change of recipe.
    * Some swaps change **nothing**: Tülu 3 and Qwen-2.5 both use the default data. Two
      recipes that sound different can be the same choice on most axes; and some swaps
      cannot run: R1's data in Tülu 3 is refused, its prompts in number words being longer
      than Tülu 3's 96 positions (R1 raises them on its scale axis). The **system** axis is
      empty in every file: at this scale every recipe runs in one process (Kimi's partial
      rollouts are a variant its header names, not a setting), so the recipes differ only in
      the other four.
    * **R1 with Qwen3's algorithm** is refused: Qwen3's four stages pose the task in /think
      mode in their brackets (`env.arithmetic_think.think_mode=think`), a setting of a task R1
      does not run. A stage list can carry a data choice with it.
    * Each symptom is caught by **its own monitor and no other** on these runs, at the step the
      lesson's map shows; a healthy run fires nothing. The gold metric is scored every 5 steps,
      so `proxy_gold_divergence` cannot fire between evaluations: it fires at step 30, the
      first evaluation after the dev pass@1 has lost 0.1 from its best.

    ## Find the knob that breaks it

    * **Loosen the line.** Every monitor is a threshold, and a line set for a quieter run hides
      a real failure. At ×3 six of the seven monitors never fire on their symptom (the map's
      "hidden from" column: the length monitor is blind from ×1.5, a limit of 3× the starting
      length against responses that grew 2.5×), although every one of those runs is as sick as
      before. `no_learning_signal` counts steps, so it hides only from ×4.5, when its count
      (22 steps) outlasts the 20 flat ones. A monitor that never fires is a reason to look at
      its line, not evidence that the run is healthy.
    * **Tülu 3 with Kimi's data.** The pre-run checks refuse the hybrid: Kimi's curation
      (`rl.curation.pool_size`) chooses the prompts of an RL stage, and Tülu 3's stage list
      has a DPO stage that trains on pairs. Kimi's reward (a length reward) into Tülu 3 is
      refused for the same reason. The axes are a way to read recipes, and they are not
      independent: a data choice can assume an algorithm.
    * **A donor equal to the recipe.** Nothing moves: the diff is empty, as it must be.

    ## Source files used here

    * `posttrain/config/files.py` — `load_file`, `from_dict`, `to_dict`: a config file into a `TrainConfig` and back
    * `posttrain/runs/lineage.py` — `flatten` and `differing_keys`, the config diff `--parent` records
    * `posttrain/pipelines/checks.py` — `check_config`, the pre-run checks that refuse a hybrid
    * `docs/guides/recipes.md` and `tests/test_recipes.py` — the catalogue and the checks every recipe passes
    * `lessons/data/23_published_recipes.toml` — the six published recipes, known and speculated apart
    * `posttrain/runs/monitors.py` — `check_all`, `MonitorConfig` and the seven monitors
    * `posttrain/pipelines/rl.py` — where a training run calls the monitors and acts on `rl.alerts.action`

    ## Exercises

    1. Swap R1-Zero's scale into R1. What does `sft.steps = 150` do to R1's cold start, and
       which axis would you say it really belongs to?
    2. The length symptom doubles responses by step 33. If the reward were the only thing you
       plotted, which other monitor would you expect to fire when length is being farmed, and
       why does it not fire on this synthetic run?
    3. Code: `exercises/23_alert_onsets.py` asks for the steps where the KL monitor fires (an
       alert where the condition starts, NaN counted as above the line); `posttrain check 23`
       compares it with `kl_explosion` on seven cases.

    Previous: [22c · Async pipelining](?file=22c_async_pipelining.py). Next:
    [24 · The RL infra engineer](?file=24_rl_infra_engineer.py).
    """)
    return


if __name__ == "__main__":
    app.run()
