"""Training FLOPs per token, one formula for the trainer (MFU, --show's cost) and the analyses
(compute-matched budgets): PaLM's count (Chowdhery et al. 2022, App. B), 6 N + 12 L d T, where N
counts the parameters one token passes through in matmuls (active experts only; the embedding
lookup excluded, the LM head included) and 12 L d T is attention's score and value products,
forward and backward. Works on numbers and on numpy arrays alike."""

from __future__ import annotations

import numpy as np


def training_flops_per_token(n_matmul, n_layers, d_model, seq_len):
    return 6.0 * np.asarray(n_matmul) + 12.0 * np.asarray(n_layers) * np.asarray(d_model) * seq_len
