"""The one table renderer of `pdctl`: a GitHub markdown table, padded to read in a terminal."""

from collections.abc import Mapping, Sequence


def render(columns: Sequence[str], rows: Sequence[Mapping[str, str]]) -> str:
    """`rows` (a cell per column name; missing cells empty) under the column names. Columns of
    numbers align right, in the terminal and in rendered markdown alike."""
    cells = [[row.get(column, "") for column in columns] for row in rows]
    widths = [
        max([len(column)] + [len(line[k]) for line in cells]) for k, column in enumerate(columns)
    ]
    right = [_numbers([line[k] for line in cells]) for k in range(len(columns))]

    def line(values: Sequence[str]) -> str:
        padded = (
            value.rjust(width) if flush else value.ljust(width)
            for value, width, flush in zip(values, widths, right, strict=True)
        )
        return "| " + " | ".join(padded) + " |"

    rule = (
        "|"
        + "|".join("-" * (w + 1) + (":" if r else "-") for w, r in zip(widths, right, strict=True))
        + "|"
    )
    return "\n".join([line(columns), rule, *(line(values) for values in cells)])


def _numbers(cells: Sequence[str]) -> bool:
    """Whether a column holds numbers: some cells, and every one not empty a number."""
    try:
        return [float(cell.replace(",", "")) for cell in cells if cell] != []
    except ValueError:
        return False
