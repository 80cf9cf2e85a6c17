"""What the CPU kernel tests share: the odd shapes they try and the float64 reference they hold results to.

Tolerance: the kernels sum k fp32 products in fp32, so against a float64 reference each output may be off
by a few units of fp32 rounding of the sum of magnitudes: |error| <= 1e-6 * (|x| @ |w|.T + |bias|)
(measured at most 1.2e-7 for the int8 kernel and 1.8e-7 for the fp32 one over these shapes).
"""

from __future__ import annotations

import torch

RELATIVE_BOUND = 1e-6
# (in_features, out_features): k not a multiple of the 8-wide vectors, odd n, n not split evenly by threads.
SHAPES = [(77, 131), (768, 97), (2051, 45), (1000, 301), (5, 3)]


def assert_exact_to_rounding(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None):
    """``y`` is ``x @ w.T + bias`` within the bound, with ``w`` the weight as float64 [n, k]."""
    b = torch.zeros(w.shape[0], dtype=torch.float64) if bias is None else bias.double()
    reference = x.double() @ w.T + b
    magnitude = x.double().abs() @ w.abs().T + b.abs()
    assert y.dtype == torch.float32 and y.shape == reference.shape
    worst = ((y.double() - reference).abs() / magnitude).max().item() if y.numel() else 0.0
    assert worst <= RELATIVE_BOUND, worst
