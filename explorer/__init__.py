"""onnxgrad's terminal explorer (Textual). Domain modules here (state, feeding, rules, stepper)
import nothing from Textual; widgets and screens call them and `engine`'s public API only."""
import os

# Before torch loads OpenMP: its threads otherwise spin between the thousands of tiny parallel
# regions of a values pass, which on two cores took 5 s of CPU for 1 s of work and starved the
# UI thread. Sleeping threads cost a wake-up per region instead. The user's own setting wins.
# The engine's CLI, started through the same console script, leaves OpenMP as the user set it
# (explorer/launcher.py undoes this for it).
SET_OMP_WAIT_POLICY = "OMP_WAIT_POLICY" not in os.environ
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
