"""reduce ops."""
from __future__ import annotations

import torch

from ..registry import register
