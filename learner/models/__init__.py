"""Policy and teacher models: loading any local HF directory, the built-in tiny Llama and its warm start."""
