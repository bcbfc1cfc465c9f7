"""Triton kernels for atom_kernels' ops (CUDA and ROCm). Imported lazily by the dispatcher only.

One module per op; each exposes a launcher with the same signature as its torch reference in
atom_kernels.reference, asserting shapes/strides/dtypes before launching.
"""
