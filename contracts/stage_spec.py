"""The stage spec of contracts §1: what the agent writes and ``python -m worker_runtime.serve`` reads.

Parsing lives apart from the server so that agents, tests and the benchmark build and validate the
very same object the process will run, and a bad spec fails with a message naming the field.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from contracts.precision import Precision

SPECULATION_MODES = ("off", "lookup", "draft")
MAX_SPECULATIVE_TOKENS = 16


class SpecError(ValueError):
    """A stage spec the server cannot run; the message names the field at fault."""


@dataclass(frozen=True)
class Emulation:
    """A modeled device: each step is paced to ``time_scale × max(bytes / bandwidth, FLOPs / peak)``,
    divided by ``speed_factor`` and by the live throttle factor read from ``throttle_file``; a copy back
    from the host KV tier to ``time_scale × bytes / host_link_gbs``."""

    memory_bandwidth_gbs: float
    fp16_tflops: float
    time_scale: float = 1.0
    # The card's link to its host (its PCIe figure), which host-tier copies take; None: copies unpaced.
    host_link_gbs: float | None = None
    # The card's real speed against its catalog figures (the fleet file's ``speed_factor``): a card
    # slower than its spec sheet says, not a throttled one. Set by the agent, not the control plane.
    speed_factor: float = 1.0
    # A JSON file ``{"factor": f}`` (0 < f <= 1) the agent rewrites while the card is made to throttle
    # (contracts §3 ``set_throttle``); the stage re-reads it at most once a second. Set by the agent.
    throttle_file: str | None = None


@dataclass(frozen=True)
class DraftLink:
    """The draft pipeline a head with ``speculation: "draft"`` asks for proposals: a one-stage pipeline
    serving a small model that shares the target's tokenizer (worker_runtime/draft_client.py)."""

    address: str  # its head's listen address
    pipeline_id: str
    auth_token: str


@dataclass(frozen=True)
class TensorRank:
    """One rank of a tensor-parallel stage (docs/pipeline.md, "Tensor-parallel stages"): the card it runs
    on, how many kv heads (with their query heads) and MLP columns of every layer of the stage it holds,
    in rank order, and its bits before the stage's ``low_from`` (from there on every rank holds
    ``low_bits``). Rank 0 is the spec's own process (its ``device`` and ``bits``); it starts the others
    on the same node and is the stage its pipeline sees."""

    device: str  # "cuda:N", or "cpu" for an emulated card
    kv_heads: int
    intermediate: int
    bits: int = 16
    device_index: int | None = None  # the node's device: its memory budget, its emulation
    emulation: Emulation | None = None  # an emulated rank's card; rank 0's is the spec's ``emulation``


