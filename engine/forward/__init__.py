"""Forward mode: J·v and H·v (forward over reverse) on the plans reverse mode runs (docs/semantics.md)."""
from .call import HVPResult, JVPResult
from .prepared import HVPOutput, JVPOutput, PreparedHVP, PreparedJVP

__all__ = ["HVPOutput", "HVPResult", "JVPOutput", "JVPResult", "PreparedHVP", "PreparedJVP"]
