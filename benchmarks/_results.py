"""Where every benchmark's raw numbers go: one JSON file, its folder made if missing."""
from __future__ import annotations

import json
import os


def write_json(path: str, data, indent: int = 1) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as fh:
        json.dump(data, fh, indent=indent)
