"""Corpus building for the shipped training prompt set (lab/make_train_prompts.py); not part of the package."""
