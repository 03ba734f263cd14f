"""What a sweep shows a person: the results table (results), the closing summary, the live
progress table, and `--show` with its time estimate (show, estimate).

May import: config, runtime, study, worker
"""
