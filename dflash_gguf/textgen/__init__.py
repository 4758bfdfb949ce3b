"""The target writes text: prompts rendered as the target reads them (chat templates included), greedy
continuations, tapped features of a sequence, and counts of the tokens the target writes. Used by engine, server,
bench, convert (draft vocabularies) and train (harvest, τ measurement); depends only on the native layer."""
