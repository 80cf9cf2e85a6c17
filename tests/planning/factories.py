"""Synthetic fleets and model profiles built from a few numbers (no fleet file, no config.json)."""

from __future__ import annotations

from contracts.hardware import GIB, DeviceSpec, FleetSpec, NodeSpec
from contracts.model_profile import LayerProfile, ModelProfile

# name: (memory GiB, bandwidth GB/s, fp16 TFLOPS)
CARDS = {
    "A100": (80, 2039, 312),
    "A10": (24, 600, 125),
    "3090": (24, 936, 71),
    "T4": (16, 320, 65),
    "P40": (24, 346, 12),
    "V100": (32, 900, 125),
}


def device(node: str, index: int, card: str, island: str | None = None, **health) -> DeviceSpec:
    memory, bandwidth, tflops = CARDS[card]
    return DeviceSpec(name=f"{node}/gpu{index}", node=node, index=index, model=card,
                      memory_bytes=memory * GIB, memory_bandwidth_gbs=bandwidth, fp16_tflops=tflops,
                      bf16_tflops=tflops, int8_tops=2 * tflops,
                      nvlink_island=island, nvlink_bandwidth_gbs=300.0 if island else 0.0, **health)


def fleet(layout: dict[str, list[str]], network_gbps: float = 100.0, name: str = "test",
          health: dict[str, dict] | None = None) -> FleetSpec:
    """``{"node-a": ["A100", "T4"], ...}``; a card name ending in '*' joins the node's NVLink island.
    ``health`` maps a device name to DeviceSpec health fields (down, throttle_factor, ...)."""
    health = health or {}
    nodes = []
    for node, cards in layout.items():
        devices = tuple(device(node, i, c.rstrip("*"), island="nv0" if c.endswith("*") else None,
                               **health.get(f"{node}/gpu{i}", {}))
                        for i, c in enumerate(cards))
        nodes.append(NodeSpec(name=node, devices=devices, network_gbps=network_gbps))
    return FleetSpec(name=name, nodes=tuple(nodes))


def layer(params: int, kv_bytes: int, context_flops: int = 0) -> LayerProfile:
    return LayerProfile(params=params, weight_bytes={16: 2 * params, 8: params + params // 64,
                                                     4: params // 2 + params // 64},
                        flops_per_token=2 * params, attention_flops_per_token_per_context=context_flops,
                        kv_bytes_per_token=kv_bytes)


def profile(num_layers: int = 32, hidden: int = 4096, layer_params: int = 200_000_000, vocab: int = 32000,
            kv_bytes: int = 2 * 2 * 1024 * 2, sizes: list[int] | None = None,
            name: str = "synthetic") -> ModelProfile:
    """A LLaMA-like profile; ``sizes`` (params per layer) makes layers differ."""
    sizes = sizes or [layer_params] * num_layers
    embed = LayerProfile(params=vocab * hidden, weight_bytes={b: 2 * vocab * hidden for b in (16, 8, 4)},
                         flops_per_token=0, attention_flops_per_token_per_context=0, kv_bytes_per_token=0)
    head = LayerProfile(params=vocab * hidden, weight_bytes={b: 2 * vocab * hidden for b in (16, 8, 4)},
                        flops_per_token=2 * vocab * hidden, attention_flops_per_token_per_context=0,
                        kv_bytes_per_token=0)
    layers = tuple(layer(p, kv_bytes, 4 * hidden) for p in sizes)
    return ModelProfile(name=name, num_layers=len(sizes), hidden_size=hidden, vocab_size=vocab,
                        activation_bytes_per_token=2 * hidden, layers=layers, embedding=embed, head=head,
                        total_params=sum(sizes) + 2 * vocab * hidden)
