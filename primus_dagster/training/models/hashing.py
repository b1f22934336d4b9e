"""The id hash: raw int64 ids -> buckets of a feature's table, and :class:`FeatureHasher` (a batch's ids
as :class:`~primus_dagster.training.model_api.SparseFeatures` buckets).

Every id is split into three limbs and hashed with fixed per-feature salts modulo the Mersenne prime
``2^31 - 1`` (:class:`~primus_dagster.training.models.tables.HashedEmbedding` documents it): no RNG,
no overflow, negative ids included.

Example::

    buckets = hash_ids(torch.tensor([[7, -3]]), table_salts(2), buckets=1000)   # [1, 2] in [0, 1000)
"""

from __future__ import annotations

import torch
from torch import nn

from primus_dagster.data import Jagged
from primus_dagster.training.features import FeatureLayout
from primus_dagster.training.model_api import SparseFeatures
from primus_dagster.training.models.protocol import NO_LISTS, Lists

HASH_PRIME = (1 << 31) - 1  # Mersenne prime modulus of the hash; products of 22-bit limbs and 31-bit salts fit int64
HASH_LIMBS = ((0, 22), (22, 22), (44, 20))  # (shift, bits): a bijection of int64 onto three non-negative limbs
_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def _one_limb(ids: torch.Tensor) -> bool:
    """Every id in [0, 2^22): its limbs 1 and 2 are 0 (ids of up to 4 M values -- most vocabularies; one
    ``aminmax`` decides; the hash is the same either way, ~half the time of the 3-limb path)."""
    low, high = torch.aminmax(ids)
    return int(low) >= 0 and int(high) < (1 << HASH_LIMBS[0][1])


def _salt(feature: int, k: int) -> int:
    """A fixed salt in [1, P-1] for coefficient ``k`` of feature ``feature`` (no RNG involved)."""
    return 1 + _splitmix64(feature * 8 + k) % (HASH_PRIME - 1)


def table_salts(count: int) -> torch.Tensor:
    """The hash's salts of ``count`` features of one table: int64 [4, count], rows a0, a1, a2, b."""
    return torch.tensor([[_salt(f, k) for f in range(count)] for k in range(4)], dtype=torch.int64).reshape(4, count)


def hash_ids(ids: torch.Tensor, salts: torch.Tensor, buckets: int) -> torch.Tensor:
    """Bucket in ``[0, buckets)`` of every raw id (int64, any value) of ``ids`` [..., F] under the
    salts [4, F] of its feature (:func:`table_salts`; :class:`~.tables.HashedEmbedding` documents the hash)."""
    ids = ids.to(torch.int64)
    if ids.numel() and _one_limb(ids):
        h = ids * salts[0] + salts[3]  # the upper limbs are 0: the same sum, 2 ops instead of 12
    else:
        h = salts[3].expand_as(ids)
        for k, (shift, bits) in enumerate(HASH_LIMBS):
            limb = torch.bitwise_and(ids >> shift, (1 << bits) - 1)  # arithmetic shift, then mask: >= 0
            h = h + limb * salts[k]  # < 2^22 * 2^31 each: the sum stays far below 2^63
    return torch.remainder(torch.remainder(h, HASH_PRIME), buckets)


class FeatureHasher(nn.Module):
    """A batch's raw ids -> :class:`~.model_api.SparseFeatures`: every id and list feature of
    ``layout``, its ids hashed into ``[0, buckets)`` of the feature's table -- the same buckets the
    built-in models' :class:`~.tables.HashedEmbedding` picks (salts per table, its id columns before its lists).

    Example::

        hasher = FeatureHasher(layout)
        features = hasher(batch.sparse, batch.lists)      # features["user_id"].values: [B] buckets
    """

    def __init__(self, layout: FeatureLayout):
        super().__init__()
        self.order = [c.name for c in (*layout.sparse, *layout.lists)]
        self.parts: list[tuple[int, list[int], list[str]]] = []  # per table: buckets, id columns, lists
        for index, name in enumerate(layout.table_names()):
            ids, lists = layout.table_features(name)
            self.parts.append((layout.tables[name][0], ids, [c.name for c in lists]))
            self.register_buffer(f"salts_{index}", table_salts(len(ids) + len(lists)), persistent=False)
        self.sparse_names = [c.name for c in layout.sparse]

    def forward(self, sparse: torch.Tensor, lists: Lists = NO_LISTS) -> SparseFeatures:
        rows = sparse.shape[0]
        ones = torch.arange(rows + 1, dtype=torch.int64, device=sparse.device)  # the offsets of one id per row
        out: dict[str, Jagged] = {}
        for index, (buckets, ids, list_names) in enumerate(self.parts):
            salts: torch.Tensor = getattr(self, f"salts_{index}")
            if ids:
                hashed = hash_ids(sparse[:, ids], salts[:, : len(ids)], buckets)
                for k, column in enumerate(ids):
                    out[self.sparse_names[column]] = Jagged(hashed[:, k].contiguous(), ones)
            for k, name in enumerate(list_names):
                f = len(ids) + k
                jagged = lists[name]
                values = hash_ids(jagged.values.unsqueeze(1), salts[:, f : f + 1], buckets).squeeze(1)
                out[name] = Jagged(values, jagged.offsets, jagged.weights)
        return SparseFeatures({name: out[name] for name in self.order}, rows)
