"""Move trainer state to host memory while colocated rollout engines use the device (MindSpeed-RL's
`offload_train_optimizer/grad/param`), and back before the next update.

Tensors are moved by *storage*: each distinct storage is copied into a host buffer and its device
allocation is released with `untyped_storage().resize_(0)`; every tensor viewing it (megatron's
contiguous param/grad buffers, `param.main_grad`, distributed-optimizer shards) keeps its identity
and becomes valid again when the storage is re-materialised and copied back. The same code runs on
every device: on CPU the "device" copy is released and the host copy is a separate allocation, so
the trainer's buffers really leave the training path between updates.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from asp_npu.device import pinnable


@dataclass
class _Moved:
    storage: torch.UntypedStorage
    host: torch.Tensor
    nbytes: int


@dataclass
class Offloader:
    """Offloads one named set of storages (optimizer state or weights) and restores it. Gradients
    need no copy (they are zeroed before every update): megatron's DDP `offload_grad_buffers` frees them."""

    name: str
    moved: list[_Moved] = field(default_factory=list)

    @property
    def offloaded(self) -> bool:
        return bool(self.moved)

    def offload(self, tensors: Iterable[torch.Tensor]) -> int:
        """Copy each distinct storage to host memory and free it on the device; returns bytes freed."""
        if self.moved:
            return 0
        freed = 0
        storages: dict[int, torch.UntypedStorage] = {}
        for t in tensors:
            s = t.untyped_storage()
            if s.nbytes():
                storages.setdefault(s.data_ptr(), s)
        for s in storages.values():
            # pinned host memory for a device storage; a blocking copy, so releasing it below is safe
            pin = pinnable(s.device.type)
            host = torch.empty(s.nbytes(), dtype=torch.uint8, device="cpu", pin_memory=pin)
            host.copy_(torch.empty(0, dtype=torch.uint8, device=s.device).set_(s))
            n = s.nbytes()
            s.resize_(0)
            self.moved.append(_Moved(s, host, n))
            freed += n
        return freed

    def restore(self) -> int:
        """Re-allocate every released storage on its device and copy the host contents back."""
        back = 0
        for m in self.moved:
            m.storage.resize_(m.nbytes)
            torch.empty(0, dtype=torch.uint8, device=m.storage.device).set_(m.storage).copy_(m.host)
            back += m.nbytes
        self.moved = []
        return back
