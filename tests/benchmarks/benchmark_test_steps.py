"""Step factories that the benchmark's memory children import in tests (not a test module)."""
import torch


def allocating_step(mb: int):
    """(step, input): the step fills a new float32 tensor of ``mb`` MB (touched, so resident)."""
    def step(_x):
        return torch.ones(mb * 2**20 // 4).sum()
    return step, None
