"""The cuda paths (packed int8/int4 kernels packed on the device); skipped where there is no GPU."""

from __future__ import annotations

import pytest
import torch

from worker_runtime import Batch, Stage

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(scope="module")
def demo_small(tmp_path_factory):
    from worker_runtime.make_demo_model import parse_args, write_demo_model

    out = tmp_path_factory.mktemp("demo_cuda")
    shape = ["--layers", "2", "--hidden", "256", "--heads", "4", "--kv-heads", "2", "--intermediate", "512"]
    write_demo_model(parse_args([str(out), *shape]))
    return out


@pytest.mark.parametrize(
    "bits,dtype,bound",
    [(16, torch.float32, 1e-3), (16, torch.bfloat16, 0.1), (8, None, 0.1), (4, torch.bfloat16, 1.5)],
)
def test_cuda_stage_matches_the_cpu_fp32_stage(demo_small, bits, dtype, bound):
    prompts = [list(range(4, 30)), list(range(100, 107))]
    batch = Batch.of_tokens([0, 1], prompts, [0, 0])
    reference = Stage.load(demo_small, 0, 2).forward(batch, all_logits=True)
    stage = Stage.load(demo_small, 0, 2, device="cuda:0", dtype=dtype, bits=bits)
    logits = stage.forward(batch, all_logits=True).cpu()
    assert ((logits - reference).abs().max() / reference.std()) < bound
    assert stage.memory().weight_bytes > 0 and stage.kv.k.is_cuda
