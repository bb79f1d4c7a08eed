"""An int8 copy of a policy for sampling: every `nn.Linear` decodes with int8 weights,
everything else (embeddings, norms, rotary tables) is the float policy's own tensors.

Decode reads every weight matrix for a handful of rows, so on a CPU it is bound by memory
traffic and by float32 GEMMs that cannot fill the vector units; an int8 weight is a
quarter of the bytes and feeds the CPU's int8 dot-product instructions. This is the CPU
analogue of sampling in FP8 on a GPU. The price is a sampler that is not quite the
trainer's policy: its log-probs differ from the float32 forward, and the update corrects
for that with truncated importance weights (roles/off_policy.py).

The kernels are torch's own dynamic quantisation (`torch.ao.nn.quantized.dynamic.Linear`,
fbgemm on x86): the weight is stored as int8, each call quantises the activations to
uint8 on the fly and multiplies in integers. torch 2.13 marks `torch.ao.quantization`
deprecated in favour of torchao, but the kernels are still there and are the fastest int8
path this CPU has without torch.compile (measured: benchmarks/int8_sampling.py); torchao's
int8 configs reach these speeds on CPU only through inductor.

Weights are quantised symmetrically per output row, w ≈ s · q with q = round(w / s) in
[-127, 127] and s = max|w_row| / 127: one scale per row keeps a row of small weights from
being rounded to zero by a large weight elsewhere in the matrix (per-tensor scaling).
"""

from __future__ import annotations

import copy
import warnings
from contextlib import contextmanager

import torch
from torch import nn

from posttrain.models.policy import Policy


@contextmanager
def _quiet_deprecation():
    # torch 2.13 warns on every quantised tensor it creates (see the module docstring): once a
    # run would be a screenful of the same two warnings
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning, message=".*torch.ao.quantization.*")
        warnings.filterwarnings("ignore", category=UserWarning, message=".*quantize_per_tensor.*")
        yield


def check_quantizable(model: Policy) -> None:
    """ValueError unless the int8 kernels can run `model`: CPU, float32 weights."""
    for name, p in model.named_parameters():
        if p.device.type != "cpu" or p.dtype != torch.float32:
            raise ValueError(f"int8 sampling needs a CPU float32 policy (torch's int8 kernels are CPU-only), but "
                             f"parameter {name} is {p.dtype} on {p.device}: pass --device cpu --dtype float32, or "
                             "sample with --rl.sampling.weights float32")


def quantize_row_wise(weight: torch.Tensor) -> torch.Tensor:
    """`weight` (out, in) as a per-row symmetric qint8 tensor (the module docstring's s and q)."""
    scale = weight.detach().abs().amax(dim=1).clamp(min=1e-12) / 127  # (out,); an all-zero row keeps s > 0
    zero_point = torch.zeros(weight.shape[0], dtype=torch.long)
    return torch.quantize_per_channel(weight.detach(), scale.double(), zero_point, 0, torch.qint8)


class Int8Sampler:
    """An int8 copy of `model` (`.module`) that `refresh()` re-quantises from the float weights.

    The copy shares every parameter and buffer with `model` (a deepcopy whose memo maps
    them to themselves) and replaces each Linear by an int8 one. So an optimizer step or a
    load_state_dict that updates `model` in place updates the copy's embeddings and norms
    for free, and only the Linear weights have to be quantised again."""

    def __init__(self, model: Policy):
        check_quantizable(model)
        if any(hasattr(m, "lora_A") for m in model.modules()):
            raise ValueError("int8 sampling cannot quantise a policy with LoRA adapters (they wrap the Linear "
                             "layers and read their float weights); train without LoRA, or sample in float32")
        shared = {id(t): t for t in [*model.parameters(), *model.buffers()]}
        self.module = copy.deepcopy(model, memo=shared).eval()
        # (the copy's parent module, attribute name, the float Linear in `model` it quantises)
        self.linears: list[tuple[nn.Module, str, nn.Linear]] = []
        source = {name: m for name, m in model.named_modules() if type(m) is nn.Linear}  # the float Linears
        for name, parent in list(self.module.named_modules()):
            for child_name, child in list(parent.named_children()):
                if type(child) is nn.Linear:  # exactly Linear: LoRA's wrappers and the like are not plain matmuls
                    full = f"{name}.{child_name}" if name else child_name
                    self.linears.append((parent, child_name, source[full]))
        if not self.linears:
            raise ValueError(f"{type(model).__name__} has no nn.Linear layer to quantise: int8 sampling would "
                             "decode in float32 anyway; sample with --rl.sampling.weights float32")
        with _quiet_deprecation():
            for parent, child_name, linear in self.linears:
                setattr(parent, child_name, torch.ao.nn.quantized.dynamic.Linear(
                    linear.in_features, linear.out_features, bias_=linear.bias is not None, dtype=torch.qint8))
        self.refresh()

    @torch.no_grad()
    def refresh(self) -> None:
        """Quantise every Linear again from the float weights as they are now."""
        with _quiet_deprecation():
            for parent, child_name, linear in self.linears:
                bias = None if linear.bias is None else linear.bias.detach()
                getattr(parent, child_name).set_weight_bias(quantize_row_wise(linear.weight), bias)
