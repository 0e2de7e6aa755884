"""Device tensors in host memory: what the tracer copies to the host, how, and what it leaves on
the device.

A CUDA tensor's copy is queued without waiting (:class:`HostCopy`) and read once the writer has
waited for the device, once a batch; a tensor of another device is copied with ``.cpu()``. Large
attention probabilities are analysed on their device instead (:func:`device_attention_rows`).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Dict, Optional, Tuple, Union

import numpy as np

from ..attention import AttentionRows, attention_rows
from ..writer import Pending, dtype_name

#: Device types whose tensors are copied to host memory asynchronously (:class:`HostCopy`):
#: the writer waits for them once a batch. Another device's are copied with ``.cpu()``.
ASYNC_COPY_DEVICES = ("cuda",)

#: Attention probabilities on a device with at least this many elements are analysed there
#: (:func:`model_trace.attention.attention_rows`: ~35 small torch operations, then one copy of
#: the results, which waits for the device); smaller ones with the batch's others in host
#: memory, from the copy made for their summary anyway. Measured on an H100 machine (torch
#: 2.11, python/benchmarks/cuda_copies.py), one tensor's analysis on the device took 1.2-1.5 ms
#: at every size from 153 to 2.4M elements (launches and the wait); in host memory 0.12 ms for
#: a decode step's [1, 9, 1, 17], 0.23 ms for a 16-token prefill's [1, 9, 16, 16], 1.1 ms for
#: 37K elements, 2.0 ms for 83K, 3.0 ms for 147K, 15 ms for 590K. They meet at about 50K; the
#: wait for the device, which also keeps it from running ahead of the host, tips it to 64K.
DEVICE_ANALYSIS_MIN_ELEMENTS = 1 << 16


def analysed_on_device(probs: Any) -> bool:
    """Whether the attention rows of ``probs`` (a torch tensor) are analysed on its device,
    rather than in host memory with the batch's other attention tensors."""
    return probs.device.type != "cpu" and probs.numel() >= DEVICE_ANALYSIS_MIN_ELEMENTS


def device_attention_rows(probs: Any) -> Optional[AttentionRows]:
    """The attention rows of ``probs`` analysed on its device (then one copy of the results)
    where :func:`analysed_on_device` says so; None for the others, which the writer analyses in
    host memory with the batch's other attention tensors."""
    return attention_rows(probs) if analysed_on_device(probs) else None


def copied_later(tensor: Any) -> bool:
    """Whether ``tensor`` is copied to the host without waiting (its device's type is one of
    :data:`ASYNC_COPY_DEVICES`)."""
    return tensor.device.type in ASYNC_COPY_DEVICES


def to_numpy(value: Any) -> Tuple[Union[np.ndarray, Pending], str]:
    """A tensor's values as float32 on the host (a CPU float32 tensor's own memory), and its
    dtype's name. A CUDA tensor's come as a :class:`HostCopy` whose values the writer reads
    once it has waited for the device (one wait a batch, not one a tensor)."""
    import torch

    if isinstance(value, torch.Tensor):
        tensor = value.detach()
        if copied_later(tensor):
            # float16 and bfloat16 copied as they are (half the bytes) and widened in host
            # memory; other types made float32 on the device, as before a blocking copy.
            if tensor.dtype not in (torch.float32, torch.float16, torch.bfloat16):
                tensor = tensor.to(torch.float32)
            return HostCopy(tensor), _dtype_name(value.dtype)
        if tensor.dtype != torch.float32:
            tensor = tensor.to(torch.float32)
        if tensor.device.type != "cpu":
            tensor = tensor.cpu()
        return tensor.numpy(), _dtype_name(value.dtype)
    array = np.asarray(value)
    return array.astype(np.float32), dtype_name(array.dtype)


class HostCopy(Pending):
    """A device tensor's copy to host memory, under way. ``tensor.to("cpu", non_blocking=True)``
    queues the copy on the device's current stream and returns at once, with a host tensor
    that torch allocates in pinned memory (``_to_copy`` pins the result of a non-blocking copy
    from an accelerator to the CPU): its values are there only once the device has reached
    the copy. So they are read (:meth:`read`) only after ``wait``, a
    ``torch.cuda.synchronize`` of the device, which the writer calls once for its batch. The
    copy is taken now: what the model does with the tensor later on the same stream comes after
    it."""

    __slots__ = ("host",)

    def __init__(self, tensor: Any):
        super().__init__(tensor.shape, _synchronizer(tensor.device))
        self.host = tensor.to("cpu", non_blocking=True)

    def read(self) -> np.ndarray:
        import torch

        host, self.host = self.host, None
        if host.dtype in (torch.float16, torch.bfloat16):
            host = host.to(torch.float32)  # exact: every float16 and bfloat16 value is a float32 one
        return host.numpy()


_SYNCHRONIZERS: Dict[Any, Callable[[], None]] = {}


def _synchronizer(device: Any) -> Callable[[], None]:
    """``torch.cuda.synchronize(device)``, one callable a device: the writer calls each distinct
    one once a batch."""
    wait = _SYNCHRONIZERS.get(device)
    if wait is None:
        import torch

        wait = _SYNCHRONIZERS[device] = functools.partial(torch.cuda.synchronize, device)
    return wait


_DTYPE_NAMES: Dict[Any, str] = {}


def _dtype_name(dtype: Any) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = dtype_name(dtype)
    return name


def kept(tensor: Any) -> Any:
    """A copy of a tensor on its device, in its dtype (None for anything else)."""
    import torch

    if not isinstance(tensor, torch.Tensor):
        return None
    return tensor.detach().clone()


def host_values(tensor: Any) -> Optional[np.ndarray]:
    """A kept tensor's values as float32 in host memory (a wait for its device)."""
    import torch

    return None if tensor is None else tensor.to(torch.float32).cpu().numpy()
