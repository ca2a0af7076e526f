"""Fixed text corpora from Python's bundled reference docs (``pydoc_data``), shared by tests (not a test module)."""

from __future__ import annotations

__all__ = ["pydoc_lines", "python_docs"]


def pydoc_lines(limit_chars: int) -> list[str]:
    """Lines of Python's bundled reference docs, over 20 characters each, until ``limit_chars`` are taken."""
    import pydoc_data.topics

    lines: list[str] = []
    total = 0
    for key in sorted(pydoc_data.topics.topics):
        for line in pydoc_data.topics.topics[key].splitlines():
            line = line.strip()
            if len(line) > 20:
                lines.append(line)
                total += len(line)
        if total > limit_chars:
            break
    return lines


def python_docs(first_topic: int, limit_chars: int = 120_000) -> list[str]:
    """Paragraphs of Python's bundled reference docs, from the given topic on (a fixed test corpus)."""
    import pydoc_data.topics

    texts: list[str] = []
    total = 0
    for key in sorted(pydoc_data.topics.topics)[first_topic:]:
        for block in pydoc_data.topics.topics[key].split("\n\n"):
            paragraph = " ".join(block.split())
            if len(paragraph) > 40:
                texts.append(paragraph)
                total += len(paragraph)
        if total >= limit_chars:
            break
    return texts
