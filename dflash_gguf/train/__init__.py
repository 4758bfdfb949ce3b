"""Distil a DFlash drafter for any GGUF target, with the target itself as teacher."""
