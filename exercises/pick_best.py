"""Exercise pick_best · best-of-N's decision rule (course milestone M0.5, docs/course/M0.5_selection.md).

Best-of-N samples N completions of one prompt from the same policy, scores each one, and
keeps one. The policy does not change; only the decision rule applied to its samples does.

    samples: a list of dicts {"id": "c03", "completion": "...", "reward": 1.0}, in sampling order
    return:  the one dict with the highest reward

Ties are common (several right answers all score 1.0), and the rule must break them the same
way every time, whatever order the list arrives in: among equal rewards, pick the smallest
`id` (string order; the pack's ids are zero-padded, c00..c07, so that is also sampling
order). It is the rule `posttrain bon` uses, and it logs the chosen id, so a rerun picks the
same completion. `max` by reward alone keeps whichever maximum it meets first: shuffle the
same samples and it chooses another one.

Check:  posttrain check pick_best
Then see your rule on the best-of-N pack (50 prompts × 8 candidates):  python exercises/pick_best.py
"""


def pick_best(samples: list[dict]) -> dict:
    """The sample with the highest reward; among equal rewards, the one with the smallest id."""
    # ---- YOUR CODE HERE (replace the line below) ----
    raise NotImplementedError("exercise pick_best: write pick_best")
    # ---- END OF YOUR CODE ----


if __name__ == "__main__":
    # Teacher code: your pick_best on the shipped pack, every candidate scored by final_int/cot-v1.
    from posttrain.eval.packs import example_of, load_pack
    from posttrain.verifiers import get_verifier

    score, pack = get_verifier("final_int/cot-v1"), load_pack("bon")
    first = chosen = 0.0
    for record in pack:
        example = example_of(record)
        samples = [{"id": c["id"], "completion": c["completion"], "reward": score(example, c["completion"])["reward"]}
                   for c in record["candidates"]]
        best = pick_best(samples)
        first, chosen = first + samples[0]["reward"], chosen + best["reward"]
        print(f"{record['id']}: chose {best['id']} (reward {best['reward']:g})")
    print(f"pass rate of the first sample {first / len(pack):.3f}, of your choice of 8 {chosen / len(pack):.3f} "
          "(posttrain bon --n 8 gives both, with the CI of the gain)")
