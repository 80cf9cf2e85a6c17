import pytest

from contracts import gpu_catalog
from contracts.hardware import GIB

REQUIRED = [
    "V100-16GB", "V100-32GB", "T4", "A10", "A10G", "L4", "L40S", "A100-40GB-PCIE", "A100-80GB-PCIE",
    "A100-40GB-SXM", "A100-80GB-SXM", "H100-PCIE", "H100-SXM", "H200", "RTX-3090", "RTX-4090", "RTX-A6000",
]


@pytest.mark.parametrize("name", REQUIRED)
def test_every_required_card_is_in_the_catalog(name):
    model = gpu_catalog.lookup(name)
    assert model.name == name
    assert model.memory_bytes > 0 and model.memory_bandwidth_gbs > 0 and model.fp16_tflops > 0


@pytest.mark.parametrize(
    "spelling, name",
    [
        ("a100-80gb-sxm", "A100-80GB-SXM"),
        ("NVIDIA A100-SXM4-80GB", "A100-80GB-SXM"),
        ("Tesla T4", "T4"),
        ("NVIDIA GeForce RTX 4090", "RTX-4090"),
        ("rtx 3090", "RTX-3090"),
        ("NVIDIA H100 80GB HBM3", "H100-SXM"),
        ("Tesla V100-SXM2-32GB", "V100-32GB"),
        ("h100_pcie", "H100-PCIE"),
    ],
)
def test_lookup_accepts_nvml_names_and_ignores_case_and_separators(spelling, name):
    assert gpu_catalog.lookup(spelling).name == name


def test_unknown_name_lists_close_matches():
    with pytest.raises(gpu_catalog.UnknownGpuModel) as error:
        gpu_catalog.lookup("A100-80G")
    assert "A100-80GB-SXM" in error.value.suggestions
    assert "'A100-80G'" in str(error.value) and "did you mean" in str(error.value)


def test_spec_sheet_figures():
    h100 = gpu_catalog.lookup("H100-SXM")
    figures = (h100.memory_bytes, h100.memory_bandwidth_gbs, h100.fp16_tflops, h100.nvlink_gbs)
    assert figures == (80 * GIB, 3350, 989, 450)
    a100 = gpu_catalog.lookup("A100-40GB-PCIE")
    figures = (a100.memory_bandwidth_gbs, a100.bf16_tflops, a100.int8_tops, a100.nvlink_gbs)
    assert figures == (1555, 312, 624, 0)
    # Volta and Turing have no bf16 tensor path; GeForce cards run FP32 accumulate at half rate.
    assert not gpu_catalog.lookup("T4").supports_bf16
    assert not gpu_catalog.lookup("V100-16GB").supports_bf16
    assert gpu_catalog.lookup("RTX-3090").fp16_tflops == 71


def test_catalog_is_consistent():
    models = gpu_catalog.all_models()
    assert len({m.name for m in models}) == len(models)
    for model in models:
        assert model.memory_gib > 0 and model.year >= 2017
        # Every listed card runs bf16 at its fp16 rate, or not at all.
        assert model.bf16_tflops in (0, model.fp16_tflops)
        assert model.pcie_gen in (3, 4, 5)
        if "SXM" in model.name:
            assert model.nvlink_gbs > 0
