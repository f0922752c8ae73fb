"""PLACEHOLDER: being written by a helper; replace this whole file."""

def deletion(*args, **kwargs):
    raise NotImplementedError


def insertion(*args, **kwargs):
    raise NotImplementedError


def average_drop(*args, **kwargs):
    raise NotImplementedError


def increase_in_confidence(*args, **kwargs):
    raise NotImplementedError


def road(*args, **kwargs):
    raise NotImplementedError


