"""A judge that grades its own homework: a reward model trained on the DPO pairs themselves.

The capstone (recipes/capstone_aligned_assistant.toml) judges DPO against SFT with a reward
model trained on *other* pairs: the SFT policy's own samples ranked by the verifier
(`posttrain rlhf`). This script trains the judge the capstone warns against, on the very
pairs DPO was trained on (the bundled UltraFeedback-schema fixture), with `posttrain
rlhf`'s reward-model settings (RewardModelConfig's defaults: the SFT body, log-likelihood
pooling, 300 steps × 32 pairs, lr 1e-4), saves it, and reports its pairwise accuracy on the
fixture and on held-out pairs of the SFT policy's own samples. Then judge with it:

    python benchmarks/homework_judge.py --sft SFT_CHECKPOINT --heldout runs/<rlhf run>/rm_pairs_heldout.jsonl \
        --out runs/homework_judge
    posttrain winrate --a runs/<capstone run> --b SFT_CHECKPOINT --judge.rm runs/homework_judge
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from posttrain.config import RewardModelConfig
from posttrain.data.feedback_fixture import FEEDBACK_FIXTURE
from posttrain.data.preference import load_preference_data
from posttrain.models import load_checkpoint_model, load_tokenizer
from posttrain.rewards.reward_model import RewardModel, pairwise_accuracy, save_reward_model
from posttrain.rewards.reward_model_training import train_reward_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sft", required=True, help="the SFT checkpoint the judge's body starts from")
    parser.add_argument("--heldout", required=True, help="pairs the judge never trains on (rlhf's rm_pairs_heldout.jsonl)")
    parser.add_argument("--out", required=True, help="the reward-model directory to write")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rm = RewardModelConfig()
    policy, tokenizer = load_checkpoint_model(Path(args.sft)), load_tokenizer(Path(args.sft))
    pairs, heldout = load_preference_data(FEEDBACK_FIXTURE), load_preference_data(args.heldout)
    model, history = train_reward_model(pairs, RewardModel.from_policy(policy, rm.pooling), tokenizer,
                                        steps=rm.steps, lr=rm.lr, batch_size=rm.batch_size, seed=args.seed)
    info = {"trained_on": str(FEEDBACK_FIXTURE), "train_pairs": len(pairs), "heldout_pairs": len(heldout),
            "train_accuracy": pairwise_accuracy(model, pairs, tokenizer),
            "heldout_accuracy": pairwise_accuracy(model, heldout, tokenizer),
            "steps": rm.steps, "lr": rm.lr, "batch_size": rm.batch_size, "pooling": rm.pooling,
            "seconds": history[-1]["seconds"]}
    save_reward_model(model, args.out, tokenizer, info)
    print(json.dumps(info, indent=2))


if __name__ == "__main__":
    main()
