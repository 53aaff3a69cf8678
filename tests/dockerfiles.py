"""Reading a Dockerfile as text, for the image tests (no image is built on these machines)."""

import re


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    joined = re.sub(r"\\\n", " ", text)
    result = []
    for raw in joined.splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            result.append((keyword.upper(), rest.strip()))
    return result


def build_stages(instructions_: list[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    """The instructions grouped by build stage (each starts at a FROM)."""
    result: list[list[tuple[str, str]]] = []
    for keyword, rest in instructions_:
        if keyword == "FROM":
            result.append([])
        if result:
            result[-1].append((keyword, rest))
    return result
