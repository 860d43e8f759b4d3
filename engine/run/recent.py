"""A dict that keeps only its most recently used entries: the model's per-selection caches.

An explorer session asks for plans and prepared gradients for every tensor the cursor visits and
every selection tried; kept forever they grew with the session (each plan holds compiled code).
"""
from __future__ import annotations

from collections import OrderedDict


class Recent(OrderedDict):
    def __init__(self, limit: int):
        super().__init__()
        self.limit = limit

    def get(self, key, default=None):
        try:  # one hash of the key, not three: Model.gradient looks up its GradientCall on every call
            self.move_to_end(key)
        except KeyError:
            return default
        return self[key]

    def __setitem__(self, key, value) -> None:
        super().__setitem__(key, value)
        self.move_to_end(key)
        while len(self) > self.limit:
            self.popitem(last=False)
