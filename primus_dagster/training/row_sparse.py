"""Embedding lookups whose table gradient arrives already coalesced: one row per touched bucket.

``nn.Embedding(sparse=True)`` and ``F.embedding_bag(sparse=True)`` return one gradient row per *looked-up
id*; the optimizer and the multi-trainer exchange need one row per *touched table row*, so they first
sort the ids (``coalesce``). On the bench's multi-hot shape (8 lists of mean length 10, batch 2048) that
sort was a quarter of a training step. :class:`RowSparseBag` builds the per-row gradient in its backward
pass (:func:`row_sums`): from a presence mask over the table when the table has at most
:data:`COUNTING_ROWS_PER_ID` rows per looked-up id (no sort), from the sort otherwise. The forward pass
is ``F.embedding_bag``'s own, so outputs are unchanged.

The gradient is a sparse COO tensor with one row per touched bucket, ascending (coalesced; autograd's
accumulation into ``.grad`` drops the ``is_coalesced`` flag, so
:func:`~primus_dagster.training.trainer.coalesced_rows` checks the order in one pass), and
:class:`~.trainer.LazyAdam` and the exchange read it without a second sort. Either way a row's sum is the same in every run.

Example::

    table = nn.Embedding(10_000, 16, sparse=True)
    pooled = row_sparse_bag(table.weight, ids, offsets, mode="sum")      # [B, 16], like F.embedding_bag
    pooled.sum().backward()
    table.weight.grad._indices()                                        # each touched bucket once, ascending
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from primus_dagster.training import kernels

# A presence mask over the table costs passes over its rows and an accumulating scatter of the ids; a sort
# costs ~log2(ids) passes over the ids, then a fast segment sum. Measured: the mask path wins up to about one
# table row per id and ties near one; the DLRM shape's shared table (several rows per id) sorts. Figures
# and their conditions in docs/training.md, "Measured reasons in the code".
COUNTING_ROWS_PER_ID = 1


def sorted_row_sums(ids: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rows, sums)``: the distinct ``ids`` ascending and, for each, the sum of its ``values`` rows --
    ``torch.sparse_coo_tensor(ids[None], values).coalesce()``'s indices and values, bit for bit
    (coalesce's own sort, then an in-order segment sum).

    Example::

        sorted_row_sums(torch.tensor([5, 2, 5]), torch.ones(3, 2))   # (tensor([2, 5]), [[1, 1], [2, 2]])
    """
    ordered, order = torch.sort(ids)  # coalesce's own sort (not stable=True: the order of ties must match)
    rows, counts = torch.unique_consecutive(ordered, return_counts=True)
    # a segment sum of the sorted rows: embedding_bag adds each bag's rows in order, from 0
    return rows, F.embedding_bag(order, values, torch.cumsum(counts, 0) - counts, mode="sum")


def touched_rows(ids: torch.Tensor, n_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rows, slot)``: the distinct ``ids`` ascending, and for every table row its place in ``rows``
    (meaningful where the row is touched), from a presence mask over the ``n_rows`` rows (no sort)."""
    present = torch.bincount(ids, minlength=n_rows) > 0
    return present.nonzero().squeeze(1), torch.cumsum(present, 0) - 1


def row_sums(ids: torch.Tensor, values: torch.Tensor, n_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rows, sums)`` as :func:`sorted_row_sums` gives them, for ``ids`` in ``[0, n_rows)``: through a
    presence mask over the rows when the table has at most :data:`COUNTING_ROWS_PER_ID` rows per id (no
    sort; each row's sum adds its values in id order, so the last bits may differ from the sort's)."""
    if n_rows > COUNTING_ROWS_PER_ID * ids.numel():
        return sorted_row_sums(ids, values)
    rows, slot = touched_rows(ids, n_rows)
    sums = torch.zeros(len(rows), values.shape[1], dtype=values.dtype, device=values.device)
    sums.index_put_((slot.index_select(0, ids),), values, accumulate=True)  # index_add_'s sums, ~10 % faster
    return rows, sums


