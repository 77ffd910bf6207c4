"""How contributions are batched: micro-batches, packing, grouped backward, shared prompts, the drain."""
