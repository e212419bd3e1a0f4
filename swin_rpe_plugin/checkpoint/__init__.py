from .loader import LoadReport, load_pretrained, read_checkpoint

__all__ = ['LoadReport', 'load_pretrained', 'read_checkpoint']
