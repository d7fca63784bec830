"""The operations only the hybrid families' layers take (engine/model/hybrid.py), mixed into the backends'
ops (engine/ops/backend.py): the Gated DeltaNet mixer over the step's recurrent states, the gated
attention's sigmoid gate, the shared expert's gated sum. HybridArrayOps is float32 array code (the CPU's
path, the reference); HybridHalfOps runs them on the GPU through engine/kernels/linear_attention.cu (the gated
sum with the next norm: norm_rope.cu's add_gated_rms_norm, HalfCupyOps.add_rms_norm)."""
from __future__ import annotations

from engine.core.step import Step
from engine.ops import gated_delta_net as gdn


class HybridArrayOps:
    def state_rows(self, step: Step, states: tuple):
        """The step's sequences' recurrent states (engine/kvcache/recurrent.py SequenceState), as the
        mixer takes them: once a forward, for every linear-attention layer."""
        return step, states

    def delta_net(self, proj, lw, hy, j: int, rows, eps: float):
        """proj (n, channels + nv*dv + 2*nv), a Gated DeltaNet layer's in-projection over the step's rows ->
        (n, nv*dv), the out-projection's input; state layer j of each sequence's state advanced
        (engine/ops/gated_delta_net.py)."""
        step, states = rows
        return gdn.mixer(proj, lw, hy, j, step, states, eps)

    def sigmoid_mul(self, x, gate):
        """x * sigmoid(gate), (n, width) both."""
        return x * gdn.sigmoid(gate)

    def add_gated(self, delta, shared, h, gate_w):
        """delta + shared * sigmoid(h . gate_w): a routed mixture's output plus its shared expert's, gated per
        row; delta, shared, h (n, dim); gate_w (1, dim) float32. The gate's dot products are each row's own sum
        (a product with one output column goes to OpenBLAS's sgemv, whose rows' sums depend on the row count)."""
        return delta + shared * gdn.sigmoid(self.xp.sum(h * gate_w, axis=-1, keepdims=True))


class HybridHalfOps(HybridArrayOps):
    """The same on the GPU: fp16 activations, the recurrent states and the delta rule in float32."""

    def state_rows(self, step: Step, states: tuple):
        return self.kernels.state_pointers(step, states)

    def delta_net(self, proj, lw, hy, j: int, rows, eps: float):
        return self.kernels.delta_net(proj, lw, hy, j, rows, eps, q8=self.decoding)  # (a decode row's: a Row8)

    def sigmoid_mul(self, x, gate):
        return self.kernels.sigmoid_mul(self.rows(x), gate, q8=self.decoding)
