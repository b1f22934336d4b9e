"""The huge-page allocator: zeros and copies on 2 MB transparent huge pages.

It backs the embedding tables (:class:`~primus_dagster.training.models.HashedEmbedding`) and the
optimiser's moments of those tables (:class:`~primus_dagster.training.trainer.LazyAdam`): both far larger
than the caches and read and written at random rows every step.

Example::

    table = huge_page_zeros((100_000, 16))       # on 2 MB pages where Linux allows, else plain zeros
    weight = huge_page_copy(torch.randn(100_000, 16))
"""

from __future__ import annotations

import math
import mmap

import torch

_HUGE_PAGE = 2 << 20


def huge_page_zeros(shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Zeros of ``shape`` in memory that Linux is asked to back with transparent huge pages
    (``MADV_HUGEPAGE``: used where THP is in ``madvise`` or ``always`` mode), or plain zeros (below
    2 MB, or where that is not available).

    For embedding tables and their optimiser state, far larger than the caches: a training step reads
    and writes ~50 000 random rows of each, and with 4 KB pages nearly every one of those also misses
    the TLB. 2 MB pages made the row gathers and writes of a step cheaper (``bench/train_throughput.py``;
    figures in docs/training.md, "Measured reasons in the code"). The values
    are the same; only the memory under them differs (an anonymous mapping, 2 MB-aligned).
    """
    count = math.prod(shape)
    nbytes = count * dtype.itemsize
    if nbytes < _HUGE_PAGE or not hasattr(mmap, "MADV_HUGEPAGE"):
        return torch.zeros(shape, dtype=dtype)
    try:
        region = mmap.mmap(-1, nbytes + _HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        region.madvise(mmap.MADV_HUGEPAGE)
    except (OSError, ValueError, AttributeError):
        return torch.zeros(shape, dtype=dtype)
    offset = -torch.frombuffer(region, dtype=torch.uint8, count=1).data_ptr() % _HUGE_PAGE
    # a storage of exactly the table (what torch.save writes); it keeps the mapping alive; anonymous memory is 0.
    # set_ rather than .view(shape): a tensor of its own, not a view (torch.compile'd kernels take it as the
    # plain tensor they were compiled for: training/kernels.py)
    flat = torch.frombuffer(region, dtype=dtype, count=count, offset=offset)
    strides = [math.prod(shape[k + 1 :]) for k in range(len(shape))]  # row-major, as .view(shape) has
    return torch.empty(0, dtype=dtype).set_(flat.untyped_storage(), 0, shape, strides)


def on_huge_pages(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` starts on a 2 MB boundary of CPU memory, as :func:`huge_page_zeros` places it (a
    tensor there needs no :func:`huge_page_copy`)."""
    return tensor.device.type == "cpu" and tensor.numel() > 0 and tensor.data_ptr() % _HUGE_PAGE == 0


def huge_page_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A copy of a CPU ``tensor`` in :func:`huge_page_zeros` memory (the tensor itself when it is
    smaller than 2 MB or not on the CPU)."""
    if tensor.device.type != "cpu" or tensor.numel() * tensor.element_size() < _HUGE_PAGE:
        return tensor
    return huge_page_zeros(tuple(tensor.shape), tensor.dtype).copy_(tensor)
