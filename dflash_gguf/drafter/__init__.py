"""The DFlash drafter as a model: its configuration and a PyTorch reference (training and parity)."""
