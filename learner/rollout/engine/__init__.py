"""The torch rollout engine: keyed sampling, continuous batching, KV reuse, captured decode."""
