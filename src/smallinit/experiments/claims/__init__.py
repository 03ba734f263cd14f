"""The paper's claims, each with a verdict and the numbers behind it (claims), and the analyses
that make them: the mechanism read from probes, the width trend, the anchor-function phase
diagram, and the report over several token budgets.

May import: data, fits, output, stats
"""
