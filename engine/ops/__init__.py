"""Op families. Importing this package fills the registry."""
from . import (activation, control, conv, elementwise, generators, indexing, nn, pool, reduce, resize, rnn,  # noqa: F401
               sequence, shape, strings)