@dataclass(frozen=True)
class StageSpec:
    pipeline_id: str
    auth_token: str
    model_path: str
    stage_index: int
    num_stages: int
    layers: tuple[int, int]
    listen: str
    head: str
    next: str | None = None
    bits: int = 16
    low_bits: int | None = None  # with low_from: layers [low_from, end) and the lm_head at low_bits
    low_from: int | None = None
    dtype: str | None = None
    device: str = "cpu"
    threads: int = 1
    kv_tokens: int = 4096
    batch: int = 1  # sequences the plan priced this stage for: the logits workspace of its footprint
    peer_timeout_s: float = 5.0
    emulation: Emulation | None = None
    # Head (stage 0) only: scheduling knobs, optional in the spec.
    micro_batches: int | None = None  # micro-batches in flight; default num_stages
    max_batch_tokens: int = 4096  # tokens per micro-batch (a longer prompt still goes alone)
    max_queue: int = 256  # requests waiting for KV space before new ones are refused
    # Automatic prefix caching (docs/pipeline.md, "Prefix caching"): the head names full KV blocks and
    # every stage keeps them for reuse; off, every prompt is prefilled from its first token. The head's
    # value decides for the pipeline; every stage carries the deployment's.
    prefix_caching: bool = True
    # KV tokens of blocks evicted from the device kept in host memory (pinned on CUDA) and copied back
    # instead of recomputed: the plan sets it where copying is cheaper than prefilling (0: no host tier).
    host_kv_tokens: int = 0
    # Speculative decoding (docs/pipeline.md, "Speculative decoding"): the head proposes tokens for each
    # decoding sequence ("lookup": n-grams of its prompt and output; "draft": a draft model's greedy
    # continuation, from the pipeline ``draft`` names) and every stage verifies them in one pass; "off":
    # one token per sequence and step. The head's values decide for the pipeline.
    speculation: str = "off"
    speculative_tokens: int = 4  # the most proposals per sequence and step: the adaptive count's ceiling
    draft: DraftLink | None = None  # head only, with speculation "draft"
    # A tensor-parallel stage: its ranks, this process first; () for a stage on one card.
    tensor_group: tuple[TensorRank, ...] = ()
    # Started beside its pipeline ahead of an in-place handover: load, bind and say ready, then wait for
    # the spec that lets it join (the same without ``hold``, given in place). No heartbeat meanwhile.
    hold: bool = False

    @property
    def precision(self) -> Precision:
        """``bits``, ``low_bits`` and ``low_from`` as one value (the spec file keeps them flat)."""
        return Precision(self.bits, self.low_bits, self.low_from)

    def rank_spec(self, rank: int) -> "StageSpec":
        """The spec rank ``rank`` of the tensor group runs: this one on that rank's card and bits."""
        member = self.tensor_group[rank]
        return replace(self, device=member.device, bits=member.bits, emulation=member.emulation)

    @property
    def is_head(self) -> bool:
        return self.stage_index == 0

    @property
    def is_last(self) -> bool:
        return self.stage_index == self.num_stages - 1

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["layers"] = list(self.layers)
        out["tensor_group"] = [asdict(rank) for rank in self.tensor_group]
        return out

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "StageSpec":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise SpecError(f"unknown spec fields: {unknown}")
        values = dict(raw)
        try:
            if values.get("emulation") is not None:
                values["emulation"] = Emulation(**values["emulation"])
            if values.get("draft") is not None:
                values["draft"] = DraftLink(**values["draft"])
            values["layers"] = tuple(values["layers"])
            values["tensor_group"] = tuple(_tensor_rank(rank) for rank in values.get("tensor_group") or ())
            spec = cls(**values)
            spec.validate()
        except SpecError:
            raise
        except (TypeError, KeyError, ValueError) as exc:  # a field of the wrong type or shape
            raise SpecError(f"invalid stage spec: {exc}") from exc
        return spec

    @classmethod
    def from_file(cls, path: str | Path) -> "StageSpec":
        return cls.from_dict(spec_file_read(path))

    def validate(self) -> None:
        start, end = self.layers
        link = self.emulation.host_link_gbs if self.emulation is not None else None
        checks = [
            (0 <= self.stage_index < self.num_stages, "stage_index must be in [0, num_stages)"),
            (0 <= start < end, "layers must be a half-open range [start, end) with start < end"),
            (self.is_last == (self.next is None), "next must be null exactly on the last stage"),
            (min(self.kv_tokens, self.threads, self.batch) > 0,
             "kv_tokens, threads and batch must be positive"),
            (self.peer_timeout_s > 0, "peer_timeout_s must be positive"),
            (self.emulation is None or self.emulation.speed_factor > 0, "emulation.speed_factor must be > 0"),
            (link is None or link > 0, "emulation.host_link_gbs must be > 0"),
            (bool(self.auth_token), "auth_token must not be empty"),
            (self.micro_batches is None or self.micro_batches >= 1, "micro_batches must be at least 1"),
            (self.max_batch_tokens > 0 and self.max_queue >= 0, "max_batch_tokens/max_queue out of range"),
            (self.host_kv_tokens >= 0, "host_kv_tokens must not be negative"),
            (self.speculation in SPECULATION_MODES, f"speculation must be one of {SPECULATION_MODES}"),
            (1 <= self.speculative_tokens <= MAX_SPECULATIVE_TOKENS,
             f"speculative_tokens must be in [1, {MAX_SPECULATIVE_TOKENS}]"),
            (self.speculation != "draft" or not self.is_head or self.draft is not None,
             'speculation "draft" needs draft (the draft pipeline\'s address, pipeline_id and auth_token)'),
            (self.draft is None or all((self.draft.address, self.draft.pipeline_id, self.draft.auth_token)),
             "draft needs a non-empty address, pipeline_id and auth_token"),
        ]
        checks += self._group_checks()
        try:
            self.precision.layer_bits(start, end)
        except ValueError as exc:  # a precision other than 16/8/4, or a bad split
            checks.append((False, str(exc)))
        for ok, message in checks:
            if not ok:
                raise SpecError(f"stage spec of {self.pipeline_id!r} stage {self.stage_index}: {message}")

    def _group_checks(self) -> list[tuple[bool, str]]:
        group = self.tensor_group
        if not group:
            return []
        checks = [
            (len(group) >= 2, "tensor_group needs at least two ranks"),
            ((group[0].device, group[0].bits) == (self.device, self.bits),
             "tensor_group's first rank is this process: its device and bits must be the spec's"),
            (all(r.kv_heads >= 1 and r.intermediate >= 1 for r in group),
             "every rank of tensor_group needs kv_heads and intermediate of at least 1"),
            (self.host_kv_tokens == 0, "a tensor-parallel stage has no host KV tier (host_kv_tokens 0)"),
        ]
        for rank in range(1, len(group)):
            try:
                self.rank_spec(rank).precision.layer_bits(*self.layers)
            except ValueError as exc:
                checks.append((False, f"tensor_group rank {rank}: {exc}"))
        return checks


