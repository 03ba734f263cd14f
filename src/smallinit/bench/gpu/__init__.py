"""GPU benchmarks: MFU of the 0.1B preset under bf16 and torch.compile (gpu_bench), and the
script a lent GPU runs with torch alone (gpu_check: MFU, both gammas, FSDP).

May import: base
"""
