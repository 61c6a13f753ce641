"""What `servesim serve` reads from an OpenAI-compatible request body (``realengine/server.py`` serves it).

The engine takes a request's prompt length, ``max_tokens`` (``max_completion_tokens`` for chat) and vLLM's
``priority``; the rest of the body changes nothing, except a field that asks for what it cannot give: ``n`` or
``best_of`` above 1 (several completions of one prompt) is refused with HTTP 400, where it answered with one
choice and the client counted one completion's tokens as the n it asked for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class ServeRequest:
    prompt_len: int  # tokens: token ids as given, text one per word
    max_tokens: int  # tokens to generate (exactly: EOS is ignored)
    priority: int  # vLLM's priority field: lower is served sooner


def prompt_length(prompt: Any) -> int:
    """Tokens in a completions ``prompt``: a list of token ids counts as given; text one token per word."""
    if isinstance(prompt, list) and len(prompt) == 1 and not isinstance(prompt[0], int):
        prompt = prompt[0]  # a batch of one prompt
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return len(prompt)
    if isinstance(prompt, str):
        return len(prompt.split())
    raise ValueError("prompt must be a string or a list of token ids (one prompt per request)")


def chat_prompt_length(messages: Any) -> int:
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list")
    n = 0
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list):  # content parts: the text ones
            content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
        if not isinstance(content, str):
            raise ValueError("each message needs a text content")
        n += len(content.split())
    return n


def parse_request(body: Any, chat: bool) -> ServeRequest:
    """The fields the engine takes from a request body; ValueError (HTTP 400) naming what is wrong."""
    if not isinstance(body, dict):
        raise ValueError("the body must be a JSON object")
    n_prompt = chat_prompt_length(body.get("messages")) if chat else prompt_length(body.get("prompt"))
    max_tokens = body.get("max_completion_tokens" if chat and "max_completion_tokens" in body else "max_tokens", 16)
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise ValueError(f"max_tokens must be an integer >= 1, got {max_tokens!r}")
    if n_prompt < 1:
        raise ValueError("the prompt is empty")
    for key in ("n", "best_of"):
        if body.get(key) not in (None, 1):
            raise ValueError(f"{key} must be 1, got {body[key]!r}: servesim serve generates one completion per "
                             "request")
    # vLLM's extra field for its priority scheduler: it was dropped, so a served priority policy (built-in or a
    # user's) saw every request at priority 0 and served first come first served, without a word
    priority = body.get("priority", 0)
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise ValueError(f"priority must be an integer (lower is served sooner), got {priority!r}")
    return ServeRequest(n_prompt, max_tokens, priority)
