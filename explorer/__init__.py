"""onnxgrad's terminal explorer (Textual). Domain modules here (state, feeding, rules, stepper)
import nothing from Textual; widgets and screens call them and `engine`'s public API only."""
