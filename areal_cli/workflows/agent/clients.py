"""The client an agent is handed: an ``openai.AsyncOpenAI`` for its episode, whose ``anthropic``
attribute is an ``anthropic.AsyncAnthropic`` for the same episode, over the same connection pool."""

from __future__ import annotations

import functools

import openai


def anthropic_base_url(base_url) -> str:
    """An OpenAI client's base URL (``.../v1``) as the Anthropic client's: without the ``/v1``,
    which the anthropic client writes itself (``/v1/messages``)."""
    return str(base_url).rstrip("/").removesuffix("/v1")


class EpisodeClient(openai.AsyncOpenAI):
    """``openai.AsyncOpenAI`` for one episode (base URL ``.../episodes/<key>/v1``), and its
    ``anthropic`` client."""

    def __init__(self, *args, http_client=None, **kwargs):
        super().__init__(*args, http_client=http_client, **kwargs)
        self.pool = http_client  # the worker's, shared by every episode (closed with the worker)

    @functools.cached_property
    def anthropic(self):
        """An ``anthropic.AsyncAnthropic`` that calls this episode's ``/v1/messages`` with the same
        key, timeout and connection pool: its calls are recorded into the episode."""
        import anthropic

        return anthropic.AsyncAnthropic(base_url=anthropic_base_url(self.base_url),
                                        api_key=self.api_key, max_retries=self.max_retries,
                                        timeout=self.timeout, http_client=self.pool)
