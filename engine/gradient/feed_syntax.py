"""The feed SPEC grammar's one-line description, importable without numpy or onnx (the CLI's --help)."""
SPEC_HELP = "a .npy path, zeros, ones, random, random:SEED, or a number"
