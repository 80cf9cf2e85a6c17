"""A tensor-parallel stage (worker_runtime.tensor_parallel) against the same stage in one process: uneven
shares of llama, mistral (sliding window) and qwen2 (q/k/v biases) layouts with grouped-query attention, at
16, 8 and 4 bits and with ranks at different precisions, over a ragged prefill and decode steps, give the
one-process stage's logits (last stage) or hidden states (first, middle stage) within test_parity's
tolerance. Ranks are CPU processes reducing through gloo; one pool of them serves the whole module."""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from contracts.model_config import ModelConfig
from contracts.precision import Precision
from worker_runtime import Batch, Stage
from worker_runtime.quantize import QuantizationError, quantize_int8_rows
from worker_runtime.tensor_parallel import split_shares

from .checkpoints import save_checkpoint
from .tensor_parallel_ranks import serve
from .test_parity import TOLERANCE

SHAPE = dict(hidden_size=128, intermediate_size=256, num_attention_heads=8, num_key_value_heads=4,
             vocab_size=256, initializer_range=0.1, torch_dtype="float32")
MODELS = {
    "llama": (LlamaConfig, LlamaForCausalLM, dict(num_hidden_layers=3, attention_bias=True, mlp_bias=True)),
    "mistral": (MistralConfig, MistralForCausalLM, dict(num_hidden_layers=2, sliding_window=6)),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, dict(num_hidden_layers=4, use_sliding_window=False)),
}
# model, layers [start, end), kv heads per rank, intermediate columns per rank, bits per rank
CASES = {
    "llama 16 bits, heads 3+1, mlp 75/25": ("llama", 0, 3, [3, 1], [192, 64], [16, 16]),
    "llama 8 bits, heads 3+1, mlp 62/38": ("llama", 0, 3, [3, 1], [160, 96], [8, 8]),
    "llama 4 bits, heads 1+3, mlp 25/75": ("llama", 0, 3, [1, 3], [64, 192], [4, 4]),
    "llama rank 0 at 16 bits, rank 1 at 8": ("llama", 0, 3, [3, 1], [192, 64], [16, 8]),
    "mistral sliding window, 16 bits": ("mistral", 0, 2, [3, 1], [176, 80], [16, 16]),
    "qwen2 middle stage, 3 ranks": ("qwen2", 1, 3, [2, 1, 1], [128, 96, 32], [16, 16, 16]),
    "qwen2 first stage, 4 bits": ("qwen2", 0, 2, [3, 1], [192, 64], [4, 4]),
}
PROMPTS = ([5, 17, 99, 3, 250, 42, 7, 7, 130, 61, 88], [9, 200, 31, 4, 77])
DECODE_STEPS = 3


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("tensor_parallel")
    return {name: str(save_checkpoint(config_cls(**SHAPE, **extra), model_cls, root / name))
            for name, (config_cls, model_cls, extra) in MODELS.items()}


class Ranks:
    """Three spawned rank processes; :meth:`run` runs one group of the first ``size`` of them."""

    def __init__(self, count: int = 3):
        context = mp.get_context("spawn")
        self.results = context.Queue()
        self.jobs = [context.Queue() for _ in range(count)]
        self.processes = [context.Process(target=serve, args=(rank, jobs, self.results), daemon=True)
                          for rank, jobs in enumerate(self.jobs)]
        for process in self.processes:
            process.start()

    def run(self, size: int, **job) -> list[dict]:
        for rank in range(size):
            self.jobs[rank].put(dict(size=size, **job))
        outcomes = [None] * size
        for _ in range(size):
            rank, outcome, error = self.results.get(timeout=180)
            assert error is None, f"rank {rank}:\n{error}"
            outcomes[rank] = outcome
        return outcomes

    def close(self) -> None:
        for jobs in self.jobs:
            jobs.put(None)
        for process in self.processes:
            process.join(timeout=20)
            if process.is_alive():
                process.terminate()


@pytest.fixture(scope="module")
def ranks():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # the ranks run one thread each, and so does the reference
    pool = Ranks()
    yield pool
    pool.close()
    torch.set_num_threads(before)


def steps(config: ModelConfig, first: bool) -> list[tuple[Batch, bool]]:
    """A ragged prefill of two sequences (every token's logits), then decode steps of both."""
    generator = torch.Generator().manual_seed(0)

    def batch(tokens: list[list[int]], starts: list[int]) -> Batch:
        made = Batch.of_tokens([1, 2], tokens, starts)
        return made if first else made.with_hidden(torch.randn(made.num_tokens, config.hidden_size,
                                                               generator=generator))

    done = [batch(list(PROMPTS), [0, 0])]
    for step in range(DECODE_STEPS):
        done.append(batch([[11 + step], [200 - step]], [len(p) + step for p in PROMPTS]))
    return [(b, i == 0) for i, b in enumerate(done)]


