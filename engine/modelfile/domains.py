"""The operator domains the engine knows: the Gradient operator's home and those it interprets itself."""

TRAINING_DOMAIN = "ai.onnx.preview.training"
# Domains whose nodes the engine interprets itself, string attributes included.
STANDARD_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml", TRAINING_DOMAIN})
