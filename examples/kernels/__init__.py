"""Custom kernels as PyTorch operators on neuron: a fused RMSNorm (JAX), a flash attention
(Pallas), and a small transformer that trains with them (see docs/KERNELS.md)."""
