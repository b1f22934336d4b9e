"""The built-in models: :class:`SingleTower` (the DLRM-style baseline) and :class:`MTRM` (a memory tower
for batch samples, an adapt tower for stream samples and serving, the label-delay calibration).

Example::

    model = MTRM(ModelSpec(type="mtrm"), FeatureLayout.plain(ModelSpec(), n_dense=13, n_sparse=5))
    ctr = torch.sigmoid(model.predict(dense, sparse))
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from primus_dagster.spec.job import ModelSpec
from primus_dagster.training.features import FeatureLayout
from primus_dagster.training.models.groups import ParameterGroups
from primus_dagster.training.models.protocol import NO_LISTS, Lists, RecModel
from primus_dagster.training.models.towers import CustomTower, DLRMTower, MemoryTower, build_tower

_KIND_INDEX = {"batch": 0, "stream": 1}
_MIN_OBSERVED = 1000  # samples of each kind before the calibration applies


class SingleTower(RecModel):
    """DLRM-style baseline: one tower learns every kind; ``predict == forward``.

    Example::

        model = SingleTower(ModelSpec(type="single"), FeatureLayout.plain(ModelSpec(), n_dense=13, n_sparse=5))
        logits = model(dense, sparse, "batch")            # [B]
    """

    model_type = "single"

    def __init__(self, spec: ModelSpec, layout: FeatureLayout):
        super().__init__(spec, layout)
        self.tower = DLRMTower(spec, layout)

    def logits(self, dense: torch.Tensor, sparse: torch.Tensor, lists: Lists, kind: str) -> torch.Tensor:
        return self.tower(dense, sparse, lists)


class MTRM(RecModel):
    """Mixture training recommendation model: ``memory`` tower (batch) + ``adapt`` tower (stream, serving).

    ``forward(.., "batch")`` -> memory head logits (gradients reach the memory tower only);
    ``forward(.., "stream")`` -> adapt head logits on the detached memory state ``h_aux`` (gradients
    reach the adapt tower only); ``predict`` -> the adapt tower, shifted by :meth:`delay_offset`.
    With ``spec.adapt_batch_weight`` w > 0, a batch sample also trains the adapt tower
    (:meth:`auxiliary_loss`: w x its BCE on the same detached ``h_aux``; the memory tower still gets no
    gradient from the adapt tower).

    **Label-delay calibration.** The adapt tower learns stream labels, which miss the clicks that
    arrive after the stream's label window, so its probabilities run low (ranking, AUC, is not
    affected). :meth:`observe` counts the positives of each kind the trainer sees; ``predict`` adds
    ``logit(rate_batch) - logit(rate_stream)`` once both kinds have ``_MIN_OBSERVED`` samples: the
    complete-label rate of the batch data over the stream's observed rate.

    Example::

        model = MTRM(ModelSpec(type="mtrm"), FeatureLayout.plain(ModelSpec(), n_dense=13, n_sparse=5))
        loss = F.binary_cross_entropy_with_logits(model(dense, sparse, "stream"), label)
        ctr = torch.sigmoid(model.predict(dense, sparse))
    """

    model_type = "mtrm"
    label_sums: torch.Tensor  # registered buffers
    label_counts: torch.Tensor

    def __init__(self, spec: ModelSpec, layout: FeatureLayout):
        super().__init__(spec, layout)
        # h_aux: the built-in memory tower's hidden state and its embeddings of the sample's ids (see
        # memory_state), or a team tower's state(inputs); either tower may be a team's (spec.memory / adapt)
        memory = build_tower(spec, layout, "memory")
        assert isinstance(memory, MemoryTower | CustomTower)
        self.memory: MemoryTower | CustomTower = memory
        self.adapt = build_tower(spec, layout, "adapt", aux_dim=memory.state_dim)
        # [batch, stream] label sums and counts (float64: exact far beyond a day of samples)
        self.register_buffer("label_sums", torch.zeros(2, dtype=torch.float64))
        self.register_buffer("label_counts", torch.zeros(2, dtype=torch.float64))

    def parameter_groups(self) -> ParameterGroups:
        """``memory`` (the memory tower) trained by batch samples, ``adapt`` by stream samples -- and by
        batch samples too with ``adapt_batch_weight`` > 0 (:meth:`auxiliary_loss`); the adapt tower reads
        the memory tower's state ``h_aux`` without a gradient (:meth:`memory_state`)."""
        adapt_on_batch = self.spec.adapt_batch_weight > 0
        return ParameterGroups(
            (("memory.", "memory"), ("adapt.", "adapt")),
            trains={"batch": ("memory", "adapt") if adapt_on_batch else ("memory",), "stream": ("adapt",)},
            reads={"stream": ("memory",), **({"batch": ("memory",)} if adapt_on_batch else {})},
        )

    def observe_labels(self, kind: str, label_sum: float, count: int) -> None:
        """Count the labels of a trained micro-batch of ``kind`` (for :meth:`delay_offset`)."""
        index = _KIND_INDEX.get(kind)
        if index is not None:
            self.label_sums[index] += label_sum
            self.label_counts[index] += count

    def observe(self, kind: str, labels: torch.Tensor) -> None:
        """:meth:`observe_labels` of the labels of a trained batch of ``kind``."""
        self.observe_labels(kind, float(labels.sum()), labels.numel())

    def delay_offset(self) -> float:
        """``logit(batch positive rate) - logit(adapt tower's positive rate)``; 0 until both kinds were
        seen. The adapt tower's rate is the stream's, or with ``adapt_batch_weight`` w the w-weighted
        mixture ``(sum_stream + w sum_batch) / (n_stream + w n_batch)`` of the labels it learnt."""
        if bool((self.label_counts < _MIN_OBSERVED).any()):
            return 0.0
        w = self.spec.adapt_batch_weight
        sums, counts = self.label_sums, self.label_counts
        adapt_rate = (sums[1] + w * sums[0]) / (counts[1] + w * counts[0])
        rates = torch.stack([sums[0] / counts[0], adapt_rate]).clamp(1e-6, 1 - 1e-6)
        logits = torch.log(rates / (1 - rates))
        return float(logits[0] - logits[1])

    def memory_state(self, dense: torch.Tensor, sparse: torch.Tensor, lists: Lists = NO_LISTS) -> torch.Tensor:
        """h_aux [B, memory_hidden[-1] + embedding width], without gradient (of transformed ``dense``):
        the memory tower's hidden state and its embeddings of the sample's ids. The embeddings, learnt
        on every batch sample's complete labels, carry the long-term user/item knowledge the adapt
        tower's own table (stream samples only) learns more slowly; with them the adapt tower gained
        AUC over the hidden state alone on the bench's tuning seeds (docs/training.md)."""
        with torch.no_grad():
            return self.memory.state(dense, sparse, lists)

    def lr_scale(self, name: str) -> float:
        """``spec.memory_lr_scale`` for the memory tower's parameters, 1 for the adapt tower's. The
        memory tower learns only the batch samples, once each; at the adapt tower's rate it stayed
        under-trained after one pass (its own AUC below the single tower's), and the adapt tower reads
        its state. 3x raised both towers' AUC in every world of the quality bench (docs/training.md);
        the default stays 1 (a faster memory tower is also a faster-moving ``h_aux``)."""
        return self.spec.memory_lr_scale if name.startswith("memory.") else 1.0

    def auxiliary_loss(
        self, dense: torch.Tensor, sparse: torch.Tensor, kind: str, label: torch.Tensor, lists: Lists = NO_LISTS
    ) -> torch.Tensor | None:
        """On a batch sample with ``spec.adapt_batch_weight`` w > 0: w x the adapt tower's BCE on the
        detached ``h_aux`` (the stream-only adapt tower had to relearn the long-term affinity from the
        stream's incomplete labels; a single tower learns it from both copies in one table). None else."""
        w = self.spec.adapt_batch_weight
        if kind != "batch" or w == 0:
            return None
        x = self.dense_transform(dense)
        logits = self.adapt(x, sparse, lists, self.memory_state(x, sparse, lists), kind="batch")
        return w * F.binary_cross_entropy_with_logits(logits, label)

    def logits(self, dense: torch.Tensor, sparse: torch.Tensor, lists: Lists, kind: str) -> torch.Tensor:
        if kind == "batch":
            return self.memory(dense, sparse, lists, kind="batch")
        if kind == "stream":
            return self.adapt(dense, sparse, lists, self.memory_state(dense, sparse, lists), kind="stream")
        raise ValueError(f"MTRM got samples of kind {kind!r}; expected 'batch' or 'stream'")

    def predict(self, dense: torch.Tensor, sparse: torch.Tensor, lists: Lists = NO_LISTS) -> torch.Tensor:
        return self.forward(dense, sparse, "stream", lists) + self.delay_offset()
