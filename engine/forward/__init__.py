"""Forward mode: J·v and H·v (forward over reverse) on the plans reverse mode runs (docs/semantics.md)."""
from .call import HVPResult, JVPResult, directions
from .prepared import HVPOutput, JVPOutput, PreparedHVP, PreparedJVP
from .rules import tangent_of

__all__ = ["HVPOutput", "HVPResult", "JVPOutput", "JVPResult", "PreparedHVP", "PreparedJVP", "directions",
           "tangent_of"]
