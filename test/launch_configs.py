"""The CUDA launch policies as data (csrc/include/baracuda/<family>_policy.h), read through
``torch.ops.baracuda._launch_config`` with the recorded facts of an H100 or an H200, on any build."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

import baracuda_ops  # noqa: F401  (registers the ops)

# The facts the recorded H200 (and H100) share with the launchers' view of a device:
# compute capability 9.0 and 132 SMs (the policies of these families read no bandwidth).
RECORDED_SMS = 132
RECORDED_L2_BYTES = 52428800


@dataclass(frozen=True)
class LaunchConfig:
    kind: str
    params: dict[str, int]
    workspace_bytes: int

    def __getitem__(self, name: str) -> int:
        return self.params[name]

    def describe(self) -> str:
        """The Plan's ``sku().variant`` for this config: kind<name=value,...>."""
        return self.kind + "<" + ",".join(f"{k}={v}" for k, v in self.params.items()) + ">"


def launch_config(op: str, problem: Sequence[int], dtype: torch.dtype, facts: str = "h200") -> LaunchConfig:
    kind, names, values, workspace = torch.ops.baracuda._launch_config(op, list(problem), dtype, facts)
    return LaunchConfig(kind, dict(zip(names, values)), workspace)


def device_has_recorded_facts(device: torch.device) -> bool:
    """Whether `device` is a GPU the policies see as the recorded H100 / H200 (sm_90, 132 SMs)."""
    if device.type != "cuda":
        return False
    props = torch.cuda.get_device_properties(device)
    return (props.major, props.minor) == (9, 0) and props.multi_processor_count == RECORDED_SMS


def recorded_facts_name(device: torch.device) -> str:
    """The recorded facts the launchers take for `device` (one with recorded facts): an H200's past
    100 GiB of memory, else an H100's (csrc/include/baracuda/cuda_utils.cuh, device_facts)."""
    return "h200" if torch.cuda.get_device_properties(device).total_memory > 100 * 2**30 else "h100"
