"""The shipped training prompt sets (data/); lab/corpus/ builds them from real text with recorded licences."""
