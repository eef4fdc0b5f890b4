"""Triton kernels for the GPU path, one fused operation a file; the torch code each replaces stays
the reference and the CPU path. Import them where used: `import workbench` needs no Triton."""
