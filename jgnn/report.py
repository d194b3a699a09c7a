"""The `explain` report: what the analysis found and every decision the compiler made, with its reason."""

from __future__ import annotations

import collections
import dataclasses


@dataclasses.dataclass(frozen=True)
class EquationRecord:
    """One analysed equation: its primitive, how it moves data and where its output lives."""

    primitive: str
    movement: str
    out_residency: str
    shape: tuple[int, ...] = ()
    index: str | None = None


@dataclasses.dataclass(frozen=True)
class RewriteRecord:
    """A rewrite that was applied (``kind`` is the pass name) or skipped (``applied=False``), and why."""

    kind: str
    detail: str
    applied: bool = True


@dataclasses.dataclass(frozen=True)
class FallbackRecord:
    """A region left to the reference program, the primitive that started it and why."""

    reason: str
    primitive: str = ""


@dataclasses.dataclass(frozen=True)
class KernelRecord:
    """A fused op and the backend chosen to run it."""

    op: str
    backend: str
    detail: str = ""


@dataclasses.dataclass(frozen=True)
class RematRecord:
    """What the training step saves for the backward pass and what it recomputes."""

    policy: str
    saved: tuple[str, ...] = ()
    recomputed: tuple[str, ...] = ()
    detail: str = ""


@dataclasses.dataclass
class Report:
    backend: str
    sizes: dict[str, int]
    equations: list[EquationRecord] = dataclasses.field(default_factory=list)
    rewrites: list[RewriteRecord] = dataclasses.field(default_factory=list)
    fallbacks: list[FallbackRecord] = dataclasses.field(default_factory=list)
    kernels: list[KernelRecord] = dataclasses.field(default_factory=list)
    remat: list[RematRecord] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def applied_rewrites(self) -> list[RewriteRecord]:
        return [r for r in self.rewrites if r.applied]

    def summary(self) -> str:
        moves = collections.Counter(e.movement for e in self.equations)
        kinds = collections.Counter(r.kind for r in self.applied_rewrites)
        parts = [f"backend={self.backend}", f"N={self.sizes.get('N')}", f"E={self.sizes.get('E')}",
                 "movements: " + ", ".join(f"{k}×{v}" for k, v in sorted(moves.items())),
                 "rewrites: " + (", ".join(f"{k}×{v}" for k, v in sorted(kinds.items())) or "none"),
                 f"kernels: {len(self.kernels)}", f"fallbacks: {len(self.fallbacks)}"]
        return "; ".join(parts)

    def __str__(self) -> str:
        lines = [f"jgnn explain — {self.summary()}", "", "equations (primitive, movement, out residency, shape):"]
        width = max((len(e.primitive) for e in self.equations), default=8)
        for i, e in enumerate(self.equations):
            idx = f"  [{e.index} ids]" if e.index else ""
            lines.append(f"  {i:3d}  {e.primitive:<{width}}  {e.movement:<14} {e.out_residency:<9} "
                         f"{list(e.shape)}{idx}")
        sections = [("rewrites", [f"{'' if r.applied else 'skipped '}{r.kind}: {r.detail}"
                                  for r in self.rewrites]),
                    ("kernels", [f"{k.op} -> {k.backend}: {k.detail}" for k in self.kernels]),
                    ("recomputation", [f"{r.policy}: saved {', '.join(r.saved) or '-'}; recomputed "
                                       f"{', '.join(r.recomputed) or '-'}. {r.detail}" for r in self.remat]),
                    ("fallbacks", [f"{f.primitive}: {f.reason}" for f in self.fallbacks]),
                    ("notes", list(self.notes))]
        for title, rows in sections:
            lines += ["", f"{title}:"] + ([f"  - {r}" for r in rows] if rows else ["  (none)"])
        return "\n".join(lines)
