"""A digest summariser on the official Anthropic SDK (`pip install 'clarion[ai]'`).

The SDK reads ANTHROPIC_API_KEY and ANTHROPIC_BASE_URL itself. One call, no SDK retries, the
digest's timeout as the SDK's: the caller (tasks.summarise) never waits past it anyway. A refusal,
an error status or an answer without text raises, and the digest uses its fallback line.
"""

from __future__ import annotations

import json

from clarion.errors import ClarionError
from clarion.tasks.summarise import SummaryRequest

PROMPT = (
    "Write one plain-text line, at most {max_chars} characters, that tells the recipient what "
    "these {count} notifications are about. No preamble, no quotes, no markdown.\n\n{items}"
)
ITEMS_CHARS = 6000  # the most item text sent to the model


class SummaryRefused(ClarionError):
    """The model refused, or answered with no text."""


def summarise(request: SummaryRequest) -> str:
    """The model's line for the digest's items (unchecked: tasks.summarise checks it)."""
    import anthropic  # the optional extra: only a catalog that names this summariser needs it

    client = anthropic.Anthropic(timeout=request.timeout, max_retries=0)
    items = json.dumps(list(request.items), default=str, ensure_ascii=False)[:ITEMS_CHARS]
    message = client.messages.create(
        model=request.model,
        max_tokens=200,
        messages=[
            {
                "role": "user",
                "content": PROMPT.format(
                    max_chars=request.max_chars, count=request.count, items=items
                ),
            }
        ],
    )
    if message.stop_reason == "refusal":
        raise SummaryRefused("the model refused to summarise")
    text = "".join(getattr(block, "text", "") for block in message.content if block.type == "text")
    if not text.strip():
        raise SummaryRefused(f"no text in the answer (stop_reason {message.stop_reason!r})")
    return text
