"""Op families. Importing this package fills the registry (forwards, and what each op's gradient is)."""
from ..registry import loading_builtins

with loading_builtins():
    from . import (  # noqa: F401
        activation,
        attention,
        contrib_act,
        contrib_attention,
        contrib_gqa,
        contrib_norm,
        contrib_quant,
        control,
        conv,
        detection,
        elementwise,
        generators,
        indexing,
        logic,
        loss,
        nn,
        pool,
        quantize,
        random_ops,
        reduce,
        resize,
        rnn,
        sampling,
        sequence,
        shape,
        signal,
        strings,
        training,
    )
