"""PyTorch DDP on generated data, as a torchrun user writes it (no ffdl import), with checkpoints and
a checkpoint on SIGTERM."""
