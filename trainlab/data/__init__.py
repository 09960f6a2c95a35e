"""The data layer: embedded and user data sources, splits, tokenizer, and the prepared on-disk format. Import the
module you need: training and evaluation read prepared data and must not load the sources (pandas, PIL, ...)."""
