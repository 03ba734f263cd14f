"""Fitted models of loss against size and tokens: L(N) and the effective model size (scaling),
effective size over (width, budget) and where small init starts to pay (effective_size,
crossover), the joint L(N, D) law (joint_fit), effective size off measured widths
(effective_width), and the token crossover at one width (token_crossover).

May import: data, output, stats
"""
