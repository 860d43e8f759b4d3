"""`python -m explorer MODEL`: the same as `onnxgrad MODEL` (and `onnxgrad explore MODEL`)."""
import sys

from .launcher import main

sys.exit(main())
