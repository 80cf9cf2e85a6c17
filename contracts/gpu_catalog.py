"""Spec-sheet figures for the NVIDIA cards motley knows by name.

NVML reports a card's name and memory but not how fast it is; the planner needs memory bandwidth
and peak tensor throughput to price a stage. These entries fill that gap, for fleet files that
declare cards by name and for agents that discover them (``lookup`` also accepts the name NVML
reports, e.g. "NVIDIA A100-SXM4-80GB" or "Tesla T4").

Conventions, so entries of different generations compare fairly:
- Throughput is *dense* peak (NVIDIA's sheets since Ampere print the 2:4-sparse figure first; we
  halve it) on the tensor cores, with FP32 accumulation for fp16/bf16 because that is what PyTorch's
  matmuls use. GeForce cards run FP32-accumulate at half their FP16-accumulate rate, which is why
  an RTX 3090 shows 71 and not 142 TFLOPs.
- ``bf16_tflops == 0`` means the card has no bf16 tensor path (Volta, Turing: V100, T4). The
  planner must not place a bf16 stage there: run the stage in fp16 (bf16 weights cast down), or
  treat the device as unusable for a bf16-only plan. ``int8_tops == 0`` likewise means no int8
  tensor path (V100); weight-only int8/int4 still run there, since they dequantize to fp16.
- Memory is the marketed capacity in GiB; NVML reports a little less (e.g. 15 GiB on a T4), and a
  discovered card keeps the figure NVML gives.
- Bandwidth in GB/s (10^9 bytes/s). ``nvlink_gbs`` is per direction between two GPUs of an SXM
  board (NVIDIA quotes the bidirectional total: we halve it); 0 where the form factor has no
  NVLink or only an optional bridge (declare a bridge with a fleet-file override).
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from contracts.hardware import GIB


@dataclass(frozen=True)
class GpuModel:
    """One catalog entry: a card as its spec sheet describes it."""

    name: str  # catalog name, e.g. "A100-80GB-SXM"
    aliases: tuple[str, ...]  # other spellings, NVML names first
    architecture: str  # "Volta", "Turing", "Ampere", "Ada Lovelace", "Hopper"
    compute_capability: str
    year: int
    memory_gib: float
    memory_bandwidth_gbs: float
    fp16_tflops: float  # dense, tensor cores, FP32 accumulate
    bf16_tflops: float  # 0: no bf16 tensor path
    int8_tops: float  # dense; 0: no int8 tensor path
    pcie_gen: int
    pcie_lanes: int = 16
    nvlink_gbs: float = 0.0  # per direction; 0: none (or only an optional bridge)
    vendor: str = "NVIDIA"

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)

    @property
    def supports_bf16(self) -> bool:
        return self.bf16_tflops > 0


class UnknownGpuModel(LookupError):
    """A name that is neither a catalog name nor a known alias; the message lists close matches."""

    def __init__(self, name: str, suggestions: list[str]):
        self.name = name
        self.suggestions = suggestions
        hint = f"did you mean {', '.join(suggestions)}?" if suggestions else f"known: {', '.join(names())}"
        super().__init__(f"unknown GPU model {name!r}; {hint}")


_CATALOG: tuple[GpuModel, ...] = (
    # --- Volta ---
    # https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf
    # V100 SXM2: 125 TFLOPs tensor, 900 GB/s HBM2, NVLink 300 GB/s total (150 per direction).
    GpuModel("V100-16GB", ("Tesla V100-SXM2-16GB", "V100-SXM2-16GB", "V100"), "Volta", "7.0", 2017,
             16, 900, 125, 0, 0, pcie_gen=3, nvlink_gbs=150),
    GpuModel("V100-32GB", ("Tesla V100-SXM2-32GB", "V100-SXM2-32GB", "Tesla V100-SXM3-32GB"), "Volta", "7.0",
             2018, 32, 900, 125, 0, 0, pcie_gen=3, nvlink_gbs=150),
    # Same datasheet, PCIe column: 112 TFLOPs tensor, 900 GB/s.
    GpuModel("V100-PCIE-16GB", ("Tesla V100-PCIE-16GB",), "Volta", "7.0", 2017,
             16, 900, 112, 0, 0, pcie_gen=3),
    GpuModel("V100-PCIE-32GB", ("Tesla V100-PCIE-32GB",), "Volta", "7.0", 2018,
             32, 900, 112, 0, 0, pcie_gen=3),
    # --- Turing ---
    # https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/t4-tensor-core-datasheet-951643.pdf
    # 65 TFLOPs FP16 mixed precision, 130 INT8 TOPs, 320 GB/s GDDR6, PCIe gen3 x16.
    GpuModel("T4", ("Tesla T4", "NVIDIA T4"), "Turing", "7.5", 2018, 16, 320, 65, 0, 130, pcie_gen=3),
    # --- Ampere ---
    # https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a10/pdf/a10-datasheet.pdf
    # 125 TF FP16/BF16 tensor, 250 INT8 TOPs (dense; sheet: 250/500 with sparsity), 600 GB/s.
    GpuModel("A10", ("NVIDIA A10",), "Ampere", "8.6", 2021, 24, 600, 125, 125, 250, pcie_gen=4),
    # AWS EC2 G5 (https://aws.amazon.com/ec2/instance-types/g5/) and the GA102 whitepaper: A10G has
    # 80 SMs at a lower clock with GeForce-rate FP32 accumulate: ~70 TF FP16/BF16 dense, 600 GB/s.
    GpuModel("A10G", ("NVIDIA A10G",), "Ampere", "8.6", 2021, 24, 600, 70, 70, 140, pcie_gen=4),
    # https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a40/proviz-print-nvidia-a40-datasheet-us-nvidia-1469711-r8-web.pdf
    # 149.7 TF FP16/BF16 tensor dense, 299.3 INT8 TOPs dense, 696 GB/s GDDR6.
    GpuModel("A40", ("NVIDIA A40",), "Ampere", "8.6", 2020, 48, 696, 149.7, 149.7, 299.3, pcie_gen=4),
    # https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf
    # 312 TF FP16/BF16 tensor dense, 624 INT8 TOPs dense; 40GB 1,555 GB/s; 80GB PCIe 1,935 GB/s,
    # 80GB SXM 2,039 GB/s; SXM NVLink 600 GB/s total (300 per direction).
    GpuModel("A100-40GB-PCIE", ("NVIDIA A100-PCIE-40GB", "A100-PCIE-40GB"), "Ampere", "8.0", 2020,
             40, 1555, 312, 312, 624, pcie_gen=4),
    GpuModel("A100-80GB-PCIE", ("NVIDIA A100 80GB PCIe", "NVIDIA A100-PCIE-80GB", "A100-PCIE-80GB"), "Ampere",
             "8.0", 2021, 80, 1935, 312, 312, 624, pcie_gen=4),
    GpuModel("A100-40GB-SXM", ("NVIDIA A100-SXM4-40GB", "A100-SXM4-40GB", "A100"), "Ampere", "8.0", 2020,
             40, 1555, 312, 312, 624, pcie_gen=4, nvlink_gbs=300),
    GpuModel("A100-80GB-SXM", ("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB"), "Ampere", "8.0", 2020,
             80, 2039, 312, 312, 624, pcie_gen=4, nvlink_gbs=300),
    # https://www.nvidia.com/content/dam/en-zz/Solutions/geforce/ampere/pdf/NVIDIA-ampere-GA102-GPU-Architecture-Whitepaper-V1.pdf
    # RTX 3090 (Table 9): FP16 tensor with FP32 accumulate 71 TF dense, INT8 284 TOPs dense, 936 GB/s.
    GpuModel("RTX-3090", ("NVIDIA GeForce RTX 3090", "GeForce RTX 3090"), "Ampere", "8.6", 2020,
             24, 936, 71, 71, 284, pcie_gen=4),
    # Same whitepaper, RTX A6000 (Quadro rate: full-speed FP32 accumulate): 154.8 TF dense,
    # INT8 309.7 TOPs dense, 768 GB/s GDDR6.
    GpuModel("RTX-A6000", ("NVIDIA RTX A6000",), "Ampere", "8.6", 2020,
             48, 768, 154.8, 154.8, 309.7, pcie_gen=4),
    # --- Ada Lovelace ---
    # https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf
    # RTX 4090 (Appendix A): FP16 tensor with FP32 accumulate 165.2 TF dense, INT8 660.6 TOPs dense,
    # 1,008 GB/s GDDR6X.
    GpuModel("RTX-4090", ("NVIDIA GeForce RTX 4090", "GeForce RTX 4090"), "Ada Lovelace", "8.9",
             2022, 24, 1008, 165.2, 165.2, 660.6, pcie_gen=4),
    # https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/l4/PB-11316-001_v01.pdf
    # L4: 121 TF FP16/BF16 dense (242 sparse), 242 INT8 TOPs dense, 300 GB/s, PCIe gen4 x16.
    GpuModel("L4", ("NVIDIA L4",), "Ada Lovelace", "8.9", 2023, 24, 300, 121, 121, 242, pcie_gen=4),
    # https://resources.nvidia.com/en-us-l40s/l40s-datasheet-28413
    # L40S: 362.05 TF FP16/BF16 dense (733 sparse), 733 INT8 TOPs dense, 864 GB/s GDDR6.
    GpuModel("L40S", ("NVIDIA L40S",), "Ada Lovelace", "8.9", 2023, 48, 864, 362, 362, 733, pcie_gen=4),
    # https://images.nvidia.com/content/Solutions/data-center/vgpu-L40-datasheet.pdf
    # L40: 181 TF FP16/BF16 dense, 362 INT8 TOPs dense, 864 GB/s.
    GpuModel("L40", ("NVIDIA L40",), "Ada Lovelace", "8.9", 2022, 48, 864, 181, 181, 362, pcie_gen=4),
    # --- Hopper ---
    # https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet
    # H100 SXM: 989 TF FP16/BF16 dense, 1,979 INT8 TOPs dense, 3.35 TB/s HBM3, NVLink 900 GB/s total.
    # H100 PCIe: 756 TF dense, 1,513 INT8 TOPs dense, 2 TB/s HBM2e, PCIe gen5.
    GpuModel("H100-PCIE", ("NVIDIA H100 PCIe", "H100 PCIe"), "Hopper", "9.0", 2022,
             80, 2000, 756, 756, 1513, pcie_gen=5),
    GpuModel("H100-SXM", ("NVIDIA H100 80GB HBM3", "H100-SXM5-80GB", "H100"), "Hopper", "9.0", 2022,
             80, 3350, 989, 989, 1979, pcie_gen=5, nvlink_gbs=450),
    # https://www.nvidia.com/en-us/data-center/h200/  H200 SXM: 141 GB HBM3e at 4.8 TB/s, same
    # compute as H100 SXM (989 TF dense, 1,979 INT8 TOPs dense), NVLink 900 GB/s total.
    GpuModel("H200", ("NVIDIA H200", "H200-SXM", "NVIDIA H200 141GB HBM3e"), "Hopper", "9.0", 2024,
             141, 4800, 989, 989, 1979, pcie_gen=5, nvlink_gbs=450),
)


def _key(name: str) -> str:
    """Spelling-insensitive key: case, spaces, dashes and underscores do not matter."""
    return re.sub(r"[\s_\-]+", "", name).lower()


_BY_KEY: dict[str, GpuModel] = {}
for _model in _CATALOG:
    for _name in (_model.name, *_model.aliases):
        if _BY_KEY.get(_key(_name), _model) is not _model:
            raise RuntimeError(f"GPU catalog: {_name!r} names two entries")
        _BY_KEY[_key(_name)] = _model


def all_models() -> tuple[GpuModel, ...]:
    return _CATALOG


def names() -> list[str]:
    return [model.name for model in _CATALOG]


def lookup(name: str) -> GpuModel:
    """The entry for a catalog name or alias (NVML names included), ignoring case and separators."""
    model = _BY_KEY.get(_key(name))
    if model is None:
        spellings = [spelling for m in _CATALOG for spelling in (m.name, *m.aliases)]
        close = difflib.get_close_matches(name, spellings, n=4, cutoff=0.5)
        close += difflib.get_close_matches(name.upper(), spellings, n=4, cutoff=0.5)
        suggestions = list(dict.fromkeys(lookup(c).name for c in close))
        raise UnknownGpuModel(name, suggestions)
    return model
