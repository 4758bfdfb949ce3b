"""The target writes text: prompts rendered as the target reads them, greedy continuations, tapped features
of a sequence, and counts of the tokens the target writes. Used by convert (draft vocabularies), train
(harvest, τ measurement) and bench; depends only on the native layer and the chat-template renderer."""
