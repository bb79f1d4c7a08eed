"""Where a policy's tensors live and in what precision its forward passes run.

    resolve_device("auto")     cuda if visible, else mps, else cpu; a named device that is not
                               there is a ValueError saying what to pass instead
    place(model, device, dtype) the model on its device, with the precision its forward passes use
    model_device(model)        the device every role creates its tensors on: the policy's own
    autocast(model)            the context a role runs a model's forward pass in

The rule the roles follow: a tensor is created on `model_device(policy)` (or derived from a
tensor that already is: `new_zeros`, `zeros_like`), never on torch's default device. The one
deliberate exception is staging: batches are assembled from Python lists on the CPU and
moved once (`RolloutBatch.to`), because row-by-row writes into a GPU tensor would each be
a host-to-device copy. tests/test_devices.py makes the default device `meta` (which cannot
compute) while the policy is on the CPU, so a tensor created without a device breaks the test.

Precision: `bfloat16` is mixed precision, not bf16 weights. The trained weights and AdamW's
state stay float32 (an update of lr 1e-4 × a weight of ~0.02 is below bf16's 8-bit mantissa,
so pure-bf16 training rounds most updates away); the forward passes run under
`torch.autocast`, which computes matmuls in bf16 and keeps reductions (softmax, norms) in
float32. Log-probs, entropies, advantages and losses are read in float32 (the `.float()`
in models/logprobs.py and roles/rollout.py), and the sampler's draw in float64.
"""

from __future__ import annotations

import contextlib
from typing import Any, TypeVar

import torch

from posttrain.config import DEVICES, DTYPES
from posttrain.models.policy import Policy, Trainable

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}  # DTYPES' torch names
ModuleT = TypeVar("ModuleT", bound=torch.nn.Module)  # place gives back the module it was handed


def mps_available() -> bool:
    return torch.backends.mps.is_available()


def use_threads(threads: int) -> None:
    """--threads: torch's intra-op threads for a job's work; 0 leaves torch's default, every core."""
    if threads:
        torch.set_num_threads(threads)


def resolve_device(name: str) -> torch.device:
    """The torch device `name` (one of DEVICES) means on this machine: "auto" is cuda when a
    CUDA device is visible, else mps (Apple silicon), else cpu. A named device that is absent
    is a ValueError that says so and what to pass instead, not a failure deep in torch."""
    if name not in DEVICES:
        raise ValueError(f"device={name!r} is not allowed: expected one of {list(DEVICES)}")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "mps" if mps_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        why = ("this torch was built without CUDA (a CPU wheel)" if torch.version.cuda is None
               else "torch has CUDA support but sees no GPU (check nvidia-smi and CUDA_VISIBLE_DEVICES)")
        raise ValueError(f"device='cuda' is not allowed: no CUDA device is visible: {why}. "
                         "Pass --device cpu (or auto, which picks cuda, then mps, then cpu)")
    if name == "mps" and not mps_available():
        raise ValueError("device='mps' is not allowed: no Apple MPS device is available on this machine. "
                         "Pass --device cpu (or auto, which picks cuda, then mps, then cpu)")
    return torch.device(name)


def check_precision(device_name: str, dtype_name: str) -> None:
    """ValueError unless dtype_name is one of DTYPES and torch can autocast to it on the
    device device_name resolves to."""
    if dtype_name not in DTYPES:
        raise ValueError(f"dtype={dtype_name!r} is not allowed: expected one of {list(DTYPES)} "
                         "(float32 everywhere; bfloat16 = float32 weights, bf16 forward passes)")
    device = resolve_device(device_name)
    if dtype_name != "float32" and not torch.amp.is_autocast_available(device.type):
        raise ValueError(f"dtype={dtype_name!r} is not allowed on device {device.type!r}: this torch cannot "
                         "autocast there; pass --dtype float32")


def place(model: ModuleT, device: torch.device | str, dtype: str | torch.dtype = "float32") -> ModuleT:
    """`model` moved to `device`, its forward passes to run in `dtype` (see `autocast`).
    The parameters themselves stay float32: see the module docstring."""
    model.to(device)
    dtype = TORCH_DTYPES[dtype] if isinstance(dtype, str) else dtype
    model.compute_dtype = dtype  # type: ignore[assignment]  # a plain attribute; Module's __setattr__ types tensors
    return model


def device_record(device_name: str, dtype_name: str) -> dict:
    """What a run's meta.json records: the device asked for, the one it resolved to (auto's
    choice), the GPU's name, and the dtype."""
    device = resolve_device(device_name)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else ""
    return {"requested": device_name, "resolved": str(device), "name": name, "dtype": dtype_name}


def model_device(model: Trainable) -> torch.device:
    """The device of the model's parameters: where every tensor fed to it is created."""
    return next(model.parameters()).device


def autocast(model: Policy) -> contextlib.AbstractContextManager[Any]:
    """The context to run `model`'s forward pass in: nothing for float32; torch.autocast
    to the model's compute dtype on its device otherwise. Reading outputs that need
    precision (log_softmax of the logits) is the caller's `.float()`."""
    dtype = model.compute_dtype
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(model_device(model).type, dtype=dtype)
