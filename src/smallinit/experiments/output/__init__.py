"""What the report is written with: figures (Figures.save refuses an unlabelled axis), the
protocol's figures, blocks rendered to report.md and a self-contained index.html, and the
Markdown cells and tables of docs/results.md.

May import: (none)
"""
