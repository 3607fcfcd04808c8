"""Data-parallel softmax regression on scikit-learn's digits, with checkpoints and resume."""