def _bag_of_ids(offsets: torch.Tensor, n_ids: int) -> torch.Tensor:
    """The bag (output row) of each of ``n_ids`` ids, from the bags' start ``offsets`` [B]."""
    lengths = torch.diff(offsets, append=offsets.new_tensor([n_ids]))
    return torch.repeat_interleave(torch.arange(len(offsets), device=offsets.device), lengths, output_size=n_ids)


class RowSparseBag(torch.autograd.Function):
    """``F.embedding_bag(ids, weight, offsets, mode, per_sample_weights=weights)`` whose ``weight``
    gradient is coalesced (module docstring). ``offsets`` None: every id is a bag of its own (a plain
    lookup, ``[N, dim]``). Use :func:`row_sparse_bag`."""

    @staticmethod
    def forward(
        ctx: Any,
        weight: torch.Tensor,
        ids: torch.Tensor,
        offsets: torch.Tensor | None,
        mode: str,
        weights: torch.Tensor | None,
    ) -> torch.Tensor:
        if offsets is None:
            out = F.embedding(ids, weight)
        else:
            out = F.embedding_bag(ids, weight, offsets, mode=mode, per_sample_weights=weights)
        ctx.save_for_backward(ids, offsets, weights)
        ctx.mode, ctx.shape = mode, weight.shape
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None, None]:
        ids, offsets, weights = ctx.saved_tensors
        n_rows, dim = ctx.shape
        bag = None if offsets is None else _bag_of_ids(offsets, ids.numel())
        compiled = kernels.active().row_grads
        if compiled is not None and n_rows <= COUNTING_ROWS_PER_ID * ids.numel():
            scale = weights
            if bag is not None and weights is None and ctx.mode == "mean":
                lengths = torch.bincount(bag, minlength=len(offsets)).clamp_(min=1)
                scale = lengths.reciprocal().to(grad_out.dtype).index_select(0, bag)
            rows, slot = touched_rows(ids, n_rows)
            # contiguous: the form the kernel was compiled for (the top MLP's input gradient arrives sliced)
            source = grad_out.reshape(-1, dim) if bag is None else grad_out.contiguous()
            summed = compiled(source, ids, bag, scale, slot, len(rows))
        else:
            rows, summed = row_sums(ids, _id_grads(grad_out, bag, weights, ctx.mode, dim), n_rows)
        grad = torch.sparse_coo_tensor(
            rows.unsqueeze(0), summed, (n_rows, dim), is_coalesced=True, check_invariants=False
        )
        return grad, None, None, None, None


def _id_grads(
    grad_out: torch.Tensor, bag: torch.Tensor | None, weights: torch.Tensor | None, mode: str, dim: int
) -> torch.Tensor:
    """The gradient of every looked-up id's row: its bag's output gradient, weighted or averaged."""
    if bag is None:
        return grad_out.reshape(-1, dim)
    id_grads = grad_out.index_select(0, bag)
    if weights is not None:
        return id_grads * weights.unsqueeze(1)
    if mode == "mean":
        lengths = torch.bincount(bag, minlength=grad_out.shape[0]).clamp_(min=1)
        return id_grads / lengths.index_select(0, bag).unsqueeze(1).to(id_grads.dtype)
    return id_grads


def row_sparse_bag(
    weight: torch.Tensor,
    ids: torch.Tensor,
    offsets: torch.Tensor | None = None,
    mode: str = "sum",
    weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """``ids`` (1-D bucket ids) looked up in ``weight`` and pooled into the bags that start at ``offsets``
    (``mode`` sum or mean, ``weights`` per id with sum), or each id alone when ``offsets`` is None; the
    gradient of ``weight`` is coalesced row-sparse (:class:`RowSparseBag`)."""
    return RowSparseBag.apply(weight, ids.reshape(-1), offsets, mode, weights)
