"""Scratch (not committed): fp8_linear's GPU error vs an exact float64 reference, and the reference's own."""
import torch
from atom_kernels.reference import fp8 as R
from atom_kernels.triton.fp8_linear import fp8_linear
from tests.kernels.test_triton_fp8_linear_interpreter import SHAPES, _gpu_case
print("tf32", torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision())
for layer, (n, k) in SHAPES.items():
    for m in (1, 8, 32, 256):
        x, wq, s, want = _gpu_case(m, n, k)
        got = fp8_linear(x, wq, s, 128, 128)
        a = R._activation(x, 128, None).double().cpu()
        w = R.fp8_dequantize(wq, s, 128).double().cpu()
        ex = a @ w.T
        r = lambda u: ((u.double().cpu() - ex).norm() / ex.norm()).item()
        print(f"{layer:32s} M={m:4d} ours {r(got):.4f} ref {r(want):.4f} exact->bf16 {r(ex.to(torch.bfloat16)):.4f}")
