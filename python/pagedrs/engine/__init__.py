"""Engine layer: offline ``LLM`` and the step-driven ``LLMEngine``."""
