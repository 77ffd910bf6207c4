"""Where a micro-batch's rows sit in its (lines, width) token grid: right-padded, one row per
line, or packed, several rows per line (``train.pack_rows``, docs/learner.md).

Packed: rows, longest first, go first-fit into lines as wide as the longest row of the rows being
planned, so a line's attention costs what the longest padded row's does (a line is never wider),
while short rows fill the room that long ones leave instead of each carrying its own padding. Each row's position ids restart
at 0 and, with no 2D attention mask, the model's mask is causal within each run of consecutive
positions (Hugging Face's packed-sequence detection from ``position_ids``): a token attends to the
earlier tokens of its own row only, at the positions it has alone. Its log-probs are then the
unpadded row's up to round-off; the first token of each row takes no log-prob (it has no
predecessor), as in a row of its own.
"""

from __future__ import annotations

import array
from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Layout:
    """(line, offset) and length of each row in a grid of ``lines`` × ``width`` token slots."""

    lines: int
    width: int
    places: tuple[tuple[int, int], ...]
    lengths: tuple[int, ...]
    packed: bool

    @property
    def slots(self) -> int:
        return self.lines * self.width

    @property
    def shares_lines(self) -> bool:
        return self.packed and self.lines < len(self.places)

    @property
    def padded_slots(self) -> int:
        return self.slots - sum(self.lengths)

    def place(self, values: Sequence[Sequence], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """(lines, width): each row's per-position ``values`` at its place, 0 elsewhere."""
        flat = [0] * self.slots
        for (line, start), n, v in zip(self.places, self.lengths, values):
            at = line * self.width + start
            flat[at:at + n] = v
        if dtype == torch.long:
            return torch.frombuffer(array.array("q", flat), dtype=torch.long).view(self.lines, self.width).to(device)
        return torch.tensor(flat, dtype=dtype, device=device).view(self.lines, self.width)

    def positions(self, device: torch.device) -> torch.Tensor:
        """Position ids restarting at 0 for every row (and for the free tail of a line)."""
        grid = [list(range(self.width)) for _ in range(self.lines)]
        ends = [0] * self.lines
        for (line, start), n in zip(self.places, self.lengths):
            grid[line][start:start + n] = range(n)
            ends[line] = max(ends[line], start + n)
        for line, end in enumerate(ends):
            grid[line][end:] = range(self.width - end)
        return torch.tensor(grid, dtype=torch.long, device=device)

    def row_values(self, grid: torch.Tensor, k: int) -> torch.Tensor:
        """Row ``k``'s per-position values of a (lines, width) tensor; its first position (no
        predecessor: 0 in a row of its own) is 0 here too."""
        line, start = self.places[k]
        values = grid[line, start:start + self.lengths[k]]
        return values if start == 0 else torch.cat([values.new_zeros(1), values[1:]])


def layout(lengths: Sequence[int], line_width: int | None = None) -> Layout:
    """The grid of rows of these ``lengths``, in this order: one row per line (``line_width``
    None), or first-fit into lines of ``line_width`` (at least the longest row)."""
    lengths = tuple(lengths)
    if line_width is None:
        return Layout(len(lengths), max(lengths), tuple((k, 0) for k in range(len(lengths))), lengths, False)
    width = max(line_width, max(lengths))
    free: list[int] = []
    places = []
    for n in lengths:
        line = next((i for i, room in enumerate(free) if room >= n), None)
        if line is None:
            free.append(width)
            line = len(free) - 1
        places.append((line, width - free[line]))
        free[line] -= n
    return Layout(len(free), width, tuple(places), lengths, True)


def segmented_layout(lengths: Sequence[int], segments: Sequence[int], width: int) -> Layout:
    """Rows packed first-fit into lines of ``width``, but a line only ever holds rows of one segment
    (consecutive rows with the same ``segments`` value): each segment's tokens are then one
    contiguous range of the grid (the grouped backward reduces them without gathering them)."""
    places, lines, start = [], 0, 0
    while start < len(lengths):
        end = start
        while end < len(lengths) and segments[end] == segments[start]:
            end += 1
        part = layout(lengths[start:end], width)
        places += [(line + lines, offset) for line, offset in part.places]
        lines, start = lines + part.lines, end
    return Layout(lines, max(width, max(lengths)), tuple(places), tuple(lengths), True)
