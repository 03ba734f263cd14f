"""docs/results.md, the record of the CPU experiments (results_doc, with results_budgets' block),
and the checks a record names: bf16 against fp32 (dtype_check), a WSD branch against a cosine run
(wsd_check).

May import: data, fits, output, stats
"""
