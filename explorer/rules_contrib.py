"""Step mode's rule lines for onnxruntime's contrib ops (com.microsoft, and the two it adds to the default
domain), in rules.py's conventions: one line per input in schema order, None where no gradient flows
(integer weights, ids, masks, lengths). Input names come from engine.modelfile.contrib_schema."""
from __future__ import annotations

_ATTENTION_BACKWARD = "dS = P ⊙ (dP − rowsum(P ⊙ dP)), dP = dO · Vᵀ, P the attention probabilities"

CONTRIB_RULES: dict[str, tuple[str | None, ...]] = {
    "Gelu": ("dX = dY · (Φ(X) + X · φ(X))   # Φ, φ the normal CDF and density",),
    "BiasGelu": ("dA = dY · Gelu′(A + B)", "dB = Σ over the leading axes of dY · Gelu′(A + B)"),
    "FastGelu": ("dX = dY · FastGelu′(X + bias)   # the derivative of the tanh approximation",
                 "dbias = Σ over the leading axes of dY · FastGelu′(X + bias)"),
    "QuickGelu": ("dX = dY · σ(αX) · (1 + αX · (1 − σ(αX)))   # α = {alpha}",),
    "BiasAdd": ("dX = dY", "dbias = Σ dY over N and S", "dskip = dY"),
    "BiasSplitGelu": ("dX = [dY · Gelu(R), dY · L · Gelu′(R)]   # L, R the halves of X + bias",
                      "dbias = Σ over N and S of dX"),
    "GemmFastGelu": ("dX = (dY · FastGelu′(Z)) · Wᵀ   # Z = X · W + bias", "dW = Xᵀ · (dY · FastGelu′(Z))",
                     "dbias = Σ over the leading axes of dY · FastGelu′(Z)"),
    "FusedMatMul": ("dA = {alpha·}dY · op(B)ᵀ, moved back through transA / transBatchA",
                    "dB = {alpha·}op(A)ᵀ · dY, moved back through transB / transBatchB"),
    "FusedConv": ("dX = ConvTranspose(dY · act′, W)   # act = {activation}, act′ at conv + Z",
                  "dW = correlate(X, dY · act′) summed over the batch", "dB = Σ dY · act′ over N and the spatial axes",
                  "dZ = dY · act′"),
    "SkipLayerNormalization": (
        "dinput = (dŜ − mean(dŜ) − Ŝ · mean(dŜ · Ŝ)) / σ   with dŜ = dY · gamma, S = input + skip + bias",
        "dskip = dinput summed to skip's shape", "dgamma = Σ dY · Ŝ over the leading axes",
        "dbeta = Σ dY over the leading axes", "dbias = Σ dinput over the leading axes"),
    "SkipSimplifiedLayerNormalization": (
        "dinput = (dŜ − Ŝ · mean(dŜ · Ŝ)) / rms   with dŜ = dY · gamma, Ŝ = S / rms, S = input + skip + bias",
        "dskip = dinput summed to skip's shape", "dgamma = Σ dY · Ŝ over the leading axes",
        "dbias = Σ dinput over the leading axes"),
    "SimplifiedLayerNormalization": ("dX = (dX̂ − X̂ · mean(dX̂ · X̂)) / rms   with dX̂ = dY · scale, X̂ = X / rms",
                                     "dscale = Σ dY · X̂ over the leading axes"),
    "EmbedLayerNormalization": (
        None, None, "dword_embedding = scatter-add of dE at input_ids   # dE: the LayerNorm backward of dY",
        "dposition_embedding = scatter-add of dE at the positions", "dsegment_embedding = scatter-add of dE at segment_ids",
        "dgamma = Σ dY · Ê over batch and sequence", "dbeta = Σ dY over batch and sequence", None, None),
    "Attention": ("dinput = dQKV · weightsᵀ   # dQ = scale · dS · K, dK = scale · dSᵀ · Q, dV = Pᵀ · dO; "
                  + _ATTENTION_BACKWARD, "dweights = inputᵀ · dQKV", "dbias = Σ dQKV over batch and sequence", None,
                  "dpast = the past positions of [dK, dV] (plus dpresent)", "dattention_bias = dS summed to its shape",
                  None),
    "MultiHeadAttention": ("dquery = scale · dS · K   # " + _ATTENTION_BACKWARD, "dkey = scale · dSᵀ · Q",
                           "dvalue = Pᵀ · dO", "dbias = [Σ dquery, Σ dkey, Σ dvalue] over batch and sequence", None,
                           "dattention_bias = dS summed to its shape", "dpast_key = the past positions of dkey",
                           "dpast_value = the past positions of dvalue", None, None),
    "GroupQueryAttention": (
        "dquery = scale · dS · K, through the rotary and q-norm backward   # " + _ATTENTION_BACKWARD,
        "dkey = scale · dSᵀ · Q summed over each group's query heads, through the rotary backward",
        "dvalue = Pᵀ · dO summed over each group's query heads", "dpast_key = the valid past positions of dpresent_key",
        "dpast_value = the valid past positions of dpresent_value", None, None,
        "dcos_cache = scatter-add at the positions of the rotary backward", "dsin_cache = likewise", None,
        "dattention_bias = dS summed to its shape", "dhead_sink = −Σ p_sink · rowsum(P ⊙ dP)   # the sink's share",
        None, None, "dq_norm_weight = Σ dq̃ · q̂ per head   # the RMS norm before the rotary",
        "dk_norm_weight = Σ dk̃ · k̂ per head", None),
    "RotaryEmbedding": ("dinput = dY rotated back by −θ on the rotary dims, dY elsewhere", None,
                        "dcos_cache = scatter-add at the positions of dY₁ · x₁ + dY₂ · x₂",
                        "dsin_cache = scatter-add at the positions of dY₂ · x₁ − dY₁ · x₂"),
    "MatMulNBits": ("dA = dY · Wᵀ   # W = (unpack(B) − zero) · scale, the dequantized weights", None,
                    "dscales = Σ over each block of (dYᵀ · A) ⊙ (q − zero)",
                    "dzero_points = −Σ over each block of (dYᵀ · A) · scale   # float zero points; packed ones are "
                    "integers", None, "dbias = Σ dY over the leading axes"),
    "GatherBlockQuantized": (None, None, "dscales = scatter-add of dY ⊙ (q − zero) into each gathered row's blocks",
                             None),
    "DynamicQuantizeMatMul": ("dA = dY · dequant(B)ᵀ   # straight-through: A's on-the-fly uint8 rounding counts "
                              "as identity", None, "db_scale = Σ (Âᵀ · dY) ⊙ (B − zero) per column   # Â: A after "
                              "its uint8 round trip", None, "dbias = Σ dY over the leading axes"),
    "MatMulIntegerToFloat": (None, None, "da_scale = Σ dY ⊙ ((A − a_zero) · (B − b_zero)) · b_scale",
                             "db_scale = Σ dY ⊙ ((A − a_zero) · (B − b_zero)) · a_scale per column", None, None,
                             "dbias = Σ dY over the leading axes"),
}
