"""Benchmarks of the CPU path: bf16 against fp32 and MFU against the matmul peak (cpu_bench), MFU
by model width (cpu_width_bench), the allocator setting (allocator_bench), torch.compile
(compile_bench).

May import: base
"""
