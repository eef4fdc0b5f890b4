"""Triton kernels for the GPU path (Triton ships with CUDA builds of torch). Each file is one
fused operation; the torch code it replaces stays the reference and the CPU path. Import them
where used: `import workbench` must work without Triton."""
