"""What runs inside a Ray worker: one trial, its metrics forwarded to Ray Tune and W&B
(trainable), and why a trial failed and whether a rerun tries it again (failures).

May import: runtime, config
"""
