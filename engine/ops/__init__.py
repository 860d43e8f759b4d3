"""Op families. Importing this package fills the registry."""
from . import elementwise, nn, reduce, rnn, shape, sequence  # noqa: F401
