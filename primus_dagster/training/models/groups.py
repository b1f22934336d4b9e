"""What a model trains on which data kind: :class:`ParameterGroups`, the declaration every model makes.

A model's parameters fall into named groups (MTRM: its ``memory`` and ``adapt`` towers; a single tower:
one group). For each data kind the declaration says which groups a micro-batch of that kind *trains*
(they get its gradients) and which it only *reads* without a gradient (MTRM's stream samples read the
memory tower's state, ``h_aux``, detached). The trainer's loop and a group's gradient exchange read this
declaration and nothing else of the model: a model with towers of its own per data kind declares them
here and trains alone or in a group unchanged.

Example::

    groups = ParameterGroups((("memory.", "memory"), ("adapt.", "adapt")),
                             trains={"batch": ("memory",), "stream": ("adapt",)},
                             reads={"stream": ("memory",)})
    groups.group_of("adapt.head.weight"), groups.trained_by("batch")      # 'adapt', ('memory',)
    groups.describe()      # 'memory: trained by batch; adapt: trained by stream (stream reads memory, no gradient)'
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

#: The sample kinds a model is called with: ``batch`` (complete, delayed labels), ``stream`` (fresh ones).
KINDS = ("batch", "stream")


@dataclass(frozen=True)
class ParameterGroups:
    """A model's parameter groups and what each data kind trains (module docstring).

    ``prefixes``: ``(name prefix, group)`` pairs, the first match wins (``""`` matches every name);
    ``trains``: kind -> the groups a micro-batch of that kind trains, in a fixed order; ``reads``: kind ->
    the groups its forward reads without a gradient.
    """

    prefixes: tuple[tuple[str, str], ...]
    trains: Mapping[str, tuple[str, ...]]
    reads: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        names = set(self.names)
        for kind, groups in {**self.trains, **self.reads}.items():
            if kind not in KINDS:
                raise ValueError(f"parameter groups name the data kind {kind!r}; the kinds are {list(KINDS)}")
            unknown = sorted(set(groups) - names)
            if unknown:
                raise ValueError(
                    f"parameter groups: kind {kind!r} names groups {unknown}; the groups are {sorted(names)}"
                )

    @classmethod
    def one(cls, name: str = "all") -> ParameterGroups:
        """Every parameter in one group that every kind trains (a single tower, a team's model)."""
        return cls((("", name),), trains=dict.fromkeys(KINDS, (name,)))

    @property
    def names(self) -> tuple[str, ...]:
        """The groups, in the order their first prefix comes."""
        return tuple(dict.fromkeys(group for _, group in self.prefixes))

    def group_of(self, parameter: str) -> str:
        """The group of the parameter called ``parameter`` (``model.named_parameters()``)."""
        for prefix, group in self.prefixes:
            if parameter.startswith(prefix):
                return group
        raise ValueError(f"parameter {parameter!r} is in no declared group (prefixes {[p for p, _ in self.prefixes]})")

    def trained_by(self, kind: str) -> tuple[str, ...]:
        """The groups a micro-batch of ``kind`` trains."""
        return self.trains.get(kind, ())

    def describe(self) -> str:
        """One line: each group and the kinds that train it, and what each kind reads without a gradient."""
        parts = []
        for group in self.names:
            kinds = [kind for kind in KINDS if group in self.trained_by(kind)] or ["nothing"]
            parts.append(f"{group}: trained by {', '.join(kinds)}")
        reads = [f"{kind} reads {', '.join(groups)}" for kind, groups in self.reads.items() if groups]
        return "; ".join(parts) + (f" ({'; '.join(reads)}, no gradient)" if reads else "")
