"""One-off measurements, each backing one decision or sentence of the docs (the doc each script names)."""
