"""Tests of the vocabulary (contract/): the decision table."""
