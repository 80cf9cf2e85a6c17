"""What the gateway records about each request, under vLLM's names and meanings, by model and replica.

The gateway's router records each request's lifecycle
(``controlplane.gateway.serving.decision_log.RouterRecorder``: decided, first token, finished); it
calls the functions below at those points, so a dashboard or an autoscaler built for vLLM reads
motley unchanged:

- ``vllm:num_requests_waiting`` (gauge): sent to the replica, first token not back yet (queued in its
  head or prefilling);
- ``vllm:num_requests_running`` (gauge): decoding, first token back, not finished;
- ``vllm:time_to_first_token_seconds`` (histogram): from the submission to the pipeline to the first token;
- ``vllm:inter_token_latency_seconds`` (histogram): the gaps between a completed request's tokens (its
  mean gap, observed once per gap);
- ``vllm:e2e_request_latency_seconds`` (histogram): submission to the last token, completed requests;
- ``vllm:prompt_tokens_total`` (counter): prompt tokens prefilled (counted at the first token);
- ``vllm:generation_tokens_total`` (counter): tokens generated, whatever ended the request.

Labels ``model_name`` (the served model) and ``replica`` (its pipeline id, ``d<deployment>-r<i>``).
``motley_router_decisions_total{model_name, strategy, replica, reason}`` counts the router's decisions
(``reason`` ``routed``, or why it refused: ``too_large``, ``unavailable``, ``saturated``; ``replica``
``none`` then) and ``motley_requests_total{model_name, replica, outcome}`` how routed requests ended.

The gateway's waiting queue (``controlplane.gateway.serving.waiting``) and request migration add
``motley_gateway_waiting_requests{model_name}`` (gauge: requests waiting now for a routable replica),
``motley_gateway_wait_seconds{model_name, outcome}`` (histogram: how long each wait lasted, by how it
ended: ``admitted``, ``timed_out``, ``full`` (refused at once, 0 s), ``refused``, ``cancelled``) and
``motley_requests_migrated_total{model_name, replica}`` (counter: requests resumed elsewhere after the
pipeline of ``replica`` broke under them).

With ``PROMETHEUS_MULTIPROC_DIR`` set (``exposition``), prometheus_client writes each process's values
to files there and a scrape sums them: counters and histograms over every process that ever wrote,
the two gauges (``livesum``) over the processes still alive. Buckets are vLLM's (v1), so percentiles
compare across the two.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, disable_created_metrics

from controlplane.observability import multiproc  # noqa: F401  (the directory exists before a value is written)

disable_created_metrics()  # no ``*_created`` series: multiprocess mode has none, and vLLM's readers want none
LABELS = ("model_name", "replica")
NO_REPLICA = "none"  # the replica label of a refused request

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0, 1920.0, 7680.0)

# Not registered anywhere: exposition.py reads them (one process) or their files (several).
WAITING = Gauge("vllm:num_requests_waiting", "Requests sent to a replica whose first token has not come back "
                "(queued in its head or prefilling).", LABELS, registry=None, multiprocess_mode="livesum")
RUNNING = Gauge("vllm:num_requests_running", "Requests decoding on a replica.", LABELS, registry=None,
                multiprocess_mode="livesum")
TTFT = Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", LABELS,
                 registry=None, buckets=TTFT_BUCKETS)
ITL = Histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", LABELS,
                registry=None, buckets=ITL_BUCKETS)
E2E = Histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", LABELS,
                registry=None, buckets=E2E_BUCKETS)
PROMPT_TOKENS = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", LABELS, registry=None)
GENERATION_TOKENS = Counter("vllm:generation_tokens", "Number of generation tokens processed.", LABELS,
                            registry=None)
ROUTER_DECISIONS = Counter(
    "motley_router_decisions", "The gateway router's decisions: routed to a replica, or refused and why.",
    ("model_name", "strategy", "replica", "reason"), registry=None,
)
REQUESTS = Counter("motley_requests", "Routed requests by how they ended: completed, failed:<kind>, "
                   "cancelled.", ("model_name", "replica", "outcome"), registry=None)
WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0)
GATEWAY_WAITING = Gauge("motley_gateway_waiting_requests", "Requests waiting in the gateway for a routable "
                        "replica of their model.", ("model_name",), registry=None,
                        multiprocess_mode="livesum")
GATEWAY_WAIT = Histogram("motley_gateway_wait_seconds", "How long requests waited in the gateway for a "
                         "routable replica, by how the wait ended.", ("model_name", "outcome"), registry=None,
                         buckets=WAIT_BUCKETS)
MIGRATED = Counter("motley_requests_migrated", "Requests resumed on another replica after the pipeline of "
                   "this replica broke under them.", LABELS, registry=None)

SERVING_METRICS = (WAITING, RUNNING, TTFT, ITL, E2E, PROMPT_TOKENS, GENERATION_TOKENS, ROUTER_DECISIONS,
                   REQUESTS, GATEWAY_WAITING, GATEWAY_WAIT, MIGRATED)


def request_decided(*, model: str, strategy: str, replica: str | None, outcome: str) -> None:
    """The router decided: ``replica`` chosen (``outcome`` "running"), or none (``rejected:<reason>``)."""
    reason = outcome.partition(":")[2] if outcome.startswith("rejected:") else "routed"
    ROUTER_DECISIONS.labels(model, strategy, replica or NO_REPLICA, reason).inc()
    if replica is not None:
        WAITING.labels(model, replica).inc()


def request_first_token(*, model: str, replica: str, ttft_s: float, prompt_tokens: int) -> None:
    """The first token came back ``ttft_s`` after the submission: the prompt is prefilled."""
    WAITING.labels(model, replica).dec()
    RUNNING.labels(model, replica).inc()
    TTFT.labels(model, replica).observe(ttft_s)
    PROMPT_TOKENS.labels(model, replica).inc(prompt_tokens)


def request_finished(
    *, model: str, replica: str, outcome: str, e2e_s: float, ttft_s: float | None, completion_tokens: int,
) -> None:
    """The request ended (``outcome`` "completed", "failed:<kind>" or "cancelled") after ``e2e_s``."""
    (RUNNING if ttft_s is not None else WAITING).labels(model, replica).dec()
    REQUESTS.labels(model, replica, outcome).inc()
    GENERATION_TOKENS.labels(model, replica).inc(completion_tokens)
    if outcome != "completed":
        return
    E2E.labels(model, replica).observe(e2e_s)
    if ttft_s is not None and completion_tokens > 1:
        gaps = completion_tokens - 1
        _observe_many(ITL.labels(model, replica), max(0.0, e2e_s - ttft_s) / gaps, gaps)


def wait_started(*, model: str) -> None:
    GATEWAY_WAITING.labels(model).inc()


def wait_ended(*, model: str, outcome: str, waited_s: float) -> None:
    """A wait ended (``outcome``: admitted, timed_out, full, refused, cancelled); "full" never waited."""
    if outcome != "full":
        GATEWAY_WAITING.labels(model).dec()
    GATEWAY_WAIT.labels(model, outcome).observe(waited_s)


def request_migrated(*, model: str, replica: str, to: str, started: bool) -> None:
    """The request left ``replica`` (its pipeline broke) for ``to``: its waiting or running gauge moves."""
    gauge = RUNNING if started else WAITING
    gauge.labels(model, replica).dec()
    gauge.labels(model, to).inc()
    MIGRATED.labels(model, replica).inc()


def _observe_many(histogram, value: float, times: int) -> None:
    """``histogram.observe(value)`` ``times`` times, in two writes instead of ``times`` (a long request
    finishes on the event loop; in multiprocess mode each observation is a file write)."""
    buckets = getattr(histogram, "_buckets", None)
    bounds = getattr(histogram, "_upper_bounds", None)
    if buckets is None or bounds is None:  # another prometheus_client layout: the plain way
        for _ in range(times):
            histogram.observe(value)
        return
    histogram._sum.inc(value * times)
    for i, bound in enumerate(bounds):
        if value <= bound:
            buckets[i].inc(times)
            break
