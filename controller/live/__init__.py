"""The live run page's path: its websocket, the channel-layer fan-out and every frame it sends (docs/web-contract.md)."""
