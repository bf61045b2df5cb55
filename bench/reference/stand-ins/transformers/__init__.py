# Stand-in: the benchmark passes prompt embeddings and no CLIP models, so diffusers only needs these names to exist.
__version__ = "4.35.2"
import torch


class PreTrainedModel(torch.nn.Module):
    pass


class PreTrainedTokenizer:
    pass


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    cls = type(name, (PreTrainedModel,), {})
    globals()[name] = cls
    return cls