def _tensor_rank(raw: dict[str, Any]) -> TensorRank:
    values = dict(raw)
    if values.get("emulation") is not None:
        values["emulation"] = Emulation(**values["emulation"])
    return TensorRank(**values)


def spec_file_read(path: str | Path) -> dict[str, Any]:
    """The JSON object of a spec file, not yet checked as a spec (``StageSpec.from_dict`` does that)."""
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SpecError(f"cannot read stage spec {path}: {exc}") from exc
    if not isinstance(raw, dict):
        raise SpecError("a stage spec is a JSON object")
    return raw


# What a running stage process cannot change without becoming another process: its pipeline and its
# credentials, the checkpoint, its place in the pipeline, the address it listens on and what it computes on.
RESPEC_FIXED = ("pipeline_id", "auth_token", "model_path", "stage_index", "listen", "device", "dtype",
                "threads")


# What a tensor-parallel stage loaded across its group: a change restarts the group, not one rank in place.
GROUP_LOADED = ("tensor_group", "layers", "bits", "low_bits", "low_from", "kv_tokens")


def respec_blocker(running: dict[str, Any], wanted: dict[str, Any]) -> str | None:
    """Why a process running the spec ``running`` cannot take ``wanted`` in place (contracts §1,
    "respec"), or None when it can: everything else (layers, precision, KV pool, its neighbours'
    addresses, the pipeline's length, pacing) a stage changes without a new process. A tensor-parallel
    stage takes a new spec in place only where its group keeps what it loaded (its neighbours moved)."""
    changed = [name for name in RESPEC_FIXED if running.get(name) != wanted.get(name)]
    if running.get("tensor_group") or wanted.get("tensor_group"):
        changed += [name for name in GROUP_LOADED if running.get(name) != wanted.get(name)]
    return f"{', '.join(changed)} changed" if changed else None


def spec_digest(spec: dict[str, Any]) -> str:
    """A short name of a spec's content, the same wherever the same JSON object is read: the control
    plane, an agent and a stage process use it to tell reports about one spec from another's."""
    canonical = json.dumps(spec, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]