def reference(path: str, start: int, end: int, shares: list, bits: list[int]) -> Stage:
    """The stage in one process: at the ranks' precision, or, where they differ, at 16 bits with each
    8-bit rank's slices rounded as that rank rounds them (rank 0, holding the lm_head, at 16)."""
    if len(set(bits)) == 1:
        return Stage.load(path, start, end, precision=Precision(bits[0]), kv_tokens=64, block_size=8)
    assert bits[0] == 16 and set(bits) <= {16, 8}, "a mixed reference rounds 8-bit ranks only"
    stage = Stage.load(path, start, end, kv_tokens=64, block_size=8)
    c = stage.config
    fused_rows = {"attention.wqkv.weight": [0, c.q_size, c.q_size + c.kv_size],
                  "feed_forward.w13.weight": [0, c.intermediate_size]}
    with torch.inference_mode():
        for share in (s for s, b in zip(shares, bits) if b == 8):
            for layer in stage.layers:
                modules = dict(layer.named_modules())
                for name in ("attention.wqkv.weight", "attention.wo.weight", "feed_forward.w13.weight",
                             "feed_forward.w2.weight"):
                    weight = modules[name.rsplit(".", 1)[0]].weight
                    rows, columns = share.slices(c, name)
                    if rows:
                        spans = zip(rows, fused_rows[name])
                        index = torch.cat([torch.arange(a, b) + at for (a, b), at in spans])
                        weight[index] = _int8_rounded(weight[index])
                    else:
                        weight[:, columns[0]:columns[1]] = _int8_rounded(weight)[:, columns[0]:columns[1]]
    return stage


def _int8_rounded(w: torch.Tensor) -> torch.Tensor:
    q, scales = quantize_int8_rows(w)
    return q.float() * scales.float()[:, None]


@pytest.mark.parametrize("case", CASES)
def test_a_tensor_parallel_stage_matches_the_stage_in_one_process(ranks, checkpoints, tmp_path, case):
    model, start, end, kv_heads, intermediate, bits = CASES[case]
    path = checkpoints[model]
    config = ModelConfig.from_file(path)
    shares = split_shares(config, start, end, kv_heads, intermediate, [Precision(b) for b in bits])
    todo = steps(config, first=start == 0)
    outcomes = ranks.run(len(shares), init_method=f"file://{tmp_path}/rendezvous", path=path, start=start,
                         end=end, shares=shares, steps=todo)
    expected = reference(path, start, end, shares, bits)
    for i, (batch, all_logits) in enumerate(todo):
        got = torch.from_numpy(outcomes[0]["outputs"][i])
        torch.testing.assert_close(got, expected.forward(batch, all_logits), atol=TOLERANCE, rtol=0,
                                   msg=lambda m, i=i: f"step {i}: {m}")
    assert all(o["outputs"] == [None] * len(todo) for o in outcomes[1:])  # rank 0 alone returns
    last = end == config.num_layers
    holds = [o["holds"] for o in outcomes]
    assert [h["kv_heads"] for h in holds] == kv_heads
    assert [h["embed"] for h in holds] == [start == 0] + [False] * (len(holds) - 1)
    assert [h["lm_head"] for h in holds] == [last] + [False] * (len(holds) - 1)


def test_shares_are_whole_kv_heads_and_mlp_blocks(checkpoints):
    config = ModelConfig.from_file(checkpoints["llama"])  # 8 heads of 16 in 4 kv groups, intermediate 256
    first, second = split_shares(config, 0, 3, [3, 1], [192, 64])
    assert (first.kv_heads, second.kv_heads, first.intermediate, second.intermediate) == (
        (0, 3), (3, 4), (0, 192), (192, 256))
    assert second.slices(config, "attention.wqkv.weight") == ([(96, 128), (48, 64), (48, 64)], None)
    assert second.slices(config, "attention.wo.weight") == (None, (96, 128))
    assert second.slices(config, "feed_forward.w13.bias") == ([(192, 256), (192, 256)], None)
    assert second.slices(config, "feed_forward.w2.weight") == (None, (192, 256))
    assert second.config(config).num_heads == 2 and first.config(config).intermediate_size == 192


def test_uneven_shares_are_checked(checkpoints):
    config = ModelConfig.from_file(checkpoints["llama"])
    with pytest.raises(ValueError, match="add up to the model's 4"):
        split_shares(config, 0, 3, [3, 2], [192, 64])
    with pytest.raises(ValueError, match="positive"):
        split_shares(config, 0, 3, [4, 0], [192, 64])
    split_shares(config, 0, 3, [3, 1], [200, 56], [Precision(16), Precision(8)])  # int8: any block
    with pytest.raises(QuantizationError, match=r"down projection columns \[200, 256\)"):
        split_shares(config, 0, 3, [3, 1], [200, 56], [Precision(16), Precision(4)])
