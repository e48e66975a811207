"""Stand-in of the paper's EMA: ExponentialMovingAverage(parameters, decay).update(parameters)."""

import torch


class ExponentialMovingAverage:
    def __init__(self, parameters, decay):
        self.decay = decay
        self.shadow = [p.detach().clone() for p in parameters]

    def update(self, parameters):
        with torch.no_grad():
            for shadow, p in zip(self.shadow, parameters, strict=True):
                shadow.lerp_(p, 1 - self.decay)
