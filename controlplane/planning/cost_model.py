"""First-principles prices of a stage: memory it needs, time of a decode step, prefill and hops.

A decode step of a stage reads its weights once and the KV cache of every sequence in the
micro-batch; it is bound by whichever is slower, moving those bytes through memory or doing the
FLOPs. Prefill is FLOP-bound. A hop moves the micro-batch's hidden states over the link. Every time
is scaled by the device's measured calibration factor at the stage's precision (``slowdown``) and
slowed by thermal throttling, so the figures improve as deployments report real step times.

All interval figures come from prefix sums, so the partition search can price every
[start, end) of a device at once as a matrix (numpy) and the evaluator can price one stage. The
memory a stage needs is ``contracts.footprint``'s, the formula the agent admits stages by: one
stage's through ``stage_footprint`` itself, every range's through the same sums and constants.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from contracts.footprint import (  # noqa: F401 (RESERVED_*: read through this module too)
    EMBEDDING_BITS,
    RESERVED_BYTES,
    RESERVED_FRACTION,
    StageFootprint,
    activation_workspace_bytes,
    logits_bytes,
    stage_footprint,
    usable_bytes,
)
from contracts.hardware import DeviceSpec, FleetSpec, LinkSpec
from controlplane.planning import tensor_parallel
from controlplane.planning.plan import StagePrecision
from controlplane.planning.request import PlanRequest
from controlplane.planning.roofline import (  # noqa: F401 (read through this module too)
    BANDWIDTH_EFFICIENCY,
    DECODE_COMPUTE_EFFICIENCY,
    LAYER_OVERHEAD_S,
    PREFILL_COMPUTE_EFFICIENCY,
    StageFit,
    _peak,
    bandwidth,
    device_key,
    slowdown,
)

TOKEN_ID_BYTES = 4  # sampled token ids returned from the last stage to the first


class StageFigures(NamedTuple):
    """Per [i, j) (matrices), with every layer and the head at 16 bits, and per device."""

    read_bytes: np.ndarray  # weights and KV a decode step reads
    compute_s: np.ndarray  # its FLOPs at the device's decode peak
    overhead_s: np.ndarray  # fixed per-layer costs
    excess_bytes: np.ndarray  # weights, KV and workspace beyond the device's capacity (<= 0: fits)
    slowdown: float  # calibration at the stages' last precision over throttling: times are multiplied by it
    bandwidth: float  # bytes per second


class CostModel:
    """Prices for one request. Holds prefix sums of the model and caches per-device matrices."""

    def __init__(self, request: PlanRequest) -> None:
        model, workload = request.model, request.workload
        self.request = request
        self.model = model
        self.fleet: FleetSpec = request.fleet
        self.num_layers = model.num_layers
        self.batch = workload.batch
        self.kv_context = workload.mean_decode_context
        self.prompt = workload.prompt
        self.kv_required = workload.kv_tokens_required
        layers = model.layers
        zero = np.zeros(1)
        self.weights = {b: np.concatenate([zero,
                                           np.cumsum([float(layer.weight_bytes[b]) for layer in layers])])
                        for b in (16, 8, 4)}
        self.flops = np.concatenate([zero, np.cumsum([float(layer.flops_per_token) for layer in layers])])
        self.attn = np.concatenate(
            [zero, np.cumsum([float(layer.attention_flops_per_token_per_context) for layer in layers])])
        self.kv = np.concatenate([zero, np.cumsum([float(layer.kv_bytes_per_token) for layer in layers])])
        # The footprint of contracts.footprint, as prefix sums: the embedding is a lookup and stays
        # 16-bit; lm_head is a matmul at its stage's last precision (the stage engine quantizes every
        # nn.Linear of a stage); the workspace, with the batch's logits on the last stage.
        self.embedding_bytes = float(model.embedding.weight_bytes[EMBEDDING_BITS])
        self.head_bytes = {b: float(model.head.weight_bytes[b]) for b in (16, 8, 4)}
        self.head_flops = float(model.head.flops_per_token)
        self.activation_bytes = float(model.activation_bytes_per_token)
        self.workspace = float(activation_workspace_bytes(model))
        self.logits = float(logits_bytes(model, workload.batch))
        self._matrices: dict[tuple, np.ndarray] = {}
        self._devices = {d.name: d for d in self.fleet.devices}
        self._links: dict[tuple[str, str], LinkSpec] = {}
        self._derived: dict[tuple, object] = {}

    def remember(self, key: tuple, make):
        """``make()``, once per key for this request: price tables derived from the matrices that
        the search would otherwise rebuild for every group of alike devices."""
        if key not in self._derived:
            self._derived[key] = make()
        return self._derived[key]

    def device(self, name: str) -> DeviceSpec:
        """The fleet's device by name (KeyError for an unknown one)."""
        return self._devices[name]

    def link(self, a: DeviceSpec, b: DeviceSpec) -> LinkSpec:
        """``FleetSpec.link_between``, remembered: the search asks for the same pairs many times."""
        key = (a.name, b.name)
        if key not in self._links:
            self._links[key] = self.fleet.link_between(a, b)
        return self._links[key]

    # -- one stage ------------------------------------------------------------------------------

    def memory(self, device: DeviceSpec, stage: StagePrecision) -> StageFit:
        """The stage's footprint on this device (``contracts.footprint``, as the agent admits it); a
        tensor-parallel group's per rank (``tensor_parallel.GroupFit``)."""
        if getattr(stage, "group", ()):
            return tensor_parallel.group_fit(self, stage)
        footprint = stage_footprint(self.model, stage.start, stage.end, stage.precision, batch=self.batch)
        return StageFit(footprint, usable_bytes(device))

    def decode_s(self, device: DeviceSpec, stage: StagePrecision, micro_batch: float) -> float:
        """One decode step of a micro-batch through the stage's layers on this device (or its group)."""
        if getattr(stage, "group", ()):
            return tensor_parallel.group_decode_s(self, stage, micro_batch)
        return float(self._decode(device, np.array(stage.start), np.array(stage.split), np.array(stage.end),
                                  stage.bits, stage.last_bits, micro_batch))

    def prefill_s(self, device: DeviceSpec, stage: StagePrecision, tokens: int) -> float:
        """Prefill of one prompt of ``tokens`` tokens: FLOP-bound, weights read at least once."""
        if getattr(stage, "group", ()):
            return tensor_parallel.group_prefill_s(self, stage, tokens)
        start, end = stage.start, stage.end
        last = end == self.num_layers
        flops = tokens * (self.flops[end] - self.flops[start] + self.head_flops * last / max(tokens, 1))
        flops += (self.attn[end] - self.attn[start]) * tokens * tokens / 2.0
        weights = self._read_weights(start, stage.split, end, stage.bits, stage.last_bits)
        seconds = max(flops / (_peak(device) * PREFILL_COMPUTE_EFFICIENCY), weights / bandwidth(device))
        return (seconds + (end - start) * LAYER_OVERHEAD_S) * slowdown(device, stage.last_bits)

    def crosses_network(self, a: DeviceSpec, b: DeviceSpec) -> bool:
        """Whether activations from a to b take the network: the search keeps such hops few, since
        each is a link other traffic shares and a path that can fail beyond the two nodes."""
        return self.link(a, b).kind == "network"

    def hop_s(self, a: DeviceSpec, b: DeviceSpec, tokens: float) -> float:
        """Hidden states of ``tokens`` tokens from a to b: bytes over bandwidth plus latency."""
        link = self.link(a, b)
        return tokens * self.activation_bytes / (link.bandwidth_gbs * 1e9) + link.latency_us * 1e-6

    def return_s(self, last: DeviceSpec, first: DeviceSpec, micro_batch: float) -> float:
        """Sampled token ids going back from the last stage to the first (closes the decode loop)."""
        if last.name == first.name:
            return 0.0
        link = self.link(last, first)
        return micro_batch * TOKEN_ID_BYTES / (link.bandwidth_gbs * 1e9) + link.latency_us * 1e-6

    def limiting_resource(self, device: DeviceSpec, stage: StagePrecision, micro_batch: float) -> str:
        """Whether the stage's decode step waits on memory bandwidth or on compute (or, for a
        tensor-parallel group, on its all-reduces)."""
        if getattr(stage, "group", ()):
            return tensor_parallel.group_resource(self, stage, micro_batch)
        memory_s, compute_s = self._parts(device, np.array(stage.start), np.array(stage.split),
                                          np.array(stage.end), stage.bits, stage.last_bits, micro_batch)
        return "memory bandwidth" if memory_s >= compute_s else "compute"

    def least_replica_bytes(self, low_bits: int, low_layers: int) -> float:
        """Least memory one replica needs with ``low_layers`` layers at ``low_bits`` (the ones that
        save the most) and the rest at 16 bits, plus the KV of the batch and one workspace."""
        per_layer = np.diff(self.weights[16])
        savings = np.sort(per_layer - np.diff(self.weights[low_bits]))[::-1]
        weights = per_layer.sum() - savings[:low_layers].sum()
        return float(weights + self.embedding_bytes + self.head_bytes[low_bits]
                     + self.kv[-1] * self.kv_required + self.workspace + self.logits)

    # -- every interval of a device at once -----------------------------------------------------

    def decode_matrix(self, device: DeviceSpec, bits: int, micro_batch: float) -> np.ndarray:
        """M[i, j] = decode step time of layers [i, j) at ``bits`` on this device, inf where it does
        not fit.

        Memory feasibility needs the KV of the whole replica batch at full context, not just the
        micro-batch: every sequence in flight keeps its cache on every stage.
        """
        key = (device_key(device), bits, micro_batch)
        if key not in self._matrices:
            n = self.num_layers + 1
            starts, ends = np.arange(n)[:, None], np.arange(n)[None, :]
            self._matrices[key] = self._priced(device, starts, ends, ends, bits, bits, micro_batch)
        return self._matrices[key]

    def split_times(self, device: DeviceSpec, low_bits: int, micro_batch: float, starts, ends,
                    low_layers) -> np.ndarray:
        """Decode step times of stages [starts, ends) (arrays) whose last ``low_layers`` layers, and
        head, run at ``low_bits`` and the rest at 16 bits; inf where a stage does not fit."""
        splits = np.maximum(np.asarray(ends) - low_layers, starts)
        return self._priced(device, np.asarray(starts), splits, np.asarray(ends), 16, low_bits, micro_batch)

    def stage_figures(self, device: DeviceSpec, micro_batch: float, low_bits: int) -> StageFigures:
        """The parts of every [i, j)'s decode step at 16 bits: what ``SplitPrices`` counts layers at
        ``low_bits`` from (a stage with any of them takes that precision's calibration)."""
        n = self.num_layers + 1
        starts, ends = np.arange(n)[:, None], np.arange(n)[None, :]
        return StageFigures(
            read_bytes=self._read_bytes(starts, ends, ends, 16, 16, micro_batch),
            compute_s=self._compute_s(device, starts, ends, micro_batch),
            overhead_s=(ends - starts) * LAYER_OVERHEAD_S,
            excess_bytes=self._kept_bytes(starts, ends, ends, 16, 16) - usable_bytes(device),
            slowdown=slowdown(device, low_bits), bandwidth=bandwidth(device))

    def _priced(self, device: DeviceSpec, starts, splits, ends, bits: int, low_bits: int,
                micro_batch: float) -> np.ndarray:
        """Decode step times of stages [starts, ends) with [splits, ends) at ``low_bits``, inf where
        the stage is empty or its weights, the batch's KV at full context and the workspace do not fit."""
        times = self._decode(device, starts, splits, ends, bits, low_bits, micro_batch)
        need = self._kept_bytes(starts, splits, ends, bits, low_bits)
        priced = np.where((need <= usable_bytes(device)) & (ends > starts), times, np.inf)
        priced.setflags(write=False)
        return priced

    def _read_weights(self, starts, splits, ends, bits: int, low_bits: int):
        """Weight bytes a step reads: [starts, splits) at ``bits``, [splits, ends) at ``low_bits``,
        and on the last stage the head, at the precision of the stage's last layer."""
        layers = (self.weights[bits][splits] - self.weights[bits][starts]
                  + self.weights[low_bits][ends] - self.weights[low_bits][splits])
        head = np.where(splits < ends, self.head_bytes[low_bits], self.head_bytes[bits])
        return layers + head * (ends == self.num_layers)

    def _stored_weights(self, starts, splits, ends, bits: int, low_bits: int):
        """Weights a stage keeps in memory: its layers, the embedding on the first, the head on the last."""
        return self._read_weights(starts, splits, ends, bits, low_bits) + self.embedding_bytes * (starts == 0)

    def _kept_bytes(self, starts, splits, ends, bits: int, low_bits: int):
        """What a stage holds: its weights, the KV of the whole batch at full context, its workspace;
        ``contracts.footprint.stage_footprint(...).holding(kv_required)`` for every range at once
        (tests/contracts/test_footprint.py holds the two to the same bytes)."""
        kv = (self.kv[ends] - self.kv[starts]) * self.kv_required
        return self._stored_weights(starts, splits, ends, bits, low_bits) + kv + self._workspace(ends)

    def _workspace(self, ends):
        return self.workspace + self.logits * (ends == self.num_layers)

    def _decode(self, device: DeviceSpec, starts, splits, ends, bits: int, low_bits: int, micro_batch: float):
        memory_s, compute_s = self._parts(device, starts, splits, ends, bits, low_bits, micro_batch)
        factor = slowdown(device, bits)
        if low_bits != bits:  # a split stage takes its last precision's factor (``slowdown``)
            factor = np.where(splits < ends, slowdown(device, low_bits), factor)
        return (np.maximum(memory_s, compute_s) + (ends - starts) * LAYER_OVERHEAD_S) * factor

    def _parts(self, device: DeviceSpec, starts, splits, ends, bits: int, low_bits: int, micro_batch: float):
        """Seconds to move the step's bytes and to do its FLOPs, before overheads and calibration."""
        read = self._read_bytes(starts, splits, ends, bits, low_bits, micro_batch)
        return read / bandwidth(device), self._compute_s(device, starts, ends, micro_batch)

    def _read_bytes(self, starts, splits, ends, bits: int, low_bits: int, micro_batch: float):
        """Bytes a decode step reads: the weights and the micro-batch's KV cache."""
        kv = (self.kv[ends] - self.kv[starts]) * micro_batch * self.kv_context
        return self._read_weights(starts, splits, ends, bits, low_bits) + kv

    def _compute_s(self, device: DeviceSpec, starts, ends, micro_batch: float):
        last = ends == self.num_layers
        flops = micro_batch * (self.flops[ends] - self.flops[starts] + self.head_flops * last
                               + (self.attn[ends] - self.attn[starts]) * self.kv_context)
        return flops / (_peak(device) * DECODE_COMPUTE_EFFICIENCY)
