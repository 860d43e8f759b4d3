"""The ONNX Gradient operator: the selection (y, xs, zs) and its rules, which edges carry a
derivative, values for what nobody fed, symbolic dimensions, and the prepared gradient call that
every front end (Model.gradient, the explorer, the backward graph's statistics, GradManager) runs.
`selection`, `feed_syntax` and `differentiable` import no torch.
"""
