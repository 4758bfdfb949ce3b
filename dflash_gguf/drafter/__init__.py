"""The DFlash drafter as a model: its configuration, tensor names, draft vocabulary and a PyTorch reference
(training and parity)."""
