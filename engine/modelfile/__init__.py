"""The model file, read without torch: the wire format, the weights where they lie, the graph index.

    reader.read_graph(source) -> GraphIndex   read, checked and indexed: producers, consumers, order, types
    reader.read(source)  -> skeleton, Weights   the ModelProto without its large initializers' bytes
    writer             a model written back without a second copy of its weights
Nothing here imports torch: `onnxgrad --help`, a bad file's error and the selection stay fast.
"""
