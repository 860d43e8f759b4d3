"""Op families. Importing this package fills the registry."""
from . import (activation, attention, control, conv, detection, elementwise, generators, indexing, loss, nn, pool, quantize, random_ops, reduce, resize, rnn,  # noqa: F401
               sampling, sequence, shape, signal, strings)
