"""Op families. Importing this package fills the registry."""
from . import (activation, attention, control, conv, detection, elementwise, generators, indexing,  # noqa: F401
               logic, loss, nn, pool, quantize, random_ops, reduce, resize, rnn, sampling, sequence, shape,
               signal, strings, training)
