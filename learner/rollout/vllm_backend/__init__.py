"""The vLLM rollout engine: the same keyed sampling on vLLM's paged KV cache (docs/vllm.md)."""
