"""Exercise 24 · Where GRPO's copies live, per GPU (lesson 24).

GRPO with mixed precision keeps three copies of a `parameters`-sized model on every GPU:

    policy          trained: bf16 weights (2 bytes), bf16 gradients (2), an fp32 master
                    copy (4) and AdamW's two fp32 moments (8): 16 bytes a parameter
    reference       frozen: bf16 weights only, 2 bytes a parameter
    rollout engine  the engine's own bf16 copy, 2 bytes a parameter

ZeRO splits state over the `gpus` data-parallel GPUs: stage 1 the optimizer's state (master
copy and moments), stage 2 also the gradients, stage 3 also the weights — the reference's
too, since it is gathered layer by layer like the policy. ZeRO never splits the engine.

Return the bytes per GPU of [policy, reference, engine], as a float tensor.

Check:  posttrain check 24
"""

import torch


def grpo_bytes_per_gpu(parameters: float, gpus: int, zero_stage: int) -> torch.Tensor:
    """(3,) bytes per GPU of the policy, the reference and the rollout engine."""
    # ---- YOUR CODE HERE (replace the line below) ----
    raise NotImplementedError("exercise 24: write grpo_bytes_per_gpu")
    # ---- END OF YOUR CODE ----
