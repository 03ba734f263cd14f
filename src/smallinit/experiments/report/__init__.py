"""`make report` (python -m smallinit.experiments.report.report): the page built from its sections
(sections, sections_mechanism, sections_protocol, token_crossover_section) over a shared Context,
its lead (findings), and the headless-browser check of a built page (screenshot).

May import: claims, data, fits, output, stats
"""
