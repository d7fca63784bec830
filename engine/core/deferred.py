"""A layer's output not yet added to the residual stream: the next norm takes it, on a GPU in the norm's own kernel
where one exists (elsewhere the norm takes its value first: ArrayOps.product, as it always did).

- Projection: rows times a weight (the attention's or the mixer's output and its out matrix, SwiGLU's and the down
  matrix); a GPU's lone decode row runs it in the norm's kernel (quant.cu's matvec_norm).
- GatedSum: a mixture's routed experts plus its shared expert gated per row (the hybrid families); a GPU takes the
  gate, the sum and the norm in one kernel (norm_rope.cu's add_gated_rms_norm), prompt rows and decode rows alike."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Projection:
    """rows (n, k) @ weight (m, k)^T, an (n, m) delta for the residual stream. rows may be a Row8 (a GPU decode
    step's)."""

    rows: object
    weight: object


@dataclass(frozen=True)
class GatedSum:
    """routed + shared * sigmoid(h . gate_w) per row: routed, shared, h (n, dim) (h its plain values), gate_w (1,
    dim) float32."""

    routed: object
    shared: object
    h: object
    gate_w: object

    def take(self, rows) -> "GatedSum":
        """The same sum over some of its rows (an index or a slice of them): each row's is its own."""
        return GatedSum(self.routed[rows], self.shared[rows], self.h[rows], self.gate_w)


def rows_of(delta, rows):
    """Some rows of a delta for the residual stream: of an array, or of a GatedSum (a Projection's product is
    taken first: its rows' sums may depend on how many it has)."""
    return delta.take(rows) if isinstance(delta, GatedSum) else delta[rows]
