"""docs/results.md, the record of the CPU experiments (results_doc, with results_budgets' block),
the checks a record names: bf16 against fp32 (dtype_check), a WSD branch against a cosine run
(wsd_check), the recipe's effective size at the crossover record's width (crossover_size), train
against held-out loss in the crossover record (train_val), the record's claims judged again from
its own numbers (record_claims), and the docs' quoted numbers held to their records (quoted).

May import: data, fits, output, stats
"""
