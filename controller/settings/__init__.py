"""Django settings: base, embedded (the one-process demo), production and test."""
