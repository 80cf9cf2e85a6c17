"""One request's quota and usage, from admission to its end: what the OpenAI views call.

``request_admit`` (after the request is tokenized, before it is routed) checks the key's limits
(quotas.py) and, when they refuse, records the refusal and raises the 429. The ``RequestAccount`` it
returns is settled exactly once: ``track(samples)`` wraps the text deltas and, whatever ends them
(the last token, a stop string, an error, a deadline, a client that went away), corrects the quota
reservation to the tokens served before the response's last bytes go out and queues the request's
usage record, which the usage writer adds to its bucket right after (usage_backlog.py: the response
does not wait for the database); ``end`` does the same for a request the router refused. Tokens served:
the completion tokens the replica sent and, once it sent one, the prompt (a request that failed or
was cancelled before its first token served nothing).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import aclosing
from datetime import UTC, datetime

from asgiref.sync import sync_to_async

from controlplane.gateway import limits
from controlplane.gateway.accounts import quotas, usage_backlog
from controlplane.gateway.accounts.quotas import Admission, quota_admit, quota_settle
from controlplane.gateway.accounts.usage_backlog import usage_keep
from controlplane.gateway.models import ApiKey
from controlplane.gateway.openai.errors import OpenAIError
from controlplane.gateway.openai.generation import Delta
from controlplane.gateway.openai.samples import Samples

log = logging.getLogger(__name__)


class RequestAccount:
    def __init__(self, api_key: ApiKey, model: str, admission: Admission) -> None:
        self.api_key, self.model, self.admission = api_key, model, admission
        self.ended = False

    async def track(self, samples: Samples) -> AsyncIterator[Delta]:
        """``samples.deltas()``, accounted for when they end (the request's one usage record: the
        prompt once, the completion tokens of every sample)."""
        unfinished, error = len(samples.generations), False
        try:
            async with aclosing(samples.deltas()) as deltas:
                async for delta in deltas:
                    unfinished -= delta.finish_reason is not None
                    yield delta
        except Exception:  # an OpenAIError from the replica or the deadline, or a bug: an error
            error = unfinished > 0
            raise
        finally:  # also on cancellation and on aclose() by the response: the client went away
            served = samples.completion_tokens  # the prompt counts once the replica produced output
            await self.end(prompt_tokens=len(samples.prompt_ids) if served else 0,
                           completion_tokens=served, error=error)

    async def end(self, *, prompt_tokens: int, completion_tokens: int, error: bool) -> None:
        """Settle once: the reservation corrected to what was served, the request added to usage."""
        if self.ended:
            return
        self.ended = True
        limits.concurrency_release(self.api_key.pk)
        try:
            await sync_to_async(self._end, thread_sensitive=True)(prompt_tokens, completion_tokens, error)
        except Exception:  # accounting never fails a request that was served
            log.exception("recording the usage of a request of key %s failed", self.api_key.pk)
        usage_backlog.write_soon()

    def _end(self, prompt_tokens: int, completion_tokens: int, error: bool) -> None:
        quota_settle(self.admission, used_tokens=prompt_tokens + completion_tokens)
        usage_keep(
            api_key_id=self.api_key.pk, user_id=self.api_key.user_id, model=self.model,
            at=datetime.fromtimestamp(self.admission.at, UTC), requests=1, prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens, errors=int(error),
        )


def _admit_sync(api_key: ApiKey, model: str, prompt_tokens: int, max_tokens: int) -> Admission:
    try:
        return quota_admit(api_key=api_key, prompt_tokens=prompt_tokens, max_tokens=max_tokens)
    except OpenAIError:
        usage_keep(api_key_id=api_key.pk, user_id=api_key.user_id, model=model,
                   at=datetime.fromtimestamp(quotas.clock(), UTC), refused=1)
        raise


async def request_admit(*, api_key: ApiKey, model: str, prompt_tokens: int, max_tokens: int,
                        samples: int = 1) -> RequestAccount:
    """Admit the request under the gateway's limits (limits.py: max_tokens, requests in flight per key)
    and its key's (or raise their 400 or 429; a refusal by the key's own limits is counted in usage).
    ``samples`` (n): the key's token limits reserve ``max_tokens`` for each."""
    limits.max_tokens_check(max_tokens)
    limits.concurrency_acquire(api_key.pk, quotas.key_label(api_key), api_key.max_concurrent_requests)
    try:
        if api_key.limited:
            admission = await sync_to_async(_admit_sync, thread_sensitive=True)(
                api_key, model, prompt_tokens, max_tokens * samples)
        else:  # nothing to count: no thread hop, no cache round trip
            admission = Admission(quotas.clock())
    except BaseException:
        limits.concurrency_release(api_key.pk)
        usage_backlog.write_soon()  # a refusal's record
        raise
    return RequestAccount(api_key, model, admission)
