"""Draft sources that need no drafter file (the DFlash family lives in engine/drafter.py and its siblings)."""
