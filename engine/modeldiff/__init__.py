"""`onnxgrad diff`: two versions of a model (or one against its own cast, or against onnxruntime), forward
and gradient, node by node; the first node where they part. See docs/diff.md."""
