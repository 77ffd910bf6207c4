"""Token-identical speculation: drafts, their verification, multi-turn drafting (docs/speculation.md)."""
