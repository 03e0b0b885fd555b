"""Reasoning parsers: the model's thinking text apart from its answer."""
