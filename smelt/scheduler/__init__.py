"""Orders the IR's buffers into steps (fused kernels and ATen calls) and plans their memory."""
from .schedule import Schedule, Step, schedule

__all__ = ["Schedule", "Step", "schedule"]
