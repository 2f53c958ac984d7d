"""trace: turn an agent's recurring failures into capability-targeted training."""

__version__ = "0.1.0"
