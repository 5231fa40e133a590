"""The payload of a weight refresh: the trainer's full weights under HF parameter names, one version."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class HFWeights:
    """Full HF-named weights of one policy version (what a weight refresh ships to the instances)."""

    version: int
    tensors: dict[str, np.ndarray] = field(default_factory=dict)

    def to_safetensors_bytes(self, dtype: str = "float32") -> bytes:
        """safetensors bytes of the tensors in `dtype` (vLLM's reload_weights reads these)."""
        from safetensors.torch import save

        return save({k: torch.from_numpy(np.array(v)).to(_DTYPES[dtype]) for k, v in self.tensors.items()},
                    metadata={"policy_version": str(self.version)})

    @property
    def num_bytes(self) -> int:
        return int(sum(v.nbytes for v in self.tensors.values()))
