"""Paired statistics, the one rule every verdict goes through: the paired differences' interval and
p-values (paired), comparisons between variants with Holm's correction (stats), validation-
sampling noise beside the seed spread (valnoise), the gap over training (curves), and where on
the eval tokens one variant beats another (tokens).

May import: data
"""
