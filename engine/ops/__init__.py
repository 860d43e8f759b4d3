"""Op families. Importing this package fills the registry."""
from . import activation, elementwise, generators, indexing, nn, reduce, rnn, sequence, shape, conv, pool, resize  # noqa: F401
